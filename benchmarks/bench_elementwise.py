"""Double-word elementwise operations against their float32 MLX equivalents.

For complex multiply, fft_scale and the 3-tap depthwise convolution at 2^20 (and
with --full 2^24) elements: time of the extended version on the active backend (or
--backend) and of the float32 MLX equivalent, bytes moved and flops per element,
and the roofline estimate for an Apple M2 Max (400 GB/s, 13.6 TFLOP/s fp32) beside
the measured numbers. On the cpu backend "extended" is the native float64 path.
Also prints how often each result is exactly rounded (reference: the float64
value, one more rounding to float32).

    python benchmarks/bench_elementwise.py [--backend cpu|emulate|metal] [--full | --quick]
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx
import numpy as np

import mlx_precise as mp

M2_MAX_BW, M2_MAX_FLOPS = 400e9, 13.6e12

# Per element: bytes read + written, flops (float32 ops). Double-word counts from
# metal/include/doubleword.h: TwoProd 2, DW*DW 9, accurate DW+DW 20, DW*FP 6,
# DW+FP 10, TwoSum 6.
COSTS = {
    # complex64 in/out; lo words of complex64 inputs are broadcast zeros (cached).
    "complex_multiply": dict(ext_bytes=24, ext_flops=4 * 9 + 2 * 20 + 2, f32_bytes=24, f32_flops=6),
    "fft_scale": dict(ext_bytes=8, ext_flops=6 + 1, f32_bytes=8, f32_flops=1),
    # 3 taps (neighbouring reads hit the cache): TwoProd + TwoSum + 2 DW+FP each.
    "depthwise3": dict(ext_bytes=8, ext_flops=3 * (2 + 6 + 20) + 10 + 1, f32_bytes=8, f32_flops=6),
}


def timeit(fn, repeat: int) -> float:
    mx.eval(fn())
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        mx.eval(out.hi if isinstance(out, mp.DoubleWord) else out)
        best = min(best, time.perf_counter() - t)
    return best


def exactly_rounded(y32: np.ndarray, y64: np.ndarray) -> float:
    return float(np.mean(y32 == y64.astype(y32.dtype)))


def cases(n: int, rng):
    a = mx.array((rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64))
    b = mx.array((rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64))
    x = mx.array(rng.standard_normal(n).astype(np.float32))
    xc = mx.array(rng.standard_normal((1, 64, n // 64)).astype(np.float32))
    w = mx.array(rng.standard_normal((64, 3)).astype(np.float32))
    a64, b64 = np.array(a).astype(np.complex128), np.array(b).astype(np.complex128)
    xc64, w64 = np.array(xc, np.float64), np.array(w, np.float64)
    dw_ref = sum(w64[None, :, j, None] * np.pad(xc64, ((0, 0), (0, 0), (2, 0)))[:, :, j:j + n // 64]
                 for j in range(3))
    return {
        "complex_multiply": (lambda be: mp.complex_multiply_extended(a, b, backend=be),
                             lambda: a * b, a64 * b64),
        "fft_scale": (lambda be: mp.fft_scale_extended(x, 1000, backend=be),
                      lambda: x * (1.0 / 1000), np.array(x, np.float64) / 1000),
        "depthwise3": (lambda be: mp.depthwise3_extended(xc, w, backend=be),
                       lambda: mp.depthwise3.plain(xc, w), dw_ref),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=mp.BACKENDS, default=None)
    p.add_argument("--full", action="store_true", help="also 2^24 elements")
    p.add_argument("--quick", action="store_true", help="2^12 elements, one run: a smoke test")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    backend = mp.core.backends.resolve(args.backend)
    sizes = [2**12] if args.quick else [2**20] + ([2**24] if args.full else [])
    repeat = 1 if args.quick else args.repeat
    print(f"backend: {backend}, MLX {mx.__version__}, default device {mx.default_device()}")
    print("| op | n | extended ms | float32 ms | ratio | B/elem | flop/elem (ext/f32) "
          "| M2 Max roofline ratio | exactly rounded ext / f32 |")
    print("|---|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for n in sizes:
        for name, (ext, f32, ref) in cases(n, rng).items():
            te = timeit(lambda: ext(backend), repeat)
            tf = timeit(f32, repeat)
            c = COSTS[name]
            roof_e = max(c["ext_bytes"] / M2_MAX_BW, c["ext_flops"] / M2_MAX_FLOPS)
            roof_f = max(c["f32_bytes"] / M2_MAX_BW, c["f32_flops"] / M2_MAX_FLOPS)
            ye, yf = np.array(ext(backend)), np.array(f32())
            if np.iscomplexobj(ref):
                er = exactly_rounded(np.concatenate([ye.real, ye.imag]), np.concatenate([ref.real, ref.imag]))
                fr = exactly_rounded(np.concatenate([yf.real, yf.imag]), np.concatenate([ref.real, ref.imag]))
            else:
                er, fr = exactly_rounded(ye, ref), exactly_rounded(yf, ref)
            print(f"| {name} | 2^{n.bit_length() - 1} | {1e3 * te:.2f} | {1e3 * tf:.2f} | "
                  f"{te / tf:.2f} | {c['ext_bytes']} | {c['ext_flops']}/{c['f32_flops']} | "
                  f"{roof_e / roof_f:.2f} | {100 * er:.4f}% / {100 * fr:.2f}% |", flush=True)


if __name__ == "__main__":
    main()
