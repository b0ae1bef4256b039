"""The float64 oracle of training in double-word (benchmarks/training_oracle.py), checked
on its own, without mlx_precise:

* every hand-written gradient against central finite differences of its own float64
  loss (random directions and single coordinates), and the elementwise derivatives
  against mpmath;
* the same gradients against plain MLX in float32 (agreement to float32 level shows
  that the MLX case and the oracle compute the same function) and in float64 on the
  CPU (closer still, where MLX's float64 ops are float64-accurate);
* the optimizer replicas (SGD with momentum / dampening / Nesterov / weight decay,
  Adam with and without bias correction, AdamW) against mlx.optimizers running the
  same 10 steps in float32 and in float64, with hyperparameters exaggerated so that
  every convention (eps placement, step counter, decay ordering) moves the result by
  far more than the tolerance; and a replica with one deliberate mistake must fail
  the same check.

The harness (benchmarks/bench_training.py) is smoke-tested last: it returns numbers,
and reports a failing case instead of raising.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.optimizers as optim
import mpmath
import numpy as np
import pytest

import bench_training as bt
import training_oracle as o

CASES = list(o.GRAD_CASES)

# MLX's float64 ops that are float64-accurate in value and derivative (the others:
# exp, erf, sigmoid, softmax, conv1d, the fast norms and attention are float32-accurate
# in float64 MLX 0.32.4, so they get the float32 tolerance there).
EXACT_IN_MLX64 = {"arith chain", "log", "tanh", "matmul", "cumsum", "param used n times",
                  "recurrence of n steps"}


def _perturbed(inputs, wrt, direction, h):
    out = {k: np.asarray(v, np.float64) for k, v in inputs.items()}
    for k in wrt:
        out[k] = out[k] + h * direction[k]
    return out


def _central(case, inputs, direction, h):
    return (case.loss(_perturbed(inputs, case.wrt, direction, h))
            - case.loss(_perturbed(inputs, case.wrt, direction, -h))) / (2 * h)


@pytest.mark.parametrize("name", CASES)
def test_gradient_oracle_matches_central_differences(name):
    case = o.GRAD_CASES[name]
    inputs = bt.case_inputs(name, chain=200)
    g = case.grad(inputs)
    assert set(g) == set(case.wrt)
    for k in case.wrt:
        assert g[k].shape == inputs[k].shape and np.all(np.isfinite(g[k]))
    gnorm = np.linalg.norm(o.flat(g, case.wrt))
    rng = np.random.default_rng(0)
    scale = {k: max(float(np.abs(inputs[k]).max()), 1.0) for k in case.wrt}
    h = 1e-5
    # random directions: the directional derivative <g, d>
    for _ in range(2):
        d = {k: scale[k] * rng.standard_normal(inputs[k].shape) for k in case.wrt}
        fd = _central(case, inputs, d, h)
        exact = float(o.flat(g, case.wrt) @ o.flat(d, case.wrt))
        assert abs(fd - exact) <= 1e-7 * gnorm * np.linalg.norm(o.flat(d, case.wrt)), (fd, exact)
    # single coordinates of every differentiated input
    for k in case.wrt:
        for idx in rng.choice(inputs[k].size, size=min(3, inputs[k].size), replace=False):
            d = {j: np.zeros(inputs[j].shape) for j in case.wrt}
            d[k].flat[idx] = scale[k]
            fd = _central(case, inputs, d, h) / scale[k]
            assert abs(fd - g[k].flat[idx]) <= 1e-7 * max(np.abs(g[k]).max(), 1e-300), (k, idx)


@pytest.mark.parametrize("name", list(o.UNARY))
def test_elementwise_derivatives_against_mpmath(name):
    f, df, (lo, hi) = o.UNARY[name]
    mp_f = {"exp": mpmath.exp, "log": mpmath.log, "tanh": mpmath.tanh,
            "sigmoid": lambda t: 1 / (1 + mpmath.exp(-t)), "erf": mpmath.erf}[name]
    with mpmath.workdps(40):
        for x in np.linspace(lo, hi, 7):
            exact = mpmath.diff(mp_f, mpmath.mpf(float(x)))
            got = float(df(np.array([x]))[0])
            assert abs(got - float(exact)) <= 4e-16 * abs(float(exact)), (x, got, exact)
            value = float(f(np.array([x]))[0])
            assert abs(value - float(mp_f(mpmath.mpf(float(x))))) <= 4e-16 * max(abs(value), 1e-300)


@pytest.mark.parametrize("name", CASES)
def test_gradient_oracle_agrees_with_mlx(name):
    case = o.GRAD_CASES[name]
    inputs = bt.case_inputs(name, chain=200)
    ref = o.flat(case.grad(inputs), case.wrt)
    err32 = o.normwise(o.flat(bt.mlx_gradient(name, inputs), case.wrt), ref)
    assert err32 < 3e-6  # float32 level: a different function would be O(1)
    with mx.stream(mx.cpu):
        err64 = o.normwise(o.flat(bt.mlx_gradient(name, inputs, mx.float64), case.wrt), ref)
    assert err64 < (1e-13 if name in EXACT_IN_MLX64 else 1e-6), err64


# ---- optimizers -----------------------------------------------------------------------

CONFIGS = [
    ("SGD", dict(learning_rate=0.1)),
    ("SGD", dict(learning_rate=0.05, momentum=0.9, weight_decay=0.1, dampening=0.5)),
    ("SGD", dict(learning_rate=0.05, momentum=0.9, nesterov=True, weight_decay=0.05)),
    ("Adam", dict(learning_rate=0.01, betas=(0.8, 0.9), eps=0.1)),
    ("Adam", dict(learning_rate=0.01, betas=(0.8, 0.9), eps=0.1, bias_correction=True)),
    ("AdamW", dict(learning_rate=0.01, betas=(0.8, 0.9), eps=0.1, weight_decay=0.5)),
    ("AdamW", dict(learning_rate=0.01, betas=(0.8, 0.9), eps=0.1, weight_decay=0.5,
                   bias_correction=True)),
    *o.OPTIMIZERS.values(),
]
STEPS = 10


@pytest.fixture(scope="module")
def start():
    x, y = o.mlp_data()
    _, p0 = bt.initial_model(0)
    return p0, x, y, sorted(p0)


def _displacement_error(p0, keys, got, ref) -> float:
    """|| (got - p0) - (ref - p0) || / || ref - p0 ||: the update's error, not the
    parameters' (which would hide a wrong update behind the unchanged bulk)."""
    P0 = o.flat(p0, keys)
    move = o.flat(ref, keys) - P0
    return float(np.linalg.norm(o.flat(got, keys) - P0 - move) / np.linalg.norm(move))


