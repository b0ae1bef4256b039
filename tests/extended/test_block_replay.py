"""A block's ops replayed on the metal path (mlx_precise.extended.blocks), checked on
the lazy Metal stand-in. No Apple GPU here, and the stand-in's launches compute
nothing (their outputs are zeros): what is compared is what a GPU would run (the
launches of the segments' traces against those of the same block run op by op,
with the rules' own replays off so that every launch is seen), the reports, and
which arrays a result depends on (lazy inputs: evaluating a result evaluates
exactly the arrays it reads). ``python -m mlx_precise selftest --backend metal``
compares the words on a Mac (``check_block_replays``)."""

from __future__ import annotations

import collections
import contextlib
import gc
import importlib
import weakref

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map

import mlx_precise as mp
from mlx_precise.core.context import switched
from mlx_precise.extended import blocks, carry, recipes
from mlx_precise.testing import graph_counts, lazy_metal_executor


@pytest.fixture(autouse=True)
def _fresh_sites():
    blocks._sites.clear()
    yield
    blocks._sites.clear()


def _blocks(fn, calls: int, replays: bool = True, backend: str = "metal", args=(),
            launches: list | None = None, rule_replays: bool = True, strict: bool = False):
    """``fn(*args(i))`` in a block at one place in the code, ``calls`` times: the
    results, the reports and the changes of the replays' stats. ``launches``: a
    list that gets the launches of each block (a list per block)."""
    before = dict(blocks.stats)
    results, reports = [], []
    with switched((blocks, "ENABLED", replays), (recipes, "ENABLED", rule_replays)):
        for i in range(calls):
            record = []
            with (lazy_metal_executor(record) if backend == "metal"
                  else contextlib.nullcontext()):
                a = args(i) if callable(args) else args
                with mp.use_backend(backend), mp.extended_precision(strict=strict) as report:
                    results.append(fn(*a))
            reports.append(report)
            if launches is not None:
                launches.append(record)
    stats = {k: blocks.stats[k] - before.get(k, 0) for k in ("learned", "followed", "missed")}
    return results, reports, stats


def _counts(report):
    return dict(report.extended), dict(report.plain), dict(report.float32)


def _programs(launches) -> collections.Counter:
    """The kernels a list of launches runs: name, template and shapes."""
    return collections.Counter(
        (x.name, repr(sorted(x.template.items())), repr(x.output_shapes)) for x in launches)


def _evaluated(a) -> bool:
    """Whether a lazy array was evaluated (MLX detaches evaluated arrays from
    their graph)."""
    return not graph_counts(a)["by_primitive"]


def _lazy(shape, seed=0):
    """An unevaluated float32 array (a probe: evaluated only where a result reads it)."""
    return mx.array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32)) * 1


@pytest.mark.parametrize("name", ["hyena", "s4d", "fno", "logmel", "vocoder",
                                  "transformer", "llama"])
def test_models_follow_with_the_launches_and_reports_of_their_ops(name):
    """The benchmark models (small): the second block learns, the third traces and
    follows, the fourth follows. Each block reports what the same block reports op
    by op; the launches traced for the third are those of a block run op by op (the
    same kernels, programs and shapes), and the graph of each result has as many
    launches."""
    mod = importlib.import_module(f"models.{name}")
    model, x = mod.build("small", 0)
    mx.eval(model.parameters())
    traced, want_launches = [], []
    results, reports, stats = _blocks(model, 4, args=(x,), launches=traced)
    _, want_reports, _ = _blocks(model, 4, replays=False, args=(x,), launches=want_launches,
                                 rule_replays=False)
    assert stats == {"learned": 1, "followed": 2, "missed": 0}
    for k in range(4):
        assert _counts(reports[k]) == _counts(want_reports[k]), k
    assert _programs(traced[2]) == _programs(want_launches[2])
    assert traced[3] == []  # (followed: nothing built on the host)
    with lazy_metal_executor():
        graphs = []
        for on in (True, False):
            with switched((blocks, "ENABLED", on)), mp.use_backend("metal"), (
                    mp.extended_precision()):
                graphs.append(graph_counts(model(x)))
    assert graphs[0]["launches"] == graphs[1]["launches"]
    assert graphs[0]["glue"] <= graphs[1]["glue"]


