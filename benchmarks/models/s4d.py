"""An S4D layer (diagonal state-space model) in plain MLX.

Input (batch, H, L). The kernel: complex diagonal A = -exp(log_A_real) + i A_imag,
complex C, step dt = exp(log_dt); zero-order-hold discretisation
dA = exp(dt A), C' = C (dA - 1) / A; Vandermonde kernel
K[h, l] = 2 Re sum_n C'[h, n] exp(dt A[h, n] l) (an einsum). Then the causal
convolution y = K * u by FFT of size 2L, the skip term D u, GELU, and an output
Linear H -> 2H with GLU (the 1x1 convolution + GLU of the public S4D block).
Output (batch, L, H).
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ._common import gelu, linear, sigmoid

SIZES = {"small": dict(batch=1, H=8, N=16, L=64), "medium": dict(batch=2, H=16, N=32, L=256),
         "large": dict(batch=2, H=32, N=64, L=1024)}


class S4DKernel(nn.Module):
    def __init__(self, H: int, N: int = 16, dt_min: float = 1e-3, dt_max: float = 1e-1):
        super().__init__()
        self.log_dt = (mx.random.uniform(shape=(H,)) * (math.log(dt_max) - math.log(dt_min))
                       + math.log(dt_min))
        self.C_re = mx.random.normal((H, N // 2)) * math.sqrt(0.5)
        self.C_im = mx.random.normal((H, N // 2)) * math.sqrt(0.5)
        self.log_A_real = mx.log(0.5 * mx.ones((H, N // 2)))
        self.A_imag = math.pi * mx.broadcast_to(mx.arange(N // 2, dtype=mx.float32), (H, N // 2))

    def __call__(self, L: int):
        dt = mx.exp(self.log_dt)                                  # (H,)
        C = self.C_re + 1j * self.C_im                            # (H, N/2)
        A = -mx.exp(self.log_A_real) + 1j * self.A_imag
        dtA = A * dt[:, None]
        C = C * (mx.exp(dtA) - 1.0) / A
        powers = mx.exp(dtA[..., None] * mx.arange(L, dtype=mx.float32))  # (H, N/2, L)
        return 2 * mx.einsum("hn,hnl->hl", C, powers).real


class S4D(nn.Module):
    def __init__(self, H: int, N: int = 16):
        super().__init__()
        self.D = mx.random.normal((H,))
        self.kernel = S4DKernel(H, N)
        self.output_linear = nn.Linear(H, 2 * H)

    def __call__(self, u):
        L = u.shape[-1]
        k = self.kernel(L)                                        # (H, L)
        n = 2 * L
        y = mx.fft.irfft(mx.fft.rfft(u, n=n) * mx.fft.rfft(k, n=n), n=n)[..., :L]
        y = nn.gelu(y + u * self.D[:, None])
        return nn.glu(self.output_linear(y.swapaxes(-1, -2)), axis=-1)


def build(size: str = "small", seed: int = 0):
    s = SIZES[size]
    mx.random.seed(seed)
    model = S4D(s["H"], s["N"])
    x = mx.array(np.random.default_rng(seed).standard_normal(
        (s["batch"], s["H"], s["L"])).astype(np.float32))
    return model, x


def oracle(p: dict, x: np.ndarray) -> np.ndarray:
    B, H, L = x.shape
    dt = np.exp(p["kernel.log_dt"])
    C = p["kernel.C_re"] + 1j * p["kernel.C_im"]
    A = -np.exp(p["kernel.log_A_real"]) + 1j * p["kernel.A_imag"]
    dtA = A * dt[:, None]
    C = C * (np.exp(dtA) - 1) / A
    K = 2 * np.einsum("hn,hnl->hl", C, np.exp(dtA[..., None] * np.arange(L))).real
    n = 2 * L
    y = np.fft.irfft(np.fft.rfft(x, n) * np.fft.rfft(K, n), n)[..., :L]
    y = gelu(y + x * p["D"][:, None])
    a, g = np.split(linear(p, "output_linear", y.swapaxes(-1, -2)), 2, axis=-1)
    return a * sigmoid(g)
