"""Split-integer DGEMM emulation: speed against native float64, and the slice rules.

    python benchmarks/bench_ozaki.py                  # n = 256, 1024; cpu: n = 2048 memory
    python benchmarks/bench_ozaki.py --full           # n = 256, 1024, 2048 (+ 4096 on Metal)
    python benchmarks/bench_ozaki.py --quick          # n = 64, one burst: does it run
    python benchmarks/bench_ozaki.py --backend emulate
    python benchmarks/bench_ozaki.py --rules          # slices and errors per rule (docs/ozaki.md)

Performance table: for square n x n products of the phi test matrices, the slices
auto mode chose, the time of ``dgemm_emulated`` on the backend, and native float64
matmul on this machine's CPU (numpy's BLAS and MLX CPU), each as FP64-equivalent
GFLOP/s (2 n^3 / time), medians of interleaved bursts. The ``emulate`` backend runs
the Metal kernels on the CPU and only says whether they run; its times mean nothing
for a GPU.

Rules table (``--rules``): over phi in {-1, 0, 0.5, 1, 2, 4}, K in {64, 256, 1024},
64 x K x 64 products and several seeds, per rule the mean slice count, the number
of fallbacks and of cases whose max relative error (against a double-double
reference) exceeds native float64 matmul's, and the fewest slices that would have
kept native accuracy.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

# Sibling modules: the benchmarks folder is not a package (and ships in the wheel as
# mlx_precise/benchmarks, where tests/ does not exist).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fft import interleaved  # noqa: E402
from dd_reference import dd_matmul, rel_err_dd  # noqa: E402

from mlx_precise.core import backends  # noqa: E402
from mlx_precise.ozaki import dgemm_emulated  # noqa: E402

PHIS = (-1, 0, 0.5, 1, 2, 4)


def phi_matrix(phi, shape, rng):
    if phi == -1:
        return rng.standard_normal(shape)
    return (rng.uniform(size=shape) - 0.5) * np.exp(phi * rng.standard_normal(shape))


def perf(backend: str, sizes, phis, repeats: int) -> None:
    print(f"backend {backend}; FP64-equivalent GFLOP/s = 2 n^3 / time; medians of "
          f"{repeats} interleaved bursts (goal on cpu at n = 1024: <= 20x numpy)")
    print(f"{'n':>5} {'phi':>4} {'slices':>6} {'pairs':>5} {'emulated s':>10} {'GFLOP/s':>8} "
          f"{'numpy s':>8} {'GFLOP/s':>8} {'mlx cpu s':>9} {'GFLOP/s':>8} {'emu/native':>10}")
    rng = np.random.default_rng(0)
    for n in sizes:
        for phi in phis:
            a, b = phi_matrix(phi, (n, n), rng), phi_matrix(phi, (n, n), rng)
            A, B = mx.array(a, dtype=mx.float64), mx.array(b, dtype=mx.float64)
            _, info = dgemm_emulated(A, B, return_info=True, backend=backend)
            t_emu, t_np, t_mx = interleaved(
                [lambda: mx.eval(dgemm_emulated(A, B, backend=backend)), lambda: a @ b,
                 lambda: mx.eval(mx.matmul(A, B, stream=mx.cpu))], repeats, pause=0.05)
            flop = 2.0 * n**3
            s = info["slices"]
            label = "fb" if info["fallback"] else str(s)
            pairs = "-" if info["fallback"] else str(s * (s + 1) // 2)
            best = min(t_np, t_mx)
            print(f"{n:>5} {phi:>4} {label:>6} {pairs:>5} {t_emu:>10.3f} {flop / t_emu / 1e9:>8.2f} "
                  f"{t_np:>8.3f} {flop / t_np / 1e9:>8.2f} {t_mx:>9.3f} {flop / t_mx / 1e9:>8.2f} "
                  f"{t_emu / best:>9.1f}x", flush=True)


def memory(n: int) -> None:
    """Extra peak memory of one cpu product at n x n (phi = 0): numpy allocations
    traced by tracemalloc (the inputs already exist; the result is counted)."""
    import tracemalloc

    rng = np.random.default_rng(1)
    a, b = phi_matrix(0, (n, n), rng), phi_matrix(0, (n, n), rng)
    t0 = time.perf_counter()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    C = dgemm_emulated(a, b, backend="cpu")
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    print(f"\nn = {n}: extra peak {peak / 2**20:.0f} MiB of numpy allocations "
          f"(goal <= 256 MiB; the float64 result itself is {8 * n * n / 2**20:.0f} MiB), "
          f"{time.perf_counter() - t0:.1f} s, C finite: {bool(np.isfinite(np.array(C)).all())}")
    # The whole process (numpy and MLX buffers, BLAS): growth of the peak resident
    # set in a fresh process, inputs N(0, 1) made without temporaries, after a warm-up.
    # (VmHWM of /proc/self/status: ru_maxrss would carry the parent's peak over fork.)
    code = (
        "import re, numpy as np\n"
        "from mlx_precise.ozaki import dgemm_emulated\n"
        "hwm = lambda: int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1])\n"
        "dgemm_emulated(np.ones((64, 64)), np.ones((64, 64)), backend='cpu')\n"
        f"rng = np.random.default_rng(1); a = rng.standard_normal(({n}, {n})); "
        f"b = rng.standard_normal(({n}, {n}))\n"
        "r0 = hwm()\n"
        "dgemm_emulated(a, b, backend='cpu')\n"
        "print(round((hwm() - r0) / 1024))\n"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    print(f"n = {n}: peak resident set grew by {out.stdout.strip() or out.stderr[-200:]} MiB "
          "in a fresh process (phi = -1; everything: numpy, MLX's copy of the result, BLAS)")


def rules(seeds: int, size: int) -> None:
    """Slices and accuracy per rule on the phi suite (cpu implementation)."""
    methods = ("esc", "esc_estimate", "tight")
    print(f"phi suite, {size} x K x {size}, {seeds} seeds, 7-bit and 8-bit slices; "
          "native = MLX CPU float64 matmul; reference: double-double")
    print(f"{'b':>2} {'phi':>4} {'K':>5} | " + " | ".join(
        f"{m:>12}: mean s, fb, worse" for m in methods) + " | fewest s (mean) | est-ESC")
    for b in (7, 8):
        for phi in PHIS:
            for K in (64, 256, 1024):
                stats = {m: [[], 0, 0] for m in methods}
                fewest, gap = [], []
                for seed in range(seeds):
                    rng = np.random.default_rng(1000 * seed + 7)
                    A, B = phi_matrix(phi, (size, K), rng), phi_matrix(phi, (K, size), rng)
                    hi, lo = dd_matmul(A, B)
                    Am, Bm = mx.array(A, dtype=mx.float64), mx.array(B, dtype=mx.float64)
                    nat = rel_err_dd(np.array(mx.matmul(Am, Bm, stream=mx.cpu)), hi, lo).max()
                    for m in methods:
                        C, info = dgemm_emulated(Am, Bm, slices=m, slice_bits=b,
                                                 return_info=True, backend="cpu")
                        st = stats[m]
                        if info["fallback"]:
                            st[1] += 1
                        else:
                            st[0].append(info["slices"])
                            st[2] += rel_err_dd(np.array(C), hi, lo).max() > nat
                        if m == "esc_estimate":
                            est = info["esc"]
                    from mlx_precise.esc import esc
                    gap.append(est - int(np.array(esc(A, B, backend="cpu")).max()))
                    for S in range(4, 14):
                        C = dgemm_emulated(Am, Bm, slices=S, slice_bits=b, backend="cpu")
                        if rel_err_dd(np.array(C), hi, lo).max() <= nat:
                            fewest.append(S)
                            break
                cells = []
                for m in methods:
                    ss, fb, worse = stats[m]
                    mean = f"{np.mean(ss):5.2f}" if ss else "    -"
                    cells.append(f"{'':>12}  {mean}, {fb:>2}, {worse:>5}")
                print(f"{b:>2} {phi:>4} {K:>5} | " + " | ".join(cells)
                      + f" | {np.mean(fewest):15.2f} | {np.mean(gap):7.1f}", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=backends.BACKENDS, default=None)
    p.add_argument("--full", action="store_true", help="n = 256, 1024, 2048 (+ 4096 on Metal)")
    p.add_argument("--quick", action="store_true", help="n = 64, one burst: a smoke test")
    p.add_argument("--rules", action="store_true", help="slice rules on the phi suite")
    p.add_argument("--seeds", type=int, default=10)
    args = p.parse_args(argv)
    if args.rules:
        rules(args.seeds, 64)
        return 0
    name = backends.resolve(args.backend)
    if args.quick:
        perf(name, (64,), (0,), repeats=1)
        if name == "cpu":
            memory(64)
        return 0
    sizes = (256, 1024, 2048) if args.full else (256, 1024)
    if args.full and name == "metal":
        sizes += (4096,)
    perf(name, sizes, (0, 1) if args.full else (0,), repeats=3)
    if name == "cpu":
        memory(2048)
    return 0


if __name__ == "__main__":
    sys.exit(main())
