"""The lazy float64 bridge of the cpu backend (doubleword.engine64.to64 / from64) and
the float64 value the flow carries beside the words on cpu (DoubleWord.wide).

Oracles: numpy float64 (hi = RN32(v), lo = RN32(v - hi)) element by element, and
the IEEE sign of zero; special values follow the kernels' rule (a non-finite high
word has a zero low word)."""

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.doubleword.types import DoubleWord
from mlx_precise.doubleword.engine64 import from64, to64
from mlx_precise.extended import low_word
from mlx_precise.extended.carry import wide_value

SPECIALS = np.array([0.0, -0.0, 1e300, -1e300, np.inf, -np.inf, np.nan, 1 / 3, -2 / 3,
                     3.4e38, 3.5e38, -3.5e38, 2.0 ** 127 * (2 - 2.0 ** -30), 1e-50, -1e-50,
                     1e-40, 2.0 ** -149, np.pi * 1e20])


def _split_numpy(v: np.ndarray):
    with np.errstate(over="ignore", invalid="ignore"):
        hi = v.astype(np.float32)
        lo = np.where(np.isfinite(hi), v - hi.astype(np.float64), 0.0).astype(np.float32)
    return hi, lo


def test_from64_matches_numpy_split_bit_for_bit():
    rng = np.random.default_rng(5)
    v = np.concatenate([SPECIALS, rng.standard_normal(1000) * 10.0 ** rng.integers(-30, 30, 1000)])
    with mx.stream(mx.cpu):
        w = from64(mx.array(v, dtype=mx.float64))
        hi, lo = np.array(w.hi), np.array(w.lo)
    ref_hi, ref_lo = _split_numpy(v)
    assert np.array_equal(hi.view(np.uint32), ref_hi.view(np.uint32))
    assert np.array_equal(lo.view(np.uint32), ref_lo.view(np.uint32))


def test_to64_joins_exactly_and_keeps_the_sign_of_zero():
    hi, lo = _split_numpy(SPECIALS)
    with mx.stream(mx.cpu):
        re, im = to64(DoubleWord(mx.array(hi), mx.array(lo)))
        out = np.array(re)
    assert im is None
    with np.errstate(invalid="ignore"):
        ref = hi.astype(np.float64) + lo.astype(np.float64)
    assert np.array_equal(out, ref, equal_nan=True)
    finite = ~np.isnan(ref)
    # the sign is the high word's (numpy's -0 + 0 = +0 would lose it)
    assert np.array_equal(np.signbit(out)[finite], np.signbit(hi)[finite])
    assert np.signbit(out[1]) and not np.signbit(out[0])  # -0 stays -0, +0 stays +0


def test_complex_from64_parts_and_wide_value():
    re = np.array([1 / 3, np.inf, -0.0, 2.0 ** 130])
    im = np.array([-np.inf, 1 / 7, 0.0, -1e-45])
    with mx.stream(mx.cpu):
        w = from64(mx.array(re, dtype=mx.float64), mx.array(im, dtype=mx.float64))
        hi, lo = np.array(w.hi), np.array(w.lo)
        back_re, back_im = (np.array(v) for v in to64(w))
    for part, v in ((np.real, re), (np.imag, im)):
        ref_hi, ref_lo = _split_numpy(v)
        assert np.array_equal(part(hi), ref_hi) and np.array_equal(part(lo), ref_lo)
    # the carried value is the float64 input itself, not the rejoined words
    assert np.array_equal(back_re, re) and np.array_equal(back_im, im)


def test_low_word_takes_no_gradient_and_value_gradient_is_exact():
    """d(hi + lo)/dv = 1: the gradient flows through hi only (lo is a constant)."""
    def f(v):
        w = from64(v)
        return (w.hi.astype(mx.float64) * 3.0 + w.lo.astype(mx.float64)).sum()

    with mx.stream(mx.cpu):
        g = mx.grad(f)(mx.array([1 / 3, -2.5, 1e10], dtype=mx.float64))
        assert np.array_equal(np.array(g), [3.0, 3.0, 3.0])


def test_flow_carries_the_float64_value_on_cpu():
    """Inside a block on cpu a result carries its float64 value; a movement op
    carries it too; the next step reads it (the result is the float64 chain)."""
    x = np.linspace(0.1, 2.0, 12).astype(np.float32)
    with mp.use_backend("cpu"), mp.extended_precision():
        a = mx.array(x) / 3
        assert wide_value(a) is not None and low_word(a) is not None
        b = a.reshape(3, 4).T
        wide = wide_value(b)
        assert wide is not None and np.array_equal(np.array(wide[0]),
                                                   (x.astype(np.float64) / 3).reshape(3, 4).T)
        c = mx.exp(b) * 7
        y = np.array(c)
    ref = np.exp((x.astype(np.float64) / 3).reshape(3, 4).T) * 7
    assert np.array_equal(y, ref.astype(np.float32))


