"""A 2-D Fourier neural operator (one Fourier layer between lifting and projection)
in plain MLX.

Input (batch, S, S, c_in), channels last. Grid coordinates (linspace) are appended,
``lift`` (Linear) to ``width`` channels, then one Fourier layer:
rfft2 over the two spatial axes, the lowest ``modes`` x ``modes`` frequencies (the
top and bottom row blocks) multiplied by complex spectral weights with an einsum
over channels, zero elsewhere, irfft2; plus a pointwise Linear; GELU. Projection:
Linear -> GELU -> Linear to one channel.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ._common import gelu, linear

SIZES = {"small": dict(batch=1, S=16, c_in=1, width=8, modes=4),
         "medium": dict(batch=2, S=32, c_in=1, width=16, modes=8),
         "large": dict(batch=2, S=64, c_in=1, width=32, modes=12)}


class SpectralConv2d(nn.Module):
    def __init__(self, c_in: int, c_out: int, modes: int):
        super().__init__()
        scale = 1 / (c_in * c_out)
        shape = (c_in, c_out, modes, modes)
        self.w1_re, self.w1_im, self.w2_re, self.w2_im = (
            scale * mx.random.uniform(shape=shape) for _ in range(4))
        self.modes = modes

    def __call__(self, x):
        B, H, W, _ = x.shape
        m = self.modes
        x_ft = mx.fft.rfft2(x, axes=(1, 2))                       # (B, H, W/2+1, C)
        w1 = self.w1_re + 1j * self.w1_im
        w2 = self.w2_re + 1j * self.w2_im
        top = mx.einsum("bxyi,ioxy->bxyo", x_ft[:, :m, :m], w1)
        bottom = mx.einsum("bxyi,ioxy->bxyo", x_ft[:, H - m:, :m], w2)
        c_out = top.shape[-1]
        middle = mx.zeros((B, H - 2 * m, m, c_out), dtype=mx.complex64)
        out_ft = mx.concatenate([top, middle, bottom], axis=1)
        out_ft = mx.pad(out_ft, [(0, 0), (0, 0), (0, W // 2 + 1 - m), (0, 0)])
        return mx.fft.irfft2(out_ft, s=(H, W), axes=(1, 2))


class FNO2d(nn.Module):
    def __init__(self, c_in: int = 1, width: int = 8, modes: int = 4):
        super().__init__()
        self.lift = nn.Linear(c_in + 2, width)
        self.spectral = SpectralConv2d(width, width, modes)
        self.pointwise = nn.Linear(width, width)
        self.proj1 = nn.Linear(width, 2 * width)
        self.proj2 = nn.Linear(2 * width, 1)

    def __call__(self, a):
        B, H, W, _ = a.shape
        gx = mx.broadcast_to(mx.linspace(0, 1, H)[None, :, None, None], (B, H, W, 1))
        gy = mx.broadcast_to(mx.linspace(0, 1, W)[None, None, :, None], (B, H, W, 1))
        x = self.lift(mx.concatenate([a, gx, gy], axis=-1))
        x = nn.gelu(self.spectral(x) + self.pointwise(x))
        return self.proj2(nn.gelu(self.proj1(x)))


def build(size: str = "small", seed: int = 0):
    s = SIZES[size]
    mx.random.seed(seed)
    model = FNO2d(s["c_in"], s["width"], s["modes"])
    x = mx.array(np.random.default_rng(seed).standard_normal(
        (s["batch"], s["S"], s["S"], s["c_in"])).astype(np.float32))
    return model, x


def oracle(p: dict, a: np.ndarray) -> np.ndarray:
    B, H, W, _ = a.shape
    gx = np.broadcast_to(np.linspace(0, 1, H)[None, :, None, None], (B, H, W, 1))
    gy = np.broadcast_to(np.linspace(0, 1, W)[None, None, :, None], (B, H, W, 1))
    x = linear(p, "lift", np.concatenate([a, gx, gy], axis=-1))
    m = p["spectral.w1_re"].shape[-1]
    w1 = p["spectral.w1_re"] + 1j * p["spectral.w1_im"]
    w2 = p["spectral.w2_re"] + 1j * p["spectral.w2_im"]
    x_ft = np.fft.rfft2(x, axes=(1, 2))
    out_ft = np.zeros(x_ft.shape[:3] + (w1.shape[1],), np.complex128)
    out_ft[:, :m, :m] = np.einsum("bxyi,ioxy->bxyo", x_ft[:, :m, :m], w1)
    out_ft[:, H - m:, :m] = np.einsum("bxyi,ioxy->bxyo", x_ft[:, H - m:, :m], w2)
    spec = np.fft.irfft2(out_ft, s=(H, W), axes=(1, 2))
    x = gelu(spec + linear(p, "pointwise", x))
    return linear(p, "proj2", gelu(linear(p, "proj1", x)))
