"""Exact power-of-two range scaling of rows, so that FFT intermediates do not overflow.

A transform of length n can grow magnitudes by up to n before any 1/n is applied,
and a product of spectra squares that: data near the top of float32's range
(2^127) overflow inside the kernels although the exact result is in range. Each row
is therefore scaled by 2^-e with the smallest e >= 0 that keeps ``max|row| * growth``
below 2^``log2_limit``, and the result scaled back by 2^e. Multiplying a float32 by
a power of two is exact (unless it falls below 2^-126, where Apple GPUs flush: only
entries 2^(126 - log2_limit)-fold below their row's maximum can be lost), so rows
that need no scaling (e = 0) give bit-identical results. The exponent comes from the
bits of the row maximum, lazily (MLX ops, no evaluation).
"""

from __future__ import annotations

import mlx.core as mx

HEADROOM = 124
"""Target: every intermediate below 2^124 (float32 overflows at 2^128)."""


def _pow2(e: mx.array) -> mx.array:
    """2^e as float32 for int32 arrays e in [-126, 127], built from the bits (the
    biased exponent e + 127 in [1, 254], shifted into place, fits int32)."""
    return ((e + 127) << 23).view(mx.float32)


def _pow2_neg(e: mx.array) -> mx.array:
    """2^-e as float32 for int32 arrays e in [-127, 126]."""
    return ((127 - e) << 23).view(mx.float32)


def row_maxima(rows: mx.array) -> mx.array:
    """float32 (rows, 1): max |row| (|z| of complex64 rows). ``rows``: float32 or
    complex64 (rows, n)."""
    return mx.max(mx.abs(rows), axis=-1, keepdims=True)


def row_exponents(rows: mx.array, growth_log2: int) -> mx.array:
    """int32 (rows, 1): the e >= 0 such that ``max|row| * 2^growth_log2 * 2^-e`` stays
    below 2^HEADROOM (0 for rows of zeros, Inf or NaN, which need no scaling). The
    FFT kernels compute the same from :func:`row_maxima` (``fft_row_exponent`` in
    ``metal/include/fft.h``).

    ``rows``: float32 or complex64 (rows, n)."""
    return exponents(row_maxima(rows), growth_log2)


def exponents(m: mx.array, growth_log2: int) -> mx.array:
    """:func:`row_exponents` from the row maxima ``m`` (float32 (rows, 1),
    :func:`row_maxima`)."""
    # The exponent field of m >= 0: max|row| < 2^(field - 126). A NaN with its sign
    # bit set gives a negative field, hence e = 0, as a NaN row needs.
    field = m.view(mx.int32) >> 23
    e = mx.maximum(field + (growth_log2 - 126 - HEADROOM), 0)
    if growth_log2 > 126 + HEADROOM + 126 - 254:  # else field <= 254 keeps e <= 126
        e = mx.minimum(e, 126)
    return mx.where(field == 255, 0, e)


def _times(a: mx.array, f: mx.array) -> mx.array:
    """a * f for a float32 factor f of a's shape but the last axis (f: (..., 1)):
    complex64 ``a`` part by part (through its float32 view: no cast, and an Inf part
    stays Inf where a complex product with f + 0i makes Inf * 0 = NaN of the other)."""
    if a.dtype != mx.complex64:
        return a * f
    return (a.view(mx.float32) * f).view(mx.complex64)


def scale(a: mx.array | None, e: mx.array) -> mx.array | None:
    """a * 2^-e (exact for normal results). ``a``: float32 or complex64 (rows, n),
    or None (then None)."""
    return scale_all(e, a)[0]


def scale_all(e: mx.array, *arrays: mx.array | None) -> tuple:
    """:func:`scale` of each array, by one factor 2^-e."""
    down = _pow2_neg(e)
    return tuple(None if a is None else _times(a, down) for a in arrays)


def unscale(hi: mx.array, lo: mx.array | None, e: mx.array):
    """(hi * 2^e, lo * 2^e): exact, and a high word that overflows to Inf gets a zero
    low word (the special-value rule of metal/include/doubleword.h; a complex high
    word with a part that is not finite, a zero low word)."""
    up = _pow2(e)
    hi = _times(hi, up)
    if lo is None:
        return hi, None
    finite = (hi - hi) == 0  # Inf - Inf and NaN - NaN are NaN; complex: both parts
    return hi, mx.where(finite, _times(lo, up), mx.array(0, lo.dtype))
