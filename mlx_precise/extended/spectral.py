"""MLX's FFTs inside the double-word flow: double-word operands in, double-word
results out, with gradients.

The intercepted ``mx.fft.*`` call (:mod:`mlx_precise.intercept`) hands its
normalised arguments here when a block carries values: the operand enters with
its carried low word (or exactly), the N-D double-word transform of
:mod:`mlx_precise.fftn` runs without rounding, and the result's low word is
attached to the returned array.
"""

from __future__ import annotations

import mlx.core as mx

from .. import fftn
from ..doubleword import DoubleWord
from .carry import attach, low_word, suspended


def _cast(a: mx.array, kind: str) -> mx.array:
    """MLX's input cast for ``kind`` on one word (exact: float32 -> complex64)."""
    if kind == "rfft":
        return a if a.dtype == mx.float32 else mx.real(a)
    return a if a.dtype == mx.complex64 else a.astype(mx.complex64)


def _words_transform(kind, s, axes, norm, backend, stream):
    """``(hi, lo) -> (hi', lo')`` as an ``mx.custom_function`` whose VJP is the
    transform's own (a linear map: the rounded double-word transform of the
    cotangent, as :func:`mlx_precise.fftn.transform` differentiates itself)."""

    @mx.custom_function
    def f(hi, lo):
        y = fftn.transform(kind, DoubleWord(hi, lo), s, axes, norm, round_output=False,
                           backend=backend, stream=stream)
        return y.hi, y.lo

    @f.vjp
    def f_vjp(primals, cotangents, outputs):
        hi, lo = primals
        g = cotangents[0]
        with suspended():
            _, (v,) = mx.vjp(lambda x: fftn.transform(kind, x, s, axes, norm, backend=backend,
                                                       stream=stream), [hi], [g])
            return v, mx.zeros_like(lo)

    return f


def transform(kind: str, a: mx.array, s, axes, norm: str, backend: str, stream) -> mx.array:
    """The double-word N-D transform of ``a`` (float32 / complex64, with or
    without a carried low word): the rounded result, its low word attached."""
    lo = low_word(a)
    hi = _cast(a, kind)
    lo = mx.zeros_like(hi) if lo is None else _cast(lo, kind)
    y_hi, y_lo = _words_transform(kind, tuple(s), tuple(axes), norm, backend, stream)(hi, lo)
    return attach(y_hi, y_lo)
