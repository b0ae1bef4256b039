"""Whole models plain float32 against ``extended_precision()``: a Hyena operator
block (with its implicit filter network) and a small convolutional network (a
HiFi-GAN-like vocoder: Conv1d, ConvTranspose1d upsamplers, dilated residual
blocks, LeakyReLU, tanh), from benchmarks/models/.

    python benchmarks/bench_models.py [--backend cpu] [--full | --quick] [--metal]

Per model:

* time of one forward pass, plain float32 and extended on cpu (the ratio is the
  cost of the double-word flow there), the model rewritten in numpy float64, and
  extended on emulate (the Metal kernels run on the CPU by the emulator: a
  correctness path, slow): steady state, the contenders interleaved, the median
  over rounds of the last call of a burst of 3 (emulate: one call);
* the share of outputs exactly rounded and the normwise error, against the
  model's math in float64 numpy (each model's ``oracle``);
* the Metal path, counted with a lazy stand-in for the kernels (the launches a
  GPU runs: not a fused chain's unread intermediate results): launches, bytes read
  + written by the double-word kernels, their
  floating-point instructions (FMA = 1) from the operation counts of the kernel
  sources (``FP_INSTRUCTIONS`` below; a model, not a measurement), per output, and
  a roofline estimate for an M2 Max: the sum over launches of
  max(bytes / 400 GB/s, instructions / 6.8e12 per s) (38 GPU cores x 128 FP32
  lanes x 1.398 GHz; Apple's 13.6 TFLOPS counts an FMA as two). Launch latency and
  MLX's own ops between the kernels (slices, pads, casts) are not included. Not
  run on an Apple GPU: an estimate to compare with ``--backend metal`` on a Mac;
* the Metal path's host side (``--metal``: every model), with the kernels replaced
  by lazy stand-ins: GPU dispatches per forward (launches plus the glue primitives
  that are not views) against the plain graph's, the host time to build one
  forward's graph, and the host cost of a call of the ``mx.compile``d forward,
  each as a ratio to plain float32 (``metal_graph``).
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import re
import statistics
import sys
import time

import mlx.core as mx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from models import MODELS  # noqa: E402,F401  (examples/whole_models.py imports it from here)
from bench_flow import steady, warmup_calls  # noqa: E402  (interleaved steady-state timing)
from models._common import params64  # noqa: E402

M2_MAX_BYTES_PER_S = 400e9
M2_MAX_FP32_PER_S = 38 * 128 * 1.398e9

# ---- floating-point instructions per kernel launch (FMA = 1) --------------------------
# Counted on the main (finite-value) path of metal/include/doubleword.h:
#   TwoSum 6, Fast2Sum 3, TwoProdFMA 2, DW + FP 10, DW + DW (accurate) 20, DW x FP 6,
#   DW x DW 9, DW / DW 35 (one float division counted as one), complex add 40,
#   complex multiply 4 x 9 + 2 x 20 = 76; dw_gemm.h: 21 per real multiply-add term
#   (TwoProdFMA, a TwoSum and a DW + FP), 10 per output (the final DW + FP), 4 real
#   terms per complex one; an FFT pass of radix 2^r: one complex twiddle product per
#   point and r radix-2 stages of a complex add and subtract per pair plus half a
#   twiddle product per point (76 + 78 r per point); fft_real: one complex product
#   and two complex adds per output (156); ext_depthwise (_nlc): a TwoProdFMA and an
#   accumulator step (TwoSum and two DW + FP) per (spread) tap, 28, and a DW + FP per
#   output; ext_scale: a DW x DW (9) or DW x FP (6) per element.
_DW_OPS = {0: 6, 1: 3, 2: 2, 3: 10, 4: 20, 5: 6, 6: 9, 7: 35, 8: 37, 9: 8}
_CDW_OPS = {0: 40, 1: 76}
# dw_math, per element (metal/include/dw_math.h: argument reduction, Horner's rule in
# double-word at 29 per degree, reconstruction): approximate main-path counts.
_DW_MATH = {"exp": 246, "expm1": 290, "log": 350, "log1p": 390, "log2": 360, "log10": 360,
            "sin": 300, "cos": 300, "tanh": 330, "sigmoid": 300, "erf": 400, "sqrt": 30,
            "rsqrt": 40, "reciprocal": 35, "power": 700, "arctan2": 250, "cexp": 800}


def fp_instructions(name: str, template: dict, inputs, output_shapes) -> float | None:
    """The kernel's floating-point instructions for one launch, or None for a kernel
    this model does not count."""
    n = math.prod(output_shapes[0])
    if name == "dw_ops":
        return n * _DW_OPS[template["OP"]]
    if name == "cdw_ops":
        return n * _CDW_OPS[template["OP"]]
    if name == "dw_math":
        from mlx_precise.doubleword.functions import FN_CODES

        fn = {v: k for k, v in FN_CODES.items()}[template["FN"]]
        return n // (2 if fn == "cexp" else 1) * _DW_MATH[fn]  # cexp: interleaved words
    if name.startswith("dw_gemm"):  # (and its siblings without a bias: linalg.gemm)
        from mlx_precise.linalg.gemm import DW_GEMM_DIM, DW_GEMM_PARAMS

        p = [int(v) for v in np.array(inputs[-1])]  # read by the layout's names
        M, N, K, ndims = (p[DW_GEMM_PARAMS.index(f)] for f in ("m", "n", "k", "batch_dims"))
        rec, at = len(DW_GEMM_DIM.names), DW_GEMM_PARAMS.size
        batch = math.prod(p[at + rec * i + DW_GEMM_DIM["size"]] for i in range(ndims))
        per_term = 21 * (4 if template.get("CPLX") else 1)
        return batch * M * N * (per_term * K + 10)
    if name == "fft_pass":
        from mlx_precise.fft.engine import FFT_PASS_PARAMS

        log_r = int(np.array(inputs[-1])[FFT_PASS_PARAMS.index("log_r")])
        points = n // 2  # complex points: the output holds (re, im) pairs
        return points * (76 + 78 * log_r)
    if name == "fft_real":
        return (n // 2) * 156
    if name == "ext_depthwise":
        taps = template["TAPS"] or inputs[1].shape[1]  # TAPS 0: K from w (C, K)
        return n * (28 * taps + 10)
    if name == "ext_depthwise_nlc":  # its taps spread by DIL, zeros between them
        return n * (28 * (template["DIL"] * (template["TAPS"] - 1) + 1) + 10)
    if name == "ext_scale":
        return n * (9 if template.get("DW_IN") else 6)
    if name.startswith(("dw_fused", "dw_reduce")):  # (their slot counts, with math)
        return _program_instructions(name, np.array(inputs[-1]), n)
    return None


def _program_instructions(name: str, prog: np.ndarray, n: int) -> float:
    """A fused program's FP instructions: its operations per element (loads,
    constants and exact word operations count 0), times the elements it runs on;
    dw_reduce adds its tree's n - 1 additions (or products) per row."""
    from mlx_precise.doubleword import fusion
    from mlx_precise.doubleword.functions import FN_CODES

    L = fusion.LIMITS
    names = {v: k for k, v in FN_CODES.items()}
    cost = {fusion.OP["add"]: 20, fusion.OP["sub"]: 20, fusion.OP["mul"]: 9,
            fusion.OP["div"]: 35}
    body = prog[L.header:L.header + L.instr * int(prog[L.prog_count])].reshape(-1, L.instr)
    per = sum(_DW_MATH[names[int(f)]] if o == fusion.OP["fn"] else cost.get(int(o), 0)
              for o, _, _, _, f in body)
    if name.startswith("dw_fused"):
        return n * per
    row = int(prog[L.prog_n])
    step = 9 if int(prog[L.prog_reduce]) == fusion.OP["mul"] else 20
    return n * (row * per + (row - 1) * step)


