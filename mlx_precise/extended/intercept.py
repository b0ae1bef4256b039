"""MLX's own FFTs and depthwise ``mx.conv1d`` run extended inside ``extended_precision()``.

Importing :mod:`mlx_precise` installs, once per process, thin dispatchers in place of
``mx.fft.fft``, ``ifft``, ``rfft``, ``irfft``, ``fft2``, ``ifft2``, ``rfft2``,
``irfft2``, ``fftn``, ``ifftn``, ``rfftn``, ``irfftn``, ``mx.conv1d`` and
``mx.compile``. Each reads a context variable (:func:`~mlx_precise.core.context.intercepting`):

* unset (outside a block, another thread or task, ``extended_precision(False)`` or
  ``extended_precision(intercept_mlx=False)``): the original MLX function is called
  with the very same arguments, so results are MLX's bit for bit;
* set: the op runs in double-word on the active backend and is rounded once
  (:mod:`mlx_precise.fft.nd`, :func:`~mlx_precise.depthwise_conv_extended`), with
  gradients (``mx.grad``) through ``mx.custom_function`` VJPs.

``mx.compile`` keeps one compiled graph per (extended?, backend) state, so a
function compiled outside a block and called inside it is traced again, extended
(on ``metal`` the kernels are graph nodes); on ``cpu`` and ``emulate`` (which compute on the host) tracing an extended op
raises :class:`~mlx_precise.TransformUnsupportedError` instead of
running plain. ``mx.vmap`` over an intercepted op raises the same error there.

Out of reach (they keep running plain float32 MLX): names bound before
``import mlx_precise`` (``from mlx.core.fft import rfft``, ``mx.compile`` objects
made earlier), arithmetic operators (the ``*`` of two spectra), ``mx.fft.stft`` /
``istft`` and other C++ code paths, dense or grouped (non-depthwise) and
non-float32 convolutions. Set ``MLX_PRECISE_INTERCEPT=0`` before the import to
install nothing.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import os
import threading

import mlx.core as mx

from .. import extended as flow
from ..core import backends
from ..core.autodiff import TransformUnsupportedError
from ..core.context import intercepting
# The original MLX functions, captured before anything is replaced: the package's
# own plain paths call these, never the dispatchers.
from ..core.plain import FFT_NAMES, plain
from ..fft.nd import transform
from . import spectral

ENV_VAR = "MLX_PRECISE_INTERCEPT"

_lock = threading.Lock()
_installed = False
# Set while mx.compile traces a function for an extended state.
_tracing: contextvars.ContextVar[bool] = contextvars.ContextVar("mlx_precise_tracing",
                                                                default=False)


def _has_norm(fn) -> bool:
    return "norm" in (fn.__doc__ or "").split("\n", 1)[0]


def _signature(name: str) -> inspect.Signature:
    """The Python signature of MLX's ``mx.fft.<name>`` (to bind user arguments)."""
    P = inspect.Parameter
    first = [P("a", P.POSITIONAL_OR_KEYWORD)]
    if name in ("fft", "ifft", "rfft", "irfft"):
        rest = [P("n", P.POSITIONAL_OR_KEYWORD, default=None),
                P("axis", P.POSITIONAL_OR_KEYWORD, default=-1)]
    else:
        axes = (-2, -1) if name.endswith("2") else None
        rest = [P("s", P.POSITIONAL_OR_KEYWORD, default=None),
                P("axes", P.POSITIONAL_OR_KEYWORD, default=axes)]
    if _has_norm(getattr(plain.fft, name)):
        rest.append(P("norm", P.POSITIONAL_OR_KEYWORD, default="backward"))
    rest.append(P("stream", P.POSITIONAL_OR_KEYWORD, default=None))
    return inspect.Signature(first + rest)


def _operand(a, kind: str) -> mx.array:
    """MLX's input casts: rfft takes the real part of complex input; others keep
    complex64 and make every real dtype float32 (float64 too, as MLX does)."""
    a = a if isinstance(a, mx.array) else mx.array(a)
    if kind == "rfft":
        return a if a.dtype == mx.float32 else a.astype(mx.float32)
    if kind == "irfft":
        return a if a.dtype == mx.complex64 else a.astype(mx.complex64)
    return a if a.dtype in (mx.float32, mx.complex64) else a.astype(
        mx.complex64 if mx.issubdtype(a.dtype, mx.complexfloating) else mx.float32)


def _sizes(name: str, kind: str, a: mx.array, b: dict):
    """(s, axes) of one call, numpy's defaults, axes normalised."""
    nd = a.ndim
    if name in FFT_NAMES[:4]:
        axes = [b["axis"]]
        s = None if b["n"] is None else [b["n"]]
    else:
        s = None if b["s"] is None else list(b["s"])
        axes = b["axes"]
        if axes is None:
            axes = list(range(nd)) if s is None else list(range(nd - len(s), nd))
        axes = list(axes)
    axes = [int(ax) % nd for ax in axes]
    if s is None:
        s = [a.shape[ax] for ax in axes]
        if kind == "irfft":
            s[-1] = 2 * (a.shape[axes[-1]] - 1)
    return s, axes


