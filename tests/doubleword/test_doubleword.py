"""The double-word core (metal/include/doubleword.h) through the Metal emulator.

Every operation runs on >= 1,000,000 random operand pairs (fixed seeds) spread over
wide exponent ranges, plus adversarial cases, and is compared with exact integer
arithmetic (tests/oracle.py; that oracle is itself cross-checked against
fractions and mpmath below). Asserted, with u = 2^-24:

* error-free transforms (TwoSum, Fast2Sum, TwoProdFMA) exact in 100% of cases above
  the flush-to-zero range, with normalised results;
* relative error of DW+FP (JMP alg 4) <= 2u^2, accurate DW+DW (alg 6) <= 3u^2 + 13u^3,
  DW*FP (alg 9) <= 2u^2, DW*DW (alg 12) <= 4u^2 (MR), DW/DW (alg 18) <= 9.8u^2, also
  from a faithful (not correctly rounded) starting reciprocal;
* complex add <= 3u^2 + 13u^3 and complex multiply <= 8.66u^2, normwise (derivation
  in the header: (4 sqrt(2) + 3)u^2 + O(u^3));
* the documented behaviour below the flush-to-zero range, value by value.

Run with ``pytest -s`` to see the maximum errors measured, in units of u^2.

Operand ranges keep clear of flush-to-zero: sums use words >= 2^-103 (multiples of
2^-126, so nothing is ever flushed; see the header's "Range"); products and
quotients have results >= 2^-51 and low words >= 2^-35 |high word|, so lo*lo
products of operands stay normal and any flushed intermediate of DW/DW moves a
result by < 2^-75 relative (2^-27 u^2).
"""

from fractions import Fraction

import mlx.core as mx
import mpmath
import numpy as np
import pytest
from helpers import run_cdw, run_dw
from oracle import (
    U,
    U2,
    Exact,
    check_norm_rel,
    check_rel,
    f32_ints,
    is_normalised,
    rel_le,
    rel_u2,
    round_f32,
    round_f32_fraction,
)

import mlx_precise.core.kernels as kern
from mlx_precise.core.kernels import eft_selftest
from mlx_precise.doubleword.dw_kernels import DW_OPS
from mlx_precise.doubleword.hostsplit import join
from mlx_precise.doubleword.types import split
from mlx_precise.core.kernels import DeviceCheckError

N = 1_000_000
BACKEND = "emulate"

# Bounds, as exact rationals (units of 1).
B_ADD_FP = 2 * U2  # JMP alg 4
B_ADD = 3 * U2 + 13 * U**3  # JMP alg 6
B_MUL_FP = 2 * U2  # JMP alg 9
B_MUL = 4 * U2  # JMP alg 12, MR's bound
B_DIV = Fraction(98, 10) * U2  # JMP alg 18
B_CMUL = Fraction(866, 100) * U2  # > (4 sqrt(2) + 3)u^2 + O(u^3); see doubleword.h


# ---- running the kernels -----------------------------------------------------


def f32(*vals):
    return np.array(vals, dtype=np.float64).astype(np.float32)


def bits(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32)


# ---- operand generators ------------------------------------------------------


def make_f32(sign, e, mant):
    """float32 from sign bit, unbiased exponent (normal range) and 23-bit fraction."""
    b = (np.asarray(sign, np.uint32) << 31) | (np.asarray(e + 127, np.uint32) << 23)
    return (b | np.asarray(mant, np.uint32)).view(np.float32)


def exponent(a):
    return ((bits(a) >> 23) & 255).astype(np.int64) - 127


def rand_hi(rng, e):
    """Random sign and significand with exponents ``e``; 20% structured significands
    (all ones or few bits above 1.0), where carries and ties concentrate."""
    n = e.size
    mant = rng.integers(0, 1 << 23, n)
    s = rng.random(n)
    mant = np.where(s < 0.1, (1 << 23) - 1 - rng.integers(0, 64, n), mant)
    mant = np.where((s >= 0.1) & (s < 0.2), rng.integers(0, 64, n), mant)
    return make_f32(rng.integers(0, 2, n), e, mant)


def rand_lo(rng, hi, kmax):
    """A low word for each ``hi`` so that (hi, lo) is normalised (hi = RN(hi + lo)):
    |lo| in [2^(e-25-k), 2^(e-24-k)) with k = 0 mostly, else up to ``kmax``; 2%
    zeros and 2% exact ties |lo| = ulp(hi)/2 (kept only where hi is even)."""
    n = hi.size
    e = exponent(hi)
    k = np.where(rng.random(n) < 0.6, 0, rng.integers(1, kmax + 1, n))
    k = np.minimum(k, e + 100)  # keep lo (even halved below) >= 2^-126
    lo = rand_hi(rng, e - 25 - k)
    r = rng.random(n)
    tie = (r >= 0.02) & (r < 0.04)
    lo[tie] = make_f32(rng.integers(0, 2, n)[tie], e[tie] - 24, 0)
    lo[r < 0.02] = 0
    bad = ~is_normalised(hi, lo)  # a tie with odd hi, or hi a power of 2 and lo < 0
    lo[bad] *= np.float32(0.5)
    assert is_normalised(hi, lo).all()
    return lo


def uniform_int(rng, lo, hi):
    """Uniform integers in [lo, hi] elementwise."""
    return lo + (rng.random(np.shape(lo)) * (hi - lo + 1)).astype(np.int64)


class Operands:
    """Float32 arrays of two double-words x = (xh, xl), y = (yh, yl) and their exact
    values (computed once, shared by the tests that use the same operands)."""

    def __init__(self, xh, xl, yh, yl):
        self.xh, self.xl, self.yh, self.yl = xh, xl, yh, yl
        self.Xh, self.Xl = Exact.f32(xh), Exact.f32(xl)
        self.Yh, self.Yl = Exact.f32(yh), Exact.f32(yl)
        self.X, self.Y = self.Xh + self.Xl, self.Yh + self.Yl

    def arrays(self):
        return self.xh, self.xl, self.yh, self.yl


