"""Training in double-word: gradients and optimizer trajectories, plain
float32 MLX against the same code inside ``extended_precision()``, both against a
float64 numpy oracle (``training_oracle.py``: independent of MLX and mlx_precise).

    python benchmarks/bench_training.py [--backend cpu|emulate ...] [--steps 1000]
                                        [--quick | --full] [--chain 2000]
                                        [--block per-step|per-burst] [--only gradients|training|metal]

1. Gradients (``run_gradient_cases``): arithmetic chain, exp / log / tanh /
   sigmoid / erf, matmul, conv1d, layer_norm, rms_norm, softmax, causal attention,
   cumsum, a parameter used n times, back-propagation through a recurrence of n
   steps (n = 2000 by default; ``--chain``), and the whole-model gradient of an
   MLP (GELU, LayerNorm). Each is taken by ``mx.grad`` (the MLP by
   ``nn.value_and_grad``), plain and inside a block, and scored normwise against
   the float64 gradient. The floor is the float64 gradient rounded once to
   float32; errors are printed as ratios to it. In the block two values are read:
   the float32 arrays the user holds ("rounded") and the value they carry
   (``astype(mx.float64)`` inside the block: high + low word; "carried"). The
   target (docs/training.md): rounded within 2x of the floor.
2. Training (``run_training``): an MLP Linear(16, 32) - GELU - LayerNorm(32) -
   Linear(32, 4), 64 samples, MSE, full batch, ``steps`` updates of SGD with
   momentum (lr 1e-2, momentum 0.9), Adam (lr 1e-3) and AdamW (lr 1e-3, weight
   decay 0.01) from mlx.optimizers, from the same float32 initial parameters as the
   float64 trajectory of the oracle. Each step in the block is what a user writes::

       with mlx_precise.extended_precision():
           loss, grads = loss_and_grad(model, x, y)
           optimizer.update(model, grads)
           mx.eval(model.parameters(), optimizer.state)

   (``--block per-burst``: one block around each burst of steps instead.) Beside
   them, the same step compiled as MLX documents it (``mx.compile(step,
   inputs=state, outputs=state)``), plain and with the block inside the compiled
   function (its low words carried through the compiled graph; backends that
   compute on the host other than cpu cannot be traced: the table says so). The
   parameters after the last step are scored against the float64 trajectory; the
   floor is float32(theta64). The target: within 3x of the floor. Two
   oracle-only columns locate float32's loss: the float64 trajectory with the
   parameters stored in float32 between steps, and with the optimizer's float
   constants (betas, eps, momentum, weight decay) rounded to float32. Time per
   step: the four trajectories advance in interleaved bursts, and each
   gets the median over bursts (the first burst, warm-up, left out) of the time per
   step; the numpy float64 oracle's time per step is printed beside them.

3. The Metal path of a training step (``metal_step``), counted with the lazy
   stand-in for the kernels (``mlx_precise.testing``; no Apple GPU here): per step,
   the double-word launches a GPU runs and the bytes they move, the other
   primitives that dispatch against the plain step's, the host time to build an
   uncompiled step and per call of the compiled step (ratios to plain float32), and
   whether the compiled step replays without Python (no launch built after tracing).

Nothing here raises on a case that fails: the error text goes in the table. The
functions return plain dicts of numbers for tests and ``python -m mlx_precise bench``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import training_oracle as oracle  # noqa: E402
from training_oracle import (  # noqa: E402
    ATTN_SCALE, CONV_PAD, DECAY, GAIN, GRAD_CASES, LN_EPS, MLP_PARAMS, MLP_SIZES, OPTIMIZERS,
    RMS_EPS, flat, floor, normwise)


# ---- the MLX side of every gradient case ----------------------------------------------
# Each entry: (inputs: dict of mx.array, wrt) -> a function of no arguments returning
# the gradients (a dict over wrt) as a user computes them. Functions are looked up
# through ``mx.`` when they run (inside a block, the dispatcher's).

def _grad_of(loss):
    def prepare(inp, wrt):
        consts = {k: v for k, v in inp.items() if k not in wrt}
        params = {k: inp[k] for k in wrt}
        return lambda: mx.grad(lambda p: loss({**consts, **p}))(params)
    return prepare


def _unary(name):
    return _grad_of(lambda a: mx.sum(a["G"] * getattr(mx, name)(a["x"])))


def _chain(a):
    x = a["x"]
    r = (0.5 * x * x + x - 0.25) / (x * x + 1)
    return mx.sum(a["G"] * (r * (x - 0.75)))


def _reuse(inp, wrt):
    rows = [inp["W"][i] for i in range(inp["W"].shape[0])]
    mx.eval(rows)

    def loss(p):
        total = mx.sum(rows[0] * p)
        for r in rows[1:]:
            total = total + mx.sum(r * p)
        return total

    return lambda: {"p": mx.grad(loss)(inp["p"])}


def _recurrence(inp, wrt):
    xs = [inp["X"][t] for t in range(inp["X"].shape[0])]
    mx.eval(xs)

    def loss(p):
        h, a = p["h0"], p["a"]
        for x_t in xs:
            h = DECAY * h + GAIN * mx.tanh(a * h + x_t)
        return mx.sum(inp["G"] * h)

    params = {k: inp[k] for k in wrt}
    return lambda: mx.grad(loss)(params)


class MLP(nn.Module):
    """Linear - GELU (exact) - LayerNorm - Linear."""

    def __init__(self, d_in=16, hidden=32, d_out=4):
        super().__init__()
        self.l1 = nn.Linear(d_in, hidden)
        self.act = nn.GELU()
        self.ln = nn.LayerNorm(hidden)
        self.l2 = nn.Linear(hidden, d_out)

    def __call__(self, x):
        return self.l2(self.ln(self.act(self.l1(x))))


def mse(model, x, y):
    return nn.losses.mse_loss(model(x), y)


def _mlp_case(inp, wrt):
    s = MLP_SIZES
    model = MLP(s["d_in"], s["hidden"], s["d_out"])
    model.update(tree_unflatten([(k, inp[k]) for k in MLP_PARAMS]))
    loss_and_grad = nn.value_and_grad(model, mse)

    def run():
        _, g = loss_and_grad(model, inp["x"], inp["y"])
        return dict(tree_flatten(g))

    return run


MLX_CASES = {
    "arith chain": _grad_of(_chain),
    **{n: _unary(n) for n in oracle.UNARY},
    "matmul": _grad_of(lambda a: mx.sum(a["G"] * (a["A"] @ a["B"]))),
    "conv1d": _grad_of(lambda a: mx.sum(a["G"] * mx.conv1d(a["x"], a["w"], padding=CONV_PAD))),
    "layer_norm": _grad_of(lambda a: mx.sum(
        a["G"] * mx.fast.layer_norm(a["x"], a["w"], a["b"], LN_EPS))),
    "rms_norm": _grad_of(lambda a: mx.sum(a["G"] * mx.fast.rms_norm(a["x"], a["w"], RMS_EPS))),
    "softmax": _grad_of(lambda a: mx.sum(a["G"] * mx.softmax(a["x"], axis=-1))),
    "attention": _grad_of(lambda a: mx.sum(a["G"] * mx.fast.scaled_dot_product_attention(
        a["q"], a["k"], a["v"], scale=ATTN_SCALE, mask="causal"))),
    "cumsum": _grad_of(lambda a: 0.5 * mx.sum(a["G"] * mx.square(mx.cumsum(a["x"])))),
    "param used n times": _reuse,
    "recurrence of n steps": _recurrence,
    "MLP (GELU, LayerNorm)": _mlp_case,
}


def _error_text(e: BaseException) -> str:
    if type(e).__name__ == "TransformUnsupportedError":
        return "TransformUnsupportedError (this backend computes on the host: no trace)"
    text = f"{type(e).__name__}: {e}".replace("\n", " ").replace("|", "/")
    return text if len(text) <= 160 else text[:157] + "..."


def case_inputs(name: str, chain: int | None = None) -> dict:
    """The float32 numpy inputs of a gradient case (fixed seeds); ``chain``: the length
    of the long chains (None: 2000)."""
    case = GRAD_CASES[name]
    return case.make(**({case.chain: chain} if chain and case.chain else {}))


def mlx_gradient(name: str, inputs: dict, dtype=mx.float32) -> dict:
    """The case's gradients by plain MLX in ``dtype`` (float64: MLX's float64 on the
    CPU), as float64 numpy arrays."""
    case = GRAD_CASES[name]
    inp = {k: mx.array(v).astype(dtype) for k, v in inputs.items()}
    g = MLX_CASES[name](inp, case.wrt)()
    mx.eval(g)
    return {k: np.array(g[k]).astype(np.float64) for k in case.wrt}


def measure_case(name: str, backends=("cpu",), chain: int | None = None) -> dict:
    """One gradient case: {"floor", "plain": {"err"}, backend: {"err", "dw_err",
    "float32": ops the block's report consumed in float32, "time"} or {"error"}}.
    Errors are normwise relative to the float64 oracle's gradient (all of ``wrt``
    concatenated)."""
    import mlx_precise as mp

    case = GRAD_CASES[name]
    inputs = case_inputs(name, chain)
    ref = flat(case.grad(inputs), case.wrt)
    out: dict = {"floor": floor(ref), "size": int(ref.size)}
    try:
        out["plain"] = {"err": normwise(flat(mlx_gradient(name, inputs), case.wrt), ref)}
    except Exception as e:  # noqa: BLE001  (the table reports it)
        out["plain"] = {"error": _error_text(e)}
    for b in backends:
        try:
            inp = {k: mx.array(v) for k, v in inputs.items()}
            run = MLX_CASES[name](inp, case.wrt)
            t = time.perf_counter()
            with mp.use_backend(b), mp.extended_precision() as rep:
                g = run()
                mx.eval(g)
                carried = {k: np.array(g[k].astype(mx.float64)) for k in case.wrt}
            elapsed = time.perf_counter() - t
            rounded = {k: np.array(g[k]) for k in case.wrt}
            out[b] = {"err": normwise(flat(rounded, case.wrt), ref),
                      "dw_err": normwise(flat(carried, case.wrt), ref),
                      "float32": dict(rep.float32), "time": elapsed}
        except Exception as e:  # noqa: BLE001
            out[b] = {"error": _error_text(e)}
    return out


def run_gradient_cases(backend="cpu", chain: int | None = None, cases=None) -> dict:
    """Every gradient case (or those named in ``cases``) on ``backend`` (a name or a
    sequence of names), the long chains of length ``chain`` (None: 2000):
    {case: measure_case(...)}."""
    backends = (backend,) if isinstance(backend, str) else tuple(backend)
    return {n: measure_case(n, backends, chain) for n in (cases or GRAD_CASES)}


# ---- training -------------------------------------------------------------------------

def initial_model(seed: int = 0) -> tuple[MLP, dict]:
    """The MLP with mlx.nn's initialisation from ``mx.random.seed(seed)``, and its
    float32 parameters as numpy arrays (name -> array)."""
    s = MLP_SIZES
    mx.random.seed(seed)
    model = MLP(s["d_in"], s["hidden"], s["d_out"])
    mx.eval(model.parameters())
    return model, {k: np.array(v) for k, v in tree_flatten(model.parameters())}


def model_from(p0: dict, dtype=mx.float32) -> MLP:
    s = MLP_SIZES
    model = MLP(s["d_in"], s["hidden"], s["d_out"])
    model.update(tree_unflatten([(k, mx.array(v).astype(dtype)) for k, v in p0.items()]))
    mx.eval(model.parameters())
    return model


def mlx_optimizer(name: str):
    kind, kw = OPTIMIZERS[name] if name in OPTIMIZERS else name
    return getattr(optim, kind)(**kw)


def mlx_trajectory(p0: dict, x, y, optimizer, steps: int, dtype=mx.float32) -> dict:
    """Plain MLX training in ``dtype`` (float64 runs on the CPU): the parameters
    after ``steps`` full-batch updates, as float64 numpy arrays."""
    model = model_from(p0, dtype)
    xm, ym = mx.array(x).astype(dtype), mx.array(y).astype(dtype)
    loss_and_grad = nn.value_and_grad(model, mse)
    for _ in range(steps):
        _, g = loss_and_grad(model, xm, ym)
        optimizer.update(model, g)
        mx.eval(model.parameters(), optimizer.state)
    return {k: np.array(v).astype(np.float64) for k, v in tree_flatten(model.parameters())}


def run_training(optimizer_name: str = "adam", steps: int = 1000, backend: str = "cpu",
                 block: str = "per-step", burst: int = 10, seed: int = 0) -> dict:
    """Train the MLP plain and inside blocks on ``backend`` from the same float32
    initial parameters, against the float64 trajectory. Returns {"floor", "steps",
    "loss0", "loss64" (the oracle's loss at the last step), "float64_time" (numpy
    oracle, s per step), "plain": {"err", "time", "cpu_time", "burst_times"}, backend:
    {"err", "dw_err", "time", "cpu_time", "burst_times", "float32"} or {"error"}};
    errors normwise over all
    parameters; "params_float32": the error of the float64 trajectory with the
    parameters rounded to float32 after every step, "hyper_float32": with the
    optimizer's float constants rounded to float32; "time" in s per step (wall
    clock), "cpu_time" the CPU time of all threads per step,
    "burst_times" each burst's s per step in order (a rising series would show the
    step's cost growing along the run)."""
    import mlx_precise as mp

    kind, kw = OPTIMIZERS[optimizer_name]
    _, p0 = initial_model(seed)
    x, y = oracle.mlp_data(MLP_SIZES["samples"], MLP_SIZES["d_in"], MLP_SIZES["d_out"])
    keys = sorted(p0)
    t = time.perf_counter()
    theta64, losses = oracle.trajectory(p0, x, y, kind, kw, steps, record=(0, steps - 1))
    out: dict = {"steps": steps, "float64_time": (time.perf_counter() - t) / max(steps, 1),
                 "loss0": losses[0], "loss64": losses[-1]}
    ref = flat(theta64, keys)
    out["floor"] = floor(ref)
    # where float32 training loses accuracy, from the oracle alone: parameters stored
    # in float32 between steps (gradients and updates exact), and the optimizer's
    # Python-float constants at their float32 values (everything else exact)
    hyper32 = oracle.float32_hyperparameters(kind, kw)
    for label, kind_kw, store in (("params_float32", kw, oracle.to_float32),
                                  ("hyper_float32", hyper32, None)):
        theta, _ = oracle.trajectory(p0, x, y, kind, kind_kw, steps, store=store)
        out[label] = normwise(flat(theta, keys), ref)

    xm, ym = mx.array(x), mx.array(y)
    runs = {}
    for who in ("plain", "plain compiled", backend, f"{backend} compiled"):
        model, opt = model_from(p0), mlx_optimizer(optimizer_name)
        opt.init(model.trainable_parameters())
        runs[who] = dict(model=model, opt=opt, step=_compiled_step(
            model, opt, backend if who != "plain compiled" else None)
            if who.endswith("compiled") else nn.value_and_grad(model, mse),
            times=[], error=None, report=None)

    def advance(who, n):
        r = runs[who]

        def one():
            _, g = r["step"](r["model"], xm, ym)
            r["opt"].update(r["model"], g)
            mx.eval(r["model"].parameters(), r["opt"].state)

        if who.endswith("compiled"):
            for _ in range(n):
                mx.eval(r["step"](xm, ym), r["model"].parameters(), r["opt"].state)
            return
        if who == "plain":
            for _ in range(n):
                one()
            return
        if block == "per-burst":
            with mp.use_backend(backend), mp.extended_precision() as rep:
                for _ in range(n):
                    one()
            r["report"] = rep
            return
        for _ in range(n):
            with mp.use_backend(backend), mp.extended_precision() as rep:
                one()
            r["report"] = rep

    done = 0
    while done < steps:
        n = min(burst, steps - done)
        for who, r in runs.items():
            if r["error"]:
                continue
            t, c = time.perf_counter(), time.process_time()
            try:
                advance(who, n)
            except Exception as e:  # noqa: BLE001
                r["error"] = f"step {done}: {_error_text(e)}"
                continue
            r["times"].append((time.perf_counter() - t) / n)
            # (CPU time of every thread: on a shared machine the steadier measure
            # of the work; MLX evaluates on threads of its own)
            r.setdefault("cpu_times", []).append((time.process_time() - c) / n)
        done += n

    def per_step(times):
        return statistics.median(times[1:] if len(times) > 1 else times)

    for who, r in runs.items():
        if r["error"]:
            out[who] = {"error": r["error"]}
            continue
        params = dict(tree_flatten(r["model"].parameters()))
        row = {"err": normwise(flat({k: np.array(v) for k, v in params.items()}, keys), ref),
               "time": per_step(r["times"]), "burst_times": r["times"],
               "cpu_time": per_step(r["cpu_times"])}
        if not who.startswith("plain"):
            row["float32"] = dict(r["report"].float32) if r["report"] is not None else {}
            try:
                with mp.use_backend(backend), mp.extended_precision():
                    carried = {k: np.array(v.astype(mx.float64)) for k, v in params.items()}
                row["dw_err"] = normwise(flat(carried, keys), ref)
            except Exception as e:  # noqa: BLE001
                row["dw_error"] = _error_text(e)
        out[who] = row
    return out


