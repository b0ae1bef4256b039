"""Double-word FFT against float32 ``mx.fft.fft``: time, accuracy, cost model.

For complex64 input, batch 1, n in {2^10, 2^16, 2^20} (--full adds 2^22, three
passes): the time of ``fft_extended`` (rounded output) on the active backend (or
--backend) and of ``mx.fft.fft`` on MLX's default device, the normwise error of
both against a long double FFT of the same input (numpy's float64 FFT where
long double is float64, e.g. on Apple arm64: it still resolves errors of 1e-15),
and per point of the transform the float32 operations and device bytes of each,
with the roofline time ratio they imply on an Apple M2 Max (400 GB/s,
13.6 TFLOP/s fp32). On the cpu backend "extended" is numpy's complex128 FFT; on
emulate it is the Metal kernels run by the CPU emulator (not a GPU timing); on
metal (a Mac) the timings are the GPU's.

    python benchmarks/bench_fft.py [--backend cpu|emulate|metal] [--full | --quick]
"""

from __future__ import annotations

import argparse
import importlib
import math
import time

import mlx.core as mx
import numpy as np

import mlx_precise as mp

try:
    import scipy
    import scipy.fft as sfft
except ImportError:
    sfft = None

mpfft = importlib.import_module("mlx_precise.fft")  # the package, not the function
fftengine = importlib.import_module("mlx_precise.fft.engine")  # the 1-D engine

M2_MAX_BW, M2_MAX_FLOPS = 400e9, 13.6e12

# float32 operations (an fma counts 1) of the double-word building blocks in
# metal/include/doubleword.h: DW+DW 20, DW*DW 9; complex: cdw_add 40, cdw_mul 76.
CDW_ADD, CDW_MUL, DW_MUL = 40, 76, 9
RADIX4_PER_POINT = (3 * CDW_MUL + 8 * CDW_ADD) / 4  # one radix-4 stage (2 levels)
RADIX2_PER_POINT = 2 * CDW_ADD / 2  # the twiddle-free radix-2 stage