class _Net(nn.Module):
    """nn.Linear's first op reads its weight (``w.T``), not the input: the input
    is first read at the second op."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def __call__(self, x, scale=0.5):
        h = nn.gelu(self.l1(x)) * scale
        return mx.exp(self.l2(h)) - 1.0


def _net(seed=0):
    mx.random.seed(seed)
    net = _Net()
    mx.eval(net.parameters())
    return net


def test_each_call_reads_its_own_inputs():
    """New inputs at each call (first read after the first op): each result reads
    its call's input, never the traced call's or the last one's."""
    net = _net()
    inputs = [_lazy((4, 8), i) for i in range(6)]
    results, reports, stats = _blocks(net, 6, args=lambda i: (inputs[i],))
    assert stats["followed"] == 4 and stats["missed"] == 0
    mx.eval(results[5])
    assert _evaluated(inputs[5]) and not any(_evaluated(x) for x in inputs[:5])
    mx.eval(results[3])
    assert _evaluated(inputs[3]) and not _evaluated(inputs[4])
    _, want, _ = _blocks(net, 6, replays=False, args=lambda i: (_lazy((4, 8), i),))
    assert [_counts(r) for r in reports] == [_counts(r) for r in want]


def test_new_parameters_are_read():
    """Parameters replaced between blocks (an optimizer's update): the result reads
    the new ones."""
    net, x = _net(), _lazy((4, 8))
    mx.eval(x)
    new = tree_map(lambda v: v * 1.5, net.parameters())

    def fn(i):
        if i == 4:
            net.update(new)
        return net(x)

    results, _, stats = _blocks(fn, 6, args=lambda i: (i,))
    mx.eval(results[4])
    assert all(_evaluated(v) for _, v in tree_flatten(new))
    assert stats["followed"] >= 3


def test_a_parameter_updated_in_place_is_read_at_its_new_value():
    """The same array object, its value replaced in place outside the blocks: the
    replay reads it as it is at the call."""
    net, x = _net(), _lazy((4, 8))
    mx.eval(x)
    probe = _lazy((4, 16), 7)

    def between(i):
        if i == 4:
            net.l2.weight[...] = probe  # (MLX's in-place update: the same Python object)
        return (x,)

    results, _, stats = _blocks(net, 6, args=between)
    assert stats["followed"] == 4 and stats["missed"] == 0
    assert not _evaluated(probe)
    mx.eval(results[5])
    assert _evaluated(probe)


def test_two_models_at_one_place_each_read_their_own_parameters():
    """A function opening blocks around whichever model it is given: each model
    follows its own record (the first op's arrays tell them apart)."""
    nets = [_net(0), _net(1)]
    params = [tree_map(lambda v: v * 1, n.parameters()) for n in nets]  # lazy aliases
    for n, p in zip(nets, params):
        n.update(p)
    x = _lazy((4, 8))
    mx.eval(x)
    results, _, stats = _blocks(lambda i: nets[i % 2](x), 8, args=lambda i: (i,))
    assert stats["missed"] == 0 and stats["followed"] >= 4
    mx.eval(results[7])  # (model 1)
    assert all(_evaluated(v) for _, v in tree_flatten(params[1]))
    assert not any(_evaluated(v) for _, v in tree_flatten(params[0]))


def test_a_carried_input_where_the_record_had_an_exact_one():
    """An input that carries a low word where the traced one was exact: its low
    word is read (the segment is traced again for it; the report is the op by op
    one)."""
    net = _net()
    with lazy_metal_executor(), mp.use_backend("metal"), mp.extended_precision():
        carried = mx.exp(_lazy((4, 8)) * 0.1)
    lo = carry.low_word(carried)
    assert lo is not None
    exact = _lazy((4, 8), 3)
    mx.eval(exact)
    pick = lambda i: (exact if i < 4 else carried,)  # noqa: E731
    results, reports, _ = _blocks(net, 6, args=pick)
    _, want, _ = _blocks(net, 6, replays=False, args=pick)
    assert [_counts(r) for r in reports] == [_counts(r) for r in want]
    assert not _evaluated(lo)
    mx.eval(results[5])
    assert _evaluated(lo)


def test_a_changed_number_is_a_miss():
    """A Python number that differs from the record (at the 5th call) ends the replay
    at that op; the op runs its rule (the report is the op by op one)."""
    net, x = _net(), _lazy((4, 8))
    scale = lambda i: 0.5 if i < 4 else 0.25  # noqa: E731
    _, reports, stats = _blocks(lambda i: net(x, scale(i)), 5, args=lambda i: (i,))
    _, want, _ = _blocks(lambda i: net(x, scale(i)), 5, replays=False, args=lambda i: (i,))
    assert stats == {"learned": 1, "followed": 2, "missed": 1}
    assert [_counts(r) for r in reports] == [_counts(r) for r in want]


