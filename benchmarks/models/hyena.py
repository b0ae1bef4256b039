"""A Hyena operator (order 2) with its implicit filter network, in plain MLX.

Input (batch, L, d). ``in_proj`` (Linear d -> 3d), a causal depthwise short
convolution (kernel 3), split into x0, x1, v; v <- v * x1; a long causal
convolution of v with a filter of length L produced by an implicit network
(positional features t, cos, sin -> Linear -> Sin -> Linear -> Sin -> Linear,
times an exponential decay window), by FFT of size 2L, plus a bias skip term;
y = v * x0; ``out_proj`` (Linear d -> d).
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ._common import conv1d, linear

SIZES = {"small": dict(batch=1, L=64, d=8), "medium": dict(batch=2, L=256, d=16),
         "large": dict(batch=2, L=1024, d=32), "xl": dict(batch=1, L=4096, d=64)}


class Sin(nn.Module):
    """sin(freq * x) with a learnable frequency per feature."""

    def __init__(self, dim: int, w: float = 1.0):
        super().__init__()
        self.freq = w * mx.ones((dim,))

    def __call__(self, x):
        return mx.sin(self.freq * x)


class ImplicitFilter(nn.Module):
    """The long filter h (L, d) as a function of position."""

    def __init__(self, d: int, emb_dim: int = 5, order: int = 16, fast_decay: float = 0.3,
                 slow_decay: float = 1.5, target: float = 1e-2, shift: float = 0.05):
        super().__init__()
        self.bands = (emb_dim - 1) // 2
        self.fc1 = nn.Linear(emb_dim, order)
        self.act1 = Sin(order)
        self.fc2 = nn.Linear(order, order)
        self.act2 = Sin(order)
        self.fc3 = nn.Linear(order, d, bias=False)
        self.bias = mx.random.normal((d,))
        self.decay_range = (math.log(target) / slow_decay, math.log(target) / fast_decay)
        self.shift = shift
        self.d = d

    def features(self, L: int):
        t = mx.linspace(0, 1, L)[:, None]                      # (L, 1)
        w = 2 * math.pi * mx.arange(L, dtype=mx.float32)[:, None] / L
        f = mx.linspace(1e-4, self.bands - 1, self.bands)[None]  # (1, bands)
        return t, mx.concatenate([t, mx.cos(f * w), -mx.sin(f * w)], axis=-1)

    def __call__(self, L: int):
        t, z = self.features(L)
        h = self.fc3(self.act2(self.fc2(self.act1(self.fc1(z)))))  # (L, d)
        deltas = mx.linspace(self.decay_range[0], self.decay_range[1], self.d)[None]
        decay = mx.exp(-t * mx.abs(deltas))
        return h * (decay + self.shift)


class HyenaOperator(nn.Module):
    def __init__(self, d: int, short_len: int = 3):
        super().__init__()
        self.in_proj = nn.Linear(d, 3 * d)
        self.short = nn.Conv1d(3 * d, 3 * d, kernel_size=short_len, padding=short_len - 1,
                               groups=3 * d)
        self.filter = ImplicitFilter(d)
        self.out_proj = nn.Linear(d, d)

    def __call__(self, u):
        L = u.shape[1]
        z = self.short(self.in_proj(u))[:, :L]                 # causal short filter
        x0, x1, v = mx.split(z, 3, axis=-1)
        v = v * x1
        k = self.filter(L)                                     # (L, d)
        n = 2 * L
        k_f = mx.fft.rfft(k, n=n, axis=0) / n
        v_f = mx.fft.rfft(v, n=n, axis=1)
        y = mx.fft.irfft(v_f * k_f, n=n, axis=1, norm="forward")[:, :L]
        y = (y + v * self.filter.bias) * x0
        return self.out_proj(y)


def build(size: str = "small", seed: int = 0):
    s = SIZES[size]
    mx.random.seed(seed)
    model = HyenaOperator(s["d"])
    x = mx.array(np.random.default_rng(seed).standard_normal(
        (s["batch"], s["L"], s["d"])).astype(np.float32))
    return model, x


def oracle(p: dict, x: np.ndarray, fast_decay=0.3, slow_decay=1.5, target=1e-2,
           shift=0.05) -> np.ndarray:
    B, L, d = x.shape
    z = linear(p, "in_proj", x)
    K = p["short.weight"].shape[1]
    z = conv1d(z, p["short.weight"], padding=K - 1, groups=3 * d)[:, :L] + p["short.bias"]
    x0, x1, v = np.split(z, 3, axis=-1)
    v = v * x1
    # implicit filter
    bands = (p["filter.fc1.weight"].shape[1] - 1) // 2
    t = np.linspace(0, 1, L)[:, None]
    w = 2 * np.pi * np.arange(L)[:, None] / L
    f = np.linspace(1e-4, bands - 1, bands)[None]
    feats = np.concatenate([t, np.cos(f * w), -np.sin(f * w)], axis=-1)
    h = np.sin(p["filter.act1.freq"] * linear(p, "filter.fc1", feats))
    h = np.sin(p["filter.act2.freq"] * linear(p, "filter.fc2", h))
    h = linear(p, "filter.fc3", h, bias=False)
    deltas = np.linspace(math.log(target) / slow_decay, math.log(target) / fast_decay, d)[None]
    k = h * (np.exp(-t * np.abs(deltas)) + shift)
    n = 2 * L
    y = np.fft.irfft(np.fft.rfft(v, n, axis=1) * np.fft.rfft(k, n, axis=0), n, axis=1)[:, :L]
    y = (y + v * p["filter.bias"]) * x0
    return linear(p, "out_proj", y)
