"""Exact reference arithmetic for tests: the one shared oracle module.

Every finite float32 is an integer multiple of 2^-149, and its exact value times
2^149 is an integer below 2^277. So arrays of float32 become numpy object arrays of
Python integers (:class:`Exact`: integers ``n`` and one shared exponent ``k``,
value ``n * 2^-k``, ``k`` at most 149 and as small as the data allow), on which
sums, differences and products are exact. Relative errors are compared with bounds
such as ``4 * 2^-48`` by cross-multiplying integers: nothing is rounded on the way
to a verdict. This is independent of the code under test (no double-word
algorithm; float arithmetic only in :func:`is_normalised`, one numpy rounding of an
exact float64 sum, and in the printed error measures) and fast enough
for millions of elements (numpy object arrays run Python-int operations at roughly
1e7 per second); :mod:`fractions` and :mod:`mpmath` cross-check it on a few
thousand cases in ``tests/test_doubleword.py``.

Conventions: "u" is the float32 unit roundoff 2^-24; bounds are :class:`Fraction`
multiples of 1 (e.g. ``4 * U**2``); error measures are floats in units of u^2.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

U = Fraction(1, 2**24)  # float32 unit roundoff
U2 = U * U  # 2^-48, the scale of double-word errors
SCALE = 149  # 2^149 * (any finite float32) is an integer

_to_int = np.frompyfunc(int, 1, 1)


def f32_ints(a, k: int = SCALE) -> np.ndarray:
    """Exact integers ``a * 2^k`` (object array, shape of ``a``) of finite float32
    values ``a``; ``k`` must make them integers (149 always does, see
    :func:`min_scale`). Subnormals keep their exact value (the oracle models real
    numbers, not the device's flush-to-zero; it has no signed zero either)."""
    a = np.asarray(a)
    if a.dtype != np.float32:
        raise TypeError(f"f32_ints expects float32, got {a.dtype}")
    if not np.all(np.isfinite(a)):
        raise ValueError("f32_ints: non-finite value (Inf/NaN has no exact value)")
    # float32 -> float64 is exact, scaling by 2^k is exact (|a| * 2^149 < 2^277 is
    # far inside float64's range) and gives an integer-valued float64, which int()
    # converts exactly.
    scaled = a.astype(np.float64) * 2.0**k
    if not np.all(scaled == np.floor(scaled)):
        raise ValueError(f"f32_ints: 2^{k} * a is not an integer for some a")
    return _to_int(scaled).astype(object)


def min_scale(a) -> int:
    """Smallest k >= 0 with every ``a * 2^k`` an integer (at most 149): the exponent
    of the smallest ulp among the nonzero values. Smaller integers make the
    oracle's big-integer products faster."""
    e = ((np.asarray(a, np.float32).view(np.uint32) >> 23) & 255).astype(np.int64)
    nz = np.asarray(a) != 0
    if not nz.any():
        return 0
    ulp_exp = np.where(e > 0, e - 150, -149)[nz]  # ulp = 2^(e - 127 - 23)
    return int(max(0, -ulp_exp.min()))


class Exact:
    """An array of exact dyadic rationals ``n * 2^-k`` (``n``: object array of
    Python ints, ``k``: one int for the whole array). ``+ - *`` and unary ``-`` are
    exact; scalar ints and :class:`Exact` operands broadcast like numpy arrays."""

    __slots__ = ("n", "k")

    def __init__(self, n, k: int):
        self.n = n
        self.k = int(k)

    @classmethod
    def f32(cls, a) -> "Exact":
        """Exact value of a float32 array (on the smallest integer scale)."""
        k = min_scale(a)
        return cls(f32_ints(a, k), k)

    @classmethod
    def dw(cls, hi, lo) -> "Exact":
        """Exact value hi + lo of float32 pairs."""
        return cls.f32(hi) + cls.f32(lo)

    def _align(self, other: "Exact"):
        if self.k == other.k:
            return self.n, other.n, self.k
        if self.k < other.k:
            return self.n * (1 << (other.k - self.k)), other.n, other.k
        return self.n, other.n * (1 << (self.k - other.k)), self.k

    def __add__(self, other: "Exact") -> "Exact":
        a, b, k = self._align(other)
        return Exact(a + b, k)

    def __sub__(self, other: "Exact") -> "Exact":
        a, b, k = self._align(other)
        return Exact(a - b, k)

    def __neg__(self) -> "Exact":
        return Exact(-self.n, self.k)

    def __mul__(self, other: "Exact") -> "Exact":
        return Exact(self.n * other.n, self.k + other.k)

    def __getitem__(self, idx) -> "Exact":
        return Exact(self.n[idx], self.k)

    def __len__(self) -> int:
        return len(self.n)

    def is_zero(self) -> np.ndarray:
        return (self.n == 0).astype(bool)

    def fractions(self) -> list:
        """The values as :class:`Fraction` (slow; for cross-checks)."""
        den = 1 << self.k
        return [Fraction(int(v), den) for v in np.ravel(self.n)]


def _scaled_abs(err: Exact, ref: Exact):
    """|err| and |ref| as integers on a common scale."""
    a, b, _ = err._align(ref)
    return np.abs(a), np.abs(b)


def _le(e, r, bound: Fraction) -> np.ndarray:
    return (e * bound.denominator <= r * bound.numerator).astype(bool)


def rel_le(err: Exact, ref: Exact, bound: Fraction) -> np.ndarray:
    """Elementwise ``|err| <= bound * |ref|``, decided exactly in integers.

    For an operation with exact result ``r`` and computed ``c`` pass
    ``err = c - r, ref = r``; for a quotient ``z ~ x / y`` pass ``err = z*y - x,
    ref = x`` (same ratio: |z - x/y| / |x/y| = |zy - x| / |x|). Where ``ref`` is 0
    this holds only if ``err`` is 0 too."""
    return _le(*_scaled_abs(err, ref), Fraction(bound))


def _div_int(e: int, r: int) -> float:
    if r == 0:
        return 0.0 if e == 0 else math.inf
    try:
        return e / r  # Python's int / int is correctly rounded
    except OverflowError:
        return math.inf


_div_vec = np.frompyfunc(_div_int, 2, 1)


def _ratio(e: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Elementwise e / r (non-negative integers) as float64, within 3 ulps (two
    correctly rounded int -> float conversions and one division; exact verdicts
    never use it); 0 where both are 0, inf where only r is. Falls back to exact
    int / int division where an integer exceeds float64's range."""
    try:
        ef, rf = e.astype(np.float64), r.astype(np.float64)
    except OverflowError:
        return np.asarray(_div_vec(e, r), dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = ef / rf
    out[(ef == 0) & (rf == 0)] = 0.0
    return out


def rel_u2(err: Exact, ref: Exact) -> np.ndarray:
    """Elementwise ``|err| / |ref|`` in units of u^2 (float64, to 3 ulps)."""
    return _ratio(*_scaled_abs(err, ref)) * 2.0**48


def check_rel(err: Exact, ref: Exact, bound: Fraction):
    """``(ok, err_u2)``: the exact verdict of :func:`rel_le` and the measured error
    of :func:`rel_u2`, sharing the integer work."""
    e, r = _scaled_abs(err, ref)
    return _le(e, r, Fraction(bound)), _ratio(e, r) * 2.0**48


def _norms2(err_re: Exact, err_im: Exact, ref_re: Exact, ref_im: Exact):
    return _scaled_abs(err_re * err_re + err_im * err_im, ref_re * ref_re + ref_im * ref_im)


def norm_rel_le(err_re: Exact, err_im: Exact, ref_re: Exact, ref_im: Exact,
                bound: Fraction) -> np.ndarray:
    """Elementwise normwise test for complex values: ``|err|_2 <= bound * |ref|_2``,
    i.e. ``(er^2 + ei^2) den^2 <= num^2 (rr^2 + ri^2)``, exactly in integers."""
    bound = Fraction(bound)
    return _le(*_norms2(err_re, err_im, ref_re, ref_im), bound * bound)


def check_norm_rel(err_re: Exact, err_im: Exact, ref_re: Exact, ref_im: Exact,
                   bound: Fraction):
    """``(ok, err_u2)`` for complex values: the exact verdict of :func:`norm_rel_le`
    and ``|err|_2 / |ref|_2`` in units of u^2 (float64)."""
    e2, r2 = _norms2(err_re, err_im, ref_re, ref_im)
    bound = Fraction(bound)
    return _le(e2, r2, bound * bound), np.sqrt(_ratio(e2, r2)) * 2.0**48


def is_normalised(hi, lo) -> np.ndarray:
    """Elementwise ``hi == RN32(hi + lo)`` for float32 arrays (finite, hi normal or 0).

    hi + lo is formed in float64: exact when the exponents of hi and lo differ by
    at most 29; otherwise |lo| < 2^-29 ulp(hi), and both the float64 rounding and
    the exact sum lie far inside the float32 rounding interval around hi, so one
    float32 rounding of the float64 sum decides correctly either way."""
    hi = np.asarray(hi, dtype=np.float32)
    lo = np.asarray(lo, dtype=np.float32)
    s = (hi.astype(np.float64) + lo.astype(np.float64)).astype(np.float32)
    return s == hi


def _rn32_int(n: int, k: int) -> float:
    """float32 value nearest ``n * 2^-k`` (ties to even significand), with gradual
    underflow and overflow to +-inf, computed in integers."""
    if n == 0:
        return 0.0
    sign = -1.0 if n < 0 else 1.0
    n = abs(n)
    e = n.bit_length() - 1 - k  # 2^e <= value < 2^(e+1)
    q = max(e - 23, -149)  # exponent of the target ulp
    d = k + q  # value / 2^q = n / 2^d
    if d <= 0:
        m = n << -d
    else:
        m = n >> d
        rem = n - (m << d)
        half = 1 << (d - 1)
        if rem > half or (rem == half and m & 1):
            m += 1
    if m * 2.0**q >= 2.0**128:  # exact in float64: m <= 2^24
        return sign * math.inf
    return sign * math.ldexp(m, q)


_rn32_vec = np.frompyfunc(_rn32_int, 2, 1)


def round_f32(x: Exact) -> np.ndarray:
    """Correctly rounded float32 (round to nearest even) of exact values."""
    return _rn32_vec(x.n, x.k).astype(np.float32)


def round_f32_fraction(fr: Fraction) -> np.float32:
    """Correctly rounded float32 of a rational, the way REFERENCES section 9 says:
    take the float32 nearest ``float(fr)`` and its two neighbours, keep the closest
    to ``fr``, ties to the even significand. (A second, independent method, used to
    cross-check :func:`round_f32`.)"""
    fr = Fraction(fr)
    with np.errstate(over="ignore"):
        c = np.float32(float(fr))
        cands = [np.nextafter(c, np.float32(-np.inf)), c, np.nextafter(c, np.float32(np.inf))]
    best = None
    for v in cands:
        if not np.isfinite(v):
            continue
        d = abs(Fraction(float(v)) - fr)
        if best is None or d < best[0] or (
            d == best[0] and int(np.array(v).view(np.uint32)) % 2 == 0
        ):
            best = (d, v)
    fmax = Fraction(float(np.finfo(np.float32).max))
    # Beyond max + ulp(max)/2 = 2^128 - 2^103 the rounding is to infinity.
    if abs(fr) >= fmax + Fraction(2) ** 103:
        return np.float32(math.copysign(math.inf, fr))
    return np.float32(best[1])


def rounding_check(c, num: Exact, den: int = 1):
    """``(exactly_rounded, faithful)``: elementwise verdicts, decided exactly, on
    whether float32 ``c`` is RN(num/den) (ties to even) and whether it is one of the
    two float32 neighbours of num/den (faithful rounding). ``den`` > 0 an integer."""
    c = np.asarray(c, dtype=np.float32)
    with np.errstate(over="ignore"):
        dn = np.nextafter(c, np.float32(-np.inf))
        up = np.nextafter(c, np.float32(np.inf))
    C, D, Up = Exact.f32(c), Exact.f32(dn), Exact.f32(up)

    def sign(a: Exact) -> np.ndarray:
        return np.sign(a.n).astype(np.int64)

    x = Exact(num.n * 2, num.k)  # 2 num, compared with den * (2 c), den * (dn + c), ...
    s_c = sign(x - Exact(C.n * (2 * den), C.k))
    s_lo = sign(x - Exact((D + C).n * den, (D + C).k))
    s_hi = sign(x - Exact((C + Up).n * den, (C + Up).k))
    even = (c.view(np.uint32) & 1) == 0
    exact = (s_c == 0) | (
        ((s_lo > 0) | ((s_lo == 0) & even)) & ((s_hi < 0) | ((s_hi == 0) & even))
    )
    s_dn = sign(x - Exact(D.n * (2 * den), D.k))
    s_up = sign(x - Exact(Up.n * (2 * den), Up.k))
    faithful = (s_c == 0) | ((s_dn > 0) & (s_up < 0))
    return exact, faithful


# ---- fixed point (Q1.15 / Q1.31): vectorised exact references ---------------------
#
# Computed from float32 bit patterns in int64 arithmetic only (no float rounding),
# so they are independent of the kernels (float clamp, multiply, rint) and of the
# cpu backend (float64 MLX operations). Rounding modes: "half_even", "half_away"
# (ties away from zero) and "truncate" (toward zero).


def fixed_magnitudes(x, bits: int, threshold, rounding: str):
    """``(neg, mag, nan)`` for float32 ``x`` (any shape, flattened): the sign bit,
    the rounded magnitude ``round(min(|x|, t) * 2^bits)`` as int64 (``t`` = the
    float32 nearest ``threshold``; Inf clamps to ``t``) and the NaN mask.

    Positive float32 values are ordered like their bit patterns, so the clamp is an
    integer ``min`` on the bits. ``|x| = sig * 2^(e - 150)`` with ``sig`` the
    significand as an integer (implicit bit included for normals, ``e`` >= 1), so
    ``|x| * 2^bits = sig * 2^s``, ``s = e - 150 + bits``; for ``s < 0`` the floor is
    ``sig >> -s`` and the remainder decides the rounding. Magnitudes are rounded, so
    the three modes are symmetric in the sign, as their definitions are."""
    if rounding not in ("half_even", "half_away", "truncate"):
        raise ValueError(f"unknown rounding {rounding!r}")
    u = np.ascontiguousarray(x, dtype=np.float32).reshape(-1).view(np.uint32)
    neg = (u >> 31).astype(bool)
    m = (u & np.uint32(0x7FFFFFFF)).astype(np.int64)
    nan = m > 0x7F800000
    m = np.minimum(m, int(np.float32(threshold).view(np.uint32)))
    exp = m >> 23
    sig = m & 0x7FFFFF
    sig = np.where(exp > 0, sig | 0x800000, sig)
    s = np.maximum(exp, 1) - 150 + bits
    d = np.minimum(np.maximum(-s, 1), 62)  # right shift; sig < 2^24 makes 62 enough
    fl = sig >> d
    rem = sig - (fl << d)
    half = np.int64(1) << (d - 1)
    if rounding == "half_even":
        up = (rem > half) | ((rem == half) & ((fl & 1) == 1))
    elif rounding == "half_away":
        up = rem >= half
    else:
        up = np.zeros(fl.shape, bool)
    mag = np.where(s >= 0, sig << np.maximum(s, 0), fl + up)
    return neg, mag, nan


def fixed_codes(x, bits: int, threshold, rounding: str) -> np.ndarray:
    """Exact Q1.``bits`` codes (int64, flattened) of float32 ``x``: clamp to
    +-threshold, round ``x * 2^bits``, saturate to [-2^bits, 2^bits - 1]; NaN -> 0."""
    neg, mag, nan = fixed_magnitudes(x, bits, threshold, rounding)
    q = np.clip(np.where(neg, -mag, mag), -(2**bits), 2**bits - 1)
    q[nan] = 0
    return q


def fixed_values(q, bits: int) -> np.ndarray:
    """float32 nearest ``q / 2^bits`` (ties to even) for integer codes ``q`` with
    ``|q| < 2^53``: ``q`` is rounded to 24 significant bits in integers, after which
    the scaling by 2^-bits and the float32 cast are exact. Zero codes give +0."""
    q = np.asarray(q, dtype=np.int64).reshape(-1)
    n = np.abs(q)
    # Bit length of n: frexp of the exact float64 value (n < 2^53).
    length = np.frexp(n.astype(np.float64))[1].astype(np.int64)
    shift = np.maximum(length - 24, 0)
    fl = n >> shift
    rem = n - (fl << shift)
    half = np.where(shift > 0, np.int64(1) << np.maximum(shift - 1, 0), 1)
    up = (shift > 0) & ((rem > half) | ((rem == half) & ((fl & 1) == 1)))
    r = (fl + up) << shift
    return (np.where(q < 0, -r, r).astype(np.float64) * 2.0**-bits).astype(np.float32)


def fixed_simulated(x, bits: int, threshold, rounding: str) -> np.ndarray:
    """Reference of the fused simulation: ``fixed_values(fixed_codes(x))``, with NaN
    for NaN inputs (float32, flattened)."""
    neg, mag, nan = fixed_magnitudes(x, bits, threshold, rounding)
    q = np.clip(np.where(neg, -mag, mag), -(2**bits), 2**bits - 1)
    out = fixed_values(q, bits)
    out[nan] = np.nan
    return out