def _ids(cfg):
    kind, kw = cfg
    return kind + "-" + "-".join(f"{k}={v}" for k, v in kw.items())


@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
def test_optimizer_replica_matches_mlx(cfg, start):
    kind, kw = cfg
    p0, x, y, keys = start
    ref, _ = o.trajectory(p0, x, y, kind, kw, STEPS)
    got32 = bt.mlx_trajectory(p0, x, y, getattr(optim, kind)(**kw), STEPS)
    assert _displacement_error(p0, keys, got32, ref) < 1e-5
    with mx.stream(mx.cpu):
        got64 = bt.mlx_trajectory(p0, x, y, getattr(optim, kind)(**kw), STEPS, mx.float64)
    # MLX's float64 erf and layer_norm are float32-accurate: close, not exact
    assert _displacement_error(p0, keys, got64, ref) < 1e-6


class _EpsInsideSqrt(o.Adam):
    def apply_single(self, g, p, s):
        b1, b2 = self.betas
        m = b1 * s.get("m", np.zeros_like(p)) + (1 - b1) * g
        v = b2 * s.get("v", np.zeros_like(p)) + (1 - b2) * g * g
        s["m"], s["v"] = m, v
        return p - self.lr * m / np.sqrt(v + self.eps)


class _DecayAfterUpdate(o.AdamW):
    def apply_single(self, g, p, s):
        return o.Adam.apply_single(self, g, p, s) * (1 - self.lr * self.weight_decay)


class _StepOffByOne(o.Adam):
    def update(self, params, grads):
        self.step += 1  # the first update sees step 2
        try:
            return super().update(params, grads)
        finally:
            self.step -= 1


