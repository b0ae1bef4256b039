"""The double-word matrix product (mlx_precise.linalg.gemm): measured accuracy, timings,
and the cost model against the split-integer (Ozaki) scheme on the int8 engine.

    python benchmarks/bench_dwgemm.py [--backend cpu|emulate] [--full | --quick]

Default: the cpu and emulate engines side by side (about 20 s on 2 cores);
``--backend`` measures that engine alone, ``--quick`` small sizes only, ``--full``
adds 512 x 512 x 512 to the timings.

Accuracy: each output's error |C - C_exact| is computed exactly rounded (math.fsum
of the exact float64 products of the float32 words, minus the two result words) and
reported in units of K u^2 S, S = sum_k |a_k| |b_k|, u = 2^-24 (the stated bound is
(K + 12) u^2 S, i.e. < 1 + 12/K in these units), plus the share of outputs that
round to the correctly rounded float32. The split-integer scheme runs as
mlx_precise.ozaki.dgemm_emulated on the same values (float64 hi + lo, exact).

Timings: medians of interleaved bursts (the last call of each burst, after a warm-up).
The emulator runs the Metal source on the CPU: its times show the cost of emulation,
not of a GPU; the model at the end estimates an M2 Max.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import mlx.core as mx
import numpy as np

from mlx_precise import ozaki
from mlx_precise.linalg import gemm as dwgemm
from mlx_precise.doubleword import DoubleWord

U2 = 2.0**-48

# M2 Max (public figures): 38 GPU cores x 128 ALUs x 1.398 GHz = 6.8e12 float32
# instructions/s (13.6 TFLOP/s counting an FMA as 2), 400 GB/s.
M2_INSTR_PER_S = 6.8e12
M2_BYTES_PER_S = 400e9
DW_INSTR_PER_TERM = 21  # metal/include/dw_gemm.h, dwg_acc_fma


def rand(rng, shape, phi=1.0):
    return (rng.random(shape) - 0.5) * np.exp(phi * rng.standard_normal(shape))


def words(x: DoubleWord):
    return np.array(x.hi).astype(np.float64), np.array(x.lo).astype(np.float64)


def exact_errors(c: DoubleWord, a: DoubleWord, b: DoubleWord):
    """(err / (K u^2 S), exactly rounded to float32?) per output, 2-D real operands."""
    (ah, al), (bh, bl), (ch, cl) = words(a), words(b), words(c)
    k = ah.shape[1]
    # every product of two float32 words is exact in float64
    prods = np.concatenate([x[:, :, None] * y[None] for x in (ah, al) for y in (bh, bl)], 1)
    s = (np.abs(ah + al) @ np.abs(bh + bl))
    m, n = ch.shape
    err = np.empty((m, n))
    rounded_ok = np.empty((m, n), bool)
    for i in range(m):
        for j in range(n):
            terms = list(prods[i, :, j])
            err[i, j] = math.fsum(terms + [-ch[i, j], -cl[i, j]])
            exact = math.fsum(terms)  # correctly rounded float64 of the exact value
            # float32 rounding of the exact value, decided on the float64 one
            # (a double rounding only within 2^-29 ulp of a float32 midpoint)
            rounded_ok[i, j] = np.float32(ch[i, j] + cl[i, j]) == np.float32(exact)
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.where(s > 0, np.abs(err) / (k * U2 * s), 0.0)
    return rel, rounded_ok


def accuracy(quick: bool, backends: list[str]) -> None:
    rng = np.random.default_rng(0)
    print("### Accuracy (max |C - C_exact| / (K u^2 S); share exactly rounded after one rounding)\n")
    print("| case | M x K x N | " + " | ".join(backends) + " | float32 matmul | exactly "
          f"rounded ({backends[-1]} / float32) |")
    print("|---|---|" + "---|" * len(backends) + "---|---|")
    cases = [("random, phi = 1", 64, 128, 64, 1.0, False),
             ("random, phi = 4", 32, 128, 32, 4.0, False),
             ("K = 1", 16, 1, 16, 1.0, False),
             ("K = 16", 16, 16, 16, 1.0, False),
             ("K = 500", 8, 500, 8, 1.0, False),
             ("cancelling rows (2^-30)", 32, 128, 32, 1.0, True)]
    if quick:
        cases = cases[:1] + cases[-1:]
    for name, m, k, n, phi, cancel in cases:
        if cancel:
            x, y = rand(rng, (m, k // 2)), rand(rng, (k // 2, n))
            e = 2.0**-30 * rand(rng, (k // 2, n))
            av, bv = np.concatenate([x, x], 1), np.concatenate([y, -y + e], 0)
        else:
            av, bv = rand(rng, (m, k), phi), rand(rng, (k, n), phi)
        a, b = DoubleWord.from_float64(av), DoubleWord.from_float64(bv)
        row = []
        for backend in backends:
            rel, ok = exact_errors(dwgemm.matmul(a, b, backend=backend), a, b)
            row.append(f"{rel.max():.3f}")
        c32 = DoubleWord.from_float32(mx.matmul(a.round(), b.round()))
        rel32, ok32 = exact_errors(c32, a, b)
        print(f"| {name} | {m} x {k} x {n} | " + " | ".join(row) + f" | {rel32.max():.3g} | "
              f"{100 * ok.mean():.1f}% / {100 * ok32.mean():.1f}% |", flush=True)


def split_integer_accuracy() -> None:
    m, k, n = 64, 128, 64
    print("\n### Split-integer scheme on the same values "
          f"({m} x {k} x {n}; 7-bit slices; max err / (K u^2 S))\n")
    kinds = [("double-word, phi = 1", 1.0, False), ("float32 (lo = 0), phi = 1", 1.0, True),
             ("float32 (lo = 0), phi = 0", 0.0, True)]
    print("| slices s | int8 GEMMs s(s+1)/2 | " + " | ".join(x[0] for x in kinds) + " |")
    print("|---|---|" + "---|" * len(kinds))
    rng = np.random.default_rng(1)
    data = []
    for _, phi, f32 in kinds:
        av, bv = rand(rng, (m, k), phi), rand(rng, (k, n), phi)
        if f32:
            a, b = (DoubleWord.from_float32(mx.array(v.astype(np.float32))) for v in (av, bv))
        else:
            a, b = DoubleWord.from_float64(av), DoubleWord.from_float64(bv)
        data.append((a, b, *(mx.array(x.to_float64(), dtype=mx.float64) for x in (a, b))))
    for s in (5, 6, 7, 8, 9):
        row = []
        for a, b, a64, b64 in data:
            c = np.array(ozaki.dgemm_emulated(a64, b64, slices=s, backend="cpu"))
            row.append(f"{exact_errors(DoubleWord.from_float64(c), a, b)[0].max():.3g}")
        print(f"| {s} | {s * (s + 1) // 2} | " + " | ".join(row) + " |", flush=True)
    row = [f"{exact_errors(dwgemm.matmul(a, b, backend='emulate'), a, b)[0].max():.3g}"
           for a, b, _, _ in data]
    print("| tiled DW GEMM | - | " + " | ".join(row) + " |")


def _median_last(fns: dict, bursts: int, burst: int) -> dict:
    for f in fns.values():
        mx.eval(f())  # warm-up (kernel build)
    times = {name: [] for name in fns}
    for _ in range(bursts):
        for name, f in fns.items():  # interleaved
            for _ in range(burst):
                t0 = time.perf_counter()
                mx.eval(f())
                t = time.perf_counter() - t0
            times[name].append(t)
    return {name: statistics.median(v) for name, v in times.items()}


def timings(quick: bool, full: bool, backends: list[str]) -> None:
    rng = np.random.default_rng(2)
    sizes = [(64, 128, 64)] if quick else [(64, 128, 64), (128, 256, 128), (256, 256, 256)]
    sizes += [(512, 512, 512)] if full else []
    print("\n### Timings (ms, median; this machine's CPU)\n")
    print("| M x K x N | DW cpu (MLX float64) | float32 mx.matmul (CPU) | DW emulate | "
          "split-int emulate, 8 slices | DW emulate ns per output x K |")
    print("|---|---|---|---|---|---|")
    for m, k, n in sizes:
        a = DoubleWord.from_float64(rand(rng, (m, k)))
        b = DoubleWord.from_float64(rand(rng, (k, n)))
        a64, b64 = (mx.array(x.to_float64(), dtype=mx.float64) for x in (a, b))
        a32, b32 = a.round(), b.round()
        mx.eval(a.hi, a.lo, b.hi, b.lo, a64, b64, a32, b32)
        fns = {
            "cpu": lambda: (lambda c: (c.hi, c.lo))(dwgemm.matmul(a, b, backend="cpu")),
            "f32": lambda: mx.matmul(a32, b32, stream=mx.cpu),
            "emulate": lambda: (lambda c: (c.hi, c.lo))(dwgemm.matmul(a, b, backend="emulate")),
            "ozaki": lambda: ozaki.dgemm_emulated(a64, b64, slices=8, backend="emulate"),
        }
        if "emulate" not in backends:
            fns.pop("emulate"), fns.pop("ozaki")
        if "cpu" not in backends:
            fns.pop("cpu")
        t = _median_last(fns, bursts=1 if quick else 3, burst=2)
        cell = (lambda key, f: f.format(1e3 * t[key]) if key in t else "-")
        per = f"{1e9 * t['emulate'] / (m * n * k):.2f}" if "emulate" in t else "-"
        print(f"| {m} x {k} x {n} | {cell('cpu', '{:.2f}')} | {cell('f32', '{:.2f}')} | "
              f"{cell('emulate', '{:.1f}')} | {cell('ozaki', '{:.1f}')} | {per} |", flush=True)


def model() -> None:
    """Per output and per k, for a 4096^3 product, on an M2 Max."""
    m = n = k = 4096
    print("\n### Metal cost model (M2 Max estimate, M = N = K = 4096)\n")
    print("| engine | launches | instructions per output per k | bytes per output per k "
          "(tile loads) | compute ms | memory ms |")
    print("|---|---|---|---|---|---|")
    macs = m * n * k
    # tiled DW GEMM: 32 x 32 tiles, both words of A and B staged once per K step
    dw_bytes = 8 * (32 + 32) / (32 * 32)
    rows = [("tiled DW GEMM (real)", 1, DW_INSTR_PER_TERM, dw_bytes)]
    # split-integer: s slices per operand (7 bits), s(s+1)/2 int8 GEMMs, one int32
    # multiply-add each per output per k; int8 tiles of 32 x 32 (1 byte per element)
    for s in (7, 8):
        t = s * (s + 1) // 2
        rows.append((f"split-int, {s} slices ({t} int8 GEMMs), int32 MAD at full rate",
                     4, t, t * (32 + 32) / (32 * 32)))
        rows.append((f"split-int, {s} slices, int32 MAD at 1/4 rate", 4, 4 * t,
                     t * (32 + 32) / (32 * 32)))
    for name, launches, instr, bpk in rows:
        print(f"| {name} | {launches} | {instr} | {bpk:.3g} | "
              f"{1e3 * macs * instr / M2_INSTR_PER_S:.0f} | "
              f"{1e3 * macs * bpk / M2_BYTES_PER_S:.0f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("cpu", "emulate"), default=None,
                   help="measure this engine only (default: cpu and emulate side by side)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small sizes only")
    size.add_argument("--full", action="store_true", help="also 512 x 512 x 512")
    args = p.parse_args()
    backends = [args.backend] if args.backend else ["cpu", "emulate"]
    print(f"MLX {mx.__version__}; engines: {', '.join(backends)}\n")
    accuracy(args.quick, backends)
    if not args.quick and "emulate" in backends:
        split_integer_accuracy()
    timings(args.quick, args.full, backends)
    model()


if __name__ == "__main__":
    main()