@pytest.fixture(scope="module")
def add_operands():
    """Sums: exponents in [-60, 60], half independent, half within 30 of each other;
    10% near-cancelling highs (yh = -(xh +- a few ulps)), 5% yh = -xh exactly, 2% of
    those with yl = -(xl +- 1 ulp) too (result ~ 2^-48 |x| or below)."""
    rng = np.random.default_rng(20240601)
    ex = rng.integers(-60, 61, N)
    near = np.clip(ex + rng.integers(-30, 31, N), -60, 60)
    ey = np.where(rng.random(N) < 0.5, rng.integers(-60, 61, N), near)
    xh, yh = rand_hi(rng, ex), rand_hi(rng, ey)
    c = rng.random(N)
    m1, m2 = c < 0.10, (c >= 0.10) & (c < 0.15)
    yh[m1] = -(bits(xh[m1]).astype(np.int64) + rng.integers(-4, 5, m1.sum())).astype(
        np.uint32).view(np.float32)
    yh[m2] = -xh[m2]
    xl, yl = rand_lo(rng, xh, 18), rand_lo(rng, yh, 18)
    m3 = m2 & (c < 0.12) & (xl != 0)
    yl[m3] = -(bits(xl[m3]).astype(np.int64) + rng.integers(-1, 2, m3.sum())).astype(
        np.uint32).view(np.float32)
    bad = ~is_normalised(yh, yl)  # xl was a tie: -xl is the only choice
    yl[bad] = -xl[bad]
    assert is_normalised(yh, yl).all()
    return Operands(xh, xl, yh, yl)


@pytest.fixture(scope="module")
def mul_operands():
    """Products: exponents in [-60, 60] with ex + ey in [-50, 124]."""
    rng = np.random.default_rng(20240602)
    ex = rng.integers(-60, 61, N)
    ey = uniform_int(rng, np.maximum(-60, -50 - ex), np.minimum(60, 124 - ex))
    xh, yh = rand_hi(rng, ex), rand_hi(rng, ey)
    return Operands(xh, rand_lo(rng, xh, 10), yh, rand_lo(rng, yh, 10))


@pytest.fixture(scope="module")
def div_operands():
    """Quotients: divisor exponents in [-40, 40], dividend exponents in [-60, 60]
    with ex - ey in [-50, 124]; 5% divisors just below a power of two (significand
    all ones but the last 1..64 ulps), where 1/yh is far from RN's neighbours."""
    rng = np.random.default_rng(20240603)
    ey = rng.integers(-40, 41, N)
    ex = uniform_int(rng, np.maximum(-60, ey - 50), np.minimum(60, ey + 124))
    xh, yh = rand_hi(rng, ex), rand_hi(rng, ey)
    m = rng.random(N) < 0.05
    yh[m] = make_f32(rng.integers(0, 2, m.sum()), ey[m],
                     (1 << 23) - rng.integers(1, 65, m.sum()))
    return Operands(xh, rand_lo(rng, xh, 10), yh, rand_lo(rng, yh, 10))


# ---- the oracle itself -------------------------------------------------------


def test_oracle_agrees_with_fractions_and_mpmath():
    """The integer oracle against Fraction (exact) and mpmath (300 bits) on 3000
    cases: values, sums, products, the relative-error verdict and its measure, and
    two independent correct-rounding methods."""
    rng = np.random.default_rng(1)
    n = 3000
    a = rand_hi(rng, rng.integers(-126, 128, n))
    b = rand_hi(rng, rng.integers(-126, 128, n))
    a[:5] = f32(0.0, -0.0, 1.0, -1.0, 3.4028234663852886e38)
    b[:3] = np.array([1, 0x00000001, 0x007FFFFF], np.uint32).view(np.float32)  # subnormals
    A, B = Exact.f32(a), Exact.f32(b)
    fa = [Fraction(float(v)) for v in a]
    fb = [Fraction(float(v)) for v in b]
    assert A.fractions() == fa
    assert (A + B).fractions() == [p + q for p, q in zip(fa, fb)]
    assert (A - B).fractions() == [p - q for p, q in zip(fa, fb)]
    assert (A * B).fractions() == [p * q for p, q in zip(fa, fb)]
    assert (A * B + A).fractions() == [p * q + p for p, q in zip(fa, fb)]
    # rel_le / rel_u2 on err = a*b - a*b*(1 + d) with d straddling 3u^2.
    d = rng.integers(-4 * 2**20, 4 * 2**20, n)  # d = k * 2^-68: |d| up to 4u^2
    D = Exact(np.array([int(k) for k in d], dtype=object), 68)
    P = A * B
    err = P * D
    ok = rel_le(err, P, 3 * U2)
    u2 = rel_u2(err, P)
    for i in range(n):
        ref = fa[i] * fb[i]
        e = abs(ref * Fraction(int(d[i]), 2**68))
        assert ok[i] == (e <= 3 * U2 * abs(ref))
        if ref != 0:
            with mpmath.workprec(300):
                want = mpmath.mpf(e.numerator) / e.denominator / (
                    mpmath.mpf(abs(ref).numerator) / abs(ref).denominator) * 2**48
            assert abs(u2[i] - float(want)) <= 1e-15 * float(want)
    assert ok.sum() not in (0, n)  # both verdicts occur
    # Correct rounding to float32: integer method vs REFERENCES section 9's method,
    # on sums (ties included: a + a/2^24 style values) and products.
    s = A + B
    got = round_f32(s)
    tie = Exact.f32(a) + Exact(f32_ints(a), 149 + 24)  # a (1 + 2^-24): ties
    got_tie = round_f32(tie)
    for i in range(n):
        assert bits(got[i]) == bits(round_f32_fraction(fa[i] + fb[i])), i
        assert bits(got_tie[i]) == bits(round_f32_fraction(fa[i] * (1 + Fraction(1, 2**24))))
    prods = round_f32(P[:500])
    for i in range(500):
        assert bits(prods[i]) == bits(round_f32_fraction(fa[i] * fb[i]))
    # And against numpy where float64 holds the exact value (one rounding only).
    x64 = a.astype(np.float64) * (1 + 2.0**-28)  # 24 + 28 bits: exact in float64
    X = Exact.f32(a) + Exact(f32_ints(a), 149 + 28)
    # (values, not bits: the oracle has no signed zero)
    np.testing.assert_array_equal(round_f32(X), x64.astype(np.float32))
    assert round_f32_fraction(Fraction(2) ** 128 - Fraction(2) ** 103) == np.inf
    assert round_f32_fraction(Fraction(2) ** 128 - Fraction(2) ** 103 - 1) == np.float32(3.4028234663852886e38)


