"""Sampling with carried parameters (bernoulli, randint, multivariate_normal) and
quantized weights (dequantize, quantized_matmul, gather_qmm) against float64
oracles built from MLX's own draws and codes (numpy, scipy)."""

import mlx.core as mx
import numpy as np
import pytest
import scipy.special

import mlx_precise as mp

from flow_helpers import f64, rng_f32, share, value64

BELOW_MINUS_ONE = float(np.nextafter(np.float32(-1), np.float32(0)))


def _uniform(shape, key):
    """MLX's float32 draw on [0, 1) for ``key`` (plain MLX, outside any block)."""
    return f64(mx.random.uniform(shape=shape, key=key))


SCALE = float(np.nextafter(np.float32(2.0**32), np.float32(np.inf)))  # MLX's p scale


def test_bernoulli_compares_the_draw_with_the_full_parameter(backend):
    """MLX's rule is ``bits < p (2^32 + 2^9)``, its draw r = 2^32 u (u its uniform
    of the same key; checked on plain MLX); with p carried, p a hair (2^-40
    relative) either side of r / (2^32 + 2^9), the exact comparison decides:
    float64 oracle ``r < p (2^32 + 2^9)``. NaN p gives False, Inf and 2^127
    True, as MLX."""
    key, n = mx.random.key(7), 4000
    r = _uniform((n,), key) * 2.0**32
    p_plain = mx.random.uniform(shape=(n,), key=mx.random.key(1))
    np.testing.assert_array_equal(np.array(mx.random.bernoulli(p_plain, key=key)),
                                  r < f64(p_plain * np.float32(SCALE)))
    v = r / SCALE * (1 + np.where(np.arange(n) % 2, 1.0, -1.0) * 2.0**-40)
    hi = v.astype(np.float32)
    lo = (v - hi).astype(np.float32)
    with mp.extended_precision(strict=True) as rep:
        p = mx.array(hi) + mx.array(lo)
        got = mx.random.bernoulli(p, key=key)
        pv = value64(p)
    assert rep.extended["random.bernoulli"] == 1
    want = r < pv * SCALE
    np.testing.assert_array_equal(np.array(got), want)
    assert want.sum() == n // 2
    plain = np.array(mx.random.bernoulli(mx.array(hi), key=key))
    assert (plain != want).sum() > n // 10  # MLX's float32 product decides otherwise
    with mp.extended_precision(strict=True):
        sp = mx.array(np.array([np.nan, np.inf, -np.inf, 2.0**127], np.float32)) / 3 * 3
        spec = mx.random.bernoulli(sp, (2, 4), key=key)
    np.testing.assert_array_equal(np.array(spec), [[False, True, False, True]] * 2)


def test_randint_floor_and_clip_on_the_exact_bounds(backend):
    """``clip(floor(low + (high - low) u), low, high - 1)`` truncated, with bounds
    2^-30 off integers (float32 rounds them to 3 and 9): the float64 oracle of
    MLX's draw u."""
    key, n = mx.random.key(3), 5000
    u = _uniform((n,), key)
    with mp.extended_precision(strict=True) as rep:
        low = mx.array([3.0]) - mx.array([2.0**-30], mx.float32)  # 3 - 2^-30
        high = mx.array([9.0]) - mx.array([2.0**-30], mx.float32)  # high - 1 < 8
        got = mx.random.randint(low, high, (n,), key=key)
        lv, hv = value64(low), value64(high)
    assert rep.extended["random.randint"] == 1
    want = np.trunc(np.clip(np.floor(lv + (hv - lv) * u), lv, hv - 1)).astype(np.int32)
    assert got.dtype == mx.int32
    np.testing.assert_array_equal(np.array(got), want)
    assert not (want == 8).any()  # high - 1 = 8 - 2^-30: clipped to 7 (trunc)
    assert (np.array(mx.random.randint(mx.array([3.0]), mx.array([9.0]), (n,), key=key))
            == 8).sum() > n // 10  # MLX's float32 bounds: 8 is reached


def test_multivariate_normal_of_carried_mean_and_covariance(backend):
    """``mean + z S`` with S the principal square root of cov (numpy's eigh in
    float64) and z = sqrt(2) erfinv(u) of MLX's draw u (scipy, float64), on both
    backends (on emulate it was MLX's float32 sampler, reported, until linalg.svd
    ran in float64 there)."""
    key = mx.random.key(11)
    m0 = rng_f32(3, 1)
    a = rng_f32((3, 3), 2)
    c0 = (a @ a.T + 0.5 * np.eye(3)).astype(np.float32)
    with mp.extended_precision(strict=True) as rep:
        mean, cov = mx.array(m0) / 3, mx.array(c0) / 3
        got = mx.random.multivariate_normal(mean, cov, (5,), key=key)
        mv, cv = value64(mean), value64(cov)
    assert not rep.float32, rep
    u = f64(mx.random.uniform(BELOW_MINUS_ONE, 1.0, (5, 3), key=key))
    z = np.sqrt(2.0) * scipy.special.erfinv(u)
    lam, vec = np.linalg.eigh(cv)
    want = mv + z @ (vec * np.sqrt(lam)) @ vec.T
    np.testing.assert_allclose(value64(got), want, rtol=2**-40, atol=2**-44)
    assert share(got, want) == 1.0
    # the high words are MLX's sample up to its float32 rounding errors
    np.testing.assert_allclose(np.array(got), np.array(mx.random.multivariate_normal(
        mx.array(mv.astype(np.float32)), mx.array(cv.astype(np.float32)), (5,), key=key)),
        rtol=1e-5, atol=1e-5)


