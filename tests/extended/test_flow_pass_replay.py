"""The flow's backward pass replayed on the metal path (mlx_precise.extended.autodiff:
a training step's pass traced once per tape structure by mx.compile), checked on the
lazy Metal stand-in (no Apple GPU here: graphs and reports are compared, not values)."""

from __future__ import annotations

import importlib
import re

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

import mlx_precise as mp
from mlx_precise.extended import autodiff, carry, recipes
from mlx_precise.testing import graph_counts, graph_text, lazy_metal_executor


@pytest.fixture(autouse=True)
def _fresh_table(monkeypatch):
    """A table of backward-pass replays of its own for each test (the process's is
    bounded: full after other tests, it would show no new replay)."""
    made = autodiff._passes
    monkeypatch.setattr(autodiff, "_passes", recipes.Sightings(made.seen_max, made.made_max))


def _canonical(*outs) -> str:
    names: dict = {}
    return re.sub(r'\b\d{6,}\b|"[A-Z]+"',
                  lambda m: names.setdefault(m.group(0), f"n{len(names)}"), graph_text(*outs))


def _steps(name: str, calls: int):
    """``calls`` training steps (value_and_grad of the model's summed output) of a
    benchmark model on the lazy metal path; per step the gradients with their low
    words, and the block's report."""
    mod = importlib.import_module(f"models.{name}")
    model, x = mod.build("small", 0)
    mx.eval(model.parameters())
    vg = nn.value_and_grad(model, lambda m, x: m(x).astype(mx.float32).sum())
    out = []
    with lazy_metal_executor():
        for _ in range(calls):
            with mp.use_backend("metal"), mp.extended_precision() as report:
                _, grads = vg(model, x)
                leaves = [g for _, g in tree_flatten(grads)]
                words = [w for g in leaves for w in (g, carry.low_word(g)) if w is not None]
                out.append((words, report))
    return out


@pytest.mark.parametrize("name", ["transformer", "llama", "hyena"])
def test_replayed_pass_builds_the_pass(name, monkeypatch):
    """The third step's gradients (a replay of the pass's trace) have the launches
    of the pass run op by op, carry low words as they do, and the block reports the
    same ops."""
    monkeypatch.setattr(autodiff, "COMPILED_PASS", False)
    (direct, direct_report), = _steps(name, 1)
    monkeypatch.setattr(autodiff, "COMPILED_PASS", True)
    before = len(autodiff._passes.made)
    runs = _steps(name, 3)
    made = [p for p in list(autodiff._passes.made.values())[before:]]
    assert made and all(isinstance(p, autodiff._FlowPass) for p in made)
    words, report = runs[-1]
    assert len(words) == len(direct)
    got, want = graph_counts(*words), graph_counts(*direct)
    assert got["launches"] == want["launches"]
    assert got["glue"] <= want["glue"]
    assert report.extended == direct_report.extended and not report.float32


def test_equal_structures_replay_one_trace():
    """Steps on new values of the same shapes replay one trace of the pass (traced
    once the forward's steps replay too: their results carry what replays record),
    the same graph at each; a new shape is a new structure."""
    w = mx.random.normal((16, 16))
    mx.eval(w)

    def loss(w, x):
        return mx.softmax(mx.fast.layer_norm(x @ w, None, None, 1e-5), axis=-1).sum()

    before = len(autodiff._passes.made)
    graphs = {}
    with lazy_metal_executor():
        for shape in [(4, 16)] * 5 + [(6, 16)] * 5:
            x = mx.random.normal(shape)
            mx.eval(x)
            with mp.use_backend("metal"), mp.extended_precision():
                g = mx.grad(loss)(w, x)
                graphs.setdefault(shape, []).append(_canonical(g, carry.low_word(g)))
    made = list(autodiff._passes.made.values())[before:]
    assert len(made) == 2 and all(isinstance(p, autodiff._FlowPass) for p in made)
    for runs in graphs.values():  # (the trace's own call gives the graph as traced)
        assert runs[-1] == runs[-2]


def _declined(e, g):
    """exp's VJP declining: MLX's float32 VJP runs (a drop)."""
    return NotImplemented


def _dropping(e, g):
    """exp's VJP whose own ops read a carried value in float32 (an op without a
    double-word rule)."""
    h = g * e.out
    return (h + mx.to_fp8(h).astype(mx.float32) * 0.0,)


@pytest.mark.parametrize("vjp, dropped", [(_declined, "exp"), (_dropping, "to_fp8")])
def test_a_pass_that_leaves_double_word_runs_op_by_op(monkeypatch, vjp, dropped):
    """A pass in which a value leaves double-word (a VJP rule that declines, so MLX's
    float32 VJP runs; one whose ops drop a carried value) is not replayed: its trace
    fails or is not kept, each step runs the pass op by op and the block reports the
    drop, at every step."""
    record = autodiff.record

    def recorded(name, rule, *args):
        return record(name, vjp if name == "exp" else rule, *args)

    monkeypatch.setattr(autodiff, "record", recorded)
    x = mx.random.normal((8, 8))
    mx.eval(x)
    before = len(autodiff._passes.made)
    with lazy_metal_executor():
        for _ in range(4):
            with mp.use_backend("metal"), mp.extended_precision() as report:
                mx.grad(lambda a: mx.exp(a * 3.0).sum())(x)
            assert sum(report.float32.values()) == 1, report
            assert dropped in str(report)
    made = list(autodiff._passes.made.values())[before:]
    assert made and not any(isinstance(p, autodiff._FlowPass) for p in made)
