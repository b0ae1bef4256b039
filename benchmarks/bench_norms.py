"""Throughput and accuracy of mlx_precise.norms.norm against MLX's own ops.

For each float32 n x n matrix and each kind it prints the time, the throughput in
GB/s (bytes of the matrix read once / time), and the error in ulps of the float32
result against the float64 value of the same norm (numpy), for mlx_precise and for
MLX: ``mx.linalg.norm`` (Frobenius) and composed MLX ops for the others
(``max(abs(A))``, ``max(sum(abs(A), 0))``, ``max(sum(abs(A), 1))``).

On an Apple GPU (backend ``metal``) it also prints the share of memory bandwidth
reached: of the streaming rate of ``mx.sum(A)`` measured here (a read-once
reduction), and of ``--peak-gbs`` if you give your chip's nominal figure. The goal
is >= 80%.

    python benchmarks/bench_norms.py                  # 1024^2, 2048^2 (< 1 min on a CPU)
    python benchmarks/bench_norms.py --full           # 4096^2, 16384^2
    python benchmarks/bench_norms.py --quick          # 64^2, one run (smoke test)
    python benchmarks/bench_norms.py --backend emulate --sizes 512 4096
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

import mlx_precise
from mlx_precise.norms import norm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fft import interleaved  # noqa: E402

KINDS = ("max", "one", "inf", "fro")
MLX_OPS = {
    "max": lambda a: mx.max(mx.abs(a)),
    "one": lambda a: mx.max(mx.sum(mx.abs(a), axis=0)),
    "inf": lambda a: mx.max(mx.sum(mx.abs(a), axis=1)),
    "fro": lambda a: mx.linalg.norm(a),
}


NUMPY_OPS = {
    "max": lambda a: np.abs(a).max(),
    "one": lambda a: np.linalg.norm(a, 1),
    "inf": lambda a: np.linalg.norm(a, np.inf),
    "fro": lambda a: np.linalg.norm(a),
}


def dsdot_products_exact():
    """Does the BLAS ``dsdot`` that scipy ships (float32 data, float64 sum) form
    exact products? (computed, exact) for 33 copies of 1 + 2^-23, whose squares
    need 47 bits; None without scipy."""
    import ctypes

    try:
        from scipy.linalg import cython_blas
    except ImportError:
        return None
    cap = cython_blas.__pyx_capi__["dsdot"]
    api = ctypes.pythonapi
    api.PyCapsule_GetName.restype, api.PyCapsule_GetName.argtypes = ctypes.c_char_p, [ctypes.py_object]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    ip, fp = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_float)
    dsdot = ctypes.CFUNCTYPE(ctypes.c_double, ip, fp, ip, fp, ip)(
        api.PyCapsule_GetPointer(cap, api.PyCapsule_GetName(cap)))
    x = np.full(33, 1 + 2.0**-23, np.float32)
    n, one, p = ctypes.c_int(x.size), ctypes.c_int(1), x.ctypes.data_as(fp)
    got = dsdot(ctypes.byref(n), p, ctypes.byref(one), p, ctypes.byref(one))
    return got, 33 * (1 + 2.0**-22 + 2.0**-46)


def reference(a64: np.ndarray, kind: str) -> np.float32:
    """The float64 norm rounded to float32 (float64 sums err by ~1e-16 relative,
    far below a float32 ulp)."""
    if kind == "max":
        v = np.abs(a64).max()
    elif kind == "one":
        v = np.abs(a64).sum(axis=0).max()
    elif kind == "inf":
        v = np.abs(a64).sum(axis=1).max()
    else:
        v = np.sqrt(np.dot(a64.ravel(), a64.ravel()))
    return np.float32(v)


def ulps(x, y) -> int:
    i, j = (np.array(np.float32(v)).view(np.int32).astype(np.int64) for v in (x, y))
    return int(abs(i - j))


def timed(fn, repeats: int) -> tuple[float, float]:
    """(best seconds, value) of ``fn`` (evaluated: .item() waits for the device)."""
    value = fn().item()  # warm-up: compile, caches
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = fn().item()
        best = min(best, time.perf_counter() - t0)
    return best, value


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--full", action="store_true", help="sizes 4096 and 16384")
    p.add_argument("--quick", action="store_true", help="size 64, one run: a smoke test")
    p.add_argument("--sizes", type=int, nargs="+", help="matrix sizes n (n x n)")
    p.add_argument("--backend", default=None, choices=mlx_precise.BACKENDS,
                   help="default: the active backend")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--peak-gbs", type=float, default=None,
                   help="nominal memory bandwidth of the device (GB/s), for the share")
    args = p.parse_args(argv)
    backend = args.backend or mlx_precise.backend()
    sizes = args.sizes or ((64,) if args.quick else (4096, 16384) if args.full else (1024, 4096))
    if args.quick:
        args.repeats = 1
    on_gpu = backend == "metal"
    print(f"mlx-precise norms on backend '{backend}' (MLX {mx.__version__}, "
          f"MLX default device {mx.default_device()})")
    if not on_gpu:
        print("note: not an Apple GPU: GB/s are those of the CPU path or the Metal "
              "emulator, not of a GPU")
    head = (f"{'n':>6} {'kind':>4} | {'ours ms':>9} {'GB/s':>7} {'ulp':>4} | "
            f"{'MLX ms':>9} {'GB/s':>7} {'ulp':>4}")
    if on_gpu:
        head += f" | {'% stream':>8}" + (f" {'% peak':>6}" if args.peak_gbs else "")
    print(head)
    print("-" * len(head))
    rows_np = []
    rng = np.random.default_rng(0)
    for n in sizes:
        a32 = rng.standard_normal((n, n), dtype=np.float32)
        a = mx.array(a32)
        mx.eval(a)
        gbytes = a.nbytes / 1e9
        a64 = a32.astype(np.float64)
        stream = None
        if on_gpu:
            t, _ = timed(lambda: mx.sum(a), args.repeats)
            stream = gbytes / t
        for kind in KINDS:
            want = reference(a64, kind)
            t_ours, v_ours = timed(lambda: norm(a, kind, backend=backend), args.repeats)
            t_mlx, v_mlx = timed(lambda: MLX_OPS[kind](a), args.repeats)
            line = (f"{n:>6} {kind:>4} | {t_ours * 1e3:>9.2f} {gbytes / t_ours:>7.1f} "
                    f"{ulps(v_ours, want):>4} | {t_mlx * 1e3:>9.2f} {gbytes / t_mlx:>7.1f} "
                    f"{ulps(v_mlx, want):>4}")
            if on_gpu:
                line += f" | {100 * gbytes / t_ours / stream:>7.0f}%"
                if args.peak_gbs:
                    line += f" {100 * gbytes / t_ours / args.peak_gbs:>5.0f}%"
            print(line, flush=True)
            if not on_gpu:  # numpy on the float64 cast (cast done beforehand), interleaved
                te, tn, tc, t_cast = interleaved(
                    [lambda: norm(a, kind, backend=backend).item(),
                     lambda: NUMPY_OPS[kind](a64),
                     lambda: NUMPY_OPS[kind](a32.astype(np.float64)),
                     lambda: a32.astype(np.float64)], args.repeats + 4, pause=0.05)
                rows_np.append(f"{n:>6} {kind:>4} | {te * 1e3:>9.2f} {tn * 1e3:>9.2f} "
                               f"{te / tn:>6.2f} | {tc * 1e3:>9.2f} {te / tc:>6.2f} | "
                               f"{t_cast * 1e3:>9.2f}")
    if rows_np:
        print("\nagainst numpy on the float64 cast (np.linalg.norm; max: np.abs().max()): "
              "on a float64 copy made beforehand, and cast included; medians of "
              "interleaved bursts (goal: <= 1.5x)")
        print(f"{'n':>6} {'kind':>4} | {'ours ms':>9} {'numpy ms':>9} {'ratio':>6} | "
              f"{'+cast ms':>9} {'ratio':>6} | {'cast ms':>9}")
        print("\n".join(rows_np))
        print("cast ms: the float64 cast alone (a32.astype(np.float64), one thread), the "
              "work any numpy path of float32 data does before its float64 sums")
        check = dsdot_products_exact()
        if check is not None:
            print(f"BLAS dsdot (float32 data, float64 sum) of 33 x (1 + 2^-23): {check[0]!r}, "
                  f"exact {check[1]!r}: {'exact' if check[0] == check[1] else 'products rounded'}")
    if on_gpu:
        print("% stream: share of the rate of mx.sum(A) on the same matrix (read once)")


if __name__ == "__main__":
    main()