# ---- error-free transforms ---------------------------------------------------


def assert_eft(z, S, name):
    """(s, t) is exact (s + t == S) and normalised (s = RN(s + t), hence RN(S))."""
    zh, zl = z
    Z = Exact.dw(zh, zl)
    exact = (Z - S).is_zero()
    norm = is_normalised(zh, zl)
    assert exact.all(), f"{name} not exact in {np.count_nonzero(~exact)} cases"
    assert norm.all(), f"{name} result not normalised in {np.count_nonzero(~norm)} cases"
    print(f"\n{name}: exact and normalised in {zh.size} of {zh.size} cases")


def test_two_sum_exact(add_operands):
    o = add_operands
    z = run_dw("two_sum", o.xh, o.xl, o.yh, o.yl)
    assert_eft(z, o.Xh + o.Yh, "TwoSum")


def test_fast_two_sum_exact_when_ordered(add_operands):
    """Fast2Sum with |a| >= |b| (exponent(a) >= exponent(b)) is exact."""
    o = add_operands
    swap = np.abs(o.xh) < np.abs(o.yh)
    a = np.where(swap, o.yh, o.xh)
    b = np.where(swap, o.xh, o.yh)
    z = run_dw("fast_two_sum", a, o.xl, b, o.yl)
    assert_eft(z, o.Xh + o.Yh, "Fast2Sum")


def test_two_prod_exact():
    """TwoProdFMA exact for exponent(a) + exponent(b) in [-80, 125] (the header's
    guarantee: the residual is a multiple of 2^(ea+eb-46) >= 2^-126)."""
    rng = np.random.default_rng(20240604)
    ea = rng.integers(-100, 101, N)
    eb = uniform_int(rng, np.maximum(-100, -80 - ea), np.minimum(100, 125 - ea))
    a, b = rand_hi(rng, ea), rand_hi(rng, eb)
    z = run_dw("two_prod", a, np.zeros_like(a), b, np.zeros_like(b))
    assert_eft(z, Exact.f32(a) * Exact.f32(b), "TwoProdFMA")


def test_eft_adversarial():
    """Ties, signed zeros, equal magnitudes, |a| < |b| for TwoSum, words near 2^-103
    (the smallest for which sums stay exact), values near 2^127."""
    big = 1.5 * 2.0**126
    a = f32(1, 1 + 2**-23, 1, -0.0, 0.0, -0.0, 2.0**-30, 3, -3, 2.0**-103 * 1.5,
            2.0**-103, big, 3.4028234663852886e38, 2.0**-30)
    b = f32(2**-24, 2**-24, -(2**-25), -0.0, -0.0, 0.0, -(1 - 2**-23), 3, 3,
            2.0**-103 * (1 + 2**-23), -(2.0**-80), -big / 3, -3.4028234663852886e38, 1)
    zs = run_dw("two_sum", a, 0 * a, b, 0 * b)
    S = Exact.f32(a) + Exact.f32(b)
    assert (Exact.dw(*zs) - S).is_zero().all() and is_normalised(*zs).all()
    # Ties round to even: 1 + 2^-24 -> (1, 2^-24); (1 + 2^-23) + 2^-24 -> (1 + 2^-22, -2^-24).
    assert zs[0][0] == 1 and zs[1][0] == 2**-24
    assert zs[0][1] == 1 + 2**-22 and zs[1][1] == -(2**-24)
    # Signed zeros: (-0) + (-0) = -0 as in IEEE, the error term is +0.
    assert bits(zs[0][3]) == 0x80000000 and bits(zs[1][3]) == 0
    assert bits(zs[0][4]) == 0 and bits(zs[0][5]) == 0
    # Equal magnitudes: x + x exact in s; x - x = (+0, +0).
    assert zs[0][7] == 6 and zs[1][7] == 0 and bits(zs[0][8]) == 0 and bits(zs[1][8]) == 0
    # Fast2Sum on the ordered subset (|a| >= |b|).
    ordered = np.abs(a) >= np.abs(b)
    zf = run_dw("fast_two_sum", a[ordered], 0 * a[ordered], b[ordered], 0 * b[ordered])
    assert (Exact.dw(*zf) - S[np.flatnonzero(ordered)]).is_zero().all()
    # Fast2Sum outside its precondition is not exact: Fast2Sum(2^-30, 1) = (1, 0).
    zf = run_dw("fast_two_sum", f32(2**-30), f32(0), f32(1), f32(0))
    assert zf[0][0] == 1 and zf[1][0] == 0
    # TwoProd: (1 + 2^-23)(1 - 2^-23) = 1 - 2^-46 -> (1, -2^-46); huge: (2^63 (2 - 2^-23))^2.
    h = np.float32(2.0**63 * (2 - 2**-23))
    p = f32(1 + 2**-23, h, -0.0, 3.0)
    q = f32(1 - 2**-23, h, 5.0, -0.0)
    zp = run_dw("two_prod", p, 0 * p, q, 0 * q)
    assert (Exact.dw(*zp) - Exact.f32(p) * Exact.f32(q)).is_zero().all()
    assert zp[0][0] == 1 and zp[1][0] == -(2.0**-46)
    assert bits(zp[0][2]) == 0x80000000 and bits(zp[0][3]) == 0x80000000


