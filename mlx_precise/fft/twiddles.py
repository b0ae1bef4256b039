"""Roots of unity for the double-word FFT, computed on the host to ~2^-100.

Every twiddle ``w = exp(-2 pi i e / m)`` (and every Bluestein chirp, a root of
unity of order ``2n``) comes from :func:`roots_dd`, which is the same on every
platform (no reliance on ``long double``, which is float64 on Apple arm64):

1. exact range reduction in integers: ``8 e = o m + r`` picks the octant ``o``,
   and the angle is reduced to ``psi = (pi/4) p / m`` in ``[0, pi/4]`` with an
   integer ``p`` (``p = r`` in even octants, ``m - r`` in odd ones); the octant's
   symmetry (swaps and sign changes, exact) gives cos and sin of the full angle;
2. ``p = a B + b`` with ``B = ceil(sqrt(m + 1))``: cos and sin of ``(pi/4) aB/m``
   and of ``(pi/4) b/m`` come from mpmath at 128 bits, rounded to double-double
   (~2^-106), about ``2 sqrt(m)`` evaluations in all;
3. the angle-addition formulas combine them in double-double arithmetic
   (Dekker's exact product via Veltkamp splitting, Knuth's TwoSum; vectorised
   numpy float64, which never contracts ``a*b + c``). All terms are
   non-negative except in ``cos = CaCb - SaSb``, where ``cos(psi) >= 1/sqrt(2)``
   bounds the cancellation, so the result is within ~2^-100 of the exact value.

:func:`roots_words` splits the double-doubles into float32 double-words
``(hi, lo)`` (hi = RN32(x), lo = RN32(x - hi)): relative error <= ~2^-49 per
component, the representation limit of a float-float. Quarter-turn values
(1, -1, i, -i, 0) are exact.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import mlx.core as mx
import mpmath
import numpy as np

# ---- double-double arithmetic on float64 arrays (Dekker 1971, Knuth) ----------

_SPLITTER = 2.0**27 + 1.0  # Veltkamp: splits a float64 into two 26-bit halves


def _two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _fast_two_sum(a, b):  # |a| >= |b|
    s = a + b
    return s, b - (s - a)


def _split(a):
    c = _SPLITTER * a
    hi = c - (c - a)
    return hi, a - hi


def _two_prod(a, b):
    """p + e = a * b exactly (Dekker), without an fma."""
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _dd_mul(xh, xl, yh, yl):
    p, e = _two_prod(xh, yh)
    return _fast_two_sum(p, e + (xh * yl + xl * yh))


def _dd_add(xh, xl, yh, yl):
    """Accurate double-double addition (the float64 analogue of JMP alg 6)."""
    s, e = _two_sum(xh, yh)
    t, f = _two_sum(xl, yl)
    s, e = _fast_two_sum(s, e + t)
    return _fast_two_sum(s, e + f)


@functools.lru_cache(maxsize=64)
def _cos_sin_table(m: int, step: int, count: int):
    """Double-double cos and sin of (pi/4) * (i * step) / m for i < count, from
    mpmath at 128 bits: four float64 arrays (cos hi, cos lo, sin hi, sin lo)."""
    out = np.zeros((4, count))
    with mpmath.workprec(128):
        q = mpmath.pi / 4 / m
        for i in range(count):
            c, s = mpmath.cos_sin(q * (i * step))
            for row, v in ((0, c), (2, s)):
                hi = float(v)
                out[row, i], out[row + 1, i] = hi, float(v - hi)
    return out


def roots_dd(m: int, e) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``exp(-2 pi i e / m)`` in double-double for integers ``e`` (any, reduced mod m).

    Returns float64 arrays ``(re_hi, re_lo, im_hi, im_lo)`` of ``e``'s shape,
    each pair within ~2^-100 of the exact component (see the module docstring).

    Raises:
        ValueError: ``m`` is not an integer >= 1.
    """
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise ValueError(f"m must be an integer >= 1, got {m!r}")
    m = int(m)
    e = np.mod(np.asarray(e, dtype=np.int64), m)
    if m >= 2**59:
        raise ValueError(f"m must be below 2^59, got {m}")
    octant = (8 * e) // m
    r = 8 * e - octant * m
    odd = (octant & 1) == 1
    p = np.where(odd, m - r, r)  # psi = (pi/4) p / m in [0, pi/4]
    big = math.isqrt(m + 1) + 1
    a, b = p // big, p % big
    ta = _cos_sin_table(m, big, int(a.max(initial=0)) + 1)
    tb = _cos_sin_table(m, 1, big)
    ca, cal, sa, sal = (ta[i][a] for i in range(4))
    cb, cbl, sb, sbl = (tb[i][b] for i in range(4))
    # cos(A + B) = CaCb - SaSb, sin(A + B) = SaCb + CaSb.
    p1, p2 = _dd_mul(ca, cal, cb, cbl), _dd_mul(sa, sal, sb, sbl)
    c_h, c_l = _dd_add(p1[0], p1[1], -p2[0], -p2[1])
    p3, p4 = _dd_mul(sa, sal, cb, cbl), _dd_mul(ca, cal, sb, sbl)
    s_h, s_l = _dd_add(p3[0], p3[1], p4[0], p4[1])
    # Odd octants measured psi from the next multiple of pi/4: swap cos and sin.
    ch, cl = np.where(odd, s_h, c_h), np.where(odd, s_l, c_l)
    sh, sl = np.where(odd, c_h, s_h), np.where(odd, c_l, s_l)
    # Rotate by j quarter turns, j = octant // 2: (c, s) -> (-s, c) per turn.
    j = octant // 2
    cos_h = np.select([j == 0, j == 1, j == 2], [ch, -sh, -ch], sh)
    cos_l = np.select([j == 0, j == 1, j == 2], [cl, -sl, -cl], sl)
    sin_h = np.select([j == 0, j == 1, j == 2], [sh, ch, -sh], -ch)
    sin_l = np.select([j == 0, j == 1, j == 2], [sl, cl, -sl], -cl)
    # exp(-i theta) = cos(theta) - i sin(theta); + 0.0 turns -0.0 into +0.0.
    return cos_h + 0.0, cos_l + 0.0, -sin_h + 0.0, -sin_l + 0.0


