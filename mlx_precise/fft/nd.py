"""N-D double-word FFTs with numpy / MLX ``norm`` modes, and their gradients.

:func:`transform` runs ``fft``, ``ifft``, ``rfft`` or ``irfft`` over several axes
by chaining the 1-D double-word transforms of :mod:`mlx_precise.fft.engine` with
double-word values in between (nothing is rounded between axes), then applies the
``norm`` factor as one double-word product, and rounds once. The axis order is
numpy's: ``rfftn`` is rfft on the last axis then fft on the others; ``irfftn`` is
ifft on all axes but the last, then irfft on the last.

Gradients follow MLX's convention for complex arrays (the VJP of a complex-linear
map ``A`` is ``A^H g``, as ``mx.vjp`` of ``mx.fft.*`` gives), computed with the same
double-word transforms, so they are differentiable again:

* fft / ifft: ``conj(T(conj g))`` (the DFT matrix is symmetric), cut or padded back
  to the input's sizes; real input: its real part.
* rfft: the real part of ``fft(conj g)`` over the full sizes ``s``.
* irfft: ``w * rfft(g)`` with the dual norm (backward <-> forward), ``w = 2`` on the
  frequencies that stand for two conjugate terms and 1 on the zero frequency and
  (even n) the Nyquist one.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import mlx.core as mx
import numpy as np

from ..core import backends
from ..core.autodiff import as_tuple
from . import engine as _fft
from ..doubleword.engine64 import from64
from ..doubleword.fusion import guarded
from ..doubleword.types import DoubleWord
from ..doubleword.elementwise import scale_extended

_ARRAY = mx.array  # the class (inside a block the name is a stand-in: a slower isinstance)
KINDS = ("fft", "ifft", "rfft", "irfft")
NORMS = ("backward", "ortho", "forward")
_DUAL = {"backward": "forward", "forward": "backward", "ortho": "ortho"}


def _sqrt(n: int) -> Fraction:
    """sqrt(n) exactly for squares, else to 2^-128 relative (far beyond 48 bits)."""
    r = math.isqrt(n)
    if r * r == n:
        return Fraction(r)
    return Fraction(math.isqrt(n << 256), 1 << 128)


def _norm_factor(kind: str, n: int, norm: str) -> Fraction | None:
    """The factor still to apply after the 1-D transforms (ifft and irfft already
    carry 1/n); None when it is 1."""
    inverse = kind in ("ifft", "irfft")
    if norm == "backward":
        return None
    if norm == "forward":
        return Fraction(n) if inverse else Fraction(1, n)
    r = _sqrt(n)
    return r if inverse else 1 / r


def _steps(kind: str, s, axes):
    """The 1-D transforms (kind, n, axis) in the order they run."""
    rest = [(s[i], axes[i]) for i in range(len(axes) - 1)]
    if kind == "rfft":
        return [("rfft", s[-1], axes[-1])] + [("fft", n, a) for n, a in reversed(rest)]
    if kind == "irfft":
        return [("ifft", n, a) for n, a in rest] + [("irfft", s[-1], axes[-1])]
    return [(kind, n, a) for n, a in reversed(list(zip(s, axes)))]


@functools.lru_cache(maxsize=256)
def _chain_plan(kind: str, s: tuple, axes: tuple, norm: str):
    """(the norm factor still to apply or None, the 1-D steps) of a transform:
    :func:`_norm_factor` (exact ints; np.prod costs ~7 us) and :func:`_steps`,
    planned once per sizes."""
    return _norm_factor(kind, math.prod(s), norm), tuple(_steps(kind, s, axes))


def _chain(kind, x, s, axes, norm, round_output, backend, stream):
    """The N-D transform without autodiff: double-word between the steps, one
    rounding (or a DoubleWord) at the end."""
    factor, steps = _chain_plan(kind, s, axes, norm)
    if backend.float64_engine and x.size:  # the float64 steps on the host, in one go
        return _fft.cpu_transform(steps, x, None if factor is None else float(factor),
                                  round_output)
    # an inverse with norm="forward" is the unnormalised sum: its 1-D steps leave out
    # their 1/n and no factor n is applied after them (one launch fewer, no rounding
    # of 1/n where n is not a power of two; the same bits where it is)
    scaled = not (norm == "forward" and kind in ("ifft", "irfft"))
    if not scaled:
        factor = None
    for i, (k, n, ax) in enumerate(steps):
        last = i == len(steps) - 1 and factor is None
        x = _fft.transform_words(k, x, n, ax, round_output and last, backend, stream, scaled)
    if factor is not None:
        x = scale_extended(x, factor, round_output=round_output, backend=backend, stream=stream)
    return x


def _complex_length(kind: str, n: int) -> int:
    """Length of the complex FFT a 1-D step of ``kind`` and size n runs: n for
    fft / ifft and odd real lengths, n/2 for even real ones (packed halves)."""
    return n if kind in ("fft", "ifft") or n % 2 else n // 2


def check_limits(kind: str, shape, s, axes) -> None:
    """The size limits of every backend, checked before dispatch so that the
    ``cpu`` backend refuses what the kernels refuse instead of allocating it: at
    most 2^30 points (rows times length) in each 1-D step, Bluestein's padded
    power-of-two length included (:mod:`mlx_precise.fft.engine`, 32-bit word indices).

    Raises:
        ValueError: a step exceeds the limit (naming it).
    """
    shape = [int(v) for v in shape]
    for k, n, ax in _steps(kind, s, axes):
        shape[ax] = n  # the step's input fitted to n (irfft: its output length)
        rows = math.prod(shape) // n if n else 0
        _fft._check_size(rows * n, f"the {k} of length {n} over {rows} row(s)")
        m = _complex_length(k, n)
        if m > 1 and m & (m - 1):
            _fft._check_size(rows * _fft._next_pow2(2 * m - 1),
                             f"Bluestein's padded transform for the {k} of length {n}")
        if k == "rfft":
            shape[ax] = n // 2 + 1


def _fit_axes(a: mx.array, shape, axes) -> mx.array:
    """Cut or zero-pad ``a`` along ``axes`` to the sizes in ``shape``."""
    for ax in axes:
        m, want = a.shape[ax], shape[ax]
        if m > want:
            a = mx.take(a, mx.arange(want), axis=ax)
        elif m < want:
            widths = [(0, 0)] * a.ndim
            widths[ax] = (0, want - m)
            a = mx.pad(a, widths)
    return a


def _hermitian_weights(n: int, axis: int, ndim: int) -> mx.array:
    """(n//2 + 1,) weights along ``axis``: 1 for k = 0 and (n even) k = n/2, else 2."""
    h = n // 2 + 1
    w = np.full(h, 2.0, np.float32)
    w[0] = 1.0
    if n % 2 == 0:
        w[-1] = 1.0
    shape = [1] * ndim
    shape[axis] = h
    return mx.array(w.reshape(shape))


def _differentiable(kind, s, axes, norm, backend, stream):
    """The rounded transform of an ``mx.array`` as an ``mx.custom_function``."""

    @mx.custom_function
    def f(x):
        return _chain(kind, x, s, axes, norm, True, backend, stream)

    @f.vjp
    def f_vjp(primals, cotangent, output):
        # One input and one output: MLX passes them bare, not in lists.
        x = as_tuple(primals)[0]
        g = as_tuple(cotangent)[0]
        again = dict(round_output=True, backend=backend, stream=stream)
        if kind in ("fft", "ifft"):
            v = mx.conj(transform(kind, mx.conj(g), s, axes, norm, **again))
        elif kind == "rfft":
            v = transform("fft", mx.conj(g), s, axes, norm, **again)
        else:
            v = transform("rfft", g, s, axes, _DUAL[norm], **again)
            v = v * _hermitian_weights(s[-1], axes[-1], v.ndim)
        v = _fit_axes(v, x.shape, axes)
        if x.dtype != mx.complex64:
            v = mx.real(v).astype(x.dtype)
        return (v,)

    return f


def check_norm(norm) -> None:
    """ValueError unless ``norm`` is one of :data:`NORMS`."""
    if norm not in NORMS:
        raise ValueError(f'norm must be one of "backward", "ortho", "forward", got {norm!r}')


# (kind, norm, shape, s, axes) of a call -> its checked (s, axes) (the oldest first out)
_CHECKED: dict = {}


def _check_call(kind: str, shape, s, axes, norm: str):
    """(s, axes) of a :func:`transform` call as ints, its arguments checked
    (:func:`transform`'s errors)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    check_norm(norm)
    s, axes = tuple(int(v) for v in s), tuple(int(a) for a in axes)
    if len(s) != len(axes) or not axes:
        raise ValueError(f"s and axes must be non-empty and of one length, got {s} and {axes}")
    check_limits(kind, shape, s, axes)
    return s, axes


def _checked(kind: str, shape, s, axes, norm: str):
    """:func:`_check_call`, once per call form (kind, norm, shape, s, axes)."""
    key = (kind, norm, tuple(shape), s, axes)
    try:
        checked = _CHECKED.get(key)
    except TypeError:  # unhashable arguments (lists): checked each time
        checked = key = None
    if checked is None:
        checked = _check_call(kind, shape, s, axes, norm)
        if key is not None:
            _CHECKED[key] = checked
            if len(_CHECKED) > 1024:
                _CHECKED.pop(next(iter(_CHECKED)), None)
    return checked


def kernel_words(kind: str, x: DoubleWord, s: tuple, axes: tuple, norm: str, backend,
                 stream) -> DoubleWord:
    """``transform(kind, x, s, axes, norm, round_output=False)`` of a DoubleWord on a
    kernel backend (``backend`` resolved) where MLX's autodiff does not trace the
    caller: the same steps without the general entry's layers (no guard runs there,
    :func:`~mlx_precise.doubleword.fusion.guarded`), for the flow's rules, whose
    host cost every layer adds to."""
    s, axes = _checked(kind, x.shape, s, axes, norm)
    if x._lo is None and x.wide is None:
        x = x.hi  # exact: no low word to make (the engine reads none)
    return _chain(kind, x, s, axes, norm, False, backend, stream)


def transform(kind: str, x, s, axes, norm: str = "backward", *, round_output: bool = True,
              backend: str | None = None, stream=None):
    """N-D double-word transform ``kind`` over ``axes`` with sizes ``s``.

    Args:
        kind: ``"fft"``, ``"ifft"``, ``"rfft"`` or ``"irfft"``.
        x: float32 / complex64 ``mx.array`` or a DoubleWord (rfft: real only).
        s: transform sizes, one per axis (ints >= 1); for irfft, ``s[-1]`` is the
            real output length of the last axis.
        axes: distinct axes, normalised to ``0 <= axis < x.ndim``.
        norm: ``"backward"`` (numpy's default), ``"ortho"`` or ``"forward"``.
        round_output: complex64 / float32 rounded once if True, else a DoubleWord.
        backend, stream: as :func:`mlx_precise.fft_extended`.

    Returns:
        complex64 (fft, ifft, rfft; rfft has ``s[-1]//2 + 1`` points on the last
        axis) or float32 (irfft) ``mx.array``, or a DoubleWord. Differentiable
        (``mx.grad``, any order) for an ``mx.array`` x with ``round_output=True``;
        otherwise a gradient raises
        :class:`~mlx_precise.core.autodiff.NotDifferentiableError`.

    Raises:
        ValueError: unknown kind or norm, ``s`` and ``axes`` of different lengths.
    """
    s, axes = _checked(kind, x.shape, s, axes, norm)
    name = backends.resolve(backend)
    if round_output and isinstance(x, _ARRAY):
        return _differentiable(kind, s, axes, norm, name, stream)(x)
    if isinstance(x, DoubleWord) and x._lo is None and x.wide is None:
        x = x.hi  # exact: no low word to make (the engine reads none)
    dw_in = isinstance(x, DoubleWord)
    # cpu: a DoubleWord's float64 value goes in and out whole, and is the guard's
    # arguments and results: no word of the input nor of the result is made here
    # (a result's high word is its rounding, made when read; made for the guard, the
    # input's low word and both high words were the peak of a model's memory)
    wide = name.float64_engine and dw_in and x.wide is not None
    arrays = [v for v in x.wide if v is not None] if wide else [x.hi, x.lo] if dw_in else [x]

    def run(*a):
        y = _chain(kind, x if wide else DoubleWord.of_words(*a) if dw_in else a[0], s, axes, norm,
                   round_output, name, stream)
        if round_output:
            return y
        if name.float64_engine and y.wide is not None:
            return tuple(v for v in y.wide if v is not None)
        return y.hi, y.lo

    out = guarded(run, arrays, f"the {kind} of a DoubleWord or with round_output=False", name)
    if round_output:
        return out
    if out[0].dtype == mx.float64:  # (re[, im]): the float64 value
        with mx.stream(mx.cpu):
            return from64(*out)
    return DoubleWord.of_words(*out)  # (the words of one shape and dtype, as x's / y's)
