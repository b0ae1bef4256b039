"""Complex division on the kernel backends: one cdw_div launch (metal/kernels/cdw_div.metal)
with the scalings and float32's rule for special operands inside. On emulate: bit for bit
the former path (the scalings by MLX ops around the cdw_ops / dw_ops kernels, the rule by
MLX ops), on operands from subnormal to near overflow, quotients that over- and underflow
(gradual underflow, as float32 multiplication rounds), Inf / NaN / zero parts, real
numerators; against mpmath (normwise <= 32u^2); on the metal path one launch and two
glue primitives."""

import mlx.core as mx
import mpmath
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.doubleword import DoubleWord
from mlx_precise.doubleword.arithmetic import operate
from mlx_precise.doubleword.kernel_engine import arith_kernels
from mlx_precise.doubleword.types import as_complex, combine, real_imag
from mlx_precise.testing import graph_counts, lazy_metal_executor

mpmath.mp.prec = 200
U = 2.0**-24


def _words(rng, n: int, special: bool = True):
    """complex64 (hi, lo) of n values with parts 2^-160 .. 2^128 (subnormal high
    words included), low words up to u/2 relative, and (``special``) Inf, NaN and
    zero parts."""
    e = rng.integers(-160, 128, (n, 2)).astype(float)
    v = rng.uniform(1, 2, (n, 2)) * rng.choice([-1.0, 1.0], (n, 2)) * 2.0**e
    hi = v.astype(np.float32)
    lo = (rng.uniform(-1, 1, (n, 2)) * np.abs(hi.astype(float)) * 2.0**-25).astype(np.float32)
    if special:
        pick = rng.uniform(size=(n, 2))
        hi[pick < 0.01] = np.inf
        hi[(pick > 0.01) & (pick < 0.02)] = np.nan
        hi[(pick > 0.02) & (pick < 0.05)] = 0
        hi[(pick > 0.05) & (pick < 0.06)] = -np.inf
    lo[~np.isfinite(hi) | (hi == 0)] = 0
    return tuple(a.view(np.complex64)[:, 0] for a in (hi, lo))  # bit for bit


def _pow2(e):
    return ((e + 127) << 23).view(mx.float32)


def _former(x: DoubleWord, y: DoubleWord) -> DoubleWord:
    """The former path of x / y on the kernel backends: exponents of the larger
    parts' high words, each operand scaled by two powers of two (MLX multiplies), the
    product x' conj(y') by cdw_ops, |y'|^2 and the quotients by dw_ops, the result
    scaled back by three; where an operand has an Inf or NaN part or y = 0, MLX's
    complex64 quotient of the high words with a zero low word, and zero low words
    where the quotient is not finite."""
    def exponent(w):
        big = mx.max(mx.abs(w.hi.reshape(w.hi.shape + (1,)).view(mx.float32)), axis=-1)
        return mx.clip(big.view(mx.int32) >> 23, 1, 254) - 127

    def scale(w, e, parts):
        for k in range(parts, 0, -1):
            ek = e // k if k > 1 else e
            f = _pow2(ek)[..., None]
            w = DoubleWord(*((a.reshape(a.shape + (1,)).view(mx.float32) * f)
                             .view(mx.complex64).reshape(a.shape) for a in (w.hi, w.lo)))
            e = e - ek
        return w

    ex, ey = exponent(as_complex(x)), exponent(y)
    xs, ys = scale(as_complex(x), -ex, 2), scale(y, -ey, 2)
    yr, yi = real_imag(ys)
    d = arith_kernels("add", arith_kernels("mul", yr, yr, "emulate", None),
                      arith_kernels("mul", yi, yi, "emulate", None), "emulate", None)
    num = arith_kernels("mul", xs, DoubleWord(mx.conj(ys.hi), mx.conj(ys.lo)), "emulate", None)
    nr, ni = real_imag(num)
    q = scale(combine(arith_kernels("div", nr, d, "emulate", None),
                      arith_kernels("div", ni, d, "emulate", None)), ex - ey, 3)

    def finite(a):
        return (a - a) == 0

    special = ~finite(x.hi) | ~finite(y.hi) | (y.hi == 0)
    hi = mx.where(special, x.hi / y.hi, q.hi)
    return DoubleWord(hi, mx.where(special | ~finite(hi), mx.array(0, mx.complex64), q.lo))


