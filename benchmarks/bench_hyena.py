"""Hyena long convolution: extended vs plain float32 MLX, time, accuracy and memory.

For batch 1, 64 channels and L in {1024, 16384, 131072} (--full adds 524288): time of
hyena_conv_extended on the active backend (or --backend) against the float32 MLX
FFT convolution (safari formula), the share of exactly rounded outputs of each
(oracle: numpy longdouble FFT where longdouble has a 64-bit significand), peak
memory of the extended call, and flops / bytes per point with the estimated
extended / float32 time ratio on an Apple GPU.

    python benchmarks/bench_hyena.py [--backend cpu|emulate|metal] [--full | --quick]

Goals: <= 1.5x the float32 MLX time on the cpu backend; <= 4x MLX's
float32 pipeline on an Apple GPU (only measurable on a Mac).
"""

from __future__ import annotations

import argparse
import math
import resource
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

import mlx_precise as mp
from mlx_precise.tools.demo import _inputs, _oracle_dtype
from mlx_precise.conv.hyena import default_fft_size, fftconv

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fft import interleaved, print_table, sfft  # noqa: E402


def gpu_cost_per_point(N: int) -> tuple[float, float, float, float]:
    """(ext flops, ext bytes, f32 flops, f32 bytes) per output point (L = N/2
    outputs) of the whole pipeline: real FFTs of u and k, the spectral product, the
    inverse real FFT, the skip term. Each real FFT is a complex FFT of N/2 points
    plus a pre/post kernel (docs/fft.md): double-word radix-4 passes of up to 1024
    points in threadgroup memory, 68.5 float32 ops per point and log2 level, 76 more
    per point for each pass after the first, 32 B per point per pass, ~30 ops and
    32 B per point for the real post-processing; the product (cdw_mul) 78 ops and
    48 B per spectrum point, the skip 30 ops and 16 B. Plain float32: 5 ops per
    point and log2 level, 16 B per point per pass (MLX's FFT, passes of 1024 too)."""
    half = N // 2
    levels = math.log2(half)
    passes = math.ceil(levels / 10)
    fft_dw = (68.5 * levels + 76 * (passes - 1) + 30, 32 * passes + 32)
    fft_32 = (5 * levels + 4, 16 * passes + 16)
    ext = (3 * fft_dw[0] + 78 + 30, 3 * fft_dw[1] + 48 + 16)
    f32 = (3 * fft_32[0] + 6 + 2, 3 * fft_32[1] + 24 + 12)
    return ext[0], ext[1], f32[0], f32[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=mp.BACKENDS, default=None)
    p.add_argument("--full", action="store_true", help="also L = 524288")
    p.add_argument("--quick", action="store_true", help="L = 256, 4 channels: a smoke test")
    p.add_argument("--channels", type=int, default=64)
    args = p.parse_args()
    backend = mp.core.backends.resolve(args.backend)
    dtype, dname = _oracle_dtype()
    lengths = [256] if args.quick else [1024, 16384, 131072] + ([524288] if args.full else [])
    if args.quick:
        args.channels = 4
    rows_sp = []
    print(f"backend: {backend}; oracle: {dname}; batch 1, channels {args.channels}")
    print("| L | extended s | float32 s | ratio | exactly rounded ext / f32 | peak MB (ext) "
          "| GPU flop/pt ext, f32 | GPU B/pt ext, f32 | est. GPU ratio (M2 Max) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for L in lengths:
        u, k, D = _inputs(1, args.channels, L)
        uu, kk, DD = mx.array(u), mx.array(k), mx.array(D)
        N = default_fft_size(L, L)
        ref = np.fft.irfft(np.fft.rfft(u.astype(dtype), N) * np.fft.rfft(k.astype(dtype), N), N)
        ref = (ref[..., :L] + D.astype(dtype)[None, :, None] * u).astype(np.float32)
        ext = lambda: mp.hyena_conv_extended(uu, kk, DD, backend=backend)  # noqa: E731
        f32 = lambda: fftconv.plain(uu, kk, DD)  # noqa: E731
        mx.eval(ext(), f32())
        times, outs = {}, {}
        mx.reset_peak_memory()
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for name, fn in (("ext", ext), ("f32", f32)):
            best = float("inf")
            for _ in range(3):
                t = time.perf_counter()
                y = fn()
                mx.eval(y)
                best = min(best, time.perf_counter() - t)
            times[name], outs[name] = best, np.array(y)
            if name == "ext":  # MLX allocator peak, or growth of the process (numpy work)
                peak = max(mx.get_peak_memory(),
                           1024 * (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0))
        if sfft is not None:  # the same float64 formula with scipy.fft, interleaved
            def sp64():
                u64, k64 = u.astype(np.float64), k.astype(np.float64)
                y = sfft.irfft(sfft.rfft(u64, N, workers=-1) * sfft.rfft(k64, N, workers=-1),
                               N, workers=-1)[..., :L]
                return (y + D.astype(np.float64)[None, :, None] * u64).astype(np.float32)

            te, t64 = interleaved([lambda: np.asarray(ext()), sp64], 5)
            rows_sp.append(f"| {L} | {te:.4f} | {t64:.4f} | {te / t64:.2f} "
                           f"| {bool((sp64() == outs['ext']).all())} |")
        ef, eb, ff, fb = gpu_cost_per_point(N)
        est = max(eb / 400e9, ef / 13.6e12) / max(fb / 400e9, ff / 13.6e12)
        print(f"| {L} | {times['ext']:.3f} | {times['f32']:.3f} | {times['ext'] / times['f32']:.2f} | "
              f"{100 * (outs['ext'] == ref).mean():.4f}% / {100 * (outs['f32'] == ref).mean():.1f}% | "
              f"{peak / 2**20:.0f} | {ef:.0f}, {ff:.0f} | {eb:.0f}, {fb:.0f} | {est:.1f} |", flush=True)
    if rows_sp:
        print_table(f"backend {backend} against the float64 formula with scipy.fft "
                    "(workers=-1), medians of interleaved bursts (goal on cpu: <= 1.1x)",
                    ("L", "extended s", "scipy f64 s", "ratio", "same bits"), rows_sp)


if __name__ == "__main__":
    main()