def test_flush_to_zero_behaviour():
    """What happens below the flush-to-zero range, as the header documents it: the
    emulator's exact outputs (Apple GPUs flush float32 subnormals the same way)."""
    # TwoSum loses a residual that would be subnormal: 2^-127 here.
    z = run_dw("two_sum", f32(2.0**-100), f32(0), f32(2.0**-104 + 2.0**-127), f32(0))
    assert z[0][0] == np.float32(2.0**-100 + 2.0**-104) and z[1][0] == 0
    # ... and a whole subnormal sum: 1.25*2^-126 - 2^-126 = 2^-128 -> (0, 0).
    z = run_dw("two_sum", f32(1.25 * 2.0**-126), f32(0), f32(-(2.0**-126)), f32(0))
    assert z[0][0] == 0 and z[1][0] == 0
    # Subnormal inputs read as zero (DAZ): TwoSum(2^-130, 1) = (1, 0),
    # TwoSum(2^-130, 2^-131) = (0, 0) although the stored bits are nonzero.
    z = run_dw("two_sum", f32(2.0**-130, 2.0**-130), f32(0, 0), f32(1, 2.0**-131), f32(0, 0))
    assert list(z[0]) == [1, 0] and list(z[1]) == [0, 0]
    # TwoProd below the guarantee (ea + eb < -80): the high part is RN(ab) (0 when
    # that is subnormal) and the residual is exact when normal and 0 when subnormal.
    rng = np.random.default_rng(5)
    n = 20000
    ea = rng.integers(-70, -40, n)
    eb = rng.integers(-70, -40, n)
    keep = (ea + eb < -80) & (ea + eb >= -140)
    a, b = rand_hi(rng, ea[keep]), rand_hi(rng, eb[keep])
    p, e = run_dw("two_prod", a, 0 * a, b, 0 * b)
    P = Exact.f32(a) * Exact.f32(b)
    rp = round_f32(P)
    tiny = np.float32(2.0**-126)
    want_p = np.where(np.abs(rp) < tiny, np.float32(0), rp)
    np.testing.assert_array_equal(p, want_p)
    normal_p = want_p != 0
    resid = round_f32(P - Exact.f32(want_p))  # exact (fits 24 bits) where p is normal
    want_e = np.where(np.abs(resid) < tiny, np.float32(0), resid)
    np.testing.assert_array_equal(e[normal_p], want_e[normal_p])
    lost = normal_p & (want_e == 0) & (resid != 0)
    assert lost.sum() > 1000  # the residual really is flushed in many cases
    assert (e[~normal_p] == 0).all()
    # Double-word operations on tiny values: x*y with |xy| ~ 2^-140 is flushed to 0.
    z = run_dw("mul", f32(2.0**-70 * 1.5), f32(2.0**-95), f32(2.0**-70 * 1.25), f32(0))
    assert z[0][0] == 0 and z[1][0] == 0
    # Just above 2^-103 everything is exact again (all words multiples of 2^-126).
    z = run_dw("add", f32(2.0**-79 * 1.5), f32(2.0**-104), f32(-(2.0**-79) * 1.5), f32(2.0**-103))
    assert z[0][0] == np.float32(3 * 2.0**-104) and z[1][0] == 0


# ---- double-word operations: random operands ---------------------------------


def check_op(name, op, o, bound, exact_of, *, in_quotient=False, min_seen=0.5):
    """Run ``op`` on operands ``o`` and assert the bound in 100% of cases, with
    normalised results; print the maximum error in units of u^2."""
    zh, zl = run_dw(op, *o.arrays())
    Z = Exact.dw(zh, zl)
    if in_quotient:  # |z - x/y| / |x/y| = |zy - x| / |x|
        ok, err = check_rel(Z * o.Y - o.X, o.X, bound)
    else:
        ref = exact_of(o)
        ok, err = check_rel(Z - ref, ref, bound)
    worst = int(np.argmax(err))
    print(f"\n{name}: max error {err[worst]:.6f} u^2 over {zh.size} pairs "
          f"(bound {float(bound / U2):.6g} u^2); worst x = ({o.xh[worst].item().hex()}, "
          f"{o.xl[worst].item().hex()}), y = ({o.yh[worst].item().hex()}, "
          f"{o.yl[worst].item().hex()})")
    assert ok.all(), f"{name}: bound exceeded in {np.count_nonzero(~ok)} cases, max {err.max()} u^2"
    assert is_normalised(zh, zl).all()
    # The measure is live: errors of this size do occur (a broken oracle reading 0
    # everywhere would fail here).
    assert err.max() >= min_seen
    return err


def test_dw_plus_fp(add_operands):
    check_op("DW+FP (JMP alg 4)", "add_fp", add_operands, B_ADD_FP, lambda o: o.X + o.Yh)


def test_dw_plus_dw(add_operands):
    check_op("DW+DW (JMP alg 6)", "add", add_operands, B_ADD, lambda o: o.X + o.Y)


def test_dw_times_fp(mul_operands):
    check_op("DW*FP (JMP alg 9)", "mul_fp", mul_operands, B_MUL_FP, lambda o: o.X * o.Yh)


def test_dw_times_dw(mul_operands):
    check_op("DW*DW (JMP alg 12)", "mul", mul_operands, B_MUL, lambda o: o.X * o.Y)


def test_dw_div_dw(div_operands):
    check_op("DW/DW (JMP alg 18)", "div", div_operands, B_DIV, None, in_quotient=True)


def test_dw_div_dw_from_faithful_reciprocal(div_operands):
    """The bound holds when the starting reciprocal is only faithful: "div_faithful" starts
    from the neighbour of RN(1/yh) on the other side of 1/yh."""
    check_op("DW/DW from a faithful reciprocal", "div_faithful", div_operands, B_DIV, None,
             in_quotient=True)


