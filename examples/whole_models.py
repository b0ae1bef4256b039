"""Whole models (examples/models/) plain float32 against ``extended_precision()``.

    python examples/whole_models.py [--size small|medium|large]
                                    [--backend cpu --backend emulate] [--models hyena s4d ...]
                                    [--repeat 3]

For each model (Hyena operator with its implicit filter, S4D, FNO, an audio log-mel
front end, a convolutional vocoder, a transformer block) and backend: the share of
outputs exactly rounded (equal to the float64 oracle rounded to float32), the
normwise error ``||y - ref|| / ||ref||`` of the float32 output, the normwise error of
the carried double-word value (high + low word, before the final rounding), the
time of one forward pass (best of ``--repeat``), and the ops that consumed a
double-word value in float32 (the report's ``float32`` list: ops without a rule).
"floor" is the error of the oracle itself rounded to float32: an exactly rounded
output has that error, so the float32 output of any method cannot go below it.
The oracle is each model's math in float64 numpy from the same float32 inputs and
parameters (examples/models/*.py: ``oracle``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

import mlx.core as mx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mlx_precise  # noqa: E402
from mlx_precise.extended import low_word  # noqa: E402
from models import MODELS  # noqa: E402
from models._common import params64  # noqa: E402


def score(y, ref) -> tuple[float, float]:
    """(share exactly rounded, normwise error) of float32 y against float64 ref."""
    y = np.array(y)
    return (float(np.mean(y == ref.astype(np.float32))),
            float(np.linalg.norm(y.astype(np.float64) - ref) / np.linalg.norm(ref)))


def words64(y) -> np.ndarray:
    """The double-word value y carries (high + low word) in float64."""
    lo = low_word(y)
    hi = np.array(y).astype(np.float64)
    return hi if lo is None else hi + np.array(lo).astype(np.float64)


def _timed(fn, repeat: int):
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        mx.eval(out)
        best = min(best, time.perf_counter() - t)
    return out, best


def measure(name: str, size: str = "small", backends=("cpu", "emulate"), repeat: int = 1,
            seed: int = 0) -> dict:
    """{"plain": row, backend: row, ..., "floor": float} with rows
    {"exact", "err", "dw_err", "time", "float32"}."""
    mod = importlib.import_module(f"models.{name}")
    model, x = mod.build(size, seed)
    ref = mod.oracle(params64(model), np.array(x).astype(np.float64))
    norm = np.linalg.norm(ref)
    y, t = _timed(lambda: model(x), repeat)
    exact, err = score(y, ref)
    out = {"floor": score(ref.astype(np.float32), ref)[1],
           "plain": dict(exact=exact, err=err, dw_err=err, time=t, float32={})}
    for b in backends:
        with mlx_precise.use_backend(b):
            reports = []

            def run():
                with mlx_precise.extended_precision() as rep:
                    v = model(x)
                    mx.eval(v)
                reports.append(rep)
                return v

            y, t = _timed(run, repeat)
        exact, err = score(y, ref)
        out[b] = dict(exact=exact, err=err, time=t, float32=dict(reports[-1].float32),
                      dw_err=float(np.linalg.norm(words64(y) - ref) / norm))
    return out


def launches(name: str, size: str = "small", seed: int = 0) -> dict:
    """The double-word kernels one forward pass launches on the Metal path,
    counted on the emulator (the same launches metal makes): {"launches",
    "bytes" (inputs read + outputs written by those kernels), "by_kernel"}.
    MLX's own ops between them (slices, pads, casts) are not counted."""
    from mlx_precise.core import kernels

    mod = importlib.import_module(f"models.{name}")
    model, x = mod.build(size, seed)
    counts: dict = {}
    total = {"launches": 0, "bytes": 0}
    call = kernels.Kernel.__call__

    def counting(self, *, inputs, output_shapes, output_dtypes, **kw):
        total["launches"] += 1
        counts[self.name] = counts.get(self.name, 0) + 1
        total["bytes"] += sum(a.nbytes for a in inputs if isinstance(a, mx.array))
        total["bytes"] += sum(int(np.prod(s)) * d.size for s, d in zip(output_shapes,
                                                                       output_dtypes))
        return call(self, inputs=inputs, output_shapes=output_shapes,
                    output_dtypes=output_dtypes, **kw)

    kernels.Kernel.__call__ = counting
    try:
        with mlx_precise.use_backend("emulate"), mlx_precise.extended_precision():
            mx.eval(model(x))
    finally:
        kernels.Kernel.__call__ = call
    return {**total, "by_kernel": counts, "outputs": int(np.prod(model(x).shape))}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="small", choices=("small", "medium", "large"))
    p.add_argument("--backend", action="append", default=None,
                   help="cpu, emulate or metal (repeatable; default: cpu and emulate)")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--launches", action="store_true",
                   help="also count the Metal path's kernel launches and bytes (emulator)")
    a = p.parse_args(argv)
    backends = a.backend or ["cpu", "emulate"]
    print(f"size {a.size}; time: one forward pass, best of {a.repeat}; "
          f"dw err: the double-word value before the final rounding\n")
    print("| model | run | exactly rounded | normwise error | dw err | time | float32 (no rule) |")
    print("|---|---|---|---|---|---|---|")
    for name in a.models:
        r = measure(name, a.size, backends, a.repeat)
        for run in ["plain"] + backends:
            row = r[run]
            label = "float32" if run == "plain" else f"extended, {run}"
            f32 = ", ".join(f"{k}: {v}" for k, v in sorted(row["float32"].items())) or "-"
            dw = "" if run == "plain" else f"{row['dw_err']:.1e}"
            print(f"| {name if run == 'plain' else ''} | {label} | {100 * row['exact']:.1f}% | "
                  f"{row['err']:.2e} | {dw} | {1e3 * row['time']:.1f} ms | {f32} |")
        print(f"| | floor (oracle rounded to float32) | 100.0% | {r['floor']:.2e} | | | |")
    if a.launches:
        print("\nMetal path (counted on the emulator): double-word kernel launches and bytes "
              "they read and write per forward pass; the time is the memory-bound lower "
              "bound at an M2 Max's 400 GB/s (launch latency and compute not included)")
        print("\n| model | launches | MB | bytes per output | >= time at 400 GB/s | kernels |")
        print("|---|---|---|---|---|---|")
        for name in a.models:
            c = launches(name, a.size)
            top = ", ".join(f"{k} {v}" for k, v in sorted(c["by_kernel"].items(),
                                                          key=lambda kv: -kv[1])[:4])
            print(f"| {name} | {c['launches']} | {c['bytes'] / 1e6:.2f} | "
                  f"{c['bytes'] / c['outputs']:.0f} | {1e6 * c['bytes'] / 400e9:.1f} us | {top} |")


if __name__ == "__main__":
    main()