def test_a_changed_integer_is_a_miss():
    """An integer argument (positional or keyword) that differs from the record:
    the op runs with it (the result has its shape)."""
    net, x = _net(), _lazy((4, 8))
    axis = lambda i: 0 if i < 4 else 1  # noqa: E731
    for fn in (lambda i: mx.sum(net(x)[:, :2], axis(i)) * 2.0,
               lambda i: mx.sum(net(x)[:, :2], axis=axis(i)) * 2.0):
        blocks._sites.clear()
        results, _, stats = _blocks(fn, 5, args=lambda i: (i,))
        assert stats == {"learned": 1, "followed": 2, "missed": 1}
        assert [r.shape for r in results] == [(2,)] * 4 + [(4,)]


@pytest.mark.parametrize("value", [-0.0, float("nan")])
def test_signed_zero_and_nan_are_told_apart(value):
    """-0.0 equals 0.0, NaN equals nothing: numbers are compared with their sign,
    and NaN as NaN (a first op that differs: no record followed, one learned)."""
    x = _lazy((4, 8))
    scale = lambda i: 0.0 if i < 4 else value  # noqa: E731
    _, _, stats = _blocks(lambda i: mx.exp(x * scale(i)) + 1.0, 5, args=lambda i: (i,))
    assert stats == {"learned": 2, "followed": 2, "missed": 0}
    blocks._sites.clear()
    _, _, stats = _blocks(lambda: mx.exp(x * value) + 1.0, 5)
    assert stats["followed"] == 3 and stats["missed"] == 0


def test_random_ops_are_never_replayed():
    """A random op reads and advances the generator's key: the record stops before
    it (the ops before it follow), and the key advances at every call."""
    net, x = _net(), _lazy((4, 8))
    mx.random.seed(0)
    keys = []

    def fn():
        y = net(x) + mx.random.normal((4, 4))
        keys.append(np.array(mx.random.state[0]))
        return y

    _, _, stats = _blocks(fn, 5)
    assert stats["followed"] == 3
    assert len({k.tobytes() for k in keys}) == 5


def test_exits_stop_the_record():
    """A value read as a Python number: the record holds the ops before; the rest
    runs as usual at every call."""
    net, x = _net(), _lazy((4, 8))

    def fn():
        y = net(x)
        return y + (y * y).sum().item()

    _, reports, stats = _blocks(fn, 5)
    _, want, _ = _blocks(fn, 5, replays=False)
    assert stats["followed"] == 3
    assert [_counts(r) for r in reports] == [_counts(r) for r in want]


def test_in_place_updates_of_the_blocks_results_are_followed():
    """``x *= c``, ``x += y``, ``x[i] = y`` of a result of the block's ops are ops of
    the record (MLX writes the result into ``x``): followed, the array holds the
    replay's result and its low word, and what reads it after reads that; of an
    array from outside the block, they stop the record."""
    net, x = _net(), _lazy((4, 8))
    probes = [_lazy((4, 4), i) for i in range(5)]

    def fn(i):
        y = net(x)
        y *= 0.5
        y += mx.exp(y) + probes[i]
        y[..., 0] = 1.0
        y[1] = y[2] * 3.0
        return y

    results, reports, stats = _blocks(fn, 5, args=lambda i: (i,))
    _, want, _ = _blocks(fn, 5, replays=False, args=lambda i: (i,))
    assert stats["followed"] == 3 and stats["missed"] == 0
    assert [_counts(r) for r in reports] == [_counts(r) for r in want]
    assert all(carry.low_word(y) is not None for y in results)
    assert not _evaluated(probes[4])
    mx.eval(results[4])  # (the array updated in place holds the update's result)
    assert _evaluated(probes[4]) and not _evaluated(probes[3])

    w = _lazy((4, 4), 3)
    mx.eval(w)

    def outside():
        y = net(x)
        w2 = w * 1  # (a result: recorded)
        w2 += y
        return w2

    _, _, stats = _blocks(outside, 5)
    assert stats["followed"] == 3

    def outside_in_place(v):
        y = net(x)
        v += y  # (an array from outside the block: the record stops here)
        return v * 2.0

    fresh = lambda i: (mx.array(np.ones((4, 4), np.float32)),)  # noqa: E731
    _, reports, stats = _blocks(outside_in_place, 5, args=fresh)
    _, want, _ = _blocks(outside_in_place, 5, replays=False, args=fresh)
    assert stats["followed"] == 3
    assert [_counts(r) for r in reports] == [_counts(r) for r in want]


