"""Precision-aware entry points: one public function, two twins.

A function decorated with :func:`precision_aware` runs its double-word twin
(``*_extended``) inside :func:`~mlx_precise.extended_precision` and its plain
float32 self outside; the switch itself is the context state of
:mod:`mlx_precise.core.context`. :func:`precision_aware_functions` lists every
such function (the docs' API page shows the same list).
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable

import mlx.core as mx

from ..core import backends
from ..core.context import is_extended
from .types import DoubleWord

# name -> the precision-aware function (filled by @precision_aware).
_REGISTRY: dict[str, Callable] = {}
# the extended twin -> (the precision-aware function's name, its flow twin, the
# extended twin's signature, whether it reads words) (filled by @precision_aware;
# read by twin_of).
_TWINS: dict[Callable, tuple] = {}


# Keywords of an extended twin that the dispatcher itself honours on the plain path,
# so that the plain twin need not: ``backend`` is validated (an unknown name raises
# as it does inside the block) and ``round_output=False`` returns the plain result as
# an exact DoubleWord (lo = 0).
DISPATCHER_KEYWORDS = ("round_output", "backend")


def twin_mismatch(plain: Callable, extended: Callable) -> str | None:
    """None when ``plain`` takes exactly the parameters of ``extended`` (names,
    kinds, defaults, order) less :data:`DISPATCHER_KEYWORDS`; else what differs."""
    ext = inspect.signature(extended).parameters
    want = [p for name, p in ext.items() if name not in DISPATCHER_KEYWORDS]
    got = list(inspect.signature(plain).parameters.values())
    for name in DISPATCHER_KEYWORDS:
        if name in ext and ext[name].kind is not inspect.Parameter.KEYWORD_ONLY:
            return f"{extended.__name__}: {name} must be keyword-only"
    if [(p.name, p.kind, p.default) for p in got] != [(p.name, p.kind, p.default) for p in want]:
        return (f"{plain.__name__}{inspect.Signature(got)} differs from "
                f"{extended.__name__}{inspect.Signature(want)} (less {DISPATCHER_KEYWORDS})")
    return None


def precision_aware(extended: Callable, flow: Callable | None = None,
                    words: bool = True) -> Callable:
    """Decorator for a plain float32 function whose double-word twin is
    ``extended``: the decorated function runs ``extended`` inside
    :func:`extended_precision` and itself outside.

    Both twins take the same arguments: the plain one must declare exactly the
    extended one's parameters less :data:`DISPATCHER_KEYWORDS` (checked here, at
    registration: ``TypeError`` otherwise), and honour each as MLX does. The
    dispatcher binds every call to the extended signature first, so an unknown or
    missing argument raises ``TypeError`` in and out of the block alike.

    ``flow``: the function a block's double-word flow runs instead of ``extended``
    where the operands carry low words or a gradient is being recorded (its ops are
    then the flow's: words in, words out, each with its VJP rule); it takes the
    plain twin's arguments and computes the same value with MLX ops (looked up as
    ``mx.<name>`` at call time, so that the flow sees them). Default: the plain twin
    itself (where it is written so). ``words``: whether ``extended`` reads its
    array operands' words (DoubleWords, the low words of carried values: through
    :func:`~.types.read_input`'s ``"words"``), not only float32 values."""
    def wrap(plain: Callable) -> Callable:
        why = twin_mismatch(plain, extended)
        if why is not None:
            raise TypeError(f"precision_aware twins take different arguments: {why}")
        sig = inspect.signature(extended)
        own = [k for k in DISPATCHER_KEYWORDS if k in sig.parameters]

        @functools.wraps(plain)
        def dispatch(*args, **kwargs):
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError as e:  # Python's message lacks the function's name
                raise TypeError(f"{plain.__name__}(): {e}") from None
            if is_extended():  # (inside a block's flow, the flow decides: twin_of)
                return extended(*args, **kwargs)
            opts = {k: bound.arguments.pop(k, sig.parameters[k].default) for k in own}
            if "backend" in opts and opts["backend"] is not None:
                backends.validate(opts["backend"])
            out = plain(*bound.args, **bound.kwargs)
            if opts.get("round_output", True):
                return out
            return DoubleWord(out, mx.zeros_like(out))  # the plain result, exactly

        dispatch.__signature__ = sig
        dispatch.extended = extended
        dispatch.plain = plain
        _REGISTRY[plain.__name__] = dispatch
        _TWINS[extended] = (plain.__name__, flow or plain, sig, words)
        return dispatch

    return wrap


def twin_of(extended: Callable) -> tuple | None:
    """``(name, flow twin, signature, words)`` of a registered extended twin (see
    :func:`precision_aware`), None for any other function."""
    return _TWINS.get(extended)


def precision_aware_functions() -> dict[str, Callable]:
    """The precision-aware entry points of the package, by name (each capability
    registers its own when it is imported, and ``import mlx_precise`` imports them
    all)."""
    return dict(sorted(_REGISTRY.items()))
