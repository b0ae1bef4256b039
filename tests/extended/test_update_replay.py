"""An optimizer's per-parameter update replayed on the metal path
(mlx_precise.extended.updates), checked on the lazy Metal stand-in (no Apple GPU
here: graphs, reports and what a replay reads are compared, not values)."""

from __future__ import annotations

import re

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten

import mlx_precise as mp
from mlx_precise.extended import carry, recipes, updates
from mlx_precise.testing import graph_counts, graph_text, lazy_metal_executor


@pytest.fixture(autouse=True)
def _fresh_table(monkeypatch):
    """A table of update replays of its own for each test (the process's is
    bounded: full after other tests, it would show no new replay)."""
    made = updates._made
    monkeypatch.setattr(updates, "_made", recipes.Sightings(made.seen_max, made.made_max))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(8, 16), nn.Linear(16, 2)
        self.norm = nn.LayerNorm(16)

    def __call__(self, x):
        return self.l2(nn.gelu(self.norm(self.l1(x))))


def _data():
    rng = np.random.default_rng(0)
    return (mx.array(rng.standard_normal((32, 8)).astype(np.float32)),
            mx.array(rng.standard_normal((32, 2)).astype(np.float32)))


def _train(make_opt, steps: int, replays: bool, monkeypatch):
    """``steps`` training steps of the MLP on the lazy metal path, each in a strict
    block; the last step's parameters and state (with their low words) and every
    step's report."""
    monkeypatch.setattr(recipes, "ENABLED", replays)
    mx.random.seed(0)
    model, opt = MLP(), make_opt()
    mx.eval(model.parameters())
    x, y = _data()
    vg = nn.value_and_grad(model, lambda m, x, y: nn.losses.mse_loss(m(x), y))
    reports = []
    with lazy_metal_executor():
        for _ in range(steps):
            with mp.use_backend("metal"), mp.extended_precision(strict=True) as report:
                _, grads = vg(model, x, y)
                opt.update(model, grads)
                arrays = [a for _, a in tree_flatten((model.parameters(), opt.state))]
                words = [w for a in arrays for w in (a, carry.low_word(a)) if w is not None]
            reports.append(report)
    return words, reports


