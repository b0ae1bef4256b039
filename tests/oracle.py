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
thousand cases in ``tests/doubleword/test_doubleword.py``.

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


def round_f32(x: Exact) -> np.ndarray:
    """Correctly rounded float32 (round to nearest even, gradual underflow,
    overflow to +-inf) of exact values (:func:`round_to` for float32)."""
    return round_to(x, "float32").astype(np.float32)


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


_FIXED_CHUNK = 1 << 18  # elements per numpy pass: keeps temporaries in cache
FIXED_ROUNDING = ("half_even", "half_away", "truncate")


def _fixed_magnitudes(u, bits: int, tbits: int, modes) -> list:
    """Rounded magnitudes (uint32, <= 2^bits) of float32 bit patterns ``u``, one
    array per rounding mode in ``modes``; see :func:`fixed_reference_modes`."""
    m = np.minimum(u & np.uint32(0x7FFFFFFF), np.uint32(tbits))
    exp = (m >> 23).astype(np.int32)
    sig = m & np.uint32(0x7FFFFF)
    sig |= np.where(exp > 0, np.uint32(0x800000), np.uint32(0))
    s = np.maximum(exp, 1) - (150 - bits)
    d = np.clip(-s, 1, 31).astype(np.uint32)  # sig < 2^24: a shift of 31 leaves 0
    fl = sig >> d
    rem = sig - (fl << d)
    half = np.uint32(1) << (d - np.uint32(1))
    # |x| <= 1 after the clamp, so s <= bits - 23 and sig << s <= 2^bits fits uint32.
    left = s >= 0
    exact = sig << np.maximum(s, 0).astype(np.uint32)
    out = []
    for rounding in modes:
        if rounding == "half_even":
            up = (rem > half) | ((rem == half) & ((fl & np.uint32(1)) == 1))
        elif rounding == "half_away":
            up = rem >= half
        else:
            up = False
        out.append(np.where(left, exact, fl + up))
    return out


def fixed_reference_modes(x, bits: int, threshold, modes=FIXED_ROUNDING) -> dict:
    """Exact references for float32 ``x`` (any shape, flattened), for each rounding
    mode in ``modes``: ``{mode: (codes, simulated)}`` with

    * ``codes`` (int32): Q1.``bits`` codes: clamp to +-t (``t`` the float32 nearest
      ``threshold``; Inf clamps too), round ``x * 2^bits`` ("half_even",
      "half_away": ties away from zero, "truncate": toward zero), saturate to
      [-2^bits, 2^bits - 1]; NaN -> 0;
    * ``simulated`` (float32): :func:`fixed_values` of the codes, NaN for NaN.

    Positive float32 values are ordered like their bit patterns, so the clamp is an
    integer ``min`` on the bits. ``|x| = sig * 2^(e - 150)`` with ``sig`` the
    significand as an integer (implicit bit included for normals, ``e`` >= 1), so
    ``|x| * 2^bits = sig * 2^s``, ``s = e - 150 + bits``; for ``s < 0`` the floor is
    ``sig >> -s`` and the remainder decides the rounding. Magnitudes are rounded, so
    the three modes are symmetric in the sign, as their definitions are."""
    bad = [r for r in modes if r not in FIXED_ROUNDING]
    if bad:
        raise ValueError(f"unknown rounding {bad}")
    u = np.ascontiguousarray(x, dtype=np.float32).reshape(-1).view(np.uint32)
    tbits = int(np.float32(threshold).view(np.uint32))
    out = {r: (np.empty(u.shape, np.int32), np.empty(u.shape, np.float32)) for r in modes}
    for i in range(0, u.size, _FIXED_CHUNK):
        c = u[i:i + _FIXED_CHUNK]
        neg = c >= np.uint32(1 << 31)
        nan = (c & np.uint32(0x7FFFFFFF)) > 0x7F800000
        for r, mag in zip(modes, _fixed_magnitudes(c, bits, tbits, modes)):
            q = np.where(neg, -np.minimum(mag, 2**bits).astype(np.int64),
                         np.minimum(mag, 2**bits - 1).astype(np.int64))
            q[nan] = 0
            v = fixed_values(q, bits)
            v[nan] = np.nan
            out[r][0][i:i + _FIXED_CHUNK] = q
            out[r][1][i:i + _FIXED_CHUNK] = v
    return out