def _compiled_step(model, opt, backend: str | None):
    """A training step compiled as MLX documents it (``mx.compile`` with the model's
    and optimizer's state as ``inputs`` and ``outputs``), the block inside it on
    ``backend`` (None: plain float32). Returns ``step(x, y) -> loss``."""
    import mlx_precise as mp

    loss_and_grad = nn.value_and_grad(model, mse)

    def step(x, y):
        loss, grads = loss_and_grad(model, x, y)
        opt.update(model, grads)
        return loss

    def step_in_block(x, y):
        with mp.use_backend(backend), mp.extended_precision():
            return step(x, y)

    state = [model.state, opt.state]
    return mx.compile(step if backend is None else step_in_block, inputs=state, outputs=state)


# ---- the Metal path of a training step (lazy stand-in, no Apple GPU) -------------------

def metal_step(optimizer_name: str = "adam", rounds: int = 7, calls: int = 20,
               seed: int = 0) -> dict:
    """One training step of the MLP (loss, gradients, optimizer update) on the metal
    path, with the kernels replaced by the lazy stand-in of ``mlx_precise.testing``
    (counts and host times on this machine; nothing runs on an Apple GPU):

    * ``launches``, ``bytes``: the double-word kernel launches a GPU runs per step
      (a fused chain's unread intermediate results never run) and the bytes they
      read and write; ``glue``: the step graph's other primitives that dispatch (not
      views); ``plain_ops``: the plain float32 step graph's dispatching primitives;
    * ``build``, ``plain_build``: seconds of host work to build one uncompiled step
      (the block around it; its graph built, not evaluated);
    * ``compiled``, ``plain_compiled``: seconds of host work per call of the step
      compiled as MLX documents it (:func:`_compiled_step`); ``replays``: whether
      the compiled step's later calls run no Python of the flow (no kernel launch is
      built after the first call: the traced graph is replayed).

    Times: medians over ``rounds`` interleaved rounds (three builds each, ``calls``
    calls for the compiled steps)."""
    import mlx_precise as mp
    from mlx_precise.core.context import switched
    from mlx_precise.extended import autodiff, recipes
    from mlx_precise.testing import graph_counts, lazy_metal_executor

    _, p0 = initial_model(seed)
    x, y = (mx.array(a) for a in oracle.mlp_data(MLP_SIZES["samples"], MLP_SIZES["d_in"],
                                                  MLP_SIZES["d_out"]))
    runs = {}
    for who in ("plain", "metal"):
        model, opt = model_from(p0), mlx_optimizer(optimizer_name)
        opt.init(model.trainable_parameters())
        runs[who] = (model, opt, nn.value_and_grad(model, mse))

    def build(who):
        """One uncompiled step's graph: the loss and the updated state, lazy."""
        model, opt, loss_and_grad = runs[who]
        with contextlib.ExitStack() as block:
            if who == "metal":
                block.enter_context(mp.use_backend("metal"))
                block.enter_context(mp.extended_precision())
            loss, grads = loss_and_grad(model, x, y)
            opt.update(model, grads)
        return [loss, model.parameters(), opt.state]

    record: list = []
    with lazy_metal_executor(record):
        plain = graph_counts(*_leaves(build("plain")))
        # (counted with replays off: a replayed rule or pass builds the same launches,
        # tests/extended/test_recipes.py and test_flow_pass_replay.py, but without the
        # Python that records each one here)
        with switched((recipes, "ENABLED", False), (autodiff, "COMPILED_PASS", False)):
            outs = build("metal")
        ext = graph_counts(*_leaves(outs))
        mx.eval(outs)
        ran = [k for k in record if k.ran() and k.name != "eft_selftest"]
        compiled = {who: _compiled_step(runs[who][0], runs[who][1],
                                        "metal" if who == "metal" else None)
                    for who in runs}
        for who, step in compiled.items():  # traced on the first two calls (fresh
            for _ in range(2):                 # state, then state with low words)
                mx.eval(step(x, y), runs[who][0].parameters(), runs[who][1].state)
        times = {k: [] for k in ("plain", "metal", "plain compiled", "metal compiled")}
        for _ in range(rounds):
            for who in runs:
                for _ in range(3):  # (a few builds a round: one build is ~0.3-3 ms)
                    t = time.perf_counter()
                    outs = build(who)
                    times[who].append(time.perf_counter() - t)
                    mx.eval(outs)
                model, opt, step = runs[who][0], runs[who][1], compiled[who]
                t = time.perf_counter()
                for _ in range(calls):
                    loss = step(x, y)
                times[f"{who} compiled"].append((time.perf_counter() - t) / calls)
                mx.eval(loss, model.parameters(), opt.state)
        # the uncompiled rounds built launches too: replay is judged on a compiled call
        record.clear()
        mx.eval(compiled["metal"](x, y), runs["metal"][0].parameters(), runs["metal"][1].state)
        replayed = not [k for k in record if k.name != "eft_selftest"]
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"launches": len(ran), "bytes": sum(k.nbytes() for k in ran),
            "glue": ext["glue"], "plain_ops": plain["glue"],
            "build": med["metal"], "plain_build": med["plain"],
            "compiled": med["metal compiled"], "plain_compiled": med["plain compiled"],
            "replays": replayed}


