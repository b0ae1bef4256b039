"""Autodiff guards for extended kernels.

The ``cpu`` and ``emulate`` backends compute on the host, and ``metal`` kernels have
no autodiff of their own, so a gradient through an extended op exists only where an
``mx.custom_function`` gives it one. Anything else would come back as zeros without
a word (the graph is cut at the host round trip). :func:`guarded` closes that gap:
it runs a function inside an ``mx.custom_function`` whose VJP raises
:class:`NotDifferentiableError`, so ``mx.grad`` through it fails loudly.
"""

from __future__ import annotations

import contextvars
import functools

import mlx.core as mx

from .context import flow, public_runner


class NotDifferentiableError(RuntimeError):
    """A gradient was asked of an extended op that has none (e.g. a DoubleWord
    input or output)."""


class TransformUnsupportedError(RuntimeError):
    """An extended op was traced by ``mx.compile`` or ``mx.vmap`` on a backend
    that computes eagerly on the host (``cpu``, ``emulate``)."""


def as_tuple(args) -> tuple:
    """A custom function's primals, cotangents or tangents (what its VJP / JVP is
    given) as a tuple: MLX passes a lone one as it is, not in a tuple
    (``list(primals)`` would split its rows)."""
    return tuple(args) if isinstance(args, (list, tuple)) else (args,)


def guarded(fn, arrays, what: str,
            hint: str = "use an mx.array input and round_output=True for a gradient"):
    """``fn(*arrays)`` (arrays: ``mx.array``\\ s; fn returns an array or a tuple
    of arrays) with a VJP that raises :class:`NotDifferentiableError` naming
    ``what`` (and ``hint``, the way to a gradient if there is one)."""

    @mx.custom_function
    def f(*a):
        return fn(*a)

    @f.vjp
    def f_vjp(primals, cotangents, outputs):
        raise NotDifferentiableError(f"{what} is not differentiable; {hint}")

    return f(*arrays)


_TRACED = "function transformations"  # in MLX's error when a traced array is evaluated
_in_guard: contextvars.ContextVar[bool] = contextvars.ContextVar("mlx_precise_guard", default=False)


def host_guard(fn):
    """Decorator for public ops: when ``fn`` is traced by ``mx.compile``, ``mx.vmap``
    or ``mx.export_function`` on a backend that computes on the host (``cpu``:
    numpy; ``emulate``: the Metal emulator), raise
    :class:`TransformUnsupportedError` naming the op, the limit and the way out,
    instead of MLX's bare evaluation error. Called while a block's double-word flow
    is on (outermost public op only), ``fn`` is handed to the flow
    (:data:`~.context.public_runner`): the operands' low words and a gradient being
    recorded are the flow's to see."""

    def body(*args, **kwargs):
        token = _in_guard.set(True)
        try:
            return fn(*args, **kwargs)
        except (RuntimeError, ValueError) as e:
            if isinstance(e, TransformUnsupportedError) or _TRACED not in str(e):
                raise
            from . import backends

            name = backends.resolve(kwargs.get("backend"))
            raise TransformUnsupportedError(
                f"{fn.__name__} on backend {name!r} computes on the host, which mx.compile, "
                "mx.vmap and mx.export_function cannot trace: call it outside the "
                "transformation, or use the 'metal' backend (an Apple GPU), where the "
                "kernels are MLX primitives and the op traces") from e
        finally:
            _in_guard.reset(token)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if _in_guard.get():  # an inner public op: the outermost one names the error
            return fn(*args, **kwargs)
        if public_runner and flow.get() is not None:  # inside a block: the flow decides
            return public_runner[0](wrapper, body, args, kwargs)
        return body(*args, **kwargs)

    return wrapper