def fixed_reference(x, bits: int, threshold, rounding: str):
    """``(codes, simulated)`` of :func:`fixed_reference_modes` for one mode."""
    return fixed_reference_modes(x, bits, threshold, (rounding,))[rounding]


def fixed_values(q, bits: int) -> np.ndarray:
    """float32 nearest ``q / 2^bits`` (ties to even) for integer codes ``q`` with
    ``|q| < 2^53`` (flattened): ``q`` is rounded to 24 significant bits in integers,
    after which the scaling by 2^-bits and the float32 cast are exact. Zero codes
    give +0."""
    q = np.asarray(q, dtype=np.int64).reshape(-1)
    n = np.abs(q)
    if n.size and n.max() >= 2**24:
        # Bit length of n: frexp of the exact float64 value (n < 2^53).
        length = np.frexp(n.astype(np.float64))[1].astype(np.int64)
        shift = np.maximum(length - 24, 0)
        fl = n >> shift
        rem = n - (fl << shift)
        half = np.where(shift > 0, np.int64(1) << np.maximum(shift - 1, 0), 1)
        up = (shift > 0) & ((rem > half) | ((rem == half) & ((fl & 1) == 1)))
        n = (fl + up) << shift
    return (np.where(q < 0, -n, n).astype(np.float64) * 2.0**-bits).astype(np.float32)


# ---- matrix norms (LAPACK xLANGE / xLANTR / xLANSY / xLANHE) -------------------


def ulps_f64(a, b) -> np.ndarray:
    """Distance in float64 ulps between float64 values: the number of float64
    values between them (+0 and -0 are 0 apart); :func:`ulp_distance` does float32."""

    def ordered(x):
        out = []
        for i in np.asarray(x, dtype=np.float64).reshape(-1).view(np.int64).tolist():
            out.append(-(i & 0x7FFFFFFFFFFFFFFF) if i < 0 else i)
        return out

    d = [abs(p - q) for p, q in zip(ordered(a), ordered(b))]
    return np.array(d, dtype=np.float64).reshape(np.shape(a))


def _rn_sqrt(q: Fraction, dtype) -> float:
    """Value of ``dtype`` (np.float32 / np.float64) nearest sqrt(q) for a rational
    q >= 0, ties to even, overflow to inf. Candidates around a float64 estimate are
    decided against the exact squares of their midpoints: sqrt(q) < m iff q < m^2."""
    q = Fraction(q)
    if q < 0:
        raise ValueError("sqrt of a negative value")
    if q == 0:
        return dtype(0.0)
    # float64 estimate without overflow: scale q by an even power of two.
    e = (q.numerator.bit_length() - q.denominator.bit_length()) // 2
    est = math.ldexp(math.sqrt(float(q / Fraction(2) ** (2 * e))), e)
    with np.errstate(over="ignore"):
        c = dtype(est)
        cands = [c]
        for _ in range(2):
            cands = [np.nextafter(cands[0], dtype(-np.inf))] + cands + [
                np.nextafter(cands[-1], dtype(np.inf))]
    cands = sorted({float(v) for v in cands if v >= 0})
    best = cands[0]
    for lo, hi in zip(cands, cands[1:]):
        if math.isinf(hi):  # the midpoint to "inf" is max + ulp/2 (the overflow bound)
            big = np.finfo(dtype).max
            mid = Fraction(float(big)) + (Fraction(float(big)) - Fraction(float(
                np.nextafter(big, dtype(0))))) / 2
        else:
            mid = (Fraction(lo) + Fraction(hi)) / 2
        m2 = mid * mid
        if q > m2 or (q == m2 and int(np.array(dtype(hi)).view(
                np.uint32 if dtype == np.float32 else np.uint64)) % 2 == 0):
            best = hi
    return dtype(best)


def rn32_sqrt(q: Fraction) -> np.float32:
    """Correctly rounded float32 of sqrt(q), q a non-negative rational."""
    return _rn_sqrt(q, np.float32)


def rn64_sqrt(q: Fraction) -> np.float64:
    """Correctly rounded float64 of sqrt(q), q a non-negative rational."""
    return _rn_sqrt(q, np.float64)