def dd_to_words(hi: np.ndarray, lo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 double-word ``(h, l)`` of double-double values: h = RN32(hi) and
    l = RN32((hi - h) + lo), where hi - h is exact in float64."""
    h = hi.astype(np.float32)
    return h, ((hi - h.astype(np.float64)) + lo).astype(np.float32)


def roots_words(m: int, e) -> np.ndarray:
    """float32 words of ``exp(-2 pi i e / m)``: array of shape ``e.shape + (4,)``
    holding ``(re_hi, re_lo, im_hi, im_lo)``, the layout the FFT kernels read."""
    rh, rl, ih, il = roots_dd(m, e)
    out = np.empty(np.shape(rh) + (4,), np.float32)
    out[..., 0], out[..., 1] = dd_to_words(rh, rl)
    out[..., 2], out[..., 3] = dd_to_words(ih, il)
    return out


@functools.lru_cache(maxsize=32)
def twiddle_table(m: int) -> mx.array:
    """The kernels' twiddle table for an even order ``m``: ``exp(-2 pi i e / m)``
    for ``e < m/2`` (the other half is its negation), as a flat float32
    ``mx.array`` of ``4 * max(m/2, 2)`` words (at least 8 so that MLX passes it as
    a device buffer, keeping one kernel instantiation). Cached per ``m``."""
    if m < 2 or m % 2:
        raise ValueError(f"twiddle tables have an even order >= 2, got {m}")
    words = roots_words(m, np.arange(max(m // 2, 2)))
    return mx.array(words.reshape(-1))


@functools.lru_cache(maxsize=32)
def chirp_words(n: int, conj: bool = False, scale_den: int = 1) -> np.ndarray:
    """Bluestein chirp ``c_k = exp(-pi i k^2 / n) = exp(-2 pi i (k^2 mod 2n) / 2n)``,
    ``k < n`` (conjugated if ``conj``, divided by ``scale_den``), as float32 words
    ``(n, 4)`` in the layout of :func:`roots_words`. The exponent is reduced
    exactly in integers, so large ``k`` lose nothing; the division by
    ``scale_den`` is a double-double product by its reciprocal (~2^-100), so the
    words are still split once from a value exact to ~2^-100."""
    k = np.arange(n, dtype=np.int64)
    rh, rl, ih, il = roots_dd(2 * n, (k * k) % (2 * n))
    if conj:
        ih, il = -ih, -il
    if scale_den != 1:
        inv = Fraction(1, int(scale_den))
        sh = float(inv)
        sl = float(inv - Fraction(sh))
        rh, rl = _dd_mul(rh, rl, sh, sl)
        ih, il = _dd_mul(ih, il, sh, sl)
    out = np.empty((n, 4), np.float32)
    out[:, 0], out[:, 1] = dd_to_words(rh, rl)
    out[:, 2], out[:, 3] = dd_to_words(ih, il)
    return out