def _leaves(tree) -> list:
    return [v for _, v in tree_flatten(tree)]


def metal_table(names) -> str:
    """One line per optimizer: :func:`metal_step`'s counts and host times."""
    lines = ["| optimizer | launches / step | bytes / step | glue | plain ops "
             "| dispatches / plain | build: metal / plain | compiled call: metal / plain "
             "| compiled step replays without Python |", "|---" * 9 + "|"]
    for name in names:
        g = metal_step(name)
        lines.append(
            f"| {name} | {g['launches']} | {g['bytes'] / 1e3:.1f} kB | {g['glue']} "
            f"| {g['plain_ops']} | {(g['launches'] + g['glue']) / g['plain_ops']:.2f} "
            f"| {1e3 * g['build']:.2f} / {1e3 * g['plain_build']:.3f} ms = "
            f"{g['build'] / g['plain_build']:.1f}x "
            f"| {1e3 * g['compiled']:.3f} / {1e3 * g['plain_compiled']:.3f} ms = "
            f"{g['compiled'] / g['plain_compiled']:.1f}x | {'yes' if g['replays'] else 'no'} |")
    return "\n".join(lines)


# ---- the tables -----------------------------------------------------------------------

def _ratio(row: dict, key: str, fl: float) -> str:
    if "error" in row:
        return "error: " + row["error"]
    if key not in row:
        return "error: " + row.get("dw_error", "-")
    return f"{row[key] / fl:.3g}x"