def _bits(a) -> np.ndarray:
    f = np.array(a).view(np.float32)
    return np.where(np.isnan(f), np.float32(np.nan), f).view(np.uint32)  # one NaN


@pytest.mark.parametrize("seed", [1, 2])
def test_bits_of_the_former_path(seed):
    rng = np.random.default_rng(seed)
    n = 3000
    xh, xl = _words(rng, n)
    yh, yl = _words(rng, n)
    with np.errstate(over="ignore", invalid="ignore"):  # moderate quotients too
        yh[:800] = xh[:800] * np.complex64(0.7 + 1.3j)
    x = DoubleWord(mx.array(xh), mx.array(xl))
    y = DoubleWord(mx.array(yh), mx.array(yl))
    real_x = DoubleWord(mx.array(xh.real.copy()), mx.array(xl.real.copy()))
    with mp.use_backend("emulate"):
        for a in (x, real_x):
            z, want = operate("div", a, y, "emulate"), _former(a, y)
            for got, ref in ((z.hi, want.hi), (z.lo, want.lo)):
                assert np.array_equal(_bits(got), _bits(ref))
    h = np.array(z.hi).view(np.float32)
    tiny = (np.abs(h) < 2.0**-126) & (h != 0)
    assert tiny.sum() > 20 and np.isinf(h).sum() > 20  # gradual underflow and overflow


def test_broadcast_operands():
    rng = np.random.default_rng(4)
    xh, xl = _words(rng, 12, special=False)
    yh, yl = _words(rng, 4, special=False)
    x = DoubleWord(mx.array(xh.reshape(3, 4)), mx.array(xl.reshape(3, 4)))
    y = DoubleWord(mx.array(yh), mx.array(yl))
    with mp.use_backend("emulate"):
        z, want = operate("div", x, y, "emulate"), _former(x, y)
        assert z.shape == (3, 4)
        assert np.array_equal(_bits(z.hi), _bits(want.hi))
        assert np.array_equal(_bits(z.lo), _bits(want.lo))


def test_against_mpmath():
    """Normwise <= 32u^2 for quotients in float32's normal range with low words
    above 2^-126 (the bound's range)."""
    rng = np.random.default_rng(7)
    n = 300
    mags = 2.0 ** rng.uniform(-60, 60, (2, n))
    za = mags[0] * np.exp(1j * rng.uniform(0, 2 * np.pi, n))
    zb = mags[1] * np.exp(1j * rng.uniform(0, 2 * np.pi, n))
    x, y = DoubleWord.from_float64(za), DoubleWord.from_float64(zb)
    with mp.use_backend("emulate"):
        z = operate("div", x, y, "emulate")

    def value(w, i):
        h, l = np.array(w.hi)[i], np.array(w.lo)[i]
        return mpmath.mpc(float(h.real), float(h.imag)) + mpmath.mpc(float(l.real), float(l.imag))

    worst = max(float(abs(value(z, i) - value(x, i) / value(y, i)) / abs(value(x, i) / value(y, i)))
                for i in range(n))
    assert 0 < worst <= 32 * U**2


def test_one_launch_on_metal():
    rng = np.random.default_rng(5)
    x, y = (DoubleWord(*(mx.array(a) for a in _words(rng, 64))) for _ in range(2))
    mx.eval(x.hi, x.lo, y.hi, y.lo)
    with lazy_metal_executor():
        z = operate("div", x, y, "metal")
        g = graph_counts(z.hi, z.lo)
    assert g["launches"] == 1
    assert g["glue"] == 2, g["by_primitive"]  # float32's quotient where special, a select
