"""The cpu backend's FFT scalings (``fft_scale_extended``, ``scale_extended``): lazy
MLX float64 ops on the carried float64 value, against IEEE float64 division /
multiplication by numpy and exact rationals (fractions), special values, values
near 2^127, float32 and float64 subnormals, complex parts one by one."""

from fractions import Fraction

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.doubleword.elementwise import scale_extended
from mlx_precise.doubleword.engine64 import FUSE_MIN, from64

SPECIAL = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1.9 * 2.0**127, -3.4e38, 2.0**-149,
                    -1.3 * 2.0**-140, 1.17e-38, 1.0, 3.0, 0.1], np.float32)


def _data(size: int) -> np.ndarray:
    rng = np.random.default_rng(size)
    x = (rng.standard_normal(size) * 2.0 ** rng.integers(-140, 127, size)).astype(np.float32)
    x[:SPECIAL.size] = SPECIAL
    return x


def _exact_quotient(v: float, n: int) -> float:
    """v / n rounded once to float64 (Fraction.__float__ rounds correctly)."""
    return float(Fraction(v) / n) if np.isfinite(v) else v / n


@pytest.mark.parametrize("size", [SPECIAL.size + 20, FUSE_MIN + 5])  # separate ops / compiled
@pytest.mark.parametrize("n", [1, 2, 3, 7, 1000, 1024, 2**20])
def test_fft_scale_is_the_correctly_rounded_quotient(size, n):
    x = _data(size)
    with np.errstate(all="ignore"):
        ref = x.astype(np.float64) / n
    y = mp.fft_scale_extended(mx.array(x), n, round_output=False, backend="cpu")
    assert y.wide is not None  # the float64 value is carried, no low word built
    assert y._lo is None
    np.testing.assert_array_equal(y.to_float64(), ref)
    for v, r in zip(x[:SPECIAL.size + 20], y.to_float64()):
        assert np.array_equal(r, _exact_quotient(float(v), n), equal_nan=True)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(np.array(mp.fft_scale_extended(mx.array(x), n, backend="cpu")),
                                      ref.astype(np.float32))
    # words of the split: hi = RN32(v), lo = RN32(v - hi), lo = 0 where hi is not finite
    hi, lo = np.array(y.hi), np.array(y.lo)
    np.testing.assert_array_equal(hi, ref.astype(np.float32))
    finite = np.isfinite(hi)
    np.testing.assert_array_equal(lo[~finite], 0)
    np.testing.assert_array_equal(lo[finite], (ref[finite] - hi[finite]).astype(np.float32))


def test_float64_value_is_read_not_the_words():
    """A DoubleWord carrying float64 values beyond float32 (subnormal and tiny
    float64s) is scaled from those values, and its low word is never built."""
    v = np.array([1e-310, 5e-324, -3e-320, 2.2250738585072014e-308, 1e-300, 7e-46,
                  1e39, -np.inf, np.nan], np.float64)
    for size in (v.size, FUSE_MIN + 1):
        w = np.resize(v, size)
        with mx.stream(mx.cpu):
            x = from64(mx.array(w, dtype=mx.float64))
        for n in (2, 3, 1024):
            y = mp.fft_scale_extended(x, n, round_output=False, backend="cpu")
            np.testing.assert_array_equal(y.to_float64(), w / n)
            assert x._lo is None and y._lo is None
        y = scale_extended(x, Fraction(8), round_output=False, backend="cpu")
        np.testing.assert_array_equal(y.to_float64(), w * 8)


def test_complex_parts_scale_one_by_one():
    """Each part is divided on its own: an infinite part leaves the other finite
    (complex128 / n in numpy is a complex division, whose 0 * inf gives NaN)."""
    x = _data(64)
    c = np.empty(x.shape, np.complex64)
    c.real, c.imag = x, x[::-1]
    y = mp.fft_scale_extended(mx.array(c), 5, round_output=False, backend="cpu")
    z = y.to_float64()
    np.testing.assert_array_equal(z.real, x.astype(np.float64) / 5)
    np.testing.assert_array_equal(z.imag, x[::-1].astype(np.float64) / 5)
    with np.errstate(all="ignore"):
        ref = np.empty(c.shape, np.complex64)
        ref.real, ref.imag = (x.astype(np.float64) / 5).astype(np.float32), \
            (x[::-1].astype(np.float64) / 5).astype(np.float32)
    np.testing.assert_array_equal(np.array(mp.fft_scale_extended(mx.array(c), 5, backend="cpu")), ref)


@pytest.mark.parametrize("factor", [Fraction(1, 3), Fraction(4), Fraction(1, 1024),
                                    Fraction(1, 7)])
def test_scale_extended_times_the_float64_factor(factor):
    """x * RN64(factor), one rounding of the float64 product (exact for powers of two)."""
    x = _data(200)
    y = scale_extended(mx.array(x), factor, round_output=False, backend="cpu")
    f = float(factor)
    expect = [float(Fraction(float(v)) * Fraction(f)) if np.isfinite(v) else float(v) * f
              for v in x]
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(y.to_float64(), np.array(expect))


def test_overflow_near_2_127():
    """Scaling up past float32's range: the float64 value stays finite and exact,
    the high word is Inf with a zero low word (the kernels' special-value rule)."""
    x = np.array([1.9 * 2.0**127, -2.0**127, 2.0**126], np.float32)
    y = scale_extended(mx.array(x), Fraction(4), round_output=False, backend="cpu")
    np.testing.assert_array_equal(y.to_float64(), x.astype(np.float64) * 4)
    np.testing.assert_array_equal(np.array(y.hi), [np.inf, -np.inf, np.inf])  # 2^126 * 4 = 2^128
    np.testing.assert_array_equal(np.array(y.lo), [0, 0, 0])
    np.testing.assert_array_equal(np.array(scale_extended(mx.array(x), Fraction(1, 2),
                                                          backend="cpu")), x / 2)