def sum_squares_f32(a) -> Fraction:
    """Exact sum of squares of finite float32 values (fewer than 2^29), fast:
    x = M 2^(e-150) with M < 2^24, so x^2 = (H 2^24 + L) 2^(2e-300) with H, L < 2^24;
    per chunk, ``np.bincount`` sums the H and the L of each exponent exactly in
    float64 (totals stay below 2^53), and the bins are added in integers."""
    u = np.ascontiguousarray(a, dtype=np.float32).reshape(-1).view(np.uint32)
    if u.size >= 1 << 29:
        raise ValueError("sum_squares_f32: too many values")
    if np.any((u & 0x7F800000) == 0x7F800000):
        raise ValueError("sum_squares_f32: non-finite value")
    hi, lo = np.zeros(512), np.zeros(512)
    for i in range(0, u.size, 1 << 18):  # chunks: temporaries stay in cache
        c = u[i:i + (1 << 18)]
        e = ((c >> 23) & 0xFF).astype(np.int64)
        mant = (c & 0x7FFFFF).astype(np.int64) | np.where(e > 0, 1 << 23, 0)
        e2 = 2 * np.maximum(e, 1)  # subnormals share normal's smallest exponent
        sq = mant * mant  # < 2^48: exact in int64
        hi += np.bincount(e2, weights=(sq >> 24).astype(np.float64), minlength=512)
        lo += np.bincount(e2, weights=(sq & 0xFFFFFF).astype(np.float64), minlength=512)
    total = 0
    for k in np.nonzero((hi != 0) | (lo != 0))[0]:
        total += ((int(hi[k]) << 24) + int(lo[k])) << int(k)
    return Fraction(total, 1 << 300)


class NormValue:
    """A norm as the reference computes it: a special float (``nan``/``inf``), an
    exact rational ``value``, the square root of an exact rational ``sqrt_of``, or
    an mpmath number (``mp``, 200+ bits, for sums of complex moduli)."""

    def __init__(self, value=None, sqrt_of=None, mp=None, special=None):
        self.value, self.sqrt_of, self.mp, self.special = value, sqrt_of, mp, special

    @property
    def exact(self) -> bool:
        return self.mp is None

    def rn(self, dtype=np.float32):
        """The value rounded to nearest (ties even) in ``dtype`` (np.float32 or
        np.float64); correct for mpmath values unless within 2^-190 of a midpoint."""
        if self.special is not None:
            return dtype(self.special)
        if self.sqrt_of is not None:
            return _rn_sqrt(self.sqrt_of, dtype)
        fr = self.value
        if self.mp is not None:  # an mpf is an exact binary float: man * 2^exp
            man, exp = self.mp.man_exp
            fr = Fraction(int(man)) * Fraction(2) ** int(exp)
        if dtype == np.float32:
            return round_f32_fraction(fr)
        return np.float64(float(fr))  # float(Fraction) is correctly rounded

    def approx(self) -> float:
        if self.special is not None:
            return float(self.special)
        if self.sqrt_of is not None:
            return math.sqrt(float(self.sqrt_of))
        return float(self.value if self.mp is None else self.mp)