def test_reciprocal_refinement_exhaustive():
    """Step 0 of DW/DW: from RN(1/yh) it changes nothing; from the other faithful
    neighbour it returns RN(1/yh), for every significand of yh in [1, 2) except
    yh = 2 - 2^-23 (t0 = 1/2: the midpoint 2^-1 (1 + 2^-24) rounds to even, 1/2).
    Power-of-two scaling and sign are exact, so this covers all normal yh with a
    normal reciprocal; a random sample of scaled, signed yh confirms it."""
    yh = (np.uint32(0x3F800000) + np.arange(1 << 23, dtype=np.uint32)).view(np.float32)
    z0 = np.zeros_like(yh)
    from_rn, from_other = run_dw("recip_refine", z0, z0, yh, z0)
    rn = np.float32(1) / yh  # numpy: IEEE correctly rounded division
    np.testing.assert_array_equal(from_rn, rn)
    diff = np.flatnonzero(from_other != rn)
    assert diff.tolist() == [(1 << 23) - 1]
    assert from_other[diff[0]] == 0.5 and rn[diff[0]] == np.float32(0.5 + 2.0**-24)
    rng = np.random.default_rng(9)
    y = rand_hi(rng, rng.integers(-120, 121, 200000))
    z0 = np.zeros_like(y)
    from_rn, from_other = run_dw("recip_refine", z0, z0, y, z0)
    rn = np.float32(1) / y
    np.testing.assert_array_equal(from_rn, rn)
    odd = (bits(np.abs(y)) & 0x7FFFFF) == 0x7FFFFF
    np.testing.assert_array_equal(from_other[~odd], rn[~odd])


def test_dw_div_faithful_start_adversarial():
    """Where a faithful start hurts most: yh just below 2, so the faithful neighbour
    t0 of 1/yh that is not RN(1/yh) is almost 2u away, and yl = half an ulp with the
    sign that makes |1 - y t0| ~ 3u. Alg 18 run directly from such a t0 leaves about
    (3u)^2 from its Newton step (9.46u^2 measured on these operands while developing
    it); with step 0 the error matches the correctly rounded start within 1u^2."""
    rng = np.random.default_rng(13)
    n = 200000
    yh = (np.uint32(0x40000000) - rng.integers(1, 4097, n).astype(np.uint32)).view(np.float32)
    rn = (np.float32(1) / yh).astype(np.float64)
    y64 = yh.astype(np.float64)
    # 1 - yh*t is exact in float64 (yh*t has 48 bits and lies within 2^-22 of 1).
    other = np.where(1 - y64 * rn > 0, np.nextafter(rn.astype(np.float32), np.float32(2)),
                     np.nextafter(rn.astype(np.float32), np.float32(0))).astype(np.float64)
    rh = 1 - y64 * other
    yl = (np.uint32(0x33800000) - rng.integers(1, 65, n).astype(np.uint32)).view(np.float32)
    yl = np.where(rh > 0, -yl, yl)  # 0x33800000 = 2^-24 = ulp(yh)/2
    xh = rand_hi(rng, np.zeros(n, np.int64))
    xl = rand_lo(rng, xh, 4)
    assert is_normalised(yh, yl).all()
    X, Y = Exact.dw(xh, xl), Exact.dw(yh, yl)
    worst = {}
    for op in ("div", "div_faithful"):
        zh, zl = run_dw(op, xh, xl, yh, yl)
        ok, err = check_rel(Exact.dw(zh, zl) * Y - X, X, B_DIV)
        assert ok.all()
        worst[op] = err.max()
    print(f"\nDW/DW, adversarial faithful starts: max error {worst['div_faithful']:.4f} u^2 "
          f"(from RN(1/yh): {worst['div']:.4f} u^2)")
    assert worst["div_faithful"] <= worst["div"] + 1.0


# ---- double-word operations: adversarial cases -------------------------------


def test_near_worst_cases():
    """Operands found by a hill-climbing search for large errors (float32, in
    [1, 2)): each error is pinned close to its bound, showing the bounds are nearly
    attained and that the computed results did not change."""
    cases = [  # op, xh, xl, yh, yl, error in u^2 (to 1e-6), bound
        ("add_fp", "0x1p+0", "0x1.000002p-25", "-0x1.fffffep-2", "0x0p+0", 1.999999762, B_ADD_FP),
        ("add", "-0x1p+0", "-0x1.600002p-25", "0x1.fffffep-2", "-0x1.000004p-28", 2.499999627,
         B_ADD),
        ("mul_fp", "0x1.02p+0", "0x1.fffffcp-25", "0x1.00008p+0", "0x0p+0", 1.984466, B_MUL_FP),
        ("mul", "-0x1.000002p+0", "-0x1.fffffap-25", "-0x1.000002p+0", "-0x1.fffffcp-25",
         3.999997675, B_MUL),
        ("div", "0x1.042ff8p+0", "0x1.fffffcp-25", "-0x1.ffffbep+0", "-0x1.f9f79cp-25", 6.061931,
         B_DIV),
    ]
    for op, *hexes, want, bound in cases:
        xh, xl, yh, yl = (f32(float.fromhex(h)) for h in hexes)
        zh, zl = run_dw(op, xh, xl, yh, yl)
        X, Y, Z = Exact.dw(xh, xl), Exact.dw(yh, yl), Exact.dw(zh, zl)
        if op == "div":
            err, ref = Z * Y - X, X
        else:
            ref = {"add_fp": X + Exact.f32(yh), "add": X + Y, "mul_fp": X * Exact.f32(yh),
                   "mul": X * Y}[op]
            err = Z - ref
        ok, u2 = check_rel(err, ref, bound)
        assert ok.all()
        assert abs(u2[0] - want) < 1e-6, (op, u2[0])