# ---- measurements ---------------------------------------------------------------------

def score(y, ref) -> tuple[float, float]:
    """(share exactly rounded, normwise error) of float32 y against float64 ref."""
    y = np.array(y)
    return (float(np.mean(y == ref.astype(np.float32))),
            float(np.linalg.norm(y.astype(np.float64) - ref) / np.linalg.norm(ref)))


def words64(y) -> np.ndarray:
    """The double-word value y carries (high + low word) in float64."""
    from mlx_precise.extended import low_word

    lo = low_word(y)
    hi = np.array(y).astype(np.float64)
    return hi if lo is None else hi + np.array(lo).astype(np.float64)


def measure(name: str, size: str = "small", backends=("cpu", "emulate"), repeat: int = 1,
            seed: int = 0, warmup: int = 0) -> dict:
    """{"plain": row, backend: row, ..., "floor": float, "float64_time": seconds of
    the numpy float64 oracle (the model rewritten in numpy)} with rows
    {"exact", "err", "dw_err", "time", "float32"} ("float32": the ops that consumed a
    double-word value in float32, from the block's report). Times: the median over
    ``repeat`` interleaved rounds of the last call of a burst of 3 (one call per
    round on emulate, whose calls take seconds), after ``warmup`` calls of each
    (not on emulate; see bench_flow.warmup_calls)."""
    import mlx_precise

    mod = importlib.import_module(f"models.{name}")
    model, x = mod.build(size, seed)
    p64, x64 = params64(model), np.array(x).astype(np.float64)
    reports: dict = {}

    def extended(b):
        def run():
            with mlx_precise.use_backend(b), mlx_precise.extended_precision() as rep:
                v = model(x)
                mx.eval(v)
            reports[b] = rep
            return v
        return run

    fast = {"plain": lambda: model(x), "float64": lambda: mod.oracle(p64, x64),
            **{b: extended(b) for b in backends if b != "emulate"}}
    times, outs = steady(fast, repeat, warmup=warmup)
    if "emulate" in backends:
        t, o = steady({"emulate": extended("emulate")}, 1, burst=1)
        times.update(t)
        outs.update(o)
    ref = outs["float64"]
    norm = np.linalg.norm(ref)
    exact, err = score(outs["plain"], ref)
    out = {"floor": score(ref.astype(np.float32), ref)[1], "float64_time": times["float64"],
           "plain": dict(exact=exact, err=err, dw_err=err, time=times["plain"], float32={})}
    for b in backends:
        exact, err = score(outs[b], ref)
        out[b] = dict(exact=exact, err=err, time=times[b], float32=dict(reports[b].float32),
                      dw_err=float(np.linalg.norm(words64(outs[b]) - ref) / norm))
    return out


