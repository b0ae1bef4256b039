"""Rules found missing by running public model code (mlx-lm architectures)
unmodified inside a block, and the ops that had none: each against an independent
float64 oracle (numpy), on both host backends, with an empty report."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from flow_helpers import rng_f32, share, value64


def _carried(shape, seed=0, scale=3.0):
    """A float32 array carrying a low word (x / 3) and its exact value in float64."""
    a = rng_f32(shape, seed)
    with mp.extended_precision():
        x = mx.array(a) / scale
    return x, a.astype(np.float64) / scale


# ---- linalg.norm: double-word on every backend, and its derivative ---------------------

_NORMS = [
    ({}, lambda x: x / np.linalg.norm(x)),
    ({"axis": -1}, lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)),
    ({"ord": 1, "axis": -1}, lambda x: np.sign(x)),
    ({"ord": np.inf, "axis": 1},
     lambda x: np.sign(x) * (np.abs(x) == np.abs(x).max(1, keepdims=True))),
    ({"ord": 3, "axis": 0},
     lambda x: np.sign(x) * x ** 2 / np.linalg.norm(x, 3, axis=0) ** 2),
    ({"ord": "fro"}, lambda x: x / np.linalg.norm(x)),
    ({"ord": 1},  # the matrix 1-norm: the largest column sum of |x|
     lambda x: np.sign(x) * (np.abs(x).sum(0) == np.abs(x).sum(0).max())),
    ({"axis": -1, "keepdims": True}, lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)),
]


@pytest.mark.parametrize("kw, derivative", _NORMS, ids=[str(k) for k, _ in _NORMS])
def test_linalg_norm_value_and_gradient(backend, kw, derivative):
    """rwkv7's ``x / max(norm(x, axis=-1), eps)`` under nn.value_and_grad: the
    norm's derivative was MLX's float32 VJP (reported) on cpu, and the norm itself
    a float32 op on emulate."""
    x, X = _carried((4, 6), seed=1)
    with mp.extended_precision() as report:
        value, grad = mx.value_and_grad(lambda v: mx.linalg.norm(v, **kw).sum())(x)
        got, g = value64(value), value64(grad)
    assert not report.float32, report
    ref = np.sum(np.linalg.norm(X, ord=kw.get("ord"), axis=kw.get("axis"),
                                keepdims=kw.get("keepdims", False)) if kw.get("ord") or
                 kw.get("axis") is not None else np.linalg.norm(X.ravel()))
    assert abs(got - ref) <= 2 ** -44 * abs(ref)
    gref = derivative(X)
    assert np.max(np.abs(g - gref)) <= 2 ** -44 * np.max(np.abs(gref))
    assert share(grad, gref) == 1.0


# ---- scaled_dot_product_attention with sinks (gpt-oss) -------------------------------


def _attention_with_sinks(q, k, v, sinks, scale, causal):
    """float64 reference: scores, a sink logit per head as an extra key with no
    value, softmax; also the sink's probability (for the derivative)."""
    heads = q.shape[1]
    k, v = (np.repeat(t, heads // t.shape[1], axis=1) for t in (k, v))
    s = scale * q @ k.swapaxes(-1, -2)
    if causal:
        L, S = s.shape[-2:]
        s = np.where(np.arange(S)[None] <= np.arange(L)[:, None] + (S - L), s,
                     np.finfo(np.float32).min)
    s = np.concatenate([np.broadcast_to(sinks.reshape(1, -1, 1, 1), s.shape[:-1] + (1,)), s],
                       axis=-1)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return p[..., 1:] @ v, p[..., 0]


@pytest.mark.parametrize("causal", [False, True])
def test_attention_sinks(backend, causal):
    """gpt-oss passes ``sinks=`` to every attention layer: it was a float32 op
    (reported), 38% of the model's logits exactly rounded. Value and the sinks'
    derivative (``d out / d sink = -p_sink out``) against float64."""
    q, Q = _carried((2, 4, 5, 8), seed=2)
    k, K = _carried((2, 2, 7, 8), seed=3)
    v, Vv = _carried((2, 2, 7, 8), seed=4)
    sinks, SINKS = _carried((4,), seed=5)
    cot = rng_f32((2, 4, 5, 8), seed=6)
    mask = "causal" if causal else None
    with mp.extended_precision() as report:
        def f(s):
            out = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.35, mask=mask, sinks=s)
            return (out * mx.array(cot)).sum(), out
        (_, out), g = mx.value_and_grad(f)(sinks)
        got, g64 = value64(out), value64(g)
    assert not report.float32, report
    ref, p_sink = _attention_with_sinks(Q, K, Vv, SINKS, 0.35, causal)
    assert share(out, ref) == 1.0
    assert np.max(np.abs(got - ref)) <= 2 ** -44 * np.max(np.abs(ref))
    gref = -np.sum(p_sink * np.sum(ref * cot, axis=-1), axis=(0, 2))
    assert np.max(np.abs(g64 - gref)) <= 2 ** -42 * np.max(np.abs(gref))
