"""Complex exp on the kernel backends reads and writes the interleaved words of its
complex64 arrays (dw_math, FN = cexp; mlx_precise/doubleword/functions.py _cexp): no
split into parts nor join. Against mpmath on emulate for shapes of several axes, with
and without low words; an empty shape; one launch and no glue on the metal path."""

import mlx.core as mx
import mpmath
import numpy as np
import pytest

from mlx_precise import DoubleWord
from mlx_precise.doubleword import functions as dwmath
from mlx_precise.testing import graph_counts, lazy_metal_executor

mpmath.mp.prec = 120


def _complex(rng, shape):
    re = rng.uniform(-20, 20, shape).astype(np.float32)
    im = (rng.standard_normal(shape) * 2.0 ** rng.integers(-10, 12, shape)).astype(np.float32)
    return np.stack([re, im], -1).view(np.complex64)[..., 0]


@pytest.mark.parametrize("shape, exact", [((5, 7), False), ((3, 1, 4), True), ((1,), False)])
def test_against_mpmath(shape, exact):
    rng = np.random.default_rng(sum(shape))
    hi = _complex(rng, shape)
    lo = (hi * np.complex64(rng.uniform(-2.0**-25, 2.0**-25))).astype(np.complex64)
    x = DoubleWord.exact(mx.array(hi)) if exact else DoubleWord(mx.array(hi), mx.array(lo))
    z = dwmath.unary("exp", x, "emulate")
    assert z.shape == shape and z.dtype == mx.complex64
    zh, zl = np.array(z.hi).reshape(-1), np.array(z.lo).reshape(-1)
    xh, xl = hi.reshape(-1), (0 * lo if exact else lo).reshape(-1)
    for i in range(xh.size):
        v = mpmath.mpc(float(xh[i].real), float(xh[i].imag)) + mpmath.mpc(float(xl[i].real),
                                                                           float(xl[i].imag))
        want = mpmath.exp(v)
        got = mpmath.mpc(float(zh[i].real), float(zh[i].imag)) + mpmath.mpc(
            float(zl[i].real), float(zl[i].imag))
        assert abs(got - want) <= 2.0**-44 * abs(want), (i, got, want)


def test_empty():
    z = dwmath.unary("exp", DoubleWord.exact(mx.zeros((0, 3), mx.complex64)), "emulate")
    assert z.shape == (0, 3) and z.dtype == mx.complex64


def test_one_launch_no_glue_on_metal():
    rng = np.random.default_rng(2)
    x = DoubleWord(mx.array(_complex(rng, (4, 6))), mx.array(_complex(rng, (4, 6)) * 1e-8))
    mx.eval(x.hi, x.lo)
    with lazy_metal_executor():
        z = dwmath.unary("exp", x, "metal")
        g = graph_counts(z.hi, z.lo)
    assert g["launches"] == 1 and g["glue"] == 0, g["by_primitive"]