def _codes(wq, s, b, group_size, bits):
    """The integer codes of an affine-quantized matrix, float64 (MLX's dequantize
    with unit scales and zero biases: exact)."""
    return f64(mx.dequantize(wq, mx.ones_like(s), mx.zeros_like(b), group_size, bits))


def _affine(rows=8, cols=128, group_size=64, bits=4, seed=0):
    w = mx.array(rng_f32((rows, cols), seed))
    wq, s, b = mx.quantize(w, group_size=group_size, bits=bits)
    q = _codes(wq, s, b, group_size, bits).reshape(rows, cols // group_size, group_size)
    value = (q * f64(s)[..., None] + f64(b)[..., None]).reshape(rows, cols)
    return wq, s, b, value


@pytest.mark.parametrize("bits", [4, 8])
def test_dequantize_is_s_q_plus_b_rounded_once(backend, bits):
    wq, s, b, value = _affine(bits=bits)
    with mp.extended_precision(strict=True) as rep:
        got = mx.dequantize(wq, s, b, group_size=64, bits=bits)
    assert rep.extended["dequantize"] == 1
    np.testing.assert_array_equal(value64(got), value)  # s q + b: exact in 48 bits here
    assert share(got, value) == 1.0
    plain = mx.dequantize(wq, s, b, group_size=64, bits=bits)
    assert share(plain, value) < 0.9  # MLX's float32 rounds twice


def test_dequantize_special_scales(backend):
    """Scales near 2^127 (s q overflows float32 only where the exact value does),
    Inf and NaN scales: float64's answers rounded once."""
    wq, s, b, _ = _affine(rows=4)
    s_np = f64(s)
    s_np[0] = 2.0**126 / 15 * 1.5
    s_np[1, 0], s_np[2, 1] = np.inf, np.nan
    s2 = mx.array(s_np.astype(np.float32))
    q = _codes(wq, s, b, 64, 4).reshape(4, 2, 64)
    with np.errstate(invalid="ignore", over="ignore"):
        want = (q * f64(s2)[..., None] + f64(b)[..., None]).reshape(4, 128)
    with mp.extended_precision(strict=True):
        got = mx.dequantize(wq, s2, b, group_size=64, bits=4)
    np.testing.assert_array_equal(np.array(got), want.astype(np.float32))


def test_non_affine_modes_are_exact(backend):
    """mxfp4 codes times a power of two: MLX's float32 (or bfloat16) values are
    exact, and the product with them is double-word."""
    w = mx.array(rng_f32((4, 64), 4))
    wq, s = mx.quantize(w, mode="mxfp4")
    value = f64(mx.dequantize(wq, s, mode="mxfp4", dtype=mx.float32))
    x0 = rng_f32((3, 64), 5)
    with mp.extended_precision(strict=True) as rep:
        d = mx.dequantize(wq, s, mode="mxfp4", dtype=mx.float32)
        d16 = mx.dequantize(wq, s, mode="mxfp4")
        y = mx.quantized_matmul(mx.array(x0) / 3, wq, s, mode="mxfp4")
    assert d16.dtype == mx.bfloat16 and not rep.float32, rep
    np.testing.assert_array_equal(value64(d), value)
    want = x0.astype(np.float64) / 3 @ value.T
    np.testing.assert_allclose(value64(y), want, rtol=2**-44, atol=2**-46)
    assert share(y, want) == 1.0


@pytest.mark.parametrize("transpose", [True, False])
def test_quantized_matmul_and_gather_qmm_are_double_word_products(backend, transpose):
    wq, s, b, value = _affine(rows=128, cols=128, seed=6)
    x0 = rng_f32((5, 128), 7)
    weight = value.T if transpose else value
    want = x0.astype(np.float64) / 3 @ weight
    with mp.extended_precision(strict=True) as rep:
        x = mx.array(x0) / 3
        y = mx.quantized_matmul(x, wq, s, b, transpose=transpose, group_size=64, bits=4)
        experts = [mx.stack([m, m]) for m in (wq, s, b)]
        g = mx.gather_qmm(mx.expand_dims(x, 0), *experts, rhs_indices=mx.array([1]),
                          transpose=transpose, group_size=64, bits=4)[0]
    assert rep.extended["quantized_matmul"] == rep.extended["gather_qmm"] == 1
    for out in (y, g):
        np.testing.assert_allclose(value64(out), want, rtol=2**-40, atol=2**-44)
        assert share(out, want) == 1.0
    plain = mx.quantized_matmul(mx.array(x0) / 3, wq, s, b, transpose=transpose)
    assert share(plain, want) < 0.9