def launches(name: str, size: str = "small", seed: int = 0) -> dict:
    """The double-word kernels one forward pass launches on the Metal path, counted
    with the lazy stand-in for Metal (``mlx_precise.testing``): the launches a GPU
    runs when the output is evaluated (a fused chain's intermediate results, which
    nothing reads, never run; the emulator, which computes every launch at once,
    would count them): {"launches", "bytes" (inputs read + outputs written),
    "instructions" (FP instructions, FP_INSTRUCTIONS model), "uncounted" (launches
    of kernels the model has no count for), "m2max_s" (roofline estimate),
    "by_kernel", "outputs"}. MLX's own ops between the kernels are not counted."""
    import mlx_precise
    from mlx_precise.testing import lazy_metal_executor

    mod = importlib.import_module(f"models.{name}")
    model, x = mod.build(size, seed)
    total = {"launches": 0, "bytes": 0, "instructions": 0.0, "uncounted": 0, "m2max_s": 0.0}
    counts: dict = {}
    record: list = []
    with lazy_metal_executor(record):
        with mlx_precise.use_backend("metal"), mlx_precise.extended_precision():
            y = model(x)
        mx.eval(y)
    for k in (k for k in record if k.ran() and k.name != "eft_selftest"):
        nbytes = k.nbytes()
        ops = fp_instructions(k.name, k.template, k.inputs, k.output_shapes)
        total["launches"] += 1
        total["bytes"] += nbytes
        # dw_fused / dw_reduce: one count over their slot counts, with and without math
        family = re.sub(r"^(dw_fused|dw_reduce)\d*(_math)?$", r"\1", k.name)
        counts[family] = counts.get(family, 0) + 1
        if ops is None:
            total["uncounted"] += 1
            ops = 0.0
        total["instructions"] += ops
        total["m2max_s"] += max(nbytes / M2_MAX_BYTES_PER_S, ops / M2_MAX_FP32_PER_S)
    return {**total, "by_kernel": counts, "outputs": int(np.prod(y.shape))}


