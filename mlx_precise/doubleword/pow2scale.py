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
    """2^e as float32 for integer arrays e in [-126, 127], built from the bits."""
    return ((e + 127).astype(mx.uint32) << 23).view(mx.float32)


def row_exponents(rows: mx.array, growth_log2: int) -> mx.array:
    """int32 (rows, 1): the e >= 0 such that ``max|row| * 2^growth_log2 * 2^-e`` stays
    below 2^HEADROOM (0 for rows of zeros, Inf or NaN, which need no scaling).

    ``rows``: float32 or complex64 (rows, n)."""
    m = mx.max(mx.abs(rows), axis=-1, keepdims=True).astype(mx.float32)
    field = ((m.view(mx.uint32) >> 23) & 0xFF).astype(mx.int32)  # max|row| < 2^(field - 126)
    e = mx.clip(field - 126 + growth_log2 - HEADROOM, 0, 126)
    return mx.where(field == 255, 0, e)


def scale(a: mx.array | None, e: mx.array) -> mx.array | None:
    """a * 2^-e (exact for normal results)."""
    return None if a is None else a * _pow2(-e)


def unscale(hi: mx.array, lo: mx.array | None, e: mx.array):
    """(hi * 2^e, lo * 2^e): exact, and a high word that overflows to Inf gets a zero
    low word (the special-value rule of metal/include/doubleword.h)."""
    up = _pow2(e)
    hi = hi * up
    if lo is None:
        return hi, None
    return hi, mx.where(mx.isfinite(hi), lo * up, mx.zeros_like(lo))
