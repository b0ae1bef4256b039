"""Host split and join of double-word numbers: float64 data into float32 word
pairs (:func:`split_float64`, and :func:`low_from_wide` lazily in MLX), pairs back
into float64 (:func:`join`), and complex64 words from float32 parts
(:func:`complex_from_parts`). Nothing here needs the :class:`DoubleWord` type; the
public :func:`~mlx_precise.doubleword.split` reads its input first
(:func:`~mlx_precise.doubleword.types.read_input`)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..core import context
from ..core.autodiff import as_tuple
from ..core.plain import plain


def _float32_words(x, name: str) -> np.ndarray:
    """A word of :func:`join` (a float32 ``mx.array`` or numpy array) as numpy;
    ValueError for another dtype or type."""
    if isinstance(x, mx.array):
        if x.dtype != mx.float32:
            raise ValueError(f"{name} must have dtype float32, got {x.dtype}")
        return np.array(x, dtype="float32")
    if isinstance(x, (np.ndarray, np.floating)):
        x = np.asarray(x)
        if x.dtype != np.float32:
            raise ValueError(f"{name} must have dtype float32, got numpy {x.dtype}")
        return x
    raise ValueError(f"{name} must be a float32 mx.array or numpy array, got "
                     f"{type(x).__name__}")


def split_float64(a: np.ndarray) -> tuple[mx.array, mx.array]:
    """float64 numpy data ``a`` into words ``(hi, lo)``: ``hi = RN32(a)``,
    ``lo = RN32(a - hi)`` (see :func:`mlx_precise.doubleword.split`).

    Raises:
        ValueError: a value that is not finite or rounds to +-inf in float32.
    """
    with np.errstate(over="ignore"):
        hi = a.astype(np.float32)
    bad = ~np.isfinite(hi)
    if np.any(bad):
        first = a[bad].flat[0]
        raise ValueError(
            f"x has {int(np.count_nonzero(bad))} value(s) outside the float32 range "
            f"(non-finite, or |x| rounds to inf in float32), e.g. {first!r}"
        )
    lo = (a - hi.astype(np.float64)).astype(np.float32)  # a - hi is exact in float64
    return mx.array(hi), mx.array(lo)


def join(hi, lo) -> np.ndarray:
    """Exact value ``hi + lo`` of double-word pairs, rounded once to float64.

    Args:
        hi, lo: float32 ``mx.array``\\ s (or numpy arrays) of the same shape.

    Returns:
        float64 numpy array of that shape: ``RN64(hi + lo)`` (float32 -> float64 is
        exact, and one float64 addition rounds the exact sum once). It is exactly
        ``hi + lo`` whenever that sum fits in 53 bits, which holds for the pairs
        :func:`split_float64` makes; a pair such as ``(1, 2^-60)`` is rounded to ``1``.

    Raises:
        ValueError: wrong dtype or type, or shapes that differ.
    """
    h = _float32_words(hi, "hi")
    l_ = _float32_words(lo, "lo")
    if h.shape != l_.shape:
        raise ValueError(f"hi and lo must have the same shape, got {h.shape} and {l_.shape}")
    return h.astype(np.float64) + l_.astype(np.float64)


# MLX's own real / imag: inside extended_precision() the names in mx are the flow's
# dispatchers, which a VJP must not go through.
_real, _imag = plain.real, plain.imag


@mx.custom_function
def _complex_bits(re: mx.array, im: mx.array) -> mx.array:
    return mx.stack([re, im], axis=-1).view(mx.complex64).reshape(re.shape)


@_complex_bits.vjp
def _complex_bits_vjp(primals, cotangent, output):
    g = as_tuple(cotangent)[0]
    return _real(g), _imag(g)


def complex_from_parts(re: mx.array, im: mx.array) -> mx.array:
    """complex64 ``re + i im`` from float32 parts (broadcast), bit for bit
    (``re + 1j * im`` would turn an infinite ``im`` into a NaN real part:
    ``0 * inf``, and can change the sign of a zero); differentiable."""
    return _complex_bits(*mx.broadcast_arrays(re, im))


def _finite_or_zero(lo: mx.array, hi: mx.array) -> mx.array:
    """lo where hi is finite, +0 where it is not (Inf, NaN), by a bit mask: MLX's
    ``where`` and ``isfinite`` on the CPU are ~10x slower than an arithmetic pass."""
    keep = -(mx.abs(hi) < float("inf")).astype(mx.int32)  # all ones / all zeros
    bits = mx.uint32 if lo.dtype == mx.float32 else mx.uint64
    return (lo.view(bits) & keep.astype(bits)).view(lo.dtype)


def _low64(v: mx.array) -> mx.array:
    """RN32(v - RN32(v)) of float64 v, 0 where RN32(v) is not finite; no gradient
    (hi + lo = v, so the low word's derivative with respect to v is 0: the
    gradient flows through hi)."""
    with mx.stream(mx.cpu), context.flow_suspended():  # plain MLX even inside a block
        s = mx.stop_gradient(v)
        h = s.astype(mx.float32)
        return _finite_or_zero((s - h.astype(mx.float64)).astype(mx.float32), h)


def low_from_wide(wide: tuple) -> mx.array:
    """The low word of the float64 value ``wide = (re, im or None)`` (complex64
    when ``im`` is given), lazily."""
    re, im = wide
    if im is None:
        return _low64(re)
    with context.flow_suspended():
        return complex_from_parts(_low64(re), _low64(im))
