"""Dense, grouped and transposed convolutions inside ``extended_precision()``
(mlx_precise.extended.rules.convolution) against plain float32 MLX.

Layers of a convolutional vocoder / image network, each timed plain and inside a
block on the active backend (or ``--backend``), in steady state (interleaved, the median of
rounds of the last call of a burst; bench_flow.steady), with the share
of outputs exactly rounded (oracle: numpy float64 from the same float32 inputs,
one strided slice per kernel tap).

    python benchmarks/bench_convolution.py [--backend cpu|emulate|metal] [--full | --quick]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_flow import compare  # noqa: E402  (plain vs extended, timed, scored)


def oracle(kind: str, x: np.ndarray, w: np.ndarray, kw: dict) -> np.ndarray:
    """The float64 result by numpy, one strided slice per kernel tap. (MLX's own
    float64 convolution on the CPU is only float32-accurate: ~1e-7 relative.)"""
    x, w = x.astype(np.float64), w.astype(np.float64)
    nd = x.ndim - 2
    s, p, d = (np.broadcast_to(kw.get(k, v), (nd,)) for k, v in (
        ("stride", 1), ("padding", 0), ("dilation", 1)))
    G = kw.get("groups", 1)
    xg = x.reshape(*x.shape[:-1], G, -1)  # (N, *S, G, Cg)
    wg = w.reshape(G, -1, *w.shape[1:])  # (G, Og, *K, Cg)
    kernel = w.shape[1:-1]
    if kind == "conv_transpose1d":  # y[i s + k d - p] += x[i] w[k]
        (N, L), K = x.shape[:2], kernel[0]
        y = np.zeros((N, (L - 1) * s[0] + d[0] * (K - 1) + 1, G, wg.shape[1]))
        for k in range(K):
            y[:, k * d[0]:k * d[0] + (L - 1) * s[0] + 1:s[0]] += np.einsum(
                "nlgc,goc->nlgo", xg, wg[:, :, k])
        return y[:, p[0]:y.shape[1] - p[0]].reshape(N, -1, w.shape[0])
    xg = np.pad(xg, [(0, 0), *((v, v) for v in p), (0, 0), (0, 0)])
    out = [(n - dd * (k - 1) - 1) // ss + 1 for n, k, ss, dd in zip(xg.shape[1:-2], kernel, s, d)]
    y = 0
    for tap in np.ndindex(*kernel):
        sl = tuple(slice(t * dd, t * dd + (o - 1) * ss + 1, ss)
                   for t, dd, o, ss in zip(tap, d, out, s))
        y = y + np.einsum("...gc,goc->...go", xg[(slice(None),) + sl],
                          wg[(slice(None), slice(None)) + tap])
    return y.reshape(*y.shape[:-2], -1)


def cases(size: str):
    """(name, op, input shape, weight shape, keyword arguments)."""
    L, S, up = {"quick": (256, 16, 64), "default": (4096, 32, 1024),
                "full": (16384, 64, 4096)}[size]
    return [
        (f"conv1d 4x{L}x64, K=7, 64 out", "conv1d", (4, L, 64), (64, 7, 64), dict(padding=3)),
        (f"conv1d grouped (8) 4x{L}x64, K=7, dilation 3", "conv1d", (4, L, 64), (64, 7, 8),
         dict(padding=9, dilation=3, groups=8)),
        (f"conv2d 8x{S}x{S}x32, 3x3, 32 out", "conv2d", (8, S, S, 32), (32, 3, 3, 32),
         dict(padding=1)),
        (f"conv_transpose1d 4x{up}x128, K=16, stride 8 (8x upsampler)", "conv_transpose1d",
         (4, up, 128), (64, 16, 128), dict(stride=8, padding=4)),
    ]


def run(backend: str, size: str, repeat: int):
    rng = np.random.default_rng(0)
    rows = []
    for name, kind, xs, ws, kw in cases(size):
        x = rng.standard_normal(xs).astype(np.float32)
        w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
        ref = oracle(kind, x, w, kw)
        X, W = mx.array(x), mx.array(w)
        t_plain, t_ext, share, rep = compare(lambda: getattr(mx, kind)(X, W, **kw), ref,
                                             backend, repeat)
        if not rep.extended[kind]:
            raise SystemExit(f"{kind} has no double-word rule in the flow's table yet")
        rows.append((name, t_plain, t_ext, share))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default=None)
    p.add_argument("--full", action="store_true", help="4x longer signals, 64x64 images")
    p.add_argument("--quick", action="store_true", help="small sizes, one run: a smoke test")
    a = p.parse_args(argv)
    import mlx_precise as mp

    backend = a.backend or mp.backend()
    size = "quick" if a.quick else "full" if a.full else "default"
    repeat = 1 if a.quick else 3
    print(f"Convolutions inside extended_precision() on backend {backend} "
          f"(steady state, median of {repeat} interleaved rounds):")
    print("| layer | float32 | extended | ratio | exactly rounded float32 / extended |")
    print("|---|---|---|---|---|")
    for name, tp, te, (sp, se) in run(backend, size, repeat):
        print(f"| {name} | {tp * 1e3:.2f} ms | {te * 1e3:.2f} ms | {te / tp:.1f}x "
              f"| {100 * sp:.1f}% / {100 * se:.1f}% |")


if __name__ == "__main__":
    main()