@pytest.mark.parametrize("backend", ["cpu", "emulate"])
def test_setitem_drops_a_stale_float64_value(backend):
    """An in-place update changes the words: the carried float64 value must go
    with the old words (else the next op would read the value from before)."""
    with mp.use_backend(backend), mp.extended_precision():
        a = mx.array(np.ones(4, np.float32)) / 3
        a[1] = 5.0
        y = np.array(a * 3)
    assert y[1] == 15.0 and y[0] == 1.0


def test_low_word_built_on_demand_matches_the_split():
    """On cpu a result's low word is built from its float64 value when first read
    (carry.low_word, DoubleWord.lo): it must be the split of that value."""
    x = np.linspace(-3.0, 3.0, 25).astype(np.float32)
    with mp.use_backend("cpu"), mp.extended_precision():
        y = mx.exp(mx.array(x) / 7) * 0.1
        wide = wide_value(y)
        lo = np.array(low_word(y))
        hi = np.array(y)
    v = np.array(wide[0])
    ref_hi, ref_lo = _split_numpy(v)
    assert np.array_equal(hi, ref_hi) and np.array_equal(lo, ref_lo)
    assert np.max(np.abs(v - np.exp(x.astype(np.float64) / 7) * 0.1)) < 1e-15
    with mx.stream(mx.cpu):
        z = from64(mx.array(np.array([1 / 3, -1e-3]), dtype=mx.float64), None)
    assert z._lo is None  # not built yet
    assert np.array_equal(np.array(z.lo), _split_numpy(np.array([1 / 3, -1e-3]))[1])


# ---- the fused float64 steps and exp (doubleword.engine64) -------------------------

def _ulps(got: np.ndarray, x: np.ndarray, f) -> np.ndarray:
    """|got - f(x)| in units of the last place of the exact value (mpmath, 120 bits)."""
    import mpmath

    out = []
    with mpmath.workprec(120):
        for g, v in zip(got, x):
            ref = f(mpmath.mpf(float(v)))
            ulp = mpmath.mpf(2) ** max(int(mpmath.floor(mpmath.log(ref, 2))) - 52, -1074)
            out.append(float(abs(mpmath.mpf(float(g)) - ref) / ulp))
    return np.array(out)


def test_exp64_within_one_ulp_and_its_special_values():
    import mpmath

    from mlx_precise.doubleword.engine64 import exp64

    rng = np.random.default_rng(11)
    x = np.concatenate([rng.uniform(-1, 1, 3000), rng.uniform(-745, 709.7, 3000),
                        rng.uniform(-745.1, -708, 500)])  # the last: subnormal results
    with mx.stream(mx.cpu):
        got = np.array(exp64(mx.array(x, dtype=mx.float64)))
    assert _ulps(got, x, mpmath.exp).max() <= 1.0  # (1 + expm1(|x|) reached 1.9 ulp)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 709.78, 709.79, -745.1, -745.2,
                        -1e300, 1e300])
    with mx.stream(mx.cpu):
        got = np.array(exp64(mx.array(special, dtype=mx.float64)))
    with np.errstate(over="ignore"):
        ref = np.exp(special)
    assert np.array_equal(got, ref, equal_nan=True)


