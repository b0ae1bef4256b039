"""Accuracy of each step of docs/port_guide.md: an MLX FFT-conv block unmodified,
wrapped in ``extended_precision()``, and ported to ``mlx_precise.fftconv``.

    python examples/port_guide.py [--backend cpu|emulate|metal] [--batch 2]
                                  [--channels 16] [--length 4096]

The blocks are those of ``examples/mlx_fftconv_block.py`` (plain ``mlx.core`` /
``mlx.nn`` code). The oracle is the same math in numpy longdouble (64-bit
significand on x86-64; float64 elsewhere) from the same float32 inputs and
parameters. Printed per block and step: the share of outputs equal to the oracle
rounded to float32 ("exactly rounded") and the normwise error
``||y - ref|| / ||ref||``. Steps: unmodified (float32), wrapped in
``extended_precision()`` (double-word values carried from op to op), ported to
``mlx_precise.fftconv`` (inside the block: it reads the carried values' low words
and its result keeps its own). A second table
scores small expressions and an FNO-style spectral layer the same way.
"""

from __future__ import annotations

import argparse
import os
import sys

import mlx.core as mx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mlx_precise  # noqa: E402
from mlx_fftconv_block import LongConvBlock, fftconv_ref  # noqa: E402

LD = np.longdouble


class PortedLongConvBlock(LongConvBlock):
    """:class:`LongConvBlock` with its four FFT lines replaced by one call."""

    def __call__(self, x):
        L = x.shape[1]
        z = self.short(x)[:, :L, :]
        # (batch, L, dim) -> (batch, dim, L): mlx_precise.fftconv's layout
        y = mlx_precise.fftconv(z.transpose(0, 2, 1), self.filter[:L].T, self.D)
        return y.transpose(0, 2, 1)


def oracle_fftconv(u, k, D):
    """fftconv_ref's math in longdouble: u (B, C, L), k (C, L), D (C,)."""
    L = u.shape[-1]
    ul = u.astype(LD)
    y = np.fft.irfft(np.fft.rfft(ul, 2 * L) * np.fft.rfft(k.astype(LD), 2 * L), 2 * L)
    return y[..., :L] + D.astype(LD)[None, :, None] * ul


def oracle_block(block: LongConvBlock, x):
    """LongConvBlock's math in longdouble: x (B, L, dim)."""
    L = x.shape[1]
    w = np.array(block.short.weight)[:, :, 0].astype(LD)  # (dim, K)
    K = w.shape[1]
    xp = np.concatenate([np.zeros((x.shape[0], K - 1, x.shape[2]), LD), x.astype(LD)], axis=1)
    z = sum(w[None, None, :, j] * xp[:, j:j + L, :] for j in range(K))
    f = np.array(block.filter[:L]).astype(LD)
    y = np.fft.irfft(np.fft.rfft(z, 2 * L, axis=1) * np.fft.rfft(f, 2 * L, axis=0), 2 * L, axis=1)
    return y[:, :L, :] + z * np.array(block.D).astype(LD)


def score(y, ref) -> tuple[float, float]:
    """(share of outputs exactly rounded, normwise error) of y against ref."""
    y = np.array(y)
    d = (y - ref).astype(np.float64)
    return (float((y == ref.astype(np.float32)).mean()),
            float(np.linalg.norm(d) / np.linalg.norm(ref.astype(np.float64))))


