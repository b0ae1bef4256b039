"""The double-word flow of ``extended_precision()``: its cost inside a block and
its (absent) cost outside.

1. Outside every block: an eager loop of small elementwise MLX ops (64-element
   float32 arrays; ``x * 0.5 + y``, ``mx.maximum``, a slice, a sum), timed in a
   fresh process without mlx-precise and in one that imported it and opened and
   closed a block first. The two processes alternate; medians of the bursts.
   Results must also be bit-identical.
2. Host costs: opening and closing an empty block (and a strict one: its heap scan,
   and a strict block once the scan has accounted for every reference to MLX's
   functions), and building one elementwise
   op in a block (16 elements, graph building only) against plain MLX; one
   elementwise op on 10^6 elements, evaluated, against plain float32 and MLX
   float64 (the cpu backend's limit).
3. Inside a block: a causal FFT convolution written in plain MLX (rfft, product,
   irfft, slice, skip term) and an FNO-style spectral layer, plain float32 against
   the same code inside ``extended_precision()`` on the active backend (or
   ``--backend``), with the share of outputs exactly rounded (oracle: float64).
4. ``--models``: the whole models of benchmarks/models/ at their large size (or
   ``--size``), one forward pass plain float32, in MLX float64 on the CPU (the
   model and input cast with ``set_dtype``: the cpu backend's limit) and in a block
   on cpu, interleaved; and each run's peak memory (MLX's allocator, above what was
   held before the call).
5. ``--profile``: where each model's cpu flow spends its time and memory, per op.

    python benchmarks/bench_flow.py [--backend cpu|emulate|metal] [--full | --quick]
    python benchmarks/bench_flow.py --models [hyena s4d ...] [--size large]
    python benchmarks/bench_flow.py --profile [hyena s4d ...] [--size large]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import mlx.core as mx
import numpy as np

_LOOP = r"""
import sys, time
import mlx.core as mx
import numpy as np
if sys.argv[1] == "1":
    import mlx_precise
    with mlx_precise.extended_precision():
        pass
x = mx.array(np.linspace(-1, 1, 64, dtype=np.float32))
y = mx.array(np.linspace(2, 3, 64, dtype=np.float32))
def step(a):
    b = mx.maximum(a * 0.5 + y, x)
    return b[1:].sum() + b
a = x
for _ in range(200):
    a = step(a) * 1e-3
mx.eval(a)
best = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    a = x
    for _ in range(2000):
        a = step(a) * 1e-3
    mx.eval(a)
    best.append(time.perf_counter() - t)