@pytest.mark.parametrize("op", ["add", "div"])
def test_fused_steps_give_the_bits_of_separate_ops(op):
    """A step compiled into one loop (>= FUSE_MIN elements) and the same step as
    separate MLX ops give the same bits, with every way an operand is read (its
    float64 value, its high word alone, its two words, a scalar constant), and the
    high word computed from the operands is the rounding of the float64 result."""
    from mlx_precise.doubleword import engine64
    from mlx_precise.extended.arith import constant

    rng = np.random.default_rng(12)
    n = engine64.FUSE_MIN
    v = np.concatenate([SPECIALS, rng.standard_normal(n) * 10.0 ** rng.integers(-20, 20, n)])
    w = rng.standard_normal(v.size) * 3.0
    hi, lo = _split_numpy(v)
    with mx.stream(mx.cpu):
        forms = {"wide": from64(mx.array(v, dtype=mx.float64)),
                 "exact": DoubleWord.exact(mx.array(w.astype(np.float32))),
                 "words": DoubleWord(mx.array(hi), mx.array(lo)), "scalar": constant(0.1)}

    def head(x):  # the first 100 elements, read the same way
        if x.size == 1:
            return x
        if x.wide is not None:
            return DoubleWord.from_wide(x.hi[:100], (x.wide[0][:100], None))
        return DoubleWord.exact(x.hi[:100]) if x._lo is None else DoubleWord(x.hi[:100],
                                                                             x.lo[:100])

    # (each compiled pair costs a kernel build the first time: a few pairs that read
    # every form on each side)
    for a, b in (("wide", "exact"), ("exact", "words"), ("words", "scalar")):
        fused = engine64.arith64(op, forms[a], forms[b])
        small = engine64.arith64(op, head(forms[a]), head(forms[b]))
        with mx.stream(mx.cpu):
            f64, rounded = np.array(fused.wide[0]), np.array(fused.hi)
            assert np.array_equal(np.array(small.wide[0]), f64[:100], equal_nan=True)
        with np.errstate(all="ignore"):
            assert np.array_equal(rounded.view(np.uint32),
                                  f64.astype(np.float32).view(np.uint32)), (a, b)


def _scalar64(f: float) -> float:
    """A Python number as the flow reads it: its float64 value, Inf where float32
    overflows (the kernels' rule)."""
    with np.errstate(over="ignore"):
        return f if np.isfinite(np.float32(f)) or not np.isfinite(f) else float(np.float32(f))


@pytest.mark.parametrize("op", ["+", "-", "*", "/"])
def test_flow_arithmetic_on_cpu_is_the_float64_operation(op):
    """``x op y`` in a cpu block, operands read every way a small step reads them
    (a carried float64 value, an exact float32 array, Python numbers including
    ones float32 does not hold, signed zeros, NaN, Inf and overflow), either side:
    the carried value is numpy's float64 operation on the operands' float64
    values, bit for bit, and the array is its float32 rounding."""
    import operator

    f = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}[op]
    rng = np.random.default_rng(21)
    base = np.concatenate([SPECIALS, rng.standard_normal(30) * 10.0 ** rng.integers(-8, 8, 30)])
    with np.errstate(over="ignore"):
        x32 = base.astype(np.float32)
    e32 = rng.standard_normal(base.size).astype(np.float32)
    scalars = [0.1, -0.0, 0.0, 3, 1e300, -np.inf, np.nan, 2.0 ** -140, 1 / 3]
    with mp.use_backend("cpu"), mp.extended_precision(strict=True), np.errstate(all="ignore"):
        carried = mx.array(x32) / 3  # carries x32 / 3 in float64
        exact = mx.array(e32)
        values = {"carried": (carried, x32.astype(np.float64) / 3),
                  "exact": (exact, e32.astype(np.float64))}
        cases = [(values[a], values[b]) for a in values for b in values]
        cases += [(v, (s, _scalar64(s))) for v in values.values() for s in scalars]
        cases += [((s, _scalar64(s)), v) for v in values.values() for s in scalars]
        for (a, a64), (b, b64) in cases:
            z = f(a, b)
            wide = wide_value(z)
            assert wide is not None and wide[1] is None
            got, ref = np.array(wide[0]), f(np.asarray(a64), np.asarray(b64))
            assert np.array_equal(got, ref, equal_nan=True), (op, a64, b64)
            assert np.array_equal(np.array(z).view(np.uint32)[np.isfinite(ref)],
                                  ref.astype(np.float32).view(np.uint32)[np.isfinite(ref)])


def test_inplace_update_on_cpu_keeps_the_float64_value():
    """``v += g`` in a cpu block leaves v carrying the float64 sum (as ``v + g``
    does), not its rounding to two words; other references see the update."""
    rng = np.random.default_rng(4)
    x, g = rng.standard_normal((2, 40)).astype(np.float32)
    with mp.use_backend("cpu"), mp.extended_precision(strict=True):
        v = mx.array(x) * 0.9
        alias = v
        v += mx.array(g) / 7
        wide = wide_value(v)
        assert wide is not None and alias is v
        got, hi = np.array(wide[0]), np.array(v)
        w = v * 1.0  # the next step reads the carried value
        again = np.array(wide_value(w)[0])
    ref = x.astype(np.float64) * 0.9 + g.astype(np.float64) / 7
    assert np.array_equal(got, ref) and np.array_equal(again, ref)
    assert np.array_equal(hi, ref.astype(np.float32))