def measure(backend: str, batch: int = 2, channels: int = 16, L: int = 4096,
            seed: int = 0) -> dict:
    """{(block, step): (exactly rounded share, normwise error)} for both blocks
    and the steps "unmodified", "wrapped", "ported"."""
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((batch, channels, L)).astype(np.float32)
    k = rng.standard_normal((channels, L)) * np.exp(
        -np.arange(L)[None] * rng.uniform(1, 20, (channels, 1)) / L)
    k = k.astype(np.float32)
    D = rng.standard_normal(channels).astype(np.float32)
    mx.random.seed(seed)
    block = LongConvBlock(channels, L)
    ported = PortedLongConvBlock(channels, L)
    ported.update(block.parameters())
    x = rng.standard_normal((batch, L, channels)).astype(np.float32)
    uu, kk, DD, xx = (mx.array(a) for a in (u, k, D, x))
    ref_f, ref_b = oracle_fftconv(u, k, D), oracle_block(block, x)
    out = {("fftconv_ref", "unmodified"): score(fftconv_ref(uu, kk, DD), ref_f),
           ("LongConvBlock", "unmodified"): score(block(xx), ref_b)}
    with mlx_precise.use_backend(backend), mlx_precise.extended_precision():
        out["fftconv_ref", "wrapped"] = score(fftconv_ref(uu, kk, DD), ref_f)
        out["LongConvBlock", "wrapped"] = score(block(xx), ref_b)
        out["fftconv_ref", "ported"] = score(mlx_precise.fftconv(uu, kk, DD), ref_f)
        out["LongConvBlock", "ported"] = score(ported(xx), ref_b)
    return out


def fno_layer(x, weights, modes: int):
    """An FNO-style 2-D spectral layer in plain MLX: x (B, H, W) float32, weights
    (modes, modes) complex64."""
    H, W = x.shape[1:]
    f = mx.fft.rfft2(x)
    low = f[:, :modes, :modes] * weights
    return mx.fft.irfft2(mx.pad(low, [(0, 0), (0, H - modes), (0, W // 2 + 1 - modes)]),
                         s=(H, W))


def measure_programs(backend: str, n: int = 100_000, seed: int = 0) -> dict:
    """{program: {step: (exactly rounded share, normwise error)}} for small
    expressions and an FNO layer, steps "unmodified", "wrapped"."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    al, bl = a.astype(LD), b.astype(LD)
    x2 = rng.standard_normal((4, 64, 64)).astype(np.float32)
    wts = (rng.standard_normal((12, 12)) + 1j * rng.standard_normal((12, 12))).astype(np.complex64)
    f = np.fft.rfft2(x2.astype(np.float64))  # a linear layer: float64 is ~1e-16 here
    g = np.zeros_like(f)
    g[:, :12, :12] = f[:, :12, :12] * wts.astype(np.complex128)
    A, B, X2, WT = (mx.array(v) for v in (a, b, x2, wts))
    programs = {
        "x * 0.1": (lambda: A * 0.1, al * LD(0.1)),
        "x / 3": (lambda: A / 3, al / 3),
        "x + 1e-3": (lambda: A + 1e-3, al + LD(1e-3)),
        "0.5 * (a + b)": (lambda: 0.5 * (A + B), (al + bl) / 2),
        "FNO spectral layer": (lambda: fno_layer(X2, WT, 12), np.fft.irfft2(g, s=(64, 64))),
    }
    out = {}
    for name, (run, ref) in programs.items():
        res = {"unmodified": score(run(), ref)}
        with mlx_precise.use_backend(backend), mlx_precise.extended_precision():
            res["wrapped"] = score(run(), ref)
        out[name] = res
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default=None)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--channels", type=int, default=16)
    p.add_argument("--length", type=int, default=4096)
    a = p.parse_args(argv)
    backend = a.backend or mlx_precise.backend()
    print(f"backend {backend}; batch {a.batch}, channels {a.channels}, L = {a.length}")
    print("| block | step | exactly rounded | normwise error |")
    print("|---|---|---|---|")
    res = measure(backend, a.batch, a.channels, a.length)
    for (blk, step), (share, err) in res.items():
        print(f"| {blk} | {step} | {100 * share:.1f}% | {err:.2e} |")
    print()
    print("| program | unmodified | wrapped |")
    print("|---|---|---|")
    for name, res in measure_programs(backend).items():
        cells = [f"{100 * s:.1f}% ({e:.1e})" for s, e in res.values()]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
