"""A block's ops replayed on the metal path (mlx_precise.extended.blocks), checked on
the lazy Metal stand-in (no Apple GPU here; the stand-in's launches compute with the
emulator when evaluated): a followed block returns what the same block returns op
by op (its words, bit for bit), reports the same, and every way the code can
differ from the record runs the ops' rules again."""

from __future__ import annotations

import importlib

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map

import mlx_precise as mp
from mlx_precise.extended import blocks, carry
from mlx_precise.testing import graph_counts, lazy_metal_executor


def _words(*arrays):
    """The evaluated words of ``arrays`` (hi, and lo where one is carried)."""
    out = []
    for a in arrays:
        lo = carry.low_word(a)
        mx.eval(a, *([] if lo is None else [lo]))
        out.append((np.array(a), None if lo is None else np.array(lo)))
    return out


def _same(words_a, words_b) -> bool:
    return len(words_a) == len(words_b) and all(
        np.array_equal(a[0], b[0], equal_nan=True) and (
            (a[1] is None and b[1] is None)
            or (a[1] is not None and b[1] is not None and np.array_equal(a[1], b[1])))
        for a, b in zip(words_a, words_b))


def _blocks(fn, calls: int, replays: bool = True, backend: str = "metal", args=()):
    """``fn(*args(i))`` in a block at one place in the code, ``calls`` times: the
    results' words, the reports and the stats of the block replays (changes)."""
    before = dict(blocks.stats)
    old = blocks.ENABLED
    blocks.ENABLED = replays
    words, reports = [], []
    try:
        with lazy_metal_executor():
            for i in range(calls):
                a = args(i) if callable(args) else args
                with mp.use_backend(backend), mp.extended_precision() as report:
                    out = fn(*a)
                outs = out if isinstance(out, (tuple, list)) else (out,)
                words.append(_words(*outs))
                reports.append(report)
    finally:
        blocks.ENABLED = old
    stats = {k: blocks.stats[k] - before.get(k, 0) for k in ("learned", "followed", "missed")}
    return words, reports, stats


def _counts(report):
    return dict(report.extended), dict(report.plain), dict(report.float32)


@pytest.fixture(autouse=True)
def _fresh_sites():
    blocks._sites.clear()
    yield
    blocks._sites.clear()


@pytest.mark.parametrize("name", ["hyena", "s4d", "fno", "logmel", "vocoder",
                                  "transformer", "llama"])
def test_models_follow_with_the_same_words_and_reports(name):
    """The benchmark models (small): blocks 3 and 4 follow the record; each block's
    result words and report are those of the same block run op by op, and so is
    the graph (launches; MLX's compiler may merge glue)."""
    mod = importlib.import_module(f"models.{name}")
    model, x = mod.build("small", 0)
    mx.eval(model.parameters())
    got, reports, stats = _blocks(model, 4, args=(x,))
    want, want_reports, _ = _blocks(model, 4, replays=False, args=(x,))
    assert stats == {"learned": 1, "followed": 2, "missed": 0}
    for k in range(4):
        assert _same(got[k], want[k]), k
        assert _counts(reports[k]) == _counts(want_reports[k]), k
    with lazy_metal_executor():
        graphs = []
        for on in (True, False):
            blocks.ENABLED = on
            with mp.use_backend("metal"), mp.extended_precision():
                graphs.append(graph_counts(model(x)))
        blocks.ENABLED = True
    assert graphs[0]["launches"] == graphs[1]["launches"]
    assert graphs[0]["glue"] <= graphs[1]["glue"]


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def __call__(self, x, scale=0.5):
        h = nn.gelu(self.l1(x)) * scale
        return mx.exp(self.l2(h)) - 1.0


def _net():
    mx.random.seed(0)
    net = _Net()
    mx.eval(net.parameters())
    x = mx.array(np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32))
    return net, x


def _inputs(i):
    return mx.array(np.random.default_rng(i).standard_normal((4, 8)).astype(np.float32)),


