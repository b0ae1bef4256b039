"""``mx.round`` with ``decimals``, and the sign of a zero that ``round`` / ``ceil`` /
``trunc`` give. ``round(x, d)`` was MLX's float32 op on the high word (reported):
its product and quotient round, so round(x, 2) missed the nearest float32 to x's
value to 2 decimals. A carried negative value that rounds to zero came out +0
(numpy and MLX: -0). Oracle: exact rationals (fractions) of each value's words."""

from __future__ import annotations

from fractions import Fraction

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from flow_helpers import rng_f32, value64


def _to_decimals(v: float, d: int) -> np.float32:
    """v to d decimals (half to even on the exact value), rounded once to float32."""
    q = round(Fraction(v) * Fraction(10) ** d)  # (Fraction rounds half to even)
    return np.float32(float(Fraction(q) / Fraction(10) ** d))


@pytest.mark.parametrize("strict", [False, True], ids=["report", "strict"])
@pytest.mark.parametrize("decimals", [1, 2, 3, -1, -2])
def test_round_to_decimals(backend, decimals, strict):
    a = rng_f32(64, 51) * 50
    with mp.extended_precision(strict=strict) as report:
        x = mx.array(a)
        carried = x / 3
        got = [mx.round(x, decimals), mx.round(carried, decimals=decimals)]
        mx.eval(got)
    assert not report.float32, report
    for y, v in zip(got, (a.astype(np.float64), value64(carried))):
        want = np.array([_to_decimals(float(t), decimals) for t in v])
        np.testing.assert_array_equal(np.array(y), want)


def test_integer_parts_keep_the_sign_of_zero(backend):
    a = np.float32([-0.3, 0.3, -0.7, -0.5, 0.5, -1e-30, 1e-30, -0.0, 0.0, -2.5])
    with mp.extended_precision(strict=True):  # (nothing leaves double-word: no raise)
        y = mx.array(a) / 1.0000001  # carried
        got = {k: getattr(mx, k)(y) for k in ("round", "floor", "ceil", "trunc")}
        mx.eval(got)
    v = np.array(y)  # (the high words: what numpy's float32 op sees; no tie here)
    for k, r in got.items():
        want = getattr(np, k)(v)
        np.testing.assert_array_equal(np.array(r), want, err_msg=k)
        np.testing.assert_array_equal(np.signbit(np.array(r)), np.signbit(want), err_msg=k)


# ---- astype out of double-word: integer, bool and half types --------------------------

def _words(his, los):
    """Carried values hi + lo (a float32 array plus a float64 one: exact, the sum's
    two words are hi and lo where |lo| <= ulp(hi) / 2)."""
    return mx.array(np.array(his, np.float32)) + mx.array(np.array(los, np.float64))


def _exact(his, los):
    return [Fraction(float(np.float32(h))) + Fraction(float(np.float64(lo)))
            for h, lo in zip(his, los)]


# (hi, lo): integers with a low word of either sign, above 2^24, at the limits of
# int16 / int32 where hi rounds to just outside the type, zero, non-integers
CAST_INTS = [(2.0**24 + 2, -0.25), (3.0, -2.0**-30), (-3.0, 2.0**-30), (3.0, 2.0**-30),
             (-3.0, -2.0**-30), (2.5, 1e-9), (0.0, 0.0), (2.0**31, -1.0), (-2.0**31, 0.5),
             (32767.0, 2.0**-20), (32768.0, -2.0**-20), (-32768.0, 2.0**-20),
             (1e6 + 0.5, -1e-12), (7.0, 0.0), (-0.5, 0.0), (2.0**40, -3.0)]


@pytest.mark.parametrize("strict", [False, True], ids=["report", "strict"])
@pytest.mark.parametrize("dtype", [mx.int16, mx.int32, mx.int64, mx.uint32, mx.uint64,
                                   mx.bool_], ids=str)
def test_astype_to_integers_truncates_the_exact_value(backend, dtype, strict):
    """``x.astype(int)`` truncates ``hi + lo``, not ``hi`` (MLX's cast of the float32
    rounding: ``3 - 2^-30`` gave 3, ``2^24 + 1.75`` gave 2^24 + 2). Values outside the
    type are left out (MLX's own conversion is undefined there)."""
    info = np.iinfo(np.dtype(str(dtype).split(".")[-1])) if dtype != mx.bool_ else None
    want = [bool(v) if info is None else int(v) for v in _exact(*zip(*CAST_INTS))]
    keep = [info is None or info.min <= w <= info.max for w in want]
    his, los = zip(*[c for c, k in zip(CAST_INTS, keep) if k])
    with mp.extended_precision(strict=strict) as report:
        got = _words(his, los).astype(dtype)
        mx.eval(got)
    assert not report.float32, report
    assert got.dtype == dtype
    assert np.array(got).tolist() == [w for w, k in zip(want, keep) if k]


