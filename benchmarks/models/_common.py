"""float64 numpy building blocks shared by the oracles (independent of MLX and
mlx_precise: plain numpy / scipy on float64 arrays)."""

from __future__ import annotations

import math

import numpy as np
from scipy.special import erf


def params64(model) -> dict:
    """Parameter name -> float64 copy (complex parameters stay complex128)."""
    from mlx.utils import tree_flatten

    out = {}
    for k, v in tree_flatten(model.parameters()):
        a = np.array(v)
        out[k] = a.astype(np.complex128 if np.iscomplexobj(a) else np.float64)
    return out


def linear(p, name, x, bias=True):
    y = x @ p[name + ".weight"].T
    return y + p[name + ".bias"] if bias and name + ".bias" in p else y


def gelu(x):
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def leaky_relu(x, slope):
    return np.maximum(slope * x, x)


def layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def conv1d(x, w, padding=0, dilation=1, groups=1):
    """MLX's conv1d (cross-correlation), channels last: x (B, L, Cin),
    w (Cout, K, Cin // groups) -> (B, Lout, Cout)."""
    B, L, Cin = x.shape
    Cout, K, cg = w.shape
    xp = np.pad(x, [(0, 0), (padding, padding), (0, 0)])
    Lout = xp.shape[1] - dilation * (K - 1)
    og = Cout // groups
    y = np.zeros((B, Lout, Cout))
    for g in range(groups):
        xs = xp[:, :, g * cg:(g + 1) * cg]
        ws = w[g * og:(g + 1) * og]
        for k in range(K):
            y[:, :, g * og:(g + 1) * og] += xs[:, k * dilation:k * dilation + Lout] @ ws[:, k].T
    return y


def conv_transpose1d(x, w, stride=1, padding=0):
    """MLX's conv_transpose1d, channels last: x (B, T, Cin), w (Cout, K, Cin):
    y[i * stride + k - padding] += x[i] w[k]."""
    B, T, _ = x.shape
    Cout, K, _ = w.shape
    full = np.zeros((B, (T - 1) * stride + K, Cout))
    for i in range(T):
        for k in range(K):
            full[:, i * stride + k] += x[:, i] @ w[:, k].T
    return full[:, padding:full.shape[1] - padding]