def gradient_head(backends) -> str:
    return ("| case | floor | float32 | " + " | ".join(
        f"{b}: rounded | {b}: carried" for b in backends) + " | consumed in float32 |\n"
        + "|" + "---|" * (3 + 2 * len(backends) + 1))


def gradient_row(name: str, r: dict, backends, chain: int | None = None) -> str:
    case = GRAD_CASES.get(name)
    cells = [case.label(chain or oracle.CHAIN) if case else name, f"{r['floor']:.2e}",
             _ratio(r["plain"], "err", r["floor"])]
    dropped = set()
    for b in backends:
        row = r.get(b, {"error": "not run"})
        cells += [_ratio(row, "err", r["floor"]),
                  "" if "error" in row else _ratio(row, "dw_err", r["floor"])]
        dropped |= set(row.get("float32", {}))
    cells.append(", ".join(sorted(dropped)) or "-")
    return "| " + " | ".join(cells) + " |"


def gradient_table(results: dict, backends, chain: int | None = None) -> str:
    return "\n".join([gradient_head(backends)]
                     + [gradient_row(n, r, backends, chain) for n, r in results.items()])


def _times(base: dict, run: dict) -> list[str]:
    """Time per step of ``base`` and ``run`` and their ratio (table cells)."""
    t0, t1 = base.get("time"), run.get("time")
    c0, c1 = base.get("cpu_time"), run.get("cpu_time")
    cpu = f" (CPU time {c1 / c0:.1f}x)" if c0 and c1 else ""
    return [f"{1e3 * t0:.2f} ms" if t0 else "-", f"{1e3 * t1:.2f} ms" if t1 else "-",
            f"{t1 / t0:.1f}x{cpu}" if t0 and t1 else "-"]


