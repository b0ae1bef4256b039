"""A long-convolution block written only against ``mlx.core`` / ``mlx.nn``, in the
style of public MLX ports of Hyena / H3 / S4-type models: nothing here imports
mlx_precise. ``docs/port_guide.md`` measures it unmodified, wrapped in
``extended_precision()`` and ported to ``mlx_precise``; the tests use it as the
"unmodified user model".

* :func:`fftconv_ref`: the safari ``fftconv_ref`` formula on (batch, channels, L)
  data, FFTs along the last axis.
* :class:`LongConvBlock`: (batch, L, dim) sequences, a causal depthwise short
  filter (``nn.Conv1d`` with ``groups=dim``), then a long convolution with an
  explicit decaying filter by FFT along axis 1, plus a skip term.
"""

import math

import mlx.core as mx
import mlx.nn as nn


def fftconv_ref(u, k, D):
    """u: (batch, channels, L); k: (channels, L); D: (channels,). Causal long
    convolution ``y[t] = sum_s k[s] u[t - s] + D u[t]`` by FFT of size 2L."""
    L = u.shape[-1]
    fft_size = 2 * L
    k_f = mx.fft.rfft(k, n=fft_size) / fft_size
    u_f = mx.fft.rfft(u, n=fft_size)
    y = mx.fft.irfft(u_f * k_f, n=fft_size, norm="forward")[..., :L]
    return y + u * D[:, None]


class LongConvBlock(nn.Module):
    """Short depthwise filter + FFT long convolution on (batch, L, dim) inputs."""

    def __init__(self, dim: int, max_len: int, short_len: int = 3):
        super().__init__()
        self.short = nn.Conv1d(dim, dim, kernel_size=short_len, padding=short_len - 1,
                               groups=dim, bias=False)
        decay = mx.exp(-mx.arange(max_len)[:, None] * mx.linspace(1, 20, dim)[None] / max_len)
        self.filter = mx.random.normal((max_len, dim)) * decay / math.sqrt(dim)
        self.D = mx.random.normal((dim,))

    def __call__(self, x):
        L = x.shape[1]
        z = self.short(x)[:, :L, :]  # causal: keep the first L of L + K - 1 outputs
        n = 2 * L
        k_f = mx.fft.rfft(self.filter[:L], n=n, axis=0)
        z_f = mx.fft.rfft(z, n=n, axis=1)
        y = mx.fft.irfft(z_f * k_f, n=n, axis=1)[:, :L, :]
        return y + z * self.D