def lapack_norm(a, kind: str, structure: str = "general", uplo: str = "lower",
                diag: str = "nonunit") -> NormValue:
    """Reference norm of a 2-D numpy array, written as LAPACK's reference loops
    (column j outer, row i inner; xLANGE, xLANTR, xLANSY, xLANHE) in exact
    arithmetic: |a| of a real entry and squares are Fractions, a complex modulus is
    sqrt(re^2 + im^2) with C99 hypot's special values (Inf beats NaN), the
    Frobenius sum takes real and imaginary parts as separate reals (zLASSQ), a
    running max is NaN-aware (``value < t or isnan(t)``), sums propagate Inf/NaN
    like IEEE sums of non-negative terms. Entries outside the structure are never
    touched. For complex one/inf norms the sums of moduli use mpmath at 220 bits."""
    import mpmath

    a = np.asarray(a)
    m, n = a.shape
    cplx = np.iscomplexobj(a)
    if min(m, n) == 0:
        return NormValue(value=Fraction(0))
    upper = uplo == "upper"
    unit = diag == "unit"
    herm = structure == "hermitian"
    sym = structure in ("symmetric", "hermitian")
    rows_of_col = []  # rows i read in column j (0-based), LAPACK's loop bounds
    for j in range(n):
        if structure == "general":
            rows = range(m)
        elif upper:
            rows = range(min(m, j) if unit else min(m, j + 1))
        else:
            rows = range(j + 1 if unit else j, m)
        rows_of_col.append(rows)

    def parts(i, j):
        z = complex(a[i, j])
        im = 0.0 if (herm and i == j) or not cplx else z.imag
        return z.real, im

    def modulus(i, j):
        """('fr', |a|) exact for reals, ('sq', |a|^2) for complex; or a special."""
        re, im = parts(i, j)
        if math.isinf(re) or math.isinf(im):
            return ("special", math.inf)
        if math.isnan(re) or math.isnan(im):
            return ("special", math.nan)
        if not cplx:
            return ("fr", abs(Fraction(re)))
        return ("sq", Fraction(re) ** 2 + Fraction(im) ** 2)

    entries = {}  # (i, j) -> modulus, for every entry read (and its mirror)
    for j in range(n):
        for i in rows_of_col[j]:
            entries[(i, j)] = modulus(i, j)
    unit_diag = [(k, k) for k in range(min(m, n))] if unit else []

    def nanmax(vals):
        v = 0.0
        for t in vals:
            if (v < t) or math.isnan(t):
                v = t
        return v

    mpmath.mp.prec = 220

    def total(mods):
        """Sum of moduli: special if any, else exact/mp value."""
        specials = [v for k, v in mods if k == "special"]
        if any(math.isnan(s) for s in specials):
            return ("special", math.nan)
        if specials:
            return ("special", math.inf)
        if cplx:
            s = mpmath.fsum(mpmath.sqrt(mpmath.mpf(v.numerator) / v.denominator)
                            for _, v in mods)
            return ("mp", s)
        return ("fr", sum((v for _, v in mods), Fraction(0)))

    def as_value(t):
        kind_, v = t
        if kind_ == "special":
            return NormValue(special=v)
        if kind_ == "fr":
            return NormValue(value=v)
        if kind_ == "sq":
            return NormValue(sqrt_of=v)
        return NormValue(mp=v)

    # max/one/inf: NaN if a modulus read is NaN (the NaN-aware max keeps it, a sum
    # with it is NaN), else Inf if one is Inf; no finite arithmetic is needed then.
    sp = [v for k, v in entries.values() if k == "special"]
    if sp and kind != "fro":
        return NormValue(special=math.nan if any(math.isnan(v) for v in sp) else math.inf)
    if kind == "max":
        mods = list(entries.values())
        mods += [("sq" if cplx else "fr", Fraction(1))] * len(unit_diag)
        return as_value(max(mods, key=lambda t: t[1]))
    if kind in ("one", "inf"):
        lines = {}
        axis = 1 if (kind == "one" or sym) else 0  # one: group by column j
        for (i, j), mod in entries.items():
            lines.setdefault((i, j)[axis], []).append(mod)
            if sym and i != j:
                lines.setdefault((i, j)[1 - axis], []).append(mod)
        one = ("sq", Fraction(1)) if cplx else ("fr", Fraction(1))
        for (i, j) in unit_diag:
            lines.setdefault(j if axis == 1 else i, []).append(one)
        vals = [total(v) for v in lines.values()]
        if not vals:
            return NormValue(value=Fraction(0))
        sp = [v for k, v in vals if k == "special"]
        if any(math.isnan(s) for s in sp):
            return NormValue(special=math.nan)
        if sp:
            return NormValue(special=math.inf)
        best = max(vals, key=lambda t: t[1])
        return as_value(best)
    if kind == "fro":
        acc, seen_inf = Fraction(0), False
        for (i, j) in entries:
            w = 2 if sym and i != j else 1
            for p in parts(i, j):
                if math.isnan(p):
                    return NormValue(special=math.nan)
                if math.isinf(p):
                    seen_inf = True
                    continue
                acc += w * Fraction(p) ** 2
        if seen_inf:
            return NormValue(special=math.inf)
        return NormValue(sqrt_of=acc + len(unit_diag))
    raise ValueError(f"unknown kind {kind!r}")


# ---- rounding to float32 / float16 / bfloat16 (int8 GEMM epilogues) -----------

# (significand bits p, exponent of the smallest normal, exponent of the largest binade)
FORMATS = {"float32": (24, -126, 127), "float16": (11, -14, 15), "bfloat16": (8, -126, 127)}