def test_adversarial_sums():
    """Massive cancellation, equal magnitudes, signed zeros and huge values for
    DW+FP and DW+DW."""
    xh = f32(1, 1, 1 + 2**-23, 3.0 * 2**40, 1.5 * 2**126, 1.5 * 2**126, 5, 5, 1)
    xl = f32(2**-30, 2**-25, -(2**-26), 2**15, 2**100, -(2**100), 2**-23, 2**-23, 2**-24)
    yh = f32(-1, -1, -(1 + 2**-23), -3.0 * 2**40, 1.25 * 2**126, -1.5 * 2**126, 5, -5, 1)
    yl = f32(-(2**-30) + 2**-53, -(2**-25) - 2**-48, 2**-26 + 2**-49, -(2**15) + 2**-8,
             2**101, 2**100 + 2**77, 2**-23, -(2**-23), 2**-24)
    assert is_normalised(xh, xl).all() and is_normalised(yh, yl).all()
    zh, zl = run_dw("add", xh, xl, yh, yl)
    X, Y = Exact.dw(xh, xl), Exact.dw(yh, yl)
    ok, err = check_rel(Exact.dw(zh, zl) - (X + Y), X + Y, B_ADD)
    assert ok.all(), err
    # Results representable as a normalised pair come out exactly here, e.g. the
    # cancellations to 2^-53, -2^-48, 2^-49, 2^-8, 2^77, and x + x = 2x, x - x = (0, 0).
    assert list(zh[[0, 1, 2, 3, 5]]) == [2.0**-53, -(2.0**-48), 2.0**-49, 2.0**-8, 2.0**77]
    assert (zl[[0, 1, 2, 3, 5]] == 0).all()
    assert (zh[6], zl[6]) == (10, np.float32(2**-22)) and zh[7] == 0 and zl[7] == 0
    assert (zh[8], zl[8]) == (2, np.float32(2**-23))  # ties in both words
    zh, zl = run_dw("add_fp", xh, xl, yh, yl)
    ok, err = check_rel(Exact.dw(zh, zl) - (X + Exact.f32(yh)), X + Exact.f32(yh), B_ADD_FP)
    assert ok.all(), err
    # Signed zeros: every combination sums to exactly 0 in both words, and the high
    # word has the sign of float32's sum of the high words (IEEE: -0 only for
    # (-0) + (-0)), in DW+DW and DW+FP alike.
    sz = np.array([0.0, -0.0], np.float32)
    g = np.array(np.meshgrid(sz, sz, sz, sz, indexing="ij")).reshape(4, -1)
    for op in ("add", "add_fp"):
        zh, zl = run_dw(op, *g)
        assert (zh == 0).all() and (zl == 0).all()
        assert np.array_equal(np.signbit(zh), np.signbit(g[0] + g[2])), op
    # Overflow gives float32's Inf with a zero low word (not the NaN residual of a
    # plain TwoSum): TwoSum(max, max) -> (inf, 0). tests/test_special_values.py has more.
    m = f32(3.4028234663852886e38)
    zh, zl = run_dw("two_sum", m, 0 * m, m, 0 * m)
    assert zh[0] == np.inf and zl[0] == 0


def test_adversarial_products_and_quotients():
    """Huge and tiny (but above the flush range) products and quotients, exact
    cases, signed zeros, and the documented limits of DW/DW."""
    h = 2.0**63
    xh = f32(1.9 * h, 2.0**-30 * 1.5, 1.5 * 2**126, 3, 1 + 2**-23, 2**-10, -1, 2**100)
    xl = f32(h * 2**-25, 2.0**-56, 2.0**101, 0, 2**-25, 0, -(2**-25), 2**75)
    yh = f32(1.9 * h, 2.0**-31 * 1.25, 0.75, 0.5, 1 - 2**-24, 2**63, 3, 2**-26)
    yl = f32(-h * 2**-25, -(2.0**-57), 2**-26, 0, 2**-49, 2**39, 0, 0)
    assert is_normalised(xh, xl).all() and is_normalised(yh, yl).all()
    X, Y = Exact.dw(xh, xl), Exact.dw(yh, yl)
    for op, bound, ref in (("mul_fp", B_MUL_FP, X * Exact.f32(yh)), ("mul", B_MUL, X * Y)):
        zh, zl = run_dw(op, xh, xl, yh, yl)
        ok, err = check_rel(Exact.dw(zh, zl) - ref, ref, bound)
        assert ok.all(), (op, err)
        assert zh[3] == 1.5 and zl[3] == 0  # exact product
    zh, zl = run_dw("div", xh, xl, yh, yl)
    ok, err = check_rel(Exact.dw(zh, zl) * Y - X, X, B_DIV)
    assert ok.all(), err
    assert zh[3] == 6 and zl[3] == 0  # 3 / 0.5 exactly
    # Signed zeros: 0 * y and 0 / y are zero in both words.
    zx = f32(0, -0.0, 0, -0.0)
    zy = f32(3, 3, -3, -3)
    for op in ("mul_fp", "mul", "div"):
        zh, zl = run_dw(op, zx, zx, zy, 0 * zy)
        assert (zh == 0).all() and (zl == 0).all()
    # Divisors up to the top of the range (1/yh subnormal above 2^126, flushed: the
    # quotient was 0; the Newton correction subnormal above ~2^101: 2^-24 error):
    # within the bound; y == 0 gives inf/NaN.
    rng = np.random.default_rng(7)
    yh = f32(*(rng.uniform(1, 2, 40) * 2.0 ** rng.integers(90, 128, 40)))
    xh = f32(*(rng.uniform(1, 2, 40) * 2.0 ** rng.integers(80, 128, 40)))
    xl, yl = xh * f32(2.0**-26), yh * f32(-(2.0**-27))
    X, Y = Exact.dw(xh, xl), Exact.dw(yh, yl)
    zh, zl = run_dw("div", xh, xl, yh, yl)
    ok, err = check_rel(Exact.dw(zh, zl) * Y - X, X, B_DIV)
    assert ok.all(), err
    zh, zl = run_dw("div", f32(1.5 * 2**127, 1), f32(0, 0), f32(1.5 * 2**126, 0), f32(0, 0))
    assert zh[0] == 2 and zl[0] == 0
    assert not np.isfinite(zh[1])