def _guard_transforms(fn, what: str):
    """Run ``fn()``; a trace by mx.compile / mx.vmap on a host backend becomes a
    clear error instead of MLX's eval error (or a silently plain graph)."""
    name = backends.backend()
    advice = ("run it uncompiled inside the block, use the 'metal' backend, or opt out "
              "with extended_precision(intercept_mlx=False)")
    if _tracing.get() and name != "metal":
        raise TransformUnsupportedError(
            f"mx.compile traced {what} inside extended_precision() on backend {name!r}, "
            f"which computes on the host and cannot be compiled: {advice}")
    try:
        return fn(name)
    except (RuntimeError, ValueError) as e:  # MLX's "[eval] ... during function transformations"
        if "function transformations" not in str(e):
            raise
        raise TransformUnsupportedError(
            f"{what} inside extended_precision() was traced by mx.compile or mx.vmap on "
            f"backend {name!r}, which computes on the host: {advice}") from e


def _fft_dispatcher(name: str):
    original = getattr(plain.fft, name)
    sig = _signature(name)
    kind = name[:-1] if name[-1] in "2n" else name  # fft2, fftn -> fft

    @functools.wraps(original)
    def dispatch(*args, **kwargs):
        if not intercepting():
            return original(*args, **kwargs)
        ref = original(*args, **kwargs)  # lazy: MLX checks the arguments, gives the shape
        b = sig.bind(*args, **kwargs)
        b.apply_defaults()
        b = b.arguments
        a = _operand(b["a"], kind)
        s, axes = _sizes(name, kind, a, b)

        norm = b.get("norm", "backward")
        report = flow.active()

        def run(backend):
            if report is not None:  # the double-word flow: words in, words out
                with flow.suspended():
                    return spectral.transform(kind, a, s, axes, norm, backend,
                                              b["stream"])
            return transform(kind, a, s, axes, norm, backend=backend, stream=b["stream"])

        y = _guard_transforms(run, f"mx.fft.{name}")
        if report is not None:
            report.extended[f"fft.{name}"] += 1
        if tuple(y.shape) != tuple(ref.shape) or y.dtype != ref.dtype:
            raise AssertionError(f"mlx_precise: extended mx.fft.{name} gave {y.shape} "
                                 f"{y.dtype}, MLX {ref.shape} {ref.dtype}")
        return y

    return dispatch


def _conv1d_dispatcher():
    original = plain.conv1d

    @functools.wraps(original)
    def conv1d(input, weight, stride=1, padding=0, dilation=1, groups=1, *, stream=None):
        args = (input, weight, stride, padding, dilation, groups)
        if not intercepting():
            return original(*args, stream=stream)
        ref = original(*args, stream=stream)  # lazy: MLX checks the arguments
        if not spectral.is_depthwise(input, weight, groups):
            return ref
        # Inside a block with the flow on, the flow's conv1d rule ran before this
        # (carrying double-word values); here each call is rounded on its own.
        geometry = (int(stride), int(padding), int(dilation))
        y = _guard_transforms(
            lambda backend: spectral.depthwise(input, weight, *geometry, backend, stream),
            "mx.conv1d")
        if tuple(y.shape) != tuple(ref.shape):
            raise AssertionError(f"mlx_precise: extended mx.conv1d gave {y.shape}, "
                                 f"MLX {ref.shape}")
        return y

    return conv1d


def _compile_dispatcher():
    original = plain.compile

    @functools.wraps(original)
    def compile(fun, inputs=None, outputs=None, shapeless=False):
        graphs: dict = {}
        lock = threading.Lock()

        def graph(state):
            with lock:
                if state not in graphs:
                    if state is None:
                        target = fun
                    else:
                        # A distinct callable: MLX caches traces by function identity.
                        def target(*a, **k):
                            token = _tracing.set(True)
                            try:
                                return fun(*a, **k)
                            finally:
                                _tracing.reset(token)

                    graphs[state] = original(target, inputs, outputs, shapeless)
                return graphs[state]

        def compiled(*args, **kwargs):
            if flow.active() is not None:  # the double-word flow runs the Python ops
                return fun(*args, **kwargs)
            state = backends.backend() if intercepting() else None
            return graph(state)(*args, **kwargs)

        return functools.update_wrapper(compiled, fun, updated=())

    return compile


def install() -> None:
    """Install the dispatchers (once per process; the package's import does it
    unless ``MLX_PRECISE_INTERCEPT=0``)."""
    global _installed
    with _lock:
        if _installed:
            return
        for name in FFT_NAMES:
            setattr(mx.fft, name, _fft_dispatcher(name))
        mx.conv1d = _conv1d_dispatcher()
        mx.compile = _compile_dispatcher()
        _installed = True


def installed() -> bool:
    """True once the dispatchers are in place."""
    return _installed


def install_from_env() -> None:
    """:func:`install` unless the environment variable says 0 / false / off."""
    if os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "off", "no"):
        install()
