"""Whole models (benchmarks/models/) plain float32 against ``extended_precision()``.

    python examples/whole_models.py [--size small|medium|large]
                                    [--backend cpu --backend emulate] [--models hyena s4d ...]
                                    [--repeat 3]

For each model (Hyena operator with its implicit filter, S4D, FNO, an audio log-mel
front end, a convolutional vocoder, a transformer block, a Llama-style block) and
backend: the share of
outputs exactly rounded (equal to the float64 oracle rounded to float32), the
normwise error ``||y - ref|| / ||ref||`` of the float32 output, the normwise error of
the carried double-word value (high + low word, before the final rounding), the
time of one forward pass (the median of ``--repeat`` interleaved rounds, each timing
the last call of a burst of 3; emulate: one call), and the ops that consumed a
double-word value in float32 (the report's ``float32`` list: ops without a rule).
"floor" is the error of the oracle itself rounded to float32: an exactly rounded
output has that error, so the float32 output of any method cannot go below it.
The oracle is each model's math in float64 numpy from the same float32 inputs and
parameters (benchmarks/models/*.py: ``oracle``).
"""

from __future__ import annotations

import argparse
import os
import sys


# the models live beside the benchmarks (benchmarks/models/, shipped with them)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

from bench_models import MODELS, launches, measure  # noqa: E402  (one copy of the measurement)


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
    print(f"size {a.size}; time: one forward pass, steady state, median of {a.repeat} rounds; "
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
        print("\nMetal path (counted on the emulator): double-word kernel launches, the bytes "
              "they read and write and their FP instructions (benchmarks/bench_models.py: "
              "a model from the kernels' operation counts) per forward pass, and a roofline "
              "estimate for an M2 Max (400 GB/s, 6.8e12 FP32 instructions/s; launch latency "
              "not included; not measured)")
        print("\n| model | launches | MB | bytes per output | FP instr. per output "
              "| M2 Max estimate | kernels |")
        print("|---|---|---|---|---|---|---|")
        for name in a.models:
            c = launches(name, a.size)
            top = ", ".join(f"{k} {v}" for k, v in sorted(c["by_kernel"].items(),
                                                          key=lambda kv: -kv[1])[:4])
            print(f"| {name} | {c['launches']} | {c['bytes'] / 1e6:.2f} | "
                  f"{c['bytes'] / c['outputs']:.0f} | {c['instructions'] / c['outputs']:.0f} | "
                  f"{1e6 * c['m2max_s']:.1f} us | {top} |")


if __name__ == "__main__":
    main()