def _forward_on_metal(model):
    """The forward pass inside ``extended_precision()`` on the metal backend."""
    import mlx_precise

    def forward(x):
        with mlx_precise.use_backend("metal"), mlx_precise.extended_precision():
            return model(x)

    return forward


def metal_graph(name: str, size: str = "small", rounds: int = 15, calls: int = 30,
                seed: int = 0) -> dict:
    """The host side of one forward pass on the metal path against plain float32,
    with the kernels replaced by lazy stand-ins (``mlx_precise.testing``: each
    launch is one graph node; no Apple GPU here, so these are counts and host
    times, not GPU timings):

    * ``launches``, ``glue``: the double-word kernel launches of one forward and
      the other primitives of its graph that dispatch work (not views: reshapes,
      slices, broadcasts, transposes, ... share their input's buffer);
      ``plain_ops``: the plain float32 graph's primitives that dispatch (``Compiled``
      counts once: MLX fuses ``nn.gelu`` & co.); ``dispatch_ratio``:
      ``(launches + glue) / plain_ops``;
    * ``build``, ``plain_build``: seconds of host work to build one forward pass's
      graph without ``mx.compile`` (a block at the same place as the last ones:
      it follows their record, :mod:`mlx_precise.extended.blocks`); ``op_by_op``:
      the same with block replays off (each op's rule runs, as in a block's first
      calls);
    * ``compiled``, ``plain_compiled``: seconds of host work per call of the
      ``mx.compile``d forward (the block inside it: later calls replay the traced
      graph, running no Python and no rules), its graph built, not evaluated.
    * ``nodes``, ``plain_nodes``: the primitives of the graph a compiled call
      replays (views included), extended and plain.

    Times: CPU seconds of this process (``time.process_time``: the host's work,
    not the machine's other load, which wall time on a shared machine includes),
    medians over ``rounds`` interleaved rounds of ``calls`` calls (a tenth as many
    for the uncompiled forms)."""
    from mlx_precise.testing import graph_counts, lazy_metal_executor

    mod = importlib.import_module(f"models.{name}")
    model, x = mod.build(size, seed)
    mx.eval(model.parameters())
    plain = graph_counts(model(x))
    with lazy_metal_executor():
        forward = _forward_on_metal(model)
        for _ in range(3):  # (the graph of a repeated call: composite rules replayed)
            forward(x)
        ext = graph_counts(forward(x))
        compiled = {"plain": mx.compile(lambda x: model(x)), "extended": mx.compile(forward)}
        mx.eval(compiled["plain"](x), compiled["extended"](x))  # traced once
        replayed = {k: _nodes(graph_counts(fn(x))) for k, fn in compiled.items()}
        built = {"plain": model, "extended": forward, "op_by_op": _op_by_op(forward)}
        times = {k: [] for k in ("plain", "extended", "op_by_op", "plain_compiled",
                                 "compiled")}
        for _ in range(rounds):
            for k, fn in built.items():
                t = time.process_time()
                for _ in range(max(calls // 10, 1)):
                    fn(x)
                times[k].append((time.process_time() - t) / max(calls // 10, 1))
            for k, fn in compiled.items():
                t = time.process_time()
                for _ in range(calls):
                    fn(x)
                times["compiled" if k == "extended" else "plain_compiled"].append(
                    (time.process_time() - t) / calls)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"launches": ext["launches"], "glue": ext["glue"], "plain_ops": plain["glue"],
            "dispatch_ratio": (ext["launches"] + ext["glue"]) / plain["glue"],
            "build": med["extended"], "plain_build": med["plain"],
            "op_by_op": med["op_by_op"],
            "compiled": med["compiled"], "plain_compiled": med["plain_compiled"],
            "nodes": replayed["extended"], "plain_nodes": replayed["plain"],
            "by_primitive": ext["by_primitive"]}


def _op_by_op(forward):
    """``forward`` with block replays off (:mod:`mlx_precise.extended.blocks`)."""
    from mlx_precise.core.context import switched
    from mlx_precise.extended import blocks

    def run(x):
        with switched((blocks, "ENABLED", False)):
            return forward(x)

    return run


def _nodes(counts: dict) -> int:
    """The primitives of a graph (:func:`~mlx_precise.testing.graph_counts`), views
    included: what a compiled call replays, one node at a time."""
    return sum(counts["by_primitive"].values())


def compiled_graph(name: str, size: str = "large", seed: int = 0) -> dict:
    """:func:`~mlx_precise.testing.graph_counts` of the graph one call of the
    ``mx.compile``d forward on the metal path replays (the lazy stand-in for the
    kernels; after MLX's simplification and fusion of the traced graph), and
    ``"nodes"``: its primitives, views included (a compiled call's host cost grows
    with them, and with each node's inputs and outputs)."""
    from mlx_precise.testing import graph_counts, lazy_metal_executor

    mod = importlib.import_module(f"models.{name}")
    model, x = mod.build(size, seed)
    mx.eval(model.parameters())
    with lazy_metal_executor():
        fn = mx.compile(_forward_on_metal(model))
        mx.eval(fn(x))  # traced once
        counts = graph_counts(fn(x))
    return {**counts, "nodes": _nodes(counts)}


def print_metal_table(names, size: str) -> None:
    """One line per model: :func:`metal_graph`'s counts and host times as ratios to
    plain float32, against the targets of the lean Metal graph (dispatches <= 2x,
    uncompiled build <= 10x, compiled call <= 3x)."""
    print("Metal path, host side (lazy stand-in for the kernels: counts and host "
          "times on this machine, no Apple GPU)\n")
    print("| model | launches | glue | plain ops | dispatches / plain (<= 2) "
          "| compiled graph nodes: extended / plain "
          "| build: extended / plain (<= 10) | build op by op / plain "
          "| compiled call: extended / plain (<= 3) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in names:
        g = metal_graph(name, size)
        print(f"| {name} | {g['launches']} | {g['glue']} | {g['plain_ops']} "
              f"| {g['dispatch_ratio']:.2f} | {g['nodes']} / {g['plain_nodes']} "
              f"| {1e3 * g['build']:.2f} / {1e3 * g['plain_build']:.3f} ms = "
              f"{g['build'] / g['plain_build']:.1f}x "
              f"| {1e3 * g['op_by_op']:.2f} ms = {g['op_by_op'] / g['plain_build']:.1f}x "
              f"| {1e3 * g['compiled']:.3f} / {1e3 * g['plain_compiled']:.3f} ms = "
              f"{g['compiled'] / g['plain_compiled']:.1f}x |")
    costs = replay_costs()
    print("\nHost cost of a compiled call per node it replays (a chain of 16 nodes, CPU "
          "time per node): " + ", ".join(f"{k} {1e6 * v:.2f} us" for k, v in costs.items()))


def replay_costs(nodes: int = 16, calls: int = 2000, rounds: int = 5) -> dict:
    """Seconds of host work per node when a compiled function replays a chain of
    ``nodes`` nodes of one kind: a launch as the lazy stand-in makes it (``Depends``
    with 5 inputs and 1 or 2 outputs: a double-word kernel writes 2 words), a view
    (reshape), and MLX's elementwise op (``exp``: MLX fuses a chain of them into one
    node, so its figure is the fused chain's cost shared out). Minimum over rounds
    of the mean over ``calls`` calls (CPU time)."""
    x = mx.random.normal((64, 64))
    deps = [mx.random.normal((64, 64)) for _ in range(4)]
    zeros = [mx.array(np.zeros((64, 64), np.float32)) for _ in range(2)]
    mx.eval(x, deps, zeros)

    def chain(step):
        def f(y):
            for _ in range(nodes):
                y = step(y)
            return y
        return mx.compile(f)

    kinds = {"launch, 1 output": lambda y: mx.depends(zeros[:1], [y] + deps)[0],
             "launch, 2 outputs": lambda y: mx.depends(zeros, [y] + deps)[0],
             "view": lambda y: y.reshape(32, 128) if y.shape == (64, 64) else y.reshape(64, 64),
             "MLX exp (fused)": mx.exp}
    out = {}
    for name, step in kinds.items():
        fn = chain(step)
        mx.eval(fn(x))
        best = math.inf
        for _ in range(rounds):
            t = time.process_time()
            for _ in range(calls):
                fn(x)
            best = min(best, (time.process_time() - t) / calls / nodes)
        out[name] = best
    return out


# ---- the benchmark --------------------------------------------------------------------

BENCH = ("hyena", "vocoder")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default=None,
                   help="the extended run besides cpu and emulate (metal on a Mac)")
    p.add_argument("--full", action="store_true", help="the largest model sizes")
    p.add_argument("--quick", action="store_true", help="small sizes, one run: a smoke test")
    p.add_argument("--metal", action="store_true",
                   help="only the Metal path's host side, every model (lazy stand-in)")
    a = p.parse_args(argv)
    import mlx_precise as mp

    size = "small" if a.quick else "xl" if a.full else "large"
    if a.metal:
        print_metal_table(MODELS, size)
        return
    repeat = 1 if a.quick else 3
    runs = ["cpu", "emulate"] + ([a.backend] if a.backend not in (None, "cpu", "emulate")
                                 else [])
    if mp.metal_available() and "metal" not in runs:
        runs.append("metal")
    print(f"Whole models, size {size!r}; one forward pass: median of {repeat} interleaved "
          f"rounds, each timing the last call of a burst of 3, after "
          f"{0 if a.quick else warmup_calls()} untimed calls (emulate: one call); exactly "
          f"rounded / normwise error against float64\n")
    print("| model | run | time | vs float32 | exactly rounded | normwise error |")
    # numpy float64: what a user would write instead (the model rewritten in numpy: the
    # oracle itself); its rounding to float32 is exactly rounded by definition
    print("|---|---|---|---|---|---|")
    for name in BENCH:
        r = measure(name, size, runs, repeat, warmup=0 if a.quick else warmup_calls())
        f64 = dict(time=r["float64_time"], exact=1.0, err=r["floor"])
        rows = [("float32", r["plain"]), ("extended, cpu", r["cpu"]),
                ("numpy float64 (rewritten model; rounded once)", f64)]
        rows += [(f"extended, {b}", r[b]) for b in runs[1:]]
        for label, row in rows:
            ratio = "" if label == "float32" else f"{row['time'] / r['plain']['time']:.1f}x"
            print(f"| {name if label == 'float32' else ''} | {label} | {1e3 * row['time']:.1f} ms "
                  f"| {ratio} | {100 * row['exact']:.1f}% | {row['err']:.2e} |")
    print("\nMetal path (launches a GPU runs, counted with a lazy stand-in; FP "
          "instructions from the kernels' operation counts; M2 Max: roofline "
          "estimate, not measured)\n")
    print("| model | outputs | launches | MB | bytes / output | FP instr. / output "
          "| M2 Max estimate | kernels |")
    print("|---|---|---|---|---|---|---|---|")
    for name in BENCH:
        c = launches(name, size)
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(c["by_kernel"].items(),
                                                       key=lambda kv: -kv[1]))
        note = f" ({c['uncounted']} launches uncounted)" if c["uncounted"] else ""
        print(f"| {name} | {c['outputs']} | {c['launches']} | {c['bytes'] / 1e6:.2f} "
              f"| {c['bytes'] / c['outputs']:.0f} | {c['instructions'] / c['outputs']:.0f}{note} "
              f"| {1e6 * c['m2max_s']:.1f} us | {kinds} |")
    print()
    print_metal_table(BENCH, size)


if __name__ == "__main__":
    main()
