"""A pre-norm transformer block (causal multi-head attention + GELU MLP) in plain MLX.

Input (batch, T, d), heads of size 8. x <- x + proj(attention(LayerNorm(x))) with the scores
q k^T / sqrt(d_head), a causal mask by ``mx.where``, softmax, times v;
x <- x + fc2(GELU(fc1(LayerNorm(x)))).
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ._common import gelu, layer_norm, linear

SIZES = {"small": dict(batch=1, T=16, d=32), "medium": dict(batch=2, T=64, d=64),
         "large": dict(batch=2, T=256, d=128)}
HEAD_DIM = 8
MASKED = -1e9


class TransformerBlock(nn.Module):
    def __init__(self, d: int, mlp_ratio: int = 4):
        super().__init__()
        self.heads = d // HEAD_DIM
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, mlp_ratio * d)
        self.fc2 = nn.Linear(mlp_ratio * d, d)

    def attention(self, x):
        B, T, d = x.shape
        H = self.heads
        q, k, v = (t.reshape(B, T, H, d // H).transpose(0, 2, 1, 3)
                   for t in mx.split(self.qkv(x), 3, axis=-1))
        scores = (q @ k.transpose(0, 1, 3, 2)) / math.sqrt(d // H)
        causal = mx.tril(mx.ones((T, T), dtype=mx.bool_))
        scores = mx.where(causal, scores, MASKED)
        out = mx.softmax(scores, axis=-1) @ v
        return self.proj(out.transpose(0, 2, 1, 3).reshape(B, T, d))

    def __call__(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(nn.gelu(self.fc1(self.ln2(x))))


def build(size: str = "small", seed: int = 0):
    s = SIZES[size]
    mx.random.seed(seed)
    model = TransformerBlock(s["d"])
    x = mx.array(np.random.default_rng(seed).standard_normal(
        (s["batch"], s["T"], s["d"])).astype(np.float32))
    return model, x


def oracle(p: dict, x: np.ndarray) -> np.ndarray:
    B, T, d = x.shape
    H = d // HEAD_DIM
    h = layer_norm(x, p["ln1.weight"], p["ln1.bias"])
    q, k, v = (t.reshape(B, T, H, d // H).transpose(0, 2, 1, 3)
               for t in np.split(linear(p, "qkv", h), 3, axis=-1))
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // H)
    s = np.where(np.tril(np.ones((T, T), bool)), s, MASKED)
    e = np.exp(s - s.max(-1, keepdims=True))
    a = (e / e.sum(-1, keepdims=True)) @ v
    x = x + linear(p, "proj", a.transpose(0, 2, 1, 3).reshape(B, T, d))
    h = layer_norm(x, p["ln2.weight"], p["ln2.bias"])
    return x + linear(p, "fc2", gelu(linear(p, "fc1", h)))