# ---- complex -----------------------------------------------------------------


@pytest.fixture(scope="module")
def complex_operands():
    """Complex double-words with component exponents in [-25, 25]; 10% with
    |re| ~ |im| and y = x (so Re(x^2) = re^2 - im^2 cancels)."""
    rng = np.random.default_rng(20240605)
    comps = []
    for _ in range(4):
        hi = rand_hi(rng, rng.integers(-25, 26, N))
        comps.append(hi)
    xrh, xih, yrh, yih = comps
    m = rng.random(N) < 0.10
    xih[m] = (bits(xrh[m]).astype(np.int64) + rng.integers(-3, 4, m.sum())).astype(
        np.uint32).view(np.float32)
    xrl, xil = rand_lo(rng, xrh, 10), rand_lo(rng, xih, 10)
    yrl, yil = rand_lo(rng, yrh, 10), rand_lo(rng, yih, 10)
    x = [xrh, xrl, xih, xil]
    y = [yrh, yrl, yih, yil]
    for a, b in zip(x, y):
        b[m] = a[m]
    Xr, Xi = Exact.dw(xrh, xrl), Exact.dw(xih, xil)
    Yr, Yi = Exact.dw(yrh, yrl), Exact.dw(yih, yil)
    return tuple(x), tuple(y), (Xr, Xi, Yr, Yi)


def test_complex_add(complex_operands):
    """Each component within 3u^2 + 13u^3 (JMP alg 6), hence also normwise."""
    x, y, (Xr, Xi, Yr, Yi) = complex_operands
    zrh, zrl, zih, zil = run_cdw("add", x, y)
    worst = 0.0
    for Z, E in ((Exact.dw(zrh, zrl), Xr + Yr), (Exact.dw(zih, zil), Xi + Yi)):
        ok, err = check_rel(Z - E, E, B_ADD)
        assert ok.all(), f"{np.count_nonzero(~ok)} components above the bound"
        worst = max(worst, err.max())
    print(f"\ncomplex add: max componentwise error {worst:.6f} u^2 over {zrh.size} pairs "
          f"(bound 3u^2 + 13u^3)")
    assert worst >= 0.5


def test_complex_multiply(complex_operands):
    """Normwise bound 8.66u^2 (derived in doubleword.h: (4 sqrt(2) + 3)u^2 + O(u^3)).
    Components alone are not bounded relatively under cancellation: the printout
    shows how large the componentwise error of Re(x^2) gets."""
    x, y, (Xr, Xi, Yr, Yi) = complex_operands
    zrh, zrl, zih, zil = run_cdw("mul", x, y)
    Er = Xr * Yr - Xi * Yi
    Ei = Xr * Yi + Xi * Yr
    Zr, Zi = Exact.dw(zrh, zrl), Exact.dw(zih, zil)
    ok, err = check_norm_rel(Zr - Er, Zi - Ei, Er, Ei, B_CMUL)
    comp = rel_u2(Zr - Er, Er)
    print(f"\ncomplex multiply: max normwise error {err.max():.4f} u^2 over {zrh.size} pairs "
          f"(bound 8.66 u^2); max componentwise error of the real part {comp.max():.3g} u^2")
    assert ok.all(), f"{np.count_nonzero(~ok)} cases above 8.66u^2, max {err.max()}"
    assert err.max() >= 1.0


# ---- kernel plumbing ---------------------------------------------------------


def test_one_element_and_partial_threadgroups():
    """n = 0, 1 and 1000 (not a multiple of the 256-thread groups): the bounds
    check against xh_shape[0] leaves no element unwritten (the emulator fills
    unwritten outputs with NaN)."""
    for n in (0, 1, 1000):
        a = np.linspace(1, 2, n, dtype=np.float32)
        zh, zl = run_dw("add", a, 0 * a, a, 0 * a)
        np.testing.assert_array_equal(zh, 2 * a)
        np.testing.assert_array_equal(zl, 0 * a)
    # An explicit grid larger than n: threads past the end return.
    a, z = mx.ones(10), mx.zeros(10)
    zh, zl = DW_OPS(inputs=[a, z, a, z], template={"OP": "mul"}, grid=(64, 1, 1),
                    threadgroup=(32, 1, 1), output_shapes=[(10,), (10,)],
                    output_dtypes=[mx.float32] * 2, backend=BACKEND)
    np.testing.assert_array_equal(np.array(zh), np.ones(10, np.float32))


# ---- device self-test --------------------------------------------------------


def test_eft_selftest_passes_on_emulator():
    assert eft_selftest(BACKEND) is None


def test_eft_selftest_reports_the_broken_property(monkeypatch):
    """The checker names the property that failed: a fake device result per case."""
    good = np.array([1, 2.0**-30, 1, -(2.0**-46), -(1 - 2.0**-23), 2.0**-30, 0, 2.0**-125],
                    np.float32)
    broken = {
        1: "TwoSum not exact",  # t = 0: what fast math does
        3: "fma residual wrong",  # a*b + c rounded twice
        5: "TwoSum not exact",
        6: "FTZ behaviour",  # neither flushed nor exact
        7: "FTZ behaviour",  # a normal value flushed
    }
    for idx, msg in broken.items():
        r = good.copy()
        r[idx] = {6: 2.0**-129, 7: 0.0}.get(idx, 0.0)
        monkeypatch.setattr(kern, "EFT_SELFTEST", lambda **kw: [mx.array(r)])
        with pytest.raises(DeviceCheckError, match=msg):
            eft_selftest(BACKEND)
    gradual = good.copy()
    gradual[6] = 2.0**-130  # exact gradual underflow is accepted
    monkeypatch.setattr(kern, "EFT_SELFTEST", lambda **kw: [mx.array(gradual)])
    eft_selftest(BACKEND)


# ---- split / join ------------------------------------------------------------


