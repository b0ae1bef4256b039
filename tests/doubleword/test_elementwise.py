"""Double-word complex multiply and FFT scaling against exact rational oracles,
on the emulate (Metal kernels) and cpu (native float64) backends."""

from fractions import Fraction

import mlx.core as mx
import numpy as np
import pytest
from oracle import Exact, rounding_check, round_f32_fraction

from mlx_precise import DoubleWord
from mlx_precise.doubleword.elementwise import (
    complex_multiply_extended,
    fft_scale_extended,
    reciprocal_words,
)

BACKENDS = ("emulate", "cpu")


def wide_f32(rng, n, lo=-30, hi=30):
    """float32 with random signs and exponents in [lo, hi]."""
    m = rng.uniform(1, 2, n) * rng.choice([-1.0, 1.0], n)
    return (m * 2.0 ** rng.integers(lo, hi + 1, n)).astype(np.float32)


def complex_operands(n, seed):
    """Random complex64 pairs over a wide exponent range, the last tenth with heavy
    cancellation in the real part (ar*br ~ ai*bi) and the imaginary part."""
    rng = np.random.default_rng(seed)
    ar, ai, br, bi = (wide_f32(rng, n) for _ in range(4))
    k = n // 10
    bi[-k:] = (ar[-k:].astype(np.float64) * br[-k:] / ai[-k:]).astype(np.float32)
    j = slice(-2 * k, -k)
    bi[j] = (-ai[j].astype(np.float64) * br[j] / ar[j]).astype(np.float32)
    return (ar + 1j * ai).astype(np.complex64), (br + 1j * bi).astype(np.complex64)


def test_rounding_check_agrees_with_fractions():
    """Cross-check of the oracle's rounding verdicts with Fraction arithmetic."""
    rng = np.random.default_rng(5)
    num = wide_f32(rng, 3000)
    den = 7
    rn = np.array([round_f32_fraction(Fraction(float(v)) / den) for v in num], np.float32)
    c = rn.copy()
    c[::3] = np.nextafter(rn[::3], np.float32(np.inf))
    exact, faithful = rounding_check(c, Exact.f32(num), den)
    truth_exact = c == rn
    truth_faithful = np.array([
        min(float(a), float(b)) < float(Fraction(float(v)) / den) < max(float(a), float(b))
        or Fraction(float(x)) == Fraction(float(v)) / den
        for x, v, a, b in zip(c, num, np.nextafter(c, np.float32(-np.inf)),
                              np.nextafter(c, np.float32(np.inf)))
    ])
    assert (exact == truth_exact).all()
    assert (faithful == truth_faithful).all()


@pytest.mark.parametrize("backend,n", [("emulate", 1_000_000), ("cpu", 200_000)])
def test_complex_multiply_rounding(backend, n):
    a, b = complex_operands(n, seed=1)
    z = np.array(complex_multiply_extended(mx.array(a), mx.array(b), backend=backend))
    ar, ai, br, bi = (Exact.f32(np.ascontiguousarray(v)) for v in (a.real, a.imag, b.real, b.imag))
    re_exact, re_faith = rounding_check(np.ascontiguousarray(z.real), ar * br - ai * bi)
    im_exact, im_faith = rounding_check(np.ascontiguousarray(z.imag), ar * bi + ai * br)
    assert re_faith.all() and im_faith.all()
    frac = (re_exact & im_exact).mean()
    print(f"{backend}: complex multiply exactly rounded (both parts) {100 * frac:.5f}%")
    assert frac >= 0.99999
    # Plain float32 a * b on the same data, recorded for comparison (not a claim).
    p = np.array(mx.array(a) * mx.array(b))
    p_exact = rounding_check(np.ascontiguousarray(p.real), ar * br - ai * bi)[0]
    print(f"plain complex64 a*b: real part exactly rounded {100 * p_exact.mean():.3f}%")
    assert p_exact.mean() < frac  # the cancellation cases defeat plain float32