def _nearest(v: Fraction, p: int, emin: int) -> float:
    """v rounded to p significant bits (exponents from emin), half to even."""
    if v == 0:
        return 0.0
    a = abs(v)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    e += 1 if Fraction(2) ** (e + 1) <= a else -1 if Fraction(2) ** e > a else 0
    ulp = Fraction(2) ** (max(e, emin) - (p - 1))
    return float((1 if v > 0 else -1) * round(a / ulp) * ulp)  # (round: half to even)


@pytest.mark.parametrize("dtype,p,emin", [(mx.float16, 11, -14), (mx.bfloat16, 8, -126)],
                         ids=["float16", "bfloat16"])
def test_astype_to_half_rounds_the_exact_value_once(backend, dtype, p, emin):
    """``x.astype(float16 / bfloat16)`` rounds ``hi + lo`` once: at a half-way point
    of the narrow type ``hi`` alone rounds to even, where ``lo`` decides (82 of these
    400 cases were off by one unit before); next to it, no change."""
    rng = np.random.default_rng(61)
    his, los = [], []
    for k in range(400):
        m, e = int(rng.integers(2 ** (p - 1), 2 ** p)), int(rng.integers(-10, 10))
        hi = np.float32((m + 0.5) * 2.0 ** (e - p + 1)) * np.float32(rng.choice([1, -1]))
        if k % 5 == 1:  # a float32 neighbour of the half-way point
            hi = np.nextafter(hi, np.float32(np.inf) * np.sign(hi))
        his.append(hi)
        los.append(rng.choice([1, -1]) * abs(float(hi)) * 2.0 ** -int(rng.integers(26, 40)))
    with mp.extended_precision() as report:
        got = np.array(_words(his, los).astype(dtype).astype(mx.float32))
    assert not report.float32, report
    want = [_nearest(v, p, emin) for v in _exact(his, los)]
    assert got.tolist() == want


@pytest.mark.parametrize("base", [0.999, 0.99999, 0.9999999, 1.0000001, 0.1, 0.9])
def test_power_of_a_python_float_base(backend, base):
    """``b ** t`` for a Python float b with more than 48 significant bits
    (``exponential_decay``'s ``0.999 ** step``, Adam's bias correction): exp(t log b)
    with log b from the host; before, b entered rounded to two float32 words and the
    error grew with t (0.99999 ** 1e5: 3.3e-11 relative, 0.9999999 ** 1e7: 5.6e-9).
    Oracle: mpmath at 40 digits of the float64 base; special exponents as float32."""
    from mpmath import mp as mpm, mpf
    mpm.dps = 40
    ts = np.array([0, 1, 3, 999, 10**5, 10**7, -50], np.int32)
    with mp.extended_precision(strict=True) as rep:
        v = base ** mx.array(ts)
        got = value64(v)
        y = np.array(base ** mx.array([np.inf, -np.inf, np.nan, 0.5], dtype=mx.float32))
    assert not rep.float32, rep
    for g, t in zip(got, ts):
        exact = mpf(base) ** int(t)
        if exact == 0 or float(exact) < 1e-30 or float(exact) > 1e30:
            continue
        assert abs(mpf(g) - exact) <= mpf(2) ** -46 * exact, (t, g)
    with np.errstate(all="ignore"):
        want = np.float32(base) ** np.array([np.inf, -np.inf, np.nan, 0.5], np.float32)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(y[ok][:2], want[ok][:2])  # 0 / inf by the side of 1
    np.testing.assert_allclose(y[3], np.sqrt(base), rtol=2**-23)


def test_power_of_a_python_float_base_gradient(backend):
    """d/dt b^t = b^t log b, double-word (the composition's VJPs)."""
    t0 = np.array([3.0, 250.5, 1000.25], np.float32)
    with mp.extended_precision(strict=True) as rep:
        g = value64(mx.grad(lambda t: (0.999 ** t).sum())(mx.array(t0)))
    assert not rep.float32, rep
    want = np.array([0.999 ** float(t) * np.log(0.999) for t in t0])
    np.testing.assert_allclose(g, want, rtol=2**-44)


def test_int_of_a_carried_value_truncates_the_exact_value(backend):
    """``int(x)`` of a carried value is its exact value truncated, as ``astype``
    to an integer type gives it (before: the float32 rounding truncated: 3 for
    3 - 2^-30). Oracle: the words joined as exact rationals."""
    cases = [(3.0, -2.0 ** -30), (-3.0, 2.0 ** -30), (2.0 ** 24, -0.25), (7.5, 0.0),
             (1.0, 2.0 ** -40), (-0.0, -2.0 ** -100)]
    with mp.use_backend(backend), mp.extended_precision(strict=True):
        got = [int(mx.array(np.float32(h)) + mx.array(np.float32(l))) for h, l in cases]
    want = [int(Fraction(float(np.float32(h))) + Fraction(float(np.float32(l))))
            for h, l in cases]
    assert got == want
    assert got[:3] == [2, -2, 2 ** 24 - 1]