@pytest.mark.parametrize("wrong,kind,kw", [
    (_EpsInsideSqrt, "Adam", dict(learning_rate=0.01, betas=(0.8, 0.9), eps=0.1)),
    (_DecayAfterUpdate, "AdamW", dict(learning_rate=0.01, betas=(0.8, 0.9), eps=0.1,
                                      weight_decay=0.5)),
    (_StepOffByOne, "Adam", dict(learning_rate=0.01, betas=(0.8, 0.9), eps=0.1,
                                 bias_correction=True)),
], ids=["eps-inside-sqrt", "decay-after-update", "step-off-by-one"])
def test_a_formula_mistake_fails_the_replica_check(wrong, kind, kw, start, monkeypatch):
    p0, x, y, keys = start
    monkeypatch.setitem(o.OPTIMIZER_CLASSES, kind, wrong)
    bad, _ = o.trajectory(p0, x, y, kind, kw, STEPS)
    got32 = bt.mlx_trajectory(p0, x, y, getattr(optim, kind)(**kw), STEPS)
    assert _displacement_error(p0, keys, got32, bad) > 1e-3


def test_trajectory_follows_the_mlp_gradient(start):
    """One plain SGD step of the replica is p - float32(lr) * the MLP's gradient, and the
    loss of the float64 trajectory falls."""
    p0, x, y, keys = start
    one, _ = o.trajectory(p0, x, y, "SGD", dict(learning_rate=0.1), 1)
    _, g = o.mlp_grad({k: v.astype(np.float64) for k, v in p0.items()},
                      x.astype(np.float64), y.astype(np.float64))
    lr = float(np.float32(0.1))
    for k in keys:
        np.testing.assert_array_equal(one[k], p0[k].astype(np.float64) - lr * g[k])
    _, losses = o.trajectory(p0, x, y, "Adam", dict(learning_rate=1e-2), 50, record=(0, 49))
    assert losses[1] < 0.5 * losses[0]


def test_floor_is_one_rounding():
    ref = np.array([1 / 3, 2 / 3, math.pi])
    assert o.floor(ref) == o.normwise(ref.astype(np.float32), ref) > 0
    assert o.floor(np.array([0.5, 0.25])) == 0.0


# ---- the harness ----------------------------------------------------------------------

def test_harness_returns_numbers_and_reports_failures(monkeypatch):
    r = bt.measure_case("tanh", ("cpu",), chain=200)
    assert r["floor"] > 0 and r["plain"]["err"] > 0
    assert {"err", "dw_err", "float32"} <= set(r["cpu"])
    t = bt.run_training("adam", steps=4, backend="cpu", burst=2)
    assert t["floor"] > 0 and t["plain"]["err"] > 0 and t["cpu"]["time"] > 0
    assert "dw_err" in t["cpu"]

    def boom(inp, wrt):
        def run():
            raise RuntimeError("no rule for this")
        return run

    monkeypatch.setitem(bt.MLX_CASES, "tanh", boom)
    r = bt.measure_case("tanh", ("cpu",))
    assert "no rule for this" in r["cpu"]["error"] and "no rule" in r["plain"]["error"]
    table = bt.gradient_table({"tanh": r}, ("cpu",))
    assert "error: RuntimeError: no rule for this" in table


def test_script_prints_the_training_table(capsys):
    bt.main(["--backend", "cpu", "--only", "training", "--steps", "3"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and " cpu | 3 |" in line]
    assert [r.split(" | ")[0] for r in rows] == [f"| {n}" for n in o.OPTIMIZERS]
    assert all("error" not in r for r in rows)


def test_diagnostic_trajectories(start):
    """The oracle-only variants of the training table: float32 constants include the
    optimizer's defaults; parameters stored in float32 stay float32 values."""
    kw = o.float32_hyperparameters("Adam", dict(learning_rate=1e-3))
    assert kw["betas"] == (float(np.float32(0.9)), float(np.float32(0.999)))
    assert kw["eps"] == float(np.float32(1e-8)) != 1e-8 and kw["bias_correction"] is False
    assert o.float32_hyperparameters("SGD", dict(learning_rate=0.1, momentum=0.9))["momentum"] \
        == float(np.float32(0.9))
    p0, x, y, keys = start
    theta, _ = o.trajectory(p0, x, y, "Adam", dict(learning_rate=1e-3), 5, store=o.to_float32)
    exact, _ = o.trajectory(p0, x, y, "Adam", dict(learning_rate=1e-3), 5)
    for k in keys:
        np.testing.assert_array_equal(theta[k], theta[k].astype(np.float32))
    assert 0 < o.normwise(o.flat(theta, keys), o.flat(exact, keys)) < 1e-6
