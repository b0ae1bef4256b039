"""Fixed-point conversion throughput: the fused kernels against composed MLX ops.

    python benchmarks/bench_fixedpoint.py            # 2^20 elements
    python benchmarks/bench_fixedpoint.py --full     # 2^24 elements
    python benchmarks/bench_fixedpoint.py --quick    # 2^12 elements, one run (smoke test)
    python benchmarks/bench_fixedpoint.py --backend emulate

The conversions are memory-bound. The fused kernel reads x once and writes the
result once; the composed version (``mx.clip``, multiply, ``mx.round``,
``mx.minimum``, multiply) reads and writes memory once per op unless ``mx.compile``
fuses them, so both the eager and the compiled composition are timed. Composed ops run
on MLX's default device (the GPU on a Mac with the ``metal`` backend, else the CPU).
Each time is the median of several runs after a warm-up; GB/s counts the bytes the
fused kernel must move (read x, write y).
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx
import numpy as np

import mlx_precise.fixedpoint as fp
from mlx_precise.core import backends


def composed_q115(x, t=fp.Q115_THRESHOLD):
    y = mx.round(mx.clip(x, -t, t) * 32768.0)  # mx.round: half to even
    return mx.minimum(y, 32767.0) * (1.0 / 32768.0)


def composed_q115_codes(x, t=fp.Q115_THRESHOLD):
    return mx.minimum(mx.round(mx.clip(x, -t, t) * 32768.0), 32767.0).astype(mx.int16)


def composed_q131(x, t=fp.Q131_THRESHOLD):
    # float32 cannot hold 2^31 - 1: saturating at 2^31 is the same float32 value.
    return mx.round(mx.clip(x, -t, t) * 2147483648.0) * (1.0 / 2147483648.0)


def timeit(fn, x, reps: int) -> float:
    mx.eval(fn(x))  # warm-up (compiles kernels)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        mx.eval(fn(x))
        mx.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="2^24 elements (default 2^20)")
    ap.add_argument("--quick", action="store_true", help="2^12 elements, one run: a smoke test")
    ap.add_argument("--backend", default=None, help="metal | emulate | cpu (default: active)")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    n = 2**12 if args.quick else 2**24 if args.full else 2**20
    if args.quick:
        args.reps = 1
    backend = backends.resolve(args.backend)
    rng = np.random.default_rng(0)
    x = mx.array(rng.uniform(-1.2, 1.2, n).astype(np.float32))
    mx.eval(x)
    print(f"fixed-point conversions, n = 2^{n.bit_length() - 1}, backend '{backend}', "
          f"composed ops on {mx.default_device()}, MLX {mx.__version__}")
    rows = [
        ("simulate_q115", lambda v: fp.simulate_q115(v, backend=backend), composed_q115, 8),
        ("float_to_q115", lambda v: fp.float_to_q115(v, backend=backend), composed_q115_codes, 6),
        ("simulate_q131", lambda v: fp.simulate_q131(v, backend=backend), composed_q131, 8),
    ]
    head = (f"{'function':<15} {'fused ms':>9} {'GB/s':>7} {'composed ms':>12} "
            f"{'compiled ms':>12} {'fused/composed':>15} {'same bits':>10}")
    print(head)
    print("-" * len(head))
    for name, fused, composed, nbytes in rows:
        same = np.array_equal(np.array(fused(x)), np.array(composed(x)))
        tf = timeit(fused, x, args.reps)
        tc = timeit(composed, x, args.reps)
        tcc = timeit(mx.compile(composed), x, args.reps)
        print(f"{name:<15} {tf * 1e3:9.2f} {n * nbytes / tf / 1e9:7.2f} {tc * 1e3:12.2f} "
              f"{tcc * 1e3:12.2f} {tf / min(tc, tcc):15.2f} {str(same):>10}")


if __name__ == "__main__":
    main()