def test_a_nested_block_stops_the_outer_record():
    net, x = _net(), _lazy((4, 8))

    def fn():
        y = net(x)
        with mp.extended_precision(False):
            z = y * 3
        return y + z

    _, reports, stats = _blocks(fn, 5)
    _, want, _ = _blocks(fn, 5, replays=False)
    assert stats["followed"] == 3
    assert [_counts(r) for r in reports] == [_counts(r) for r in want]


def test_blocks_longer_or_shorter_than_the_record():
    """A block that goes on past the record runs the rest as usual; one that ends
    early returns what the replay made so far."""
    net, x = _net(), _lazy((4, 8))

    def longer(i):
        y = net(x)
        return mx.sin(y) * y if i >= 4 else y

    def shorter(i):
        return net.l1(x) if i >= 4 else net(x)

    for fn in (longer, shorter):
        _, reports, _ = _blocks(fn, 6, args=lambda i: (i,))
        _, want, _ = _blocks(fn, 6, replays=False, args=lambda i: (i,))
        assert [_counts(r) for r in reports] == [_counts(r) for r in want]


def test_gradients_are_recorded_not_replayed():
    net, x = _net(), _lazy((4, 8))
    vg = nn.value_and_grad(net, lambda m, x: m(x).sum())
    _, reports, stats = _blocks(lambda: vg(net, x), 4)
    _, want, _ = _blocks(lambda: vg(net, x), 4, replays=False)
    assert stats["followed"] == 0
    assert [_counts(r) for r in reports] == [_counts(r) for r in want]


@pytest.mark.parametrize("backend", ["emulate", "cpu"])
def test_host_backends_never_replay(backend):
    net, x = _net(), _lazy((4, 8))
    _, _, stats = _blocks(net, 4, backend=backend, args=(x,))
    assert stats == {"learned": 0, "followed": 0, "missed": 0}


def test_results_carry_their_low_words_into_the_next_block():
    """A followed block's results carry their low words (a later block reads them)."""
    net, x = _net(), _lazy((4, 8))
    results, _, stats = _blocks(net, 5, args=(x,))
    assert stats["followed"] == 3
    assert all(carry.low_word(y) is not None for y in results)


def test_replays_hold_no_arrays_after_the_block():
    """Neither a record nor a followed block keeps the block's arrays alive."""
    net, x = _net(), _lazy((4, 8))
    refs = []

    def fn():
        y = net(x)
        refs.append(weakref.ref(y))
        return y * 1.0

    _blocks(fn, 5)
    gc.collect()
    assert all(r() is None for r in refs)


def test_the_selftest_check_runs_its_path():
    """``python -m mlx_precise selftest --backend metal`` compares the followed
    blocks' words with the blocks run op by op, bit for bit (on a Mac; here the
    stand-in's values are zeros, so this runs the check's path: three blocks
    followed)."""
    from mlx_precise.extended import checks

    with lazy_metal_executor():
        check = checks.check_block_replays("metal")
    assert check.passed and "5 of 5 bit-identical" in check.figure, check.figure
    assert "3 followed" in check.name


def test_decorated_functions_are_places_of_their_own():
    """A function decorated with extended_precision() is the block's place (not
    contextlib's wrapper, which every decorated function shares)."""
    net, x = _net(), _lazy((4, 8))
    before = dict(blocks.stats)

    @mp.extended_precision()
    def f():
        return net(x)

    @mp.extended_precision()
    def g():
        return net(x) * 2.0

    with lazy_metal_executor(), mp.use_backend("metal"):
        for _ in range(4):
            f()
            g()
    assert blocks.stats["followed"] - before.get("followed", 0) == 4
    assert len(blocks._sites) == 2


def test_ops_on_another_backend_inside_the_block_run_there():
    """A backend chosen inside the block (``use_backend``) for some ops: those ops
    and the rest run as usual on it (neither recorded nor served)."""
    net, x = _net(), _lazy((4, 8))

    def fn():
        y = net(x)
        with mp.use_backend("cpu"):
            z = mx.exp(y) * 2.0
        return z

    results, reports, stats = _blocks(fn, 5)
    expected, want, _ = _blocks(fn, 5, replays=False)
    assert stats["followed"] == 3
    assert [_counts(r) for r in reports] == [_counts(r) for r in want]
    got, ref = graph_counts(results[-1]), graph_counts(expected[-1])
    assert got["launches"] == ref["launches"]  # (the cpu ops: MLX's float64 ops, no kernel)
    # (cpu's exp: float64 MLX ops, its exponent bits shifted into place)
    assert got["by_primitive"].get("LeftShift") == ref["by_primitive"].get("LeftShift") == 2