def _rn_format_int(n: int, k: int, p: int, emin: int, emax: int) -> float:
    """Value of the ``p``-bit binary format nearest ``n * 2^-k`` (ties to even),
    gradual underflow, overflow to +-inf; the result is exact in float64."""
    if n == 0:
        return 0.0
    sign = -1.0 if n < 0 else 1.0
    n = abs(n)
    e = n.bit_length() - 1 - k  # 2^e <= value < 2^(e+1)
    q = max(e, emin) - (p - 1)  # exponent of the target ulp
    d = k + q  # value / 2^q = n / 2^d
    if d <= 0:
        m = n << -d
    else:
        m = n >> d
        rem = n - (m << d)
        half = 1 << (d - 1)
        if rem > half or (rem == half and m & 1):
            m += 1
    if m * 2.0**q >= 2.0 ** (emax + 1):  # exact: m <= 2^p
        return sign * math.inf
    return sign * math.ldexp(m, q)


_rn_format_vec = np.frompyfunc(_rn_format_int, 5, 1)


def round_to(x: Exact, fmt: str) -> np.ndarray:
    """Correctly rounded (to nearest, ties to even) values of ``x`` in ``fmt``
    ("float32", "float16" or "bfloat16"), as a float64 array (exact)."""
    p, emin, emax = FORMATS[fmt]
    return _rn_format_vec(x.n, x.k, p, emin, emax).astype(np.float64)


def exact_f64(a) -> Exact:
    """Exact value of finite float64 values (any shape) as :class:`Exact`."""
    a = np.asarray(a, dtype=np.float64)
    if not np.all(np.isfinite(a)):
        raise ValueError("exact_f64: non-finite value")
    _, e = np.frexp(a)
    # a = m 2^e with 53-bit m: a * 2^(53 - e) is an integer; one k for the array.
    k = int(max(0, (53 - e[a != 0]).max())) if np.any(a != 0) else 0
    n = np.frompyfunc(lambda v: int(Fraction(float(v)) * 2**k), 1, 1)(a)
    return Exact(np.asarray(n, dtype=object), k)


def ulp_distance(a, b, fmt: str) -> np.ndarray:
    """Number of ``fmt`` values from ``a`` to ``b`` (elementwise, int64), for float
    arrays holding values representable in ``fmt`` (e.g. a kernel's output cast to
    float32 and an oracle from :func:`round_to`); +0 and -0 count as one value."""

    def key(x):
        x = np.asarray(x, dtype=np.float64)
        if fmt == "float16":
            bits = x.astype(np.float16).view(np.uint16).astype(np.int64)
            sign, mag = bits >> 15, bits & 0x7FFF
        else:
            bits = x.astype(np.float32).view(np.uint32).astype(np.int64)
            if fmt == "bfloat16":
                bits >>= 16
                sign, mag = bits >> 15, bits & 0x7FFF
            else:
                sign, mag = bits >> 31, bits & 0x7FFFFFFF
        return np.where(sign == 1, -mag, mag)

    return np.abs(key(a) - key(b))


# ---- discrete Fourier transforms: long double / mpmath references ------------------
#
# On x86-64 Linux numpy's long double has a 64-bit significand and numpy.fft accepts
# it (REFERENCES section 9): its FFT of the exact input is ~2^11 times more precise
# than a float64 FFT, i.e. ~1e-18 normwise, far below the 1e-13 claims under test.
# Elsewhere (Apple arm64: long double is float64) the references fall back to an
# O(n^2) mpmath DFT, affordable only for small transforms.

LONGDOUBLE_FFT = np.finfo(np.longdouble).nmant >= 63


def exact_value(x) -> np.ndarray:
    """The exact value of float32 / complex64 / float64 / complex128 data, or of a
    double-word (hi, lo) pair given as a tuple, in long double (exact on x86-64:
    a float32 pair's sum has at most 48 + 126 bits only when the exponents differ
    by > 40, impossible for normalised pairs, so hi + lo fits 64 bits)."""
    if isinstance(x, tuple):
        hi, lo = (np.asarray(a) for a in x)
        return exact_value(hi) + exact_value(lo)
    x = np.asarray(x)
    return x.astype(np.clongdouble if np.iscomplexobj(x) else np.longdouble)


def _mp_dft(x, inverse: bool) -> np.ndarray:
    import mpmath

    n = x.shape[-1]
    out = np.empty(x.shape, np.clongdouble)
    with mpmath.workprec(100):
        w = [mpmath.expj((1 if inverse else -1) * 2 * mpmath.pi * k / n) for k in range(n)]
        for idx in np.ndindex(x.shape[:-1]):
            row = [mpmath.mpc(complex(v)) for v in x[idx]]
            for k in range(n):
                s = mpmath.fsum(row[j] * w[(j * k) % n] for j in range(n))
                if inverse:
                    s /= n
                out[idx + (k,)] = complex(s)
    return out


