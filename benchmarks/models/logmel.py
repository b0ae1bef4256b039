"""An audio log-mel front end in plain MLX.

Input (batch, T) waveform. Reflect padding by n_fft/2 on both sides (slices and
reversal), framing by slicing and stacking (hop n_fft / 4), a periodic Hann window
computed in the call, rfft, the power spectrum re^2 + im^2, a triangular (HTK) mel
filterbank (a float32 parameter) by matmul, and log10 with a floor
(``mx.maximum(mel, 1e-10)``). Output (batch, frames, n_mels).
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np

SIZES = {"small": dict(batch=1, T=1024, n_fft=128, n_mels=16),
         "medium": dict(batch=2, T=4096, n_fft=256, n_mels=40),
         "large": dict(batch=2, T=16000, n_fft=400, n_mels=80)}


def mel_filterbank(n_fft: int, n_mels: int, sr: float = 16000.0) -> np.ndarray:
    """(n_fft // 2 + 1, n_mels) triangular filters equally spaced on the HTK mel
    scale (numpy, float64)."""
    mel = (lambda f: 2595.0 * np.log10(1.0 + f / 700.0))
    hz = (lambda m: 700.0 * (10.0 ** (m / 2595.0) - 1.0))
    edges = hz(np.linspace(mel(0.0), mel(sr / 2), n_mels + 2))
    freqs = np.linspace(0, sr / 2, n_fft // 2 + 1)
    lo, mid, hi = edges[:-2], edges[1:-1], edges[2:]
    up = (freqs[:, None] - lo) / (mid - lo)
    down = (hi - freqs[:, None]) / (hi - mid)
    return np.maximum(0.0, np.minimum(up, down))


class LogMel(nn.Module):
    def __init__(self, n_fft: int = 128, n_mels: int = 16, sr: float = 16000.0):
        super().__init__()
        self.n_fft, self.hop = n_fft, n_fft // 4
        self.filters = mx.array(mel_filterbank(n_fft, n_mels, sr).astype(np.float32))

    def __call__(self, x):
        n_fft, hop = self.n_fft, self.hop
        half = n_fft // 2
        left = x[:, 1:half + 1][:, ::-1]
        right = x[:, -half - 1:-1][:, ::-1]
        x = mx.concatenate([left, x, right], axis=1)
        n_frames = 1 + (x.shape[1] - n_fft) // hop
        frames = mx.stack([x[:, i * hop:i * hop + n_fft] for i in range(n_frames)], axis=1)
        n = mx.arange(n_fft, dtype=mx.float32)
        window = 0.5 - 0.5 * mx.cos(2 * math.pi * n / n_fft)
        spec = mx.fft.rfft(frames * window, axis=-1)
        power = spec.real ** 2 + spec.imag ** 2
        mel = power @ self.filters
        return mx.log10(mx.maximum(mel, 1e-10))


def build(size: str = "small", seed: int = 0):
    s = SIZES[size]
    model = LogMel(s["n_fft"], s["n_mels"])
    rng = np.random.default_rng(seed)
    t = np.arange(s["T"]) / 16000.0
    # a chirp plus noise: tonal peaks and a noise floor across the spectrum
    wave = 0.5 * np.sin(2 * np.pi * (200 + 3000 * t) * t) + 0.1 * rng.standard_normal(s["T"])
    x = mx.array(np.stack([wave * (1 + 0.3 * b) for b in range(s["batch"])]).astype(np.float32))
    return model, x


def oracle(p: dict, x: np.ndarray) -> np.ndarray:
    n_fft = 2 * (p["filters"].shape[0] - 1)
    hop = n_fft // 4
    xp = np.pad(x, [(0, 0), (n_fft // 2, n_fft // 2)], mode="reflect")
    n_frames = 1 + (xp.shape[1] - n_fft) // hop
    idx = np.arange(n_frames)[:, None] * hop + np.arange(n_fft)[None]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    spec = np.fft.rfft(xp[:, idx] * window, axis=-1)
    power = spec.real ** 2 + spec.imag ** 2
    return np.log10(np.maximum(power @ p["filters"], 1e-10))
