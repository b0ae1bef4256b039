"""A Llama-style decoder block in plain MLX / mlx.nn: RMSNorm, rotary position
embeddings, grouped-query attention through ``mx.fast.scaled_dot_product_attention``
with a causal mask, and a SwiGLU MLP.

Input (batch, T, d), heads of size 8, half as many key / value heads as query heads.
x <- x + o(attention(rope(q), rope(k), v)) with q, k, v = Linear(RMSNorm(x)) (no
biases); x <- x + down(silu(gate(h)) * up(h)) with h = RMSNorm(x).
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ._common import linear, sigmoid

SIZES = {"small": dict(batch=1, T=16, d=32), "medium": dict(batch=2, T=64, d=64),
         "large": dict(batch=2, T=256, d=128)}
HEAD_DIM = 8
BASE = 10000.0
EPS = 1e-5


class LlamaBlock(nn.Module):
    def __init__(self, d: int, hidden: int | None = None):
        super().__init__()
        self.heads, self.kv_heads = d // HEAD_DIM, d // HEAD_DIM // 2
        hidden = hidden or 3 * d
        self.norm1 = nn.RMSNorm(d, eps=EPS)
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, self.kv_heads * HEAD_DIM, bias=False)
        self.v = nn.Linear(d, self.kv_heads * HEAD_DIM, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.rope = nn.RoPE(HEAD_DIM, base=BASE)
        self.norm2 = nn.RMSNorm(d, eps=EPS)
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)
        # RMSNorm starts at ones; random scales exercise the weight
        self.norm1.weight = 1 + 0.1 * mx.random.normal((d,))
        self.norm2.weight = 1 + 0.1 * mx.random.normal((d,))

    def attention(self, x):
        B, T, d = x.shape
        q = self.q(x).reshape(B, T, self.heads, HEAD_DIM).transpose(0, 2, 1, 3)
        k = self.k(x).reshape(B, T, self.kv_heads, HEAD_DIM).transpose(0, 2, 1, 3)
        v = self.v(x).reshape(B, T, self.kv_heads, HEAD_DIM).transpose(0, 2, 1, 3)
        out = mx.fast.scaled_dot_product_attention(
            self.rope(q), self.rope(k), v, scale=1 / math.sqrt(HEAD_DIM), mask="causal")
        return self.o(out.transpose(0, 2, 1, 3).reshape(B, T, d))

    def __call__(self, x):
        x = x + self.attention(self.norm1(x))
        h = self.norm2(x)
        return x + self.down(nn.silu(self.gate(h)) * self.up(h))


def build(size: str = "small", seed: int = 0):
    s = SIZES[size]
    mx.random.seed(seed)
    model = LlamaBlock(s["d"])
    x = mx.array(np.random.default_rng(seed).standard_normal(
        (s["batch"], s["T"], s["d"])).astype(np.float32))
    return model, x


def _rms_norm(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w


def _rope(x):
    """MLX's RoPE (non-traditional) on (B, H, T, HEAD_DIM)."""
    T, half = x.shape[-2], HEAD_DIM // 2
    theta = np.arange(T)[:, None] * np.exp(-np.arange(half) * math.log(BASE) / half)[None]
    c, s = np.cos(theta), np.sin(theta)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)


def oracle(p: dict, x: np.ndarray) -> np.ndarray:
    B, T, d = x.shape
    H, KV = d // HEAD_DIM, d // HEAD_DIM // 2
    h = _rms_norm(x, p["norm1.weight"])
    q = linear(p, "q", h).reshape(B, T, H, HEAD_DIM).transpose(0, 2, 1, 3)
    k = linear(p, "k", h).reshape(B, T, KV, HEAD_DIM).transpose(0, 2, 1, 3)
    v = linear(p, "v", h).reshape(B, T, KV, HEAD_DIM).transpose(0, 2, 1, 3)
    q, k = _rope(q), _rope(k)
    k, v = (np.repeat(t, H // KV, axis=1) for t in (k, v))
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(HEAD_DIM)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    a = (e / e.sum(-1, keepdims=True)) @ v
    x = x + linear(p, "o", a.transpose(0, 2, 1, 3).reshape(B, T, d))
    h = _rms_norm(x, p["norm2.weight"])
    g = linear(p, "gate", h)
    return x + linear(p, "down", g * sigmoid(g) * linear(p, "up", h))