def training_row(name: str, backend: str, r: dict) -> str:
    fl = r["floor"]
    ext = r.get(backend, {"error": "not run"})
    comp = r.get(f"{backend} compiled", {"error": "not run"})
    cells = [name, backend, str(r["steps"]), f"{r['loss0']:.4g} -> {r['loss64']:.4g}",
             f"{fl:.2e}", _ratio(r["plain"], "err", fl), f"{r['params_float32'] / fl:.3g}x",
             f"{r['hyper_float32'] / fl:.3g}x", _ratio(ext, "err", fl),
             "" if "error" in ext else _ratio(ext, "dw_err", fl), _ratio(comp, "err", fl),
             *_times(r["plain"], ext), *_times(r.get("plain compiled", {}), comp),
             f"{1e3 * r['float64_time']:.2f} ms",
             ", ".join(sorted(ext.get("float32", {}))) or "-"]
    return "| " + " | ".join(cells) + " |"


TRAINING_HEAD = ("| optimizer | backend | steps | loss (float64) | floor | float32 "
                 "| float64, params stored float32 | float64, float32 constants | in block: "
                 "rounded | in block: carried | compiled step, block inside: rounded "
                 "| time/step float32 | in block | ratio | float32 compiled | in block compiled "
                 "| ratio | numpy float64 | consumed in float32 |\n" + "|---" * 19 + "|")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", action="append", default=None,
                   help="extended backend (repeatable; default: the active one)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 1000)")
    p.add_argument("--block", choices=("per-step", "per-burst"), default="per-step")
    p.add_argument("--quick", action="store_true",
                   help="long chains of 200, 50 training steps: a smoke test")
    p.add_argument("--chain", type=int, default=None,
                   help="length of the two long chains (default 2000; the emulator's time "
                        "grows faster than linearly with it)")
    p.add_argument("--full", action="store_true", help="the full sizes (the default)")
    p.add_argument("--only", choices=("gradients", "training", "metal"), default=None)
    a = p.parse_args(argv)
    import mlx_precise as mp

    backends = a.backend or [mp.backend()]
    steps = a.steps or (50 if a.quick else 1000)
    chain = a.chain or (200 if a.quick else None)
    print("Training in double-word: errors as ratios to the floor (the float64 "
          "oracle rounded once to float32), normwise; float32 = plain MLX; rounded = the "
          "float32 arrays after the block; carried = astype(float64) inside the block\n")
    if a.only in (None, "gradients"):
        print("Gradients; target: rounded <= 2x\n")
        print(gradient_head(backends), flush=True)
        for name in GRAD_CASES:
            print(gradient_row(name, measure_case(name, backends, chain), backends, chain),
                  flush=True)
    if a.only in (None, "training"):
        print(f"\nTraining the MLP ({MLP_SIZES['d_in']}-{MLP_SIZES['hidden']}-"
              f"{MLP_SIZES['d_out']}, {MLP_SIZES['samples']} samples, MSE, full batch), "
              f"block {a.block}; target: rounded <= 3x. Time per step: median of "
              f"interleaved bursts of 10 steps (wall clock; in brackets the ratio of "
              f"CPU time, all threads)\n")
        print(TRAINING_HEAD, flush=True)
        for b in backends:
            for name in OPTIMIZERS:
                print(training_row(name, b, run_training(name, steps, b, a.block)), flush=True)
    if a.only in (None, "metal"):
        print("\nThe Metal path of one training step of the MLP (lazy stand-in for the kernels: "
              "counts and host times on this machine, no Apple GPU); launches a GPU runs, "
              "glue = other primitives that are not views; times: host work to build one step "
              "(uncompiled, block inside) and per call of the compiled step\n")
        print(metal_table(OPTIMIZERS), flush=True)


if __name__ == "__main__":
    main()
