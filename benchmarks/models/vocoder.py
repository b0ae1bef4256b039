"""A small convolutional vocoder (HiFi-GAN-like generator) in plain MLX.

Input (batch, frames, n_mels), channels last. ``conv_pre`` (Conv1d, kernel 7),
then per upsampling stage: LeakyReLU(0.1), ConvTranspose1d (kernel 2r, stride r,
halving the channels), a residual block of dilated Conv1d layers
(x <- x + conv(LeakyReLU(x)), dilations 1 and 3); finally LeakyReLU, ``conv_post``
(Conv1d to one channel, kernel 7) and tanh. Output (batch, frames * prod(r), 1).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ._common import conv1d, conv_transpose1d, leaky_relu

SIZES = {"small": dict(batch=1, frames=8, n_mels=16, channels=32, rates=(4, 4)),
         "medium": dict(batch=1, frames=32, n_mels=40, channels=64, rates=(4, 4)),
         "large": dict(batch=2, frames=64, n_mels=80, channels=128, rates=(8, 4)),
         "xl": dict(batch=2, frames=128, n_mels=80, channels=128, rates=(8, 4))}
SLOPE = 0.1
DILATIONS = (1, 3)


class ResBlock(nn.Module):
    def __init__(self, ch: int, kernel: int = 3, dilations=DILATIONS):
        super().__init__()
        self.convs = [nn.Conv1d(ch, ch, kernel, dilation=d, padding=d * (kernel - 1) // 2)
                      for d in dilations]

    def __call__(self, x):
        for conv in self.convs:
            x = x + conv(nn.leaky_relu(x, SLOPE))
        return x


class Vocoder(nn.Module):
    def __init__(self, n_mels: int = 16, channels: int = 32, rates=(4, 4)):
        super().__init__()
        self.conv_pre = nn.Conv1d(n_mels, channels, 7, padding=3)
        chs = [channels // 2 ** i for i in range(len(rates) + 1)]
        self.ups = [nn.ConvTranspose1d(chs[i], chs[i + 1], 2 * r, stride=r, padding=r // 2)
                    for i, r in enumerate(rates)]
        self.res = [ResBlock(chs[i + 1]) for i in range(len(rates))]
        self.conv_post = nn.Conv1d(chs[-1], 1, 7, padding=3)

    def __call__(self, x):
        x = self.conv_pre(x)
        for up, res in zip(self.ups, self.res):
            x = res(up(nn.leaky_relu(x, SLOPE)))
        return mx.tanh(self.conv_post(nn.leaky_relu(x, SLOPE)))


def build(size: str = "small", seed: int = 0):
    s = SIZES[size]
    mx.random.seed(seed)
    model = Vocoder(s["n_mels"], s["channels"], s["rates"])
    x = mx.array(np.random.default_rng(seed).standard_normal(
        (s["batch"], s["frames"], s["n_mels"])).astype(np.float32))
    return model, x


def oracle(p: dict, x: np.ndarray) -> np.ndarray:
    x = conv1d(x, p["conv_pre.weight"], padding=3) + p["conv_pre.bias"]
    i = 0
    while f"ups.{i}.weight" in p:
        K = p[f"ups.{i}.weight"].shape[1]
        r = K // 2
        x = conv_transpose1d(leaky_relu(x, SLOPE), p[f"ups.{i}.weight"], stride=r,
                             padding=r // 2) + p[f"ups.{i}.bias"]
        for j, d in enumerate(DILATIONS):
            w = p[f"res.{i}.convs.{j}.weight"]
            pad = d * (w.shape[1] - 1) // 2
            x = x + conv1d(leaky_relu(x, SLOPE), w, padding=pad, dilation=d) \
                + p[f"res.{i}.convs.{j}.bias"]
        i += 1
    return np.tanh(conv1d(leaky_relu(x, SLOPE), p["conv_post.weight"], padding=3)
                   + p["conv_post.bias"])