def test_complex_multiply_broadcast_doubleword_and_scalar():
    rng = np.random.default_rng(2)
    a = (rng.standard_normal((4, 1, 5)) + 1j * rng.standard_normal((4, 1, 5))).astype(np.complex64)
    b = (rng.standard_normal((3, 1)) + 1j * rng.standard_normal((3, 1))).astype(np.complex64)
    z = complex_multiply_extended(mx.array(a), mx.array(b), backend="emulate")
    assert z.shape == (4, 3, 5)
    ref = (a.astype(np.complex128) * b)
    np.testing.assert_array_equal(np.array(z), ref.astype(np.complex64))
    # DoubleWord operands (float64 data) and an unrounded DoubleWord result.
    x64 = rng.standard_normal(64) + 1j * rng.standard_normal(64)
    y64 = rng.standard_normal(64) + 1j * rng.standard_normal(64)
    d = complex_multiply_extended(DoubleWord.from_float64(x64), DoubleWord.from_float64(y64),
                                  round_output=False, backend="emulate")
    assert isinstance(d, DoubleWord) and d.dtype == mx.complex64
    err = np.abs(d.to_float64() - x64 * y64) / np.abs(x64 * y64)
    assert err.max() < 2.0**-44  # split (2^-49 each) + 8.66 u^2 normwise
    # 0-d operands give a 0-d result.
    s = complex_multiply_extended(mx.array(np.complex64(1 + 2j)), mx.array(np.complex64(3 - 1j)),
                                  backend="emulate")
    assert s.shape == () and s.item() == (1 + 2j) * (3 - 1j)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fft_scale_powers_of_two_exact(backend):
    rng = np.random.default_rng(3)
    x = wide_f32(rng, 4096, -60, 60)
    for k in range(0, 31, 3):
        y = np.array(fft_scale_extended(mx.array(x), 2**k, backend=backend))
        assert (y == x / np.float32(2.0**k)).all(), k  # exact: no rounding at all


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [3, 1000, 3 * 2**20])
def test_fft_scale_exactly_rounded(backend, n):
    rng = np.random.default_rng(n)
    x = wide_f32(rng, 1_000_000)
    y = np.array(fft_scale_extended(mx.array(x), n, backend=backend))
    exact, faithful = rounding_check(y, Exact.f32(x), n)
    assert faithful.all()
    print(f"{backend} n={n}: {100 * exact.mean():.5f}% exactly rounded")
    assert exact.mean() >= 0.99999


def test_fft_scale_complex_and_doubleword():
    rng = np.random.default_rng(4)
    z = (wide_f32(rng, 1000) + 1j * wide_f32(rng, 1000)).astype(np.complex64)
    y = np.array(fft_scale_extended(mx.array(z), 3, backend="emulate"))
    for part_y, part_x in ((y.real, z.real), (y.imag, z.imag)):
        exact, faithful = rounding_check(np.ascontiguousarray(part_y),
                                         Exact.f32(np.ascontiguousarray(part_x)), 3)
        assert faithful.all() and exact.mean() >= 0.999
    x64 = rng.standard_normal(1000) * 1e3
    d = fft_scale_extended(DoubleWord.from_float64(x64), 1000, round_output=False, backend="emulate")
    assert isinstance(d, DoubleWord)
    assert np.max(np.abs(d.to_float64() - x64 / 1000) / np.abs(x64 / 1000)) < 2.0**-45


def test_reciprocal_words_from_exact_rational():
    for n in (1, 3, 7, 1000, 3 * 2**20, 2**31 - 1):
        hi, lo = reciprocal_words(n)
        err = abs(Fraction(hi) + Fraction(lo) - Fraction(1, n))
        assert err <= Fraction(1, 2**48) / n
        assert np.float32(hi) == round_f32_fraction(Fraction(1, n))


def test_bad_input():
    c = mx.array(np.ones(4, np.complex64))
    with pytest.raises(TypeError, match="a has dtype mlx.core.float32, expected complex64"):
        complex_multiply_extended(mx.ones(4), c, backend="emulate")
    # real float64 data would enter as a real DoubleWord: refused before the split
    with pytest.raises(TypeError, match="b has dtype mlx.core.float64, expected complex64"):
        complex_multiply_extended(c, mx.ones(4, mx.float64), backend="emulate")
    with pytest.raises(ValueError, match="do not broadcast"):
        complex_multiply_extended(c, mx.array(np.ones(3, np.complex64)), backend="emulate")
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="n must be an integer >= 1"):
            fft_scale_extended(mx.ones(4), bad, backend="emulate")
    with pytest.raises(TypeError, match="x has dtype mlx.core.int32"):
        fft_scale_extended(mx.ones(4, mx.int32), 3, backend="emulate")
    with pytest.raises(TypeError, match="float32 or both complex64"):
        DoubleWord(mx.ones(3), mx.ones(3, mx.float16))
    with pytest.raises(ValueError, match="one shape"):
        DoubleWord(mx.ones(3), mx.ones(4))