OPTIMIZERS = {
    "adam": lambda: optim.Adam(1e-2),
    "adamw": lambda: optim.AdamW(1e-2, weight_decay=0.1),
    "sgd, momentum, nesterov": lambda: optim.SGD(1e-2, momentum=0.9, nesterov=True,
                                                 weight_decay=1e-3),
    "adam, scheduled": lambda: optim.Adam(optim.cosine_decay(1e-2, 100)),
    "lion (a value-free op, sign)": lambda: optim.Lion(1e-3, weight_decay=0.1),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_replayed_updates_build_the_updates(name, monkeypatch):
    """With replays, the fourth step's parameters and state have the graph of the
    step run op by op (the same launches, views and glue but for what MLX's
    compile fuses) and every step reports the same ops; the updates did replay."""
    before = len(updates._made.made)
    words, reports = _train(OPTIMIZERS[name], 4, True, monkeypatch)
    made = list(updates._made.made.values())[before:]
    assert made and all(isinstance(u, updates._Update) for u in made), made
    direct, direct_reports = _train(OPTIMIZERS[name], 4, False, monkeypatch)
    assert len(words) == len(direct)
    got, want = graph_counts(*words), graph_counts(*direct)
    assert got["launches"] == want["launches"]
    assert got["glue"] <= want["glue"]
    for r, d in zip(reports, direct_reports):
        assert (r.extended, r.float32, r.plain) == (d.extended, d.float32, d.plain), (r, d)
        assert not r.float32


def test_a_replay_reads_the_current_learning_rate_and_step(monkeypatch):
    """A scheduled learning rate and the step count are new arrays at every step:
    each replayed update is given them (its inputs), never the values they had when
    it was traced."""
    monkeypatch.setattr(recipes, "ENABLED", True)
    calls = []
    call = recipes.COMPILED_CALL

    def kept(compiled, *inputs):
        calls.append(inputs)
        return call(compiled, *inputs)

    monkeypatch.setattr(recipes, "COMPILED_CALL", kept)
    mx.random.seed(0)
    model, opt = MLP(), optim.Adam(optim.cosine_decay(1e-2, 100))
    mx.eval(model.parameters())
    x, y = _data()
    vg = nn.value_and_grad(model, lambda m, x, y: nn.losses.mse_loss(m(x), y))
    replayed = 0
    with lazy_metal_executor():
        for step in range(5):
            with mp.use_backend("metal"), mp.extended_precision(strict=True):
                _, grads = vg(model, x, y)
                del calls[:]
                opt.update(model, grads)
            now = [opt.state["learning_rate"], opt.state["step"]]
            updating = [c for c in calls if any(a is now[0] for a in c)]
            replayed += len(updating)
            assert all(any(a is now[1] for a in c) for c in updating)
            if step >= 2:  # (every parameter's update replays from the third step)
                assert len(updating) == len(tree_flatten(model.trainable_parameters()))
            mx.eval(model.parameters(), opt.state)
    assert replayed


class _Reads(optim.SGD):
    """Reads an array that is none of its inputs (a replay would hold it)."""

    scale = None

    def apply_single(self, gradient, parameter, state):
        return parameter - self.learning_rate * _Reads.outside * gradient


class _Updates(optim.Optimizer):
    """Updates its state's array in place (a replay would not)."""

    def __init__(self):
        super().__init__()
        self._maybe_schedule("learning_rate", 1e-2)

    def init_single(self, parameter, state):
        state["v"] = mx.zeros_like(parameter)

    def apply_single(self, gradient, parameter, state):
        state["v"] += gradient
        return parameter - self.learning_rate * state["v"]


class _Counts(optim.SGD):
    """Changes one of its attributes at each update (a replay would not)."""

    calls = 0

    def apply_single(self, gradient, parameter, state):
        self.calls = self.calls + 1
        return super().apply_single(gradient, parameter, state)


@pytest.mark.parametrize("make", [lambda: _Reads(1e-2), _Updates, lambda: _Counts(1e-2)],
                         ids=["reads an outside array", "updates an input in place",
                              "changes an attribute"])
def test_updates_that_cannot_replay_run_op_by_op(make, monkeypatch):
    """None of these updates replays (each is traced once and not kept, or, where
    an attribute changes at every call, its structure is new at every call): they
    run op by op, with the launches and reports of the steps with replays off."""
    _Reads.outside = mx.array(0.5)
    # (these updates are this module's: replayed, as MLX's would be, for the check)
    monkeypatch.setattr(updates, "REPLAYED", (*updates.REPLAYED, __name__))
    before = dict(updates._made.made)
    words, reports = _train(make, 4, True, monkeypatch)
    made = [v for k, v in updates._made.made.items() if k not in before]
    assert all(v is None for v in made), made
    direct, direct_reports = _train(make, 4, False, monkeypatch)
    assert graph_counts(*words)["launches"] == graph_counts(*direct)["launches"]
    assert [(r.extended, r.float32) for r in reports] == [
        (r.extended, r.float32) for r in direct_reports]


def test_counted_attribute_keeps_counting(monkeypatch):
    """An update that changes the optimizer runs at every step (four steps, four
    calls per parameter)."""
    words, _ = _train(lambda: _Counts(1e-2), 4, True, monkeypatch)
    # (the optimizer of _train is not returned: count through a fresh one)
    monkeypatch.setattr(recipes, "ENABLED", True)
    mx.random.seed(0)
    model, opt = MLP(), _Counts(1e-2)
    x, y = _data()
    vg = nn.value_and_grad(model, lambda m, x, y: nn.losses.mse_loss(m(x), y))
    with lazy_metal_executor():
        for _ in range(4):
            with mp.use_backend("metal"), mp.extended_precision():
                _, grads = vg(model, x, y)
                opt.update(model, grads)
    assert opt.calls == 4 * len(tree_flatten(model.trainable_parameters()))


def test_no_replay_off_metal_or_outside_blocks(monkeypatch):
    """cpu and emulate run the updates op by op; outside blocks MLX's
    apply_gradients runs untouched (no stand-in is installed)."""
    assert optim.Optimizer.__dict__["apply_gradients"] is updates._provide()[
        optim.Optimizer]["apply_gradients"][0]
    before = len(updates._made.made)
    mx.random.seed(0)
    model, opt = MLP(), optim.Adam(1e-2)
    x, y = _data()
    vg = nn.value_and_grad(model, lambda m, x, y: nn.losses.mse_loss(m(x), y))
    for _ in range(3):
        with mp.use_backend("cpu"), mp.extended_precision():
            _, grads = vg(model, x, y)
            opt.update(model, grads)
    assert len(updates._made.made) == before
    assert "apply_single" not in vars(opt)


def test_the_selftest_check_runs_its_path():
    """``python -m mlx_precise selftest --backend metal`` compares the replayed
    updates with the updates run op by op, bit for bit (on a Mac; here the stand-in's
    values are zeros, so this runs the check's path only: the updates replayed)."""
    from mlx_precise.extended import checks

    before = len(updates._made.made)
    with lazy_metal_executor():
        check = checks.check_update_replays("metal")
    assert check.passed and "45 of 45 bit-identical" in check.figure, check.figure
    assert any(isinstance(u, updates._Update)
               for u in list(updates._made.made.values())[before:])


def test_updates_defined_elsewhere_run_op_by_op(monkeypatch):
    """An apply_single that is not MLX's (it might read Python state a replay would
    hold at its traced value) is never traced."""
    _Reads.outside = mx.array(0.5)
    monkeypatch.setattr(updates, "_made", recipes.Sightings(seen_max=8, made_max=8))
    _train(lambda: _Reads(1e-2), 4, True, monkeypatch)
    assert updates._made.made == {} and updates._made.seen == {}
    _train(lambda: optim.SGD(1e-2, momentum=0.9), 4, True, monkeypatch)
    assert updates._made.made  # (MLX's own: replayed)