print(min(best), np.array(a).view(np.uint32).tobytes().hex())
"""


def outside(bursts: int, rounds: int) -> tuple[float, float, bool]:
    """(median time without, median time with mlx-precise imported, same bits)."""
    times = {"0": [], "1": []}
    bits = set()
    for _ in range(rounds):
        for flag in ("0", "1"):
            out = subprocess.run([sys.executable, "-c", _LOOP, flag, str(bursts)],
                                 capture_output=True, text=True, check=True).stdout.split()
            times[flag].append(float(out[0]))
            bits.add(out[1])
    return statistics.median(times["0"]), statistics.median(times["1"]), len(bits) == 1


def conv(u, k, D):
    L = u.shape[-1]
    n = 2 * L
    k_f = mx.fft.rfft(k, n=n) / n
    y = mx.fft.irfft(mx.fft.rfft(u, n=n) * k_f, n=n, norm="forward")[..., :L]
    return y + u * D[:, None]


def fno(x, w):
    H, W = x.shape[1:]
    m = w.shape[0]
    f = mx.fft.rfft2(x)[:, :m, :m] * w
    return mx.fft.irfft2(mx.pad(f, [(0, 0), (0, H - m), (0, W // 2 + 1 - m)]), s=(H, W))


def steady(contenders: dict, rounds: int, burst: int = 3,
           warmup: int = 0) -> tuple[dict, dict]:
    """Steady-state times: in each of ``rounds`` rounds every contender (name ->
    function of no arguments) runs a burst of ``burst`` calls, evaluated, and the
    last call is timed; the contenders interleave, and each gets the median of its
    rounds. ``warmup`` calls of each come first, untimed (:func:`warmup_calls`).
    Returns ({name: seconds}, {name: last output})."""
    times: dict = {k: [] for k in contenders}
    outs: dict = {}
    for fn in contenders.values():
        for _ in range(warmup):
            out = fn()
            if isinstance(out, mx.array):
                mx.eval(out)
    for _ in range(max(rounds, 1)):
        for k, fn in contenders.items():
            for i in range(burst):
                t = time.perf_counter()
                outs[k] = fn()
                if isinstance(outs[k], mx.array):
                    mx.eval(outs[k])
                if i == burst - 1:
                    times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}, outs


def warmup_calls() -> int:
    """Calls of a model before it is timed: ``mlx_precise.core.jit.COMPILE_AT``,
    after which the cpu engine's small float64 loops run compiled (those of a model
    run a few times run uncompiled: slower, and no C++ compiler run)."""
    from mlx_precise.core import jit

    return jit.COMPILE_AT


def compare(fn, ref, backend: str, repeat: int):
    """``fn()`` plain and inside ``extended_precision()`` on ``backend``, interleaved
    (:func:`steady`): (float32 time, extended time, [exactly rounded share float32,
    extended], the block's report)."""
    import mlx_precise as mp

    reports = []

    def extended():
        with mp.use_backend(backend), mp.extended_precision() as report:
            out = fn()
            mx.eval(out)
        reports.append(report)
        return out

    times, outs = steady({"plain": fn, "extended": extended}, repeat)
    share = [float(np.mean(np.array(outs[k]) == ref.astype(np.float32)))
             for k in ("plain", "extended")]
    return times["plain"], times["extended"], share, reports[-1]


def inside(backend: str, L: int, side: int, repeat: int):
    rng = np.random.default_rng(0)
    u = rng.standard_normal((1, 16, L)).astype(np.float32)
    k = rng.standard_normal((16, L)).astype(np.float32)
    D = rng.standard_normal(16).astype(np.float32)
    x = rng.standard_normal((4, side, side)).astype(np.float32)
    w = (rng.standard_normal((8, 8)) + 1j * rng.standard_normal((8, 8))).astype(np.complex64)
    n = 2 * L
    kf = np.fft.rfft(k.astype(np.float64), n)
    ref_conv = np.fft.irfft(np.fft.rfft(u.astype(np.float64), n) * kf, n)[..., :L] \
        + u.astype(np.float64) * D.astype(np.float64)[:, None]
    f = np.fft.rfft2(x.astype(np.float64))
    g = np.zeros_like(f)
    g[:, :8, :8] = f[:, :8, :8] * w.astype(np.complex128)
    ref_fno = np.fft.irfft2(g, s=(side, side))
    rows = []
    for name, fn, args, ref in (("causal FFT conv (1x16x%d)" % L, conv, (u, k, D), ref_conv),
                                ("FNO layer (4x%dx%d)" % (side, side), fno, (x, w), ref_fno)):
        arrays = [mx.array(a) for a in args]
        t_plain, t_ext, share, _ = compare(lambda: fn(*arrays), ref, backend, repeat)
        rows.append((name, t_plain, t_ext, share))
    return rows


def _median_us(fn, n: int, rounds: int) -> float:
    """Median over ``rounds`` of the mean time of ``n`` calls, in microseconds."""
    fn()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(times)


def host_costs(backend: str, rounds: int) -> dict:
    import mlx_precise as mp

    def empty(strict: bool = False):
        with mp.extended_precision(strict=strict):
            pass

    small = [mx.array(np.linspace(-1, 1, 16, dtype=np.float32) + k) for k in range(2)]
    big = [mx.array(np.random.default_rng(k).standard_normal(10**6).astype(np.float32))
           for k in range(2)]
    big64 = [v.astype(mx.float64) for v in big]
    mx.eval(*big64)
    import gc
    import threading

    held, done = threading.Event(), threading.Event()

    def hold():  # a reference to an MLX function out of the collector's sight
        f = mx.sigmoid
        held.set()
        done.wait(600)
        del f

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(60)
    objects = len(gc.get_objects())
    out = {"empty block": _median_us(empty, 500, rounds),
           f"strict block, a reference out of sight: scans the heap ({objects} objects)":
               _median_us(lambda: empty(True), 3, rounds)}
    done.set()
    thread.join(60)
    out["strict block, every reference accounted for"] = _median_us(lambda: empty(True), 500,
                                                                    rounds)
    out.update({
           "op, 16 elements, plain": _median_us(lambda: small[0] * small[1], 2000, rounds)})
    with mp.use_backend(backend), mp.extended_precision():
        out["op, 16 elements, in a block"] = _median_us(lambda: small[0] * small[1], 2000,
                                                         rounds)

    def ext():
        with mp.use_backend(backend), mp.extended_precision():
            return big[0] * big[1]

    for name, fn in (("op, 1e6 elements, plain float32", lambda: big[0] * big[1]),
                     ("op, 1e6 elements, MLX float64", lambda: big64[0] * big64[1]),
                     ("op, 1e6 elements, in a block", ext)):
        out[name] = _median_us(lambda: mx.eval(fn()), 5, rounds)
    return out


def peak_mb(fn) -> float:
    """MLX's peak allocation of one evaluated call of ``fn`` above what was held
    before it, in MB (after a warm-up call)."""
    import gc

    mx.eval(fn())
    gc.collect()
    mx.clear_cache()
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    mx.eval(fn())
    return (mx.get_peak_memory() - base) / 1e6


def model_runs(name: str, size: str) -> dict:
    """One forward of the model ``name`` of benchmarks/models/ at ``size`` as
    functions {run: fn}: plain float32, the cpu flow and MLX float64 (absent where
    MLX refuses the model in float64)."""
    import importlib
    import os

    import mlx_precise as mp

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    mod = importlib.import_module(f"models.{name}")
    model, x = mod.build(size, 0)
    model64, _ = mod.build(size, 0)
    model64.set_dtype(mx.float64)
    x64 = x.astype(mx.float64)

    def extended():
        with mp.use_backend("cpu"), mp.extended_precision():
            y = model(x)
            mx.eval(y)
        return y

    runs = {"float32": lambda: model(x), "cpu flow": extended}
    try:
        mx.eval(model64(x64))
        runs["MLX float64"] = lambda: model64(x64)
    except (ValueError, RuntimeError):  # e.g. no float64 convolutions
        pass
    return runs


def models(names, size: str, rounds: int, warmup: int = 0) -> list:
    """Rows (model, times {run: seconds}, peak MB {run: MB}) of :func:`model_runs`."""
    rows = []
    for name in names:
        runs = model_runs(name, size)
        times, _ = steady(runs, rounds, warmup=warmup)
        rows.append((name, times, {k: peak_mb(f) for k, f in runs.items()}))
    return rows


def profile(name: str, size: str, rounds: int, top: int = 10) -> tuple:
    """Where one model's cpu flow spends its time and memory: each op of the block
    evaluated as it is made (its float64 value), its time summed per op name over
    ``rounds`` forwards and its peak (MLX's allocator, above what was held before
    the op) kept per op name. Evaluating each op serialises the graph: the total is
    above a lazy forward's, the shares are what to act on.

    Returns:
        (total seconds per forward, [(op, seconds per forward, calls, peak MB)]).
    """
    import collections
    import importlib
    import os

    import mlx_precise as mp
    from mlx_precise.extended import carry, dispatch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    model, x = importlib.import_module(f"models.{name}").build(size, 0)
    seconds, calls, peaks = collections.Counter(), collections.Counter(), {}
    run = dispatch._run

    def leaves(v):
        if isinstance(v, mx.array):
            yield v
        elif isinstance(v, (list, tuple)):
            for a in v:
                yield from leaves(a)

    def timed(entry, report, args, kwargs):
        base = mx.get_active_memory()
        mx.reset_peak_memory()
        t = time.perf_counter()
        out = run(entry, report, args, kwargs)
        wide = [w for a in leaves(out) for w in (carry.wide_value(a) or ()) if w is not None]
        mx.eval(*(wide or list(leaves(out))))
        seconds[entry.op] += time.perf_counter() - t
        calls[entry.op] += 1
        peaks[entry.op] = max(peaks.get(entry.op, 0.0), (mx.get_peak_memory() - base) / 1e6)
        return out

    def forward():
        with mp.use_backend("cpu"), mp.extended_precision():
            mx.eval(model(x))

    dispatch._run = timed
    try:
        forward()  # warm-up (kernels compiled)
        seconds.clear(), calls.clear()
        t = time.perf_counter()
        for _ in range(rounds):
            forward()
        total = (time.perf_counter() - t) / rounds
    finally:
        dispatch._run = run
    return total, [(op, s / rounds, calls[op] // rounds, peaks[op])
                   for op, s in seconds.most_common(top)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default=None)
    p.add_argument("--full", action="store_true", help="L = 2^16, 256x256 layer")
    p.add_argument("--quick", action="store_true", help="small sizes, one run: a smoke test")
    p.add_argument("--models", nargs="*", default=None,
                   help="whole models against MLX float64 (all of benchmarks/models by default)")
    p.add_argument("--size", default="large", help="the models' size (--models)")
    p.add_argument("--profile", nargs="*", default=None,
                   help="per-op time and peak memory of models' cpu flow (each op evaluated)")
    a = p.parse_args(argv)
    import mlx_precise as mp

    if a.profile is not None:
        from models import MODELS

        for name in a.profile or MODELS:
            total, rows = profile(name, a.size, 1 if a.quick else 3)
            print(f"\n{name} ({a.size}), cpu flow with each op evaluated: {total * 1e3:.1f} ms")
            print("| op | ms per forward | calls | peak MB |\n|---|---|---|---|")
            for op, sec, n, mb in rows:
                print(f"| {op} | {sec * 1e3:.2f} | {n} | {mb:.1f} |")
        return

    if a.models is not None:
        from models import MODELS

        print(f"Whole models, size {a.size!r}, one forward pass (median of interleaved rounds, "
              f"after {0 if a.quick else warmup_calls()} untimed calls); "
              "peak MB above what was held before the call\n")
        print("| model | float32 | MLX float64 | cpu flow | flow / float32 | flow / float64 "
              "| peak MB float32 / float64 / flow |")
        print("|---|---|---|---|---|---|---|")
        for name, t, mb in models(a.models or MODELS, a.size, 1 if a.quick else 5,
                                  0 if a.quick else warmup_calls()):
            f64 = t.get("MLX float64")
            cell = (lambda v: "-" if v is None else f"{v * 1e3:.1f} ms")
            ratio = "-" if f64 is None else f"{t['cpu flow'] / f64:.2f}x"
            mem = " / ".join("-" if k not in mb else f"{mb[k]:.1f}"
                             for k in ("float32", "MLX float64", "cpu flow"))
            print(f"| {name} | {cell(t['float32'])} | {cell(f64)} | {cell(t['cpu flow'])} "
                  f"| {t['cpu flow'] / t['float32']:.2f}x | {ratio} | {mem} |")
        return

    backend = a.backend or mp.backend()
    bursts, rounds = (1, 1) if a.quick else (5, 3)
    t0, t1, same = outside(bursts, rounds)
    print("Outside every block: eager loop of small elementwise ops (2000 steps)")
    print(f"  without mlx-precise {t0 * 1e3:.1f} ms, after import and a block {t1 * 1e3:.1f} ms:"
          f" {100 * (t1 / t0 - 1):+.1f}%; results bit-identical: {same}")
    costs = host_costs(backend, 1 if a.quick else 5)
    print(f"\nHost costs on backend {backend} (medians):")
    for name, us in costs.items():
        print(f"  {name}: {us:.1f} us")
    L, side = (256, 32) if a.quick else (2**16, 256) if a.full else (4096, 64)
    repeat = 1 if a.quick else 3
    print(f"\nInside extended_precision() on backend {backend} "
          f"(steady state, median of {repeat} interleaved rounds):")
    print("| program | float32 | extended | ratio | exactly rounded float32 / extended |")
    print("|---|---|---|---|---|")
    for name, tp, te, (sp, se) in inside(backend, L, side, repeat):
        print(f"| {name} | {tp * 1e3:.2f} ms | {te * 1e3:.2f} ms | {te / tp:.1f}x "
              f"| {100 * sp:.1f}% / {100 * se:.1f}% |")


if __name__ == "__main__":
    main()