def test_split_join_round_trip_exact_for_48_bit_values():
    """float64 values with <= 48 significant bits and exponent in [-78, 127] split
    into (hi, lo) with lo normal or 0, and join back exactly; hi = RN32(x),
    lo = RN32(x - hi) checked against the integer oracle."""
    rng = np.random.default_rng(11)
    n = 200000
    m = rng.integers(1 << 47, 1 << 48, n, dtype=np.int64).astype(np.float64)
    e = rng.integers(-78, 127, n)
    x = np.ldexp(m, e - 47) * rng.choice([-1.0, 1.0], n)
    x[:3] = [0.0, -0.0, np.float32(3.4028234663852886e38).item()]
    hi, lo = split(x)
    assert hi.dtype == mx.float32 and lo.dtype == mx.float32 and hi.shape == (n,)
    h, lw = np.array(hi), np.array(lo)
    back = join(hi, lo)
    assert back.dtype == np.float64
    np.testing.assert_array_equal(back, x)
    assert ((np.abs(lw) >= 2.0**-126) | (lw == 0)).all()
    assert is_normalised(h, lw).all()
    # hi = RN32(x) and lo = RN32(x - hi), against integer rounding of exact values.
    k = 125  # every x here is a multiple of 2^-125
    X = Exact(np.array([int(v) for v in np.ldexp(x[:5000], k)], dtype=object), k)
    np.testing.assert_array_equal(round_f32(X), h[:5000])  # values: no -0 in the oracle
    np.testing.assert_array_equal(round_f32(X - Exact.f32(h[:5000])), lw[:5000])
    # Shapes are kept; mx.array float64 input works too.
    x2 = x[:12].reshape(3, 4)
    h2, l2 = split(mx.array(x2, dtype=mx.float64))
    assert h2.shape == (3, 4)
    np.testing.assert_array_equal(join(h2, l2), x2)


def test_split_join_general_float64():
    """53-bit float64: hi + lo is within 2^-49 |x| (the remainder x - hi has up to 28
    bits, lo keeps 24), and not always exact; below float32's normal range the low
    word cannot hold the remainder (|x - (hi + lo)| <= 2^-150)."""
    rng = np.random.default_rng(12)
    n = 5000
    x = rng.standard_normal(n) * 2.0 ** rng.integers(-78, 120, n)
    hi, lo = split(x)
    back = join(hi, lo)
    errs = [abs(Fraction(float(b)) - Fraction(float(a))) / abs(Fraction(float(a)))
            for a, b in zip(x, back)]
    worst = max(errs)
    assert worst <= Fraction(1, 2**49)
    assert sum(e != 0 for e in errs) > n // 2  # most 53-bit values lose bits
    tiny = np.array([2.0**-140 * (1 + 2**-10), 2.0**-130 * 1.75, 2.0**-200])
    h, lw = split(tiny)
    h, lw = np.array(h), np.array(lw)
    assert h[0] == np.float32(2.0**-140) and lw[0] == 0  # 2^-150 tie rounds to even 0
    assert h[1] == np.float32(2.0**-130 * 1.75)  # subnormal hi, kept on the host
    assert h[2] == 0 and lw[2] == 0
    assert (np.abs(join(h, lw) - tiny) <= 2.0**-150).all()
    # join rounds once when the pair spans more than 53 bits.
    assert join(f32(1.0), f32(2.0**-60))[0] == 1.0
    assert join(f32(1.0), f32(2.0**-52))[0] == 1.0 + 2.0**-52


def test_split_join_errors():
    big = np.array([1.0, 2.0**128 - 2.0**103])  # rounds to inf in float32
    with pytest.raises(ValueError, match="outside the float32 range"):
        split(big)
    # Just below the rounding boundary: FLT_MAX with a positive low word.
    hi, lo = split(np.array([2.0**128 - 2.0**103 - 2.0**75]))
    assert np.array(hi)[0] == np.float32(3.4028234663852886e38) and np.array(lo)[0] > 0
    for bad in (np.array([np.inf]), np.array([np.nan]), np.array([-np.inf, 1.0])):
        with pytest.raises(ValueError, match="outside the float32 range"):
            split(bad)
    # lists of Python floats are float64 values (docs/api.md, "Inputs"): accepted
    for wrong in (np.ones(3, np.float32), np.ones(3, np.int64), mx.ones(3), "x"):
        with pytest.raises(ValueError, match="float64"):
            split(wrong)
    with pytest.raises(ValueError, match="float32"):
        join(np.ones(2), np.ones(2))
    with pytest.raises(ValueError, match="same shape"):
        join(np.ones(2, np.float32), np.ones(3, np.float32))
    with pytest.raises(ValueError, match="float32"):
        join(mx.ones(2, dtype=mx.float16), mx.ones(2, dtype=mx.float16))


def test_signed_zeros_follow_float32():
    """A zero result has the sign float32 gives the same operation on the high
    words (-0 + -0 = -0, -0 * 2 = -0, -0 / 3 = -0, x - x = +0): Fast2Sum's +0
    correction must not turn a -0 high word into +0. Oracle: numpy float32."""
    from mlx_precise.doubleword.types import DoubleWord
    from mlx_precise.doubleword.arithmetic import operate as binary

    z = np.array([-0.0, 0.0, -0.0, 0.0, 1.5, -2.0, -0.0], np.float32)
    w = np.array([-0.0, -0.0, 2.0, -3.0, 1.5, 0.0, -1e30], np.float32)
    x, y = (DoubleWord(mx.array(a), mx.zeros(a.shape)) for a in (z, w))
    with np.errstate(divide="ignore", invalid="ignore"):
        for op, ref in (("add", z + w), ("sub", z - w), ("mul", z * w), ("div", z / w)):
            got = np.array(binary(op, x, y, "emulate").hi)
            zero = ref == 0
            assert zero.any()
            assert np.array_equal(got[zero], ref[zero]), op
            assert np.array_equal(np.signbit(got[zero]), np.signbit(ref[zero])), (op, got, ref)