def test_new_inputs_each_call_are_read():
    """The first op's arrays are the call's own: new inputs at every call give each
    call's result (as op by op), not the traced call's."""
    net, _ = _net()
    got, _, stats = _blocks(net, 5, args=_inputs)
    want, _, _ = _blocks(net, 5, replays=False, args=_inputs)
    assert stats["followed"] == 3 and stats["missed"] == 0
    assert all(_same(g, w) for g, w in zip(got, want))
    assert not _same(got[3], got[4])


def test_a_changed_number_is_a_miss():
    """A Python number that differs from the record (here at the 4th call) ends the
    replay at that op: the result is that of the new number."""
    net, x = _net()
    scale = lambda i: 0.5 if i < 3 else 0.25  # noqa: E731
    got, _, stats = _blocks(lambda i: net(x, scale(i)), 4, args=lambda i: (i,))
    want, _, _ = _blocks(lambda i: net(x, scale(i)), 4, replays=False, args=lambda i: (i,))
    assert stats == {"learned": 1, "followed": 1, "missed": 1}
    assert all(_same(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("value", [-0.0, float("nan")])
def test_signed_zero_and_nan_numbers_are_told_apart(value):
    """-0.0 equals 0.0 and NaN equals nothing: compared by sign and as NaN."""
    net, x = _net()
    scale = lambda i: 0.0 if i < 3 else value  # noqa: E731
    got, _, stats = _blocks(lambda i: x * scale(i) + 1.0, 4, args=lambda i: (i,))
    want, _, _ = _blocks(lambda i: x * scale(i) + 1.0, 4, replays=False,
                         args=lambda i: (i,))
    assert stats["missed"] == 1
    assert all(_same(g, w) for g, w in zip(got, want))
    same = _blocks(lambda i: x * value + 1.0, 4, args=lambda i: (i,))[2]
    assert same["followed"] == 2 and same["missed"] == 0


def test_new_parameters_are_read():
    """Parameters replaced (an optimizer's update): the replay does not follow the
    old arrays; the result is the new parameters'."""
    def run(replays):
        net, x = _net()

        def fn(i):
            if i == 3:
                net.update(tree_map(lambda v: v * 1.5, net.parameters()))
            return net(x)

        return _blocks(fn, 5, replays=replays, args=lambda i: (i,))

    got, _, stats = run(True)
    want, _, _ = run(False)
    assert stats["missed"] >= 1
    assert all(_same(g, w) for g, w in zip(got, want))
    assert not _same(got[2], got[3])


def test_a_parameter_updated_in_place_between_blocks_is_read_at_its_new_value():
    """The same array object, its value changed in place outside the blocks: the
    replay reads its value at the call."""
    def run(replays):
        net, x = _net()

        def between(i):
            if i == 3:
                w = net.l2.weight
                w[...] = w * 2  # (MLX's in-place update: the same Python object)
            return (i,)

        return _blocks(lambda i: net(x), 5, replays=replays, args=between)

    got, _, stats = run(True)
    want, _, _ = run(False)
    assert stats["followed"] == 3
    assert all(_same(g, w) for g, w in zip(got, want))
    assert not _same(got[2], got[3])


def test_a_carried_input_is_not_an_exact_one():
    """An outside array that carries a low word where the record's was exact (or
    the reverse): the record is not followed; the words are read as op by op."""
    net, x = _net()
    with lazy_metal_executor(), mp.use_backend("metal"), mp.extended_precision():
        carried = mx.exp(x * 0.1)
    assert carry.low_word(carried) is not None
    plain = mx.array(np.array(carried))
    inputs = lambda i: (plain if i < 3 else carried,)  # noqa: E731
    got, _, stats = _blocks(net, 5, args=inputs)
    want, _, _ = _blocks(net, 5, replays=False, args=inputs)
    assert all(_same(g, w) for g, w in zip(got, want))
    assert not _same(got[2], got[3])
    assert stats["followed"] >= 2


def test_random_ops_are_never_replayed():
    """A random op reads and advances the generator's state: the record stops before
    it, and every call draws new numbers."""
    net, x = _net()
    got, _, stats = _blocks(lambda: net(x) + mx.random.normal((4, 4)), 5)
    assert all(not _same(got[k], got[k + 1]) for k in range(4))
    assert stats["followed"] == 3  # (the ops before it)


def test_in_place_updates_and_exits_stop_the_record():
    """An in-place update inside the block, and a value read as a Python number:
    the record holds the ops before; the rest runs as usual at every call."""
    net, x = _net()

    def fn():
        y = net(x)
        y[0] = y[1] * 2
        s = (y * y).sum().item()
        return y + s

    got, _, stats = _blocks(fn, 4)
    want, _, _ = _blocks(fn, 4, replays=False)
    assert all(_same(g, w) for g, w in zip(got, want))
    assert stats["followed"] == 2


def test_a_nested_block_stops_the_outer_record():
    net, x = _net()

    def fn():
        y = net(x)
        with mp.extended_precision(False):
            z = y * 3
        return y + z

    got, _, stats = _blocks(fn, 4)
    want, _, _ = _blocks(fn, 4, replays=False)
    assert all(_same(g, w) for g, w in zip(got, want))
    assert stats["followed"] == 2


def test_a_block_longer_or_shorter_than_the_record():
    """A block that goes on past the record runs the rest as usual; one that ends
    early returns the replay's results so far."""
    net, x = _net()
    extra = lambda i: (i,)  # noqa: E731

    def fn(i):
        y = net(x)
        if i >= 3:
            y = mx.sin(y) * y
        return y

    got, _, stats = _blocks(fn, 5, args=extra)
    want, _, _ = _blocks(fn, 5, replays=False, args=extra)
    assert all(_same(g, w) for g, w in zip(got, want))

    def short(i):
        return net.l1(x) if i >= 3 else net(x)

    got, _, _ = _blocks(short, 5, args=extra)
    want, _, _ = _blocks(short, 5, replays=False, args=extra)
    assert all(_same(g, w) for g, w in zip(got, want))


def test_gradients_are_recorded_not_replayed():
    """A gradient taken inside the block records its ops (no replay): the gradients
    are those of the blocks run op by op."""
    net, x = _net()
    vg = nn.value_and_grad(net, lambda m, x: m(x).sum())

    def fn():
        _, g = vg(net, x)
        return [a for _, a in tree_flatten(g)]

    got, _, stats = _blocks(fn, 4)
    want, _, _ = _blocks(fn, 4, replays=False)
    assert all(_same(g, w) for g, w in zip(got, want))
    assert stats["followed"] == 0


@pytest.mark.parametrize("backend", ["emulate", "cpu"])
def test_host_backends_never_replay(backend):
    net, x = _net()
    _, _, stats = _blocks(net, 4, backend=backend, args=(x,))
    assert stats == {"learned": 0, "followed": 0, "missed": 0}


def test_results_that_live_on_carry_their_low_words():
    """A followed block's result used in the next block is read with its low word
    (as op by op): chained blocks give the same words."""
    net, x = _net()
    state = {}

    def fn(i):
        y = net(x) if i == 0 else net(x) + state["y"]
        state["y"] = y
        return y

    got, _, stats = _blocks(fn, 5, args=lambda i: (i,))
    state.clear()
    want, _, _ = _blocks(fn, 5, replays=False, args=lambda i: (i,))
    assert all(_same(g, w) for g, w in zip(got, want))
    assert stats["followed"] >= 2
    assert got[4][0][1] is not None  # (a carried result)


def test_replays_hold_no_arrays_after_the_block():
    """Neither a record nor a followed replay keeps the block's arrays alive."""
    import gc
    import weakref
    net, x = _net()
    refs = []

    def fn():
        y = net(x)
        refs.append(weakref.ref(y))
        return y * 1.0

    _blocks(fn, 4)
    gc.collect()
    assert all(r() is None for r in refs)