def fft_reference(x, kind: str, n=None, axis: int = -1, mp_limit: int = 4096):
    """numpy.fft.<kind> (fft, ifft, rfft, irfft) of ``exact_value(x)``, with
    numpy's n / axis conventions, as long double (complex256 / float128).
    Without a 64-bit long double it uses an mpmath DFT when the transform has at
    most ``mp_limit`` points in all, else returns None (callers skip)."""
    v = exact_value(x)
    if LONGDOUBLE_FFT:
        return getattr(np.fft, kind)(v, n=n, axis=axis)
    m = v.shape[axis] if n is None else n
    if v.size // max(v.shape[axis], 1) * m > mp_limit:
        return None
    # Fall back: numpy's own n / axis / Hermitian handling on float64 data decides
    # the layout; the values come from the mpmath DFT of the padded input.
    v = np.moveaxis(v, axis, -1)
    if kind in ("fft", "ifft"):
        full = np.zeros(v.shape[:-1] + (m,), np.clongdouble)
        k = min(m, v.shape[-1])
        full[..., :k] = v[..., :k]
        return np.moveaxis(_mp_dft(full, kind == "ifft"), -1, axis)
    if kind == "rfft":
        full = np.zeros(v.shape[:-1] + (m,), np.clongdouble)
        k = min(m, v.shape[-1])
        full[..., :k] = v[..., :k]
        return np.moveaxis(_mp_dft(full, False)[..., : m // 2 + 1], -1, axis)
    h = m // 2 + 1  # irfft: Hermitian extension of the first h points
    half = np.zeros(v.shape[:-1] + (h,), np.clongdouble)
    k = min(h, v.shape[-1])
    half[..., :k] = v[..., :k]
    half[..., 0] = half[..., 0].real
    if m % 2 == 0:
        half[..., -1] = half[..., -1].real
    full = np.concatenate([half, np.conj(half[..., 1:(m + 1) // 2][..., ::-1])], axis=-1)
    return np.moveaxis(_mp_dft(full, True).real, -1, axis)


def normwise_error(y, ref) -> float:
    """||y - ref||_2 / ||ref||_2 over all elements, in long double (0 when both
    are 0)."""
    y, ref = exact_value(y), np.asarray(ref)
    den = np.sqrt(np.sum(np.abs(ref) ** 2))
    num = np.sqrt(np.sum(np.abs(y - ref) ** 2))
    return float(num / den) if den else float(num != 0) * math.inf


def fraction_exactly_rounded(y, ref) -> float:
    """Share of the real components of float32 / complex64 ``y`` equal to the
    single rounding of the long double reference (complex: both parts count)."""
    y = np.asarray(y)
    r = np.asarray(ref).astype(np.complex64 if np.iscomplexobj(y) else np.float32)
    if np.iscomplexobj(y):
        return float(np.mean(np.concatenate([(y.real == r.real).ravel(),
                                             (y.imag == r.imag).ravel()])))
    return float(np.mean(y == r))


# ---- float64 matrix products (split-integer DGEMM) ----------------------------------


def exact_matmul(a: Exact, b: Exact) -> Exact:
    """Exact matrix product of :class:`Exact` matrices (object-array ``np.dot`` on
    Python integers: O(MNK) big-integer operations, for small sizes)."""
    return Exact(np.dot(a.n, b.n), a.k + b.k)


def _rn64_int(n: int, k: int) -> float:
    # CPython's int / int true division is correctly rounded (to nearest, ties to
    # even, gradual underflow); it raises OverflowError beyond float64's range,
    # where round to nearest gives +-inf.
    try:
        return n / (1 << k)
    except OverflowError:
        return math.inf if n > 0 else -math.inf


_rn64_vec = np.frompyfunc(_rn64_int, 2, 1)


def round_f64(x: Exact) -> np.ndarray:
    """Correctly rounded float64 (round to nearest even) of exact values."""
    return _rn64_vec(x.n, x.k).astype(np.float64)


# The double-double matmul reference lives with the benchmarks, which the wheel ships
# (bench_ozaki uses it there too); benchmarks/ is on the tests' path (pyproject.toml).
from dd_reference import dd_matmul, rel_err_dd  # noqa: E402,F401