def test_threads_follow_one_place_together():
    """Blocks at one place in several threads at once (each thread's block its own
    record or replay): every call's report is the op by op one, nothing raises."""
    import threading

    net = _net()
    inputs = [_lazy((4, 8), i) for i in range(4)]
    for x in inputs:
        mx.eval(x)
    _, want, _ = _blocks(net, 1, replays=False, args=(inputs[0],))
    reports, errors = [], []

    def work(x):
        try:
            for _ in range(6):
                with mp.use_backend("metal"), mp.extended_precision() as report:
                    net(x)
                reports.append(_counts(report))
        except BaseException as e:  # (reported below)
            errors.append(e)

    before = blocks.stats["followed"]
    with lazy_metal_executor():
        threads = [threading.Thread(target=work, args=(x,)) for x in inputs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    assert len(reports) == 24 and all(r == _counts(want[0]) for r in reports)
    assert blocks.stats["followed"] - before >= 12


def test_a_place_that_keeps_missing_learns_again_only_now_and_then():
    """A block whose ops differ at every call (a number changes): after
    blocks.MISSES dropped records its place learns only every blocks.RETRY blocks
    (the per-op path, without the recording's cost, in between)."""
    net, x = _net(), _lazy((4, 8))
    calls = blocks.RETRY + 6
    _, reports, stats = _blocks(lambda i: net(x, float(i)), calls, args=lambda i: (i,))
    _, want, _ = _blocks(lambda i: net(x, float(i)), calls, replays=False,
                         args=lambda i: (i,))
    assert stats == {"learned": blocks.MISSES + 1, "followed": 0,
                     "missed": blocks.MISSES + 1}
    assert [_counts(r) for r in reports] == [_counts(r) for r in want]


def test_a_recording_block_holds_no_input_it_read():
    """A block that records (here its inputs made and dropped in a loop inside it)
    keeps none of the arrays it read alive."""
    net = _net()
    refs = []

    def fn():
        for i in range(4):
            x = _lazy((4, 8), i)
            refs.append(weakref.ref(x))
            net(x)
            del x
        gc.collect()
        return [r() is None for r in refs[-4:]]

    results, _, stats = _blocks(fn, 2)
    assert stats["learned"] == 1
    assert all(results[1])  # (the second block: recording)


def test_a_value_leaving_double_word_ends_the_record_before_it():
    """An op that consumes a carried value in float32 (reported: ``to_fp8`` has no
    double-word rule) ends the record before it: the ops before it follow at every
    call, it and the rest run as usual and are reported as op by op."""
    net, x = _net(), _lazy((4, 8))

    def consuming():
        y = net(x)
        return mx.to_fp8(y), y * 2.0

    _, reports, stats = _blocks(consuming, 5)
    _, want, _ = _blocks(consuming, 5, replays=False)
    assert [_counts(r) for r in reports] == [_counts(r) for r in want]
    assert want[-1].float32 == {"to_fp8": 1}
    assert stats == {"learned": 1, "followed": 3, "missed": 0}


def test_a_trace_that_fails_is_dropped_as_a_miss(monkeypatch):
    """A segment whose trace fails (here it raises) is a miss: the record is
    dropped, the block runs op by op, and the place backs off after blocks.MISSES
    of them (no trace tried again at every block)."""
    net, x = _net(), _lazy((4, 8))

    def failing(self, *values):
        raise ValueError("no trace here")

    monkeypatch.setattr(blocks._Traced, "_trace", failing)
    _, reports, stats = _blocks(net, 12, args=(x,))
    _, want, _ = _blocks(net, 12, replays=False, args=(x,))
    assert [_counts(r) for r in reports] == [_counts(r) for r in want]
    assert stats == {"learned": blocks.MISSES, "followed": 0, "missed": blocks.MISSES}


def test_strict_blocks_follow_and_still_raise_where_a_value_leaves():
    """In strict blocks a followed record raises nothing it would not raise op by
    op, and a value leaving double-word after the record still raises at every
    call."""
    net, x = _net(), _lazy((4, 8))
    _, reports, stats = _blocks(net, 5, args=(x,), strict=True)
    assert stats["followed"] == 3
    assert all(r.float32 == {} and r.extended for r in reports)

    calls = []

    def leaving():
        y = net(x)
        calls.append(1)
        return mx.to_fp8(y)

    blocks._sites.clear()
    before = blocks.stats["followed"]
    for _ in range(5):
        with pytest.raises(mp.extended.PrecisionDropError, match="to_fp8"):
            _blocks(leaving, 1, strict=True)
    assert len(calls) == 5 and blocks.stats["followed"] - before == 3