def dw_cost(n: int, rounded: bool = True) -> tuple[float, float]:
    """(flops, device bytes) per point of a complex64 -> complex64 DW FFT of a
    power of two n, following mlx_precise.fft.engine._plan and fft_pass.metal. Twiddle
    reads are assumed to hit the cache (the table is 8 B per point of n)."""
    flops, nbytes = 0.0, 0.0
    logs = fftengine._plan(int(math.log2(n)))
    for i, r in enumerate(logs):
        flops += (r % 2) * RADIX2_PER_POINT + (r // 2) * RADIX4_PER_POINT
        flops += CDW_MUL if i > 0 else 0  # pre-twiddle of later passes
        read = 8 if i == 0 else 16  # complex64 input: no low words to read
        write = 8 if (i == len(logs) - 1 and rounded) else 16
        nbytes += read + write
    return flops, nbytes


def f32_cost(n: int) -> tuple[float, float]:
    """(flops, bytes) per point of a float32 complex FFT: the textbook 5 log2 n
    flops, and 16 B per pass with MLX's passes (one up to 4096 points in
    threadgroup memory, two above: its four-step plan)."""
    passes = 1 if n <= 4096 else 2
    return 5 * math.log2(n), 16.0 * passes


def best_time(fn, repeat: int) -> float:
    mx.eval(fn())
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        mx.eval(fn())
        best = min(best, time.perf_counter() - t)
    return best


def interleaved(fns, repeat: int, pause: float = 0.0, burst: int = 2) -> list:
    """Median seconds of each function, the functions taking turns ``repeat``
    times (so that load from other processes hits all of them alike). A turn is a
    burst of ``burst`` calls of which the last is timed: it measures a function
    called again and again, as a user's loop does, not the page faults of regrowing
    a heap that the previous function's frees trimmed (glibc returns freed memory
    to the system). Each call comes after a ``pause`` in seconds: where BLAS runs,
    its worker threads spin for a while after a call and would otherwise slow
    whichever function runs next."""
    times = [[] for _ in fns]
    for f in fns:
        f()
    for _ in range(repeat):
        for t, f in zip(times, fns):
            for _ in range(burst):
                time.sleep(pause)
                t0 = time.perf_counter()
                f()
                dt = time.perf_counter() - t0
            t.append(dt)
    return [float(np.median(t)) for t in times]


def print_table(title: str, header, rows) -> None:
    """A markdown table under a blank line and its title."""
    print(f"\n{title}")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    print("\n".join(rows))


def reference(x: np.ndarray) -> tuple[np.ndarray, str]:
    if np.finfo(np.longdouble).nmant >= 63:
        return np.fft.fft(x.astype(np.clongdouble)), "long double"
    return np.fft.fft(x.astype(np.complex128)), "float64"


def normwise(y: np.ndarray, ref: np.ndarray) -> float:
    d = y.astype(ref.dtype) - ref
    return float(np.sqrt(np.sum(np.abs(d) ** 2) / np.sum(np.abs(ref) ** 2)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=mp.BACKENDS, default=None)
    p.add_argument("--full", action="store_true", help="also n = 2^22")
    p.add_argument("--quick", action="store_true", help="n = 2^10 only, one run: a smoke test")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    backend = mp.core.backends.resolve(args.backend)
    sizes = [2**10] if args.quick else [2**10, 2**16, 2**20] + ([2**22] if args.full else [])
    if args.quick:
        args.repeat = 1
    rng = np.random.default_rng(0)
    print(f"backend: {backend}; mx.fft.fft on {mx.default_device()}; batch 1, complex64 input")
    print("| n | passes | extended s | mx.fft s | ratio | normwise ext | normwise f32 "
          "| exactly rounded ext / f32 | flop/pt ext, f32 | B/pt ext, f32 "
          "| est. GPU ratio (M2 Max) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows_sp = []
    for n in sizes:
        x = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64)
        xm = mx.array(x)
        ext = lambda: mpfft.fft_extended(xm, backend=backend)  # noqa: E731
        f32 = lambda: mx.fft.fft(xm)  # noqa: E731
        t_ext, t_f32 = best_time(ext, args.repeat), best_time(f32, args.repeat)
        if sfft is not None:  # what a Linux user would run instead, interleaved
            sp64 = lambda: sfft.fft(x.astype(np.complex128), workers=-1).astype(np.complex64)  # noqa: E731
            sp32 = lambda: sfft.fft(x, workers=-1)  # noqa: E731
            te, t64, t32 = interleaved([lambda: np.asarray(ext()), sp64, sp32], args.repeat + 4)
            rows_sp.append(f"| 2^{int(math.log2(n))} | {te:.4g} | {t64:.4g} | {t32:.4g} "
                           f"| {te / t64:.2f} | {te / t32:.2f} |")
        ref, rname = reference(x)
        d = mpfft.fft_extended(xm, round_output=False, backend=backend)
        e_dw = normwise(d.to_float64(), ref)
        y_ext, y_f32 = np.array(ext()), np.array(f32())
        r32 = ref.astype(np.complex64)
        frac = [float(np.mean(np.concatenate([(y.real == r32.real), (y.imag == r32.imag)])))
                for y in (y_ext, y_f32)]
        (fe, be), (ff, bf) = dw_cost(n), f32_cost(n)
        est = max(fe / M2_MAX_FLOPS, be / M2_MAX_BW) / max(ff / M2_MAX_FLOPS, bf / M2_MAX_BW)
        print(f"| 2^{int(math.log2(n))} | {len(fftengine._plan(int(math.log2(n))))} "
              f"| {t_ext:.4g} | {t_f32:.4g} | {t_ext / t_f32:.3g} | {e_dw:.2e} "
              f"| {normwise(y_f32, ref):.2e} | {100 * frac[0]:.4f}% / {100 * frac[1]:.1f}% "
              f"| {fe:.0f}, {ff:.0f} | {be:.0f}, {bf:.0f} | {est:.2f} |")
    if rows_sp:
        print_table(f"backend {backend} against scipy.fft {scipy.__version__} (workers=-1), "
                    "medians of interleaved bursts (goal on cpu: <= 1.1x float64)",
                    ("n", "extended s", "scipy f64 s", "scipy f32 s", "ext / f64", "ext / f32"),
                    rows_sp)
    print(f"(reference: {rname} FFT of the complex64 input; 'normwise ext' is the "
          "unrounded DoubleWord result)")


if __name__ == "__main__":
    main()
