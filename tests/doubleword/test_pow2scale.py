"""The exact power-of-two row scaling of the FFTs (mlx_precise/doubleword/pow2scale.py)
against numpy: the exponents from frexp, the scalings as float64 products (exact for
powers of two), the special-value rule of the low words."""

from __future__ import annotations

import numpy as np
import pytest

import mlx.core as mx
from mlx_precise.doubleword import pow2scale

INF, NAN = np.inf, np.nan
# the oracle overflows float32 on purpose (rows near 2^128 scaled up)
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _rows(complex_: bool) -> np.ndarray:
    rng = np.random.default_rng(3)
    mags = [0.0, 1e-45, 1e-30, 1.0, 3.0, 1e30, 2.0**120, 2.0**126, 3e38, 3.4e38]
    rows = [rng.standard_normal(6) * m for m in mags]
    rows += [np.array([1.0, INF, 2, 0, 0, 0]), np.array([NAN, 1, 2, 3, 4, 5]),
             np.array([-INF, 0, 0, 0, 0, 1e38]), np.full(6, 2.0**124)]
    a = np.array(rows, np.float32)
    if complex_:
        b = np.roll(a, 1, axis=0)[:, ::-1]
        a = (a + 1j * b).astype(np.complex64)
    return a


def _oracle_exponents(a: np.ndarray, growth: int) -> np.ndarray:
    m = np.max(np.abs(a.astype(np.complex128 if np.iscomplexobj(a) else np.float64)),
               axis=-1, keepdims=True).astype(np.float32).astype(np.float64)
    e = np.zeros(m.shape, np.int64)
    for i, v in enumerate(m[:, 0]):
        if not np.isfinite(v) or v == 0:
            continue
        # the smallest e >= 0 with 2^(floor(log2 v) + 1) * 2^growth * 2^-e <= 2^124
        # (v < 2^(floor(log2 v) + 1): the bound the exponent field gives)
        top = np.frexp(np.float32(v))[1] if v >= 2.0**-126 else -125
        e[i, 0] = min(max(top + growth - pow2scale.HEADROOM, 0), 126)
    return e


@pytest.mark.parametrize("complex_", [False, True])
@pytest.mark.parametrize("growth", [0, 11, 40, 94])
def test_row_exponents(complex_, growth):
    a = _rows(complex_)
    e = np.array(pow2scale.row_exponents(mx.array(a), growth))
    assert e.dtype == np.int32
    assert np.array_equal(e, _oracle_exponents(a, growth))


@pytest.mark.parametrize("complex_", [False, True])
def test_scale_and_unscale_are_exact_products(complex_):
    a = _rows(complex_)
    e = np.arange(a.shape[0], dtype=np.int32)[:, None] * 9 % 127  # 0 ... 126
    s = np.array(pow2scale.scale(mx.array(a), mx.array(e)))
    parts = (lambda z: (z.real, z.imag)) if complex_ else (lambda z: (z,))
    want = [p.astype(np.float64) * 2.0**-e for p in parts(a)]
    for got, w in zip(parts(s), want):  # part by part: an Inf part stays Inf
        w32 = w.astype(np.float32)
        # Apple GPUs flush float32 subnormals; the cpu stream keeps them: compare
        # where the product is normal or zero
        keep = ~((np.abs(w) < 2.0**-126) & (w != 0))
        assert np.array_equal(got[keep], w32[keep], equal_nan=True)
    lo = (a * np.float32(2.0**-30)).astype(a.dtype)
    hi2, lo2 = pow2scale.unscale(mx.array(a), mx.array(lo), mx.array(e))
    hi2, lo2 = np.array(hi2), np.array(lo2)
    for got, p in zip(parts(hi2), parts(a)):
        assert np.array_equal(got, (p.astype(np.float64) * 2.0**e).astype(np.float32),
                              equal_nan=True)
    finite = np.all([np.isfinite(p) for p in parts(hi2)], axis=0)
    for got, p in zip(parts(lo2), parts(lo)):
        w = np.where(finite, (p.astype(np.float64) * 2.0**e).astype(np.float32), 0)
        assert np.array_equal(got, w, equal_nan=True)
    assert np.any(~finite) and np.any(finite & (e > 0))
