"""softmax, logsumexp and attention of values that carry a low word, out to the
top of float32's range. Their shift was the maximum of the high words alone, so
``x - shift`` was the largest element's low word, up to ``|x| 2^-25``: past about
2^31 its exp overflowed or vanished and softmax gave NaN (logsumexp -inf) where
float32 gives the one-hot answer, with an empty report. Oracle: numpy float64 on
the exact values (each value's words joined)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from flow_helpers import rng_f32, value64


def _softmax64(v):
    e = np.exp(v - v.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _logsumexp64(v):
    m = v.max(-1, keepdims=True)
    return (np.log(np.exp(v - m).sum(-1, keepdims=True)) + m)[..., 0]


@pytest.mark.parametrize("strict", [False, True], ids=["report", "strict"])
@pytest.mark.parametrize("scale", [1e6, 3e9, 1e12, 1e20, 1e30])
def test_softmax_of_large_carried_logits(backend, scale, strict):
    a = rng_f32((3, 7), 41)
    with mp.extended_precision(strict=strict) as report:
        x = mx.array(a) * (scale / 3)  # carried: the product's low words
        sm, lse = mx.softmax(x, axis=-1), mx.logsumexp(x, axis=-1)
        q = x.reshape(1, 1, 3, 7) * (1e14 / scale)  # scores up to ~1e29
        att = mx.fast.scaled_dot_product_attention(q, q, q, scale=1.0)
        grad = mx.grad(lambda t: mx.sum(mx.softmax(t, axis=-1)[:, 0]))(x)
        mx.eval(sm, lse, att, grad)
    assert not report.float32, report
    v = value64(x)
    want = _softmax64(v)
    np.testing.assert_array_equal(np.array(sm), want.astype(np.float32))
    np.testing.assert_allclose(value64(lse), _logsumexp64(v), rtol=2**-46, atol=0)
    qv = value64(q)[0, 0]
    s = qv @ qv.T
    np.testing.assert_array_equal(np.array(att)[0, 0], (_softmax64(s) @ qv).astype(np.float32))
    # d softmax_0 / dx_j = p_0 (delta_0j - p_j)
    p = want
    g = p[:, :1] * ((np.arange(7) == 0) - p)
    assert np.all(np.isfinite(np.array(grad)))
    np.testing.assert_allclose(value64(grad), g, rtol=0, atol=2**-46 * np.abs(g).max() + 1e-300)
