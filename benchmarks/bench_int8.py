"""scaled_mm against a float16 ``mx.matmul`` of the same shape, and the epilogue's
share of the time (scaled_mm minus the plain int8 -> int32 GEMM of the same engine).

    python benchmarks/bench_int8.py                  # M in {1, 32, 512}, N = K = 1024
    python benchmarks/bench_int8.py --full           # N = K = 4096
    python benchmarks/bench_int8.py --quick          # M = 1, N = K = 64, one run
    python benchmarks/bench_int8.py --backend emulate

The backend is mlx_precise's active one unless given (on a Mac: metal). The float16
``mx.matmul`` runs on MLX's default device. Times are medians of ``--repeat`` runs
after one warm-up, each forced with ``mx.eval``; on the cpu backend the int8 products
run as float64 BLAS products (exact) and the figures say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx
import numpy as np

import mlx_precise
from mlx_precise.int8 import scaled_mm
from mlx_precise.int8.engine import int8_matmul


def _time(fn, repeat: int) -> float:
    mx.eval(fn())  # warm-up: kernel build, caches
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        mx.eval(fn())
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def run(ms, n: int, k: int, backend: str, repeat: int) -> None:
    rng = np.random.default_rng(0)
    print(f"backend {backend}, MLX {mx.__version__}, default device {mx.default_device()}")
    print(f"{'M':>5} {'N':>5} {'K':>5} | {'scaled_mm ms':>12} {'int8 GEMM ms':>12} "
          f"{'fp16 matmul ms':>14} | {'epilogue share':>14} {'fp16 / scaled_mm':>16}")
    b = mx.array(rng.integers(-128, 128, (k, n), dtype=np.int8))
    b16 = mx.array(rng.standard_normal((k, n)).astype(np.float16))
    s_b = mx.array(rng.uniform(0.001, 0.01, (1, n)).astype(np.float32))
    bias = mx.array(rng.standard_normal(n).astype(np.float32))
    for m in ms:
        a = mx.array(rng.integers(-128, 128, (m, k), dtype=np.int8))
        a16 = mx.array(rng.standard_normal((m, k)).astype(np.float16))
        s_a = mx.array(rng.uniform(0.001, 0.01, (m, 1)).astype(np.float32))
        mx.eval(a, a16, s_a)
        t_s = _time(lambda: scaled_mm(a, b, s_a, s_b, bias=bias, out_dtype=mx.float16,
                                      backend=backend), repeat)
        t_g = _time(lambda: int8_matmul(a, b, backend=backend), repeat)
        t_h = _time(lambda: mx.matmul(a16, b16), repeat)
        share = max(t_s - t_g, 0.0) / t_s
        print(f"{m:>5} {n:>5} {k:>5} | {1e3 * t_s:>12.3f} {1e3 * t_g:>12.3f} {1e3 * t_h:>14.3f} | "
              f"{100 * share:>13.1f}% {t_h / t_s:>16.2f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--full", action="store_true", help="N = K = 4096")
    p.add_argument("--quick", action="store_true", help="M = 1, N = K = 64, one run: a smoke test")
    p.add_argument("--backend", choices=mlx_precise.BACKENDS, default=None)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    backend = mlx_precise.core.backends.resolve(args.backend)
    if args.quick:
        run((1,), 64, 64, backend, 1)
        return
    nk = 4096 if args.full else 1024
    run((1, 32, 512), nk, nk, backend, args.repeat)


if __name__ == "__main__":
    main()
