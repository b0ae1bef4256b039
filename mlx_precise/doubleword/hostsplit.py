"""Host split and join of double-word numbers: float64 data into float32 word
pairs (:func:`split`, and :func:`low_from_wide` lazily in MLX), pairs back into
float64 (:func:`join`), and complex64 words from float32 parts
(:func:`complex_from_parts`). Nothing here needs the :class:`DoubleWord` type."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..core import context
from ..core.arrays import float64_data
from ..core.plain import plain


def _as_numpy(x, name: str, dtype: str) -> np.ndarray:
    """``x`` (an ``mx.array`` or numpy data of exactly ``dtype``, "float32" or
    "float64") as a numpy array; ValueError for another dtype or type."""
    if isinstance(x, mx.array):
        if x.dtype != getattr(mx, dtype):
            raise ValueError(f"{name} must have dtype {dtype}, got {x.dtype}")
        return np.array(x, dtype=dtype)
    if isinstance(x, (np.ndarray, np.floating)):
        x = np.asarray(x)
        if x.dtype != dtype:
            raise ValueError(f"{name} must have dtype {dtype}, got numpy {x.dtype}")
        return x
    raise ValueError(f"{name} must be a {dtype} mx.array or numpy array, got "
                     f"{type(x).__name__}")


def split(x) -> tuple[mx.array, mx.array]:
    """Split float64 values into double-word pairs.

    Args:
        x: float64 values, any shape: a numpy array (or ``np.float64``), an
            ``mx.array`` of dtype float64 (CPU), or real Python numbers, lists and
            tuples (read as the float64 values Python holds).

    Returns:
        ``(hi, lo)``: two float32 ``mx.array``\\ s of ``x``'s shape with
        ``hi = RN32(x)`` and ``lo = RN32(x - hi)`` (``x - hi`` is exact in float64).
        ``hi + lo`` equals ``x`` exactly when ``x - hi`` fits in 24 bits (e.g. ``x``
        has at most 48 significant bits) and ``lo`` is a normal float32; otherwise it
        is within ``2^-48 |x|`` (relative) for ``|x| >= 2^-78``. Words below 2^-126
        are kept as float32 subnormals here, but kernels read them as zero (Apple
        GPUs flush subnormals), so full precision on the device needs
        ``|x| >= ~2^-78``.

    Raises:
        ValueError: wrong dtype or type, or a value that is not finite or rounds to
            +-inf in float32 (``|x| >= 2^128 - 2^103``).
    """
    a = _as_numpy(float64_data(x, "x"), "x", "float64")  # lists, numbers: their float64
    with np.errstate(over="ignore"):
        hi = a.astype(np.float32)
    bad = ~np.isfinite(hi)
    if np.any(bad):
        first = a[bad].flat[0]
        raise ValueError(
            f"x has {int(np.count_nonzero(bad))} value(s) outside the float32 range "
            f"(non-finite, or |x| rounds to inf in float32), e.g. {first!r}"
        )
    return _split_result(a)


def join(hi, lo) -> np.ndarray:
    """Exact value ``hi + lo`` of double-word pairs, rounded once to float64.

    Args:
        hi, lo: float32 ``mx.array``\\ s (or numpy arrays) of the same shape.

    Returns:
        float64 numpy array of that shape: ``RN64(hi + lo)`` (float32 -> float64 is
        exact, and one float64 addition rounds the exact sum once). It is exactly
        ``hi + lo`` whenever that sum fits in 53 bits, which holds for the pairs
        :func:`split` makes; a pair such as ``(1, 2^-60)`` is rounded to ``1``.

    Raises:
        ValueError: wrong dtype or type, or shapes that differ.
    """
    h = _as_numpy(hi, "hi", "float32")
    l_ = _as_numpy(lo, "lo", "float32")
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
    g = cotangent[0] if isinstance(cotangent, (list, tuple)) else cotangent
    return _real(g), _imag(g)


def complex_from_parts(re: mx.array, im: mx.array) -> mx.array:
    """complex64 ``re + i im`` from float32 parts (broadcast), bit for bit
    (``re + 1j * im`` would turn an infinite ``im`` into a NaN real part:
    ``0 * inf``, and can change the sign of a zero); differentiable."""
    return _complex_bits(*mx.broadcast_arrays(re, im))


def _split_result(y: np.ndarray) -> tuple[mx.array, mx.array]:
    """:func:`split` for a computed result: a value that is not finite in float32
    (Inf, NaN, overflow) becomes that float32 value with a zero low word, the rule
    the kernels follow (docs/api.md, "Special values"), instead of an error."""
    y = np.asarray(y)
    if np.iscomplexobj(y):  # part by part, in one pass over complex128 data
        with np.errstate(over="ignore", invalid="ignore"):
            hi = y.astype(np.complex64)
            rest = y - hi.astype(np.complex128)
        lo = np.empty(y.shape, np.complex64)
        lo.real = np.where(np.isfinite(hi.real), rest.real, 0.0)
        lo.imag = np.where(np.isfinite(hi.imag), rest.imag, 0.0)
        return mx.array(hi), mx.array(lo)
    with np.errstate(over="ignore", invalid="ignore"):
        hi = y.astype(np.float32)
        lo = np.where(np.isfinite(hi), y - hi.astype(np.float64), 0.0).astype(np.float32)
    return mx.array(hi), mx.array(lo)


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
