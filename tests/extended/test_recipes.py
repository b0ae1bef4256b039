"""A composite rule's graph replayed by mx.compile on the metal path
(mlx_precise.extended.recipes), checked on the lazy Metal stand-in (no Apple GPU
here: the graphs are compared, not values):

- the structure's key is complete: calls whose keys are equal build the same graph
  when the form runs (the same primitives, wired the same way, the same launches
  with the same templates and programs), over operands in every state the block
  records (exact, a fused result, a GEMM's packed output, moved packed words, a
  single value, broadcast leaves, one array passed twice);
- a replay builds the graph the form builds (MLX's compile fuses the form's
  elementwise glue into its own kernels: those are compared by the other nodes);
- what cannot be keyed runs the form; emulate and cpu never replay.
"""

from __future__ import annotations

import re

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.doubleword import fusion
from mlx_precise.extended import blocks, carry, recipes
from mlx_precise.testing import graph_counts, graph_text, lazy_metal_executor


@pytest.fixture(autouse=True)
def _no_block_replays(monkeypatch):
    """The rules' replays on their own: a block followed as a whole
    (mlx_precise.extended.blocks) runs no rule; a table of replays of its own for
    each test (the process's is bounded: full after other tests, it would count no
    new replay)."""
    monkeypatch.setattr(blocks, "ENABLED", False)
    monkeypatch.setattr(recipes, "_recipes", recipes.Sightings(seen_max=1024, made_max=256))


def _rand(shape, seed):
    return mx.array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _operands(seed):
    """Arrays made outside the block (exact float32 values)."""
    return {"A": _rand((2, 8, 32), seed), "B": _rand((2, 8, 32), seed + 100),
            "C": _rand((16, 32), seed + 200), "W": _rand((32, 32), seed + 300),
            "w": _rand((32,), seed + 400), "b": _rand((32,), seed + 500),
            "Q": _rand((1, 4, 8, 16), seed + 600), "K": _rand((1, 2, 8, 16), seed + 700),
            "V": _rand((1, 2, 8, 16), seed + 800), "M": _rand((8, 8), seed + 900),
            "D": _rand((32, 5, 1), seed + 1200), "E": _rand((16, 3, 32), seed + 1300),
            "G": _rand((16, 3, 8), seed + 1400), "T": _rand((8, 4, 32), seed + 1500)}


# Operands of one shape, (2, 8, 32), in the states a block records.
STATES = {
    "exact": lambda r: r["A"],
    "sum": lambda r: r["A"] + r["B"],
    "scaled": lambda r: r["A"] * 2.5,
    "function": lambda r: mx.exp(r["A"]),
    "broadcast sum": lambda r: r["A"] + r["w"],
    "gemm": lambda r: r["A"] @ r["W"],
    "moved gemm": lambda r: (r["C"] @ r["W"]).reshape(2, 8, 32),
    "swapped gemm": lambda r: (r["A"].swapaxes(0, 1) @ r["W"]).swapaxes(0, 1),
    "sum of a sum": lambda r: (r["A"] + r["B"]) * r["B"],
    "transposed sum": lambda r: (r["A"].swapaxes(1, 2) + 1.0).swapaxes(1, 2),
    "transposed gemm": lambda r: (r["A"] @ r["W"]).swapaxes(1, 2).reshape(2, 32, 8).swapaxes(1, 2),
}

# Ops on an operand x of STATES (and r's arrays), keyword arguments included.
OPS = {
    "layer_norm": lambda x, r: mx.fast.layer_norm(x, r["w"], r["b"], 1e-5),
    "layer_norm without affine": lambda x, r: mx.fast.layer_norm(x, None, None, 1e-6),
    "layer_norm of x by x": lambda x, r: mx.fast.layer_norm(x, x[0, 0], None, 1e-5),
    "rms_norm": lambda x, r: mx.fast.rms_norm(x, r["w"], 1e-5),
    "matmul": lambda x, r: x @ r["W"],
    "matmul by a transpose": lambda x, r: x @ r["W"].T,
    "matmul of a transpose": lambda x, r: x.swapaxes(1, 2) @ x,
    "addmm": lambda x, r: mx.addmm(r["b"], x, r["W"].T),
    "complex matmul": lambda x, r: (x + 1j * r["B"]) @ (r["W"] * (0.5 - 1j)),
    "conv1d": lambda x, r: mx.conv1d(x, r["E"], padding=1),
    "conv1d, strided, dilated, grouped": lambda x, r: mx.conv1d(
        x * x, r["G"], stride=2, padding=3, dilation=3, groups=4),
    "conv_transpose1d": lambda x, r: mx.conv_transpose1d(x, r["T"], stride=2, padding=1),
    "depthwise conv1d": lambda x, r: mx.conv1d(x, r["D"], padding=2, groups=32),
    "depthwise conv1d, dilated": lambda x, r: mx.conv1d(x * x, r["D"], padding=4,
                                                        dilation=2, groups=32),
    "complex slice": lambda x, r: (x + 1j * r["B"])[:, 2:6, ::2] * 2.0,
    "complex reshape, transpose": lambda x, r: (x * (1 - 1j)).reshape(2, 16, 16).transpose(
        0, 2, 1),
    "einsum": lambda x, r: mx.einsum("bij,jk->bik", x, r["W"]),
    "complex einsum": lambda x, r: mx.einsum("bij,kj->bki", x + 1j * r["B"], r["W"] * (1 - 1j)),
    "complex quotient": lambda x, r: (x + 1j * r["B"]) / (r["A"] - 2j * x),
    "complex exp": lambda x, r: mx.exp(x * 0.125 + 1j * r["B"]),
    "complex product": lambda x, r: (x + 1j * r["B"]) * (r["A"] - 0.5j),
    "complex square": lambda x, r: (x * (1 + 2j)) * (x * (1 + 2j)) + (3 - 1j),
    "transform product": lambda x, r: mx.fft.irfft(mx.fft.rfft(x) * mx.fft.rfft(r["B"]), n=32),
    "softmax": lambda x, r: mx.softmax(x, axis=-1),
    "softmax of two axes": lambda x, r: mx.softmax(x, axis=(1, 2)),
    "logsumexp": lambda x, r: mx.logsumexp(x, axis=-1),
    "logsumexp kept": lambda x, r: mx.logsumexp(x, axis=1, keepdims=True),
    "rope": lambda x, r: mx.fast.rope(x, 32, traditional=False, base=10000.0, scale=1.0,
                                      offset=3),
    "rope traditional, part": lambda x, r: mx.fast.rope(x, 16, traditional=True, base=500.0,
                                                        scale=0.5, offset=0),
    "rope, array offset": lambda x, r: mx.fast.rope(x, 32, traditional=False, base=10000.0,
                                                    scale=1.0, offset=mx.array(2)),
    "attention": lambda x, r: mx.fast.scaled_dot_product_attention(
        x[None], x[None], x[None], scale=0.125),
    "attention, causal": lambda x, r: mx.fast.scaled_dot_product_attention(
        x[None], r["B"][None], x[None], scale=0.125, mask="causal"),
    "attention, grouped heads, masks": lambda x, r: mx.fast.scaled_dot_product_attention(
        r["Q"] * 1.5, r["K"] + x[0, :, :16], r["V"], scale=0.25, mask=r["M"] > 0),
    "attention, additive mask": lambda x, r: mx.fast.scaled_dot_product_attention(
        r["Q"], r["K"], r["V"] * x[0, :, :16], scale=0.25, mask=r["M"]),
}

# Ops whose form has no elementwise glue: a replay's graph is the form's, node for node
# (elsewhere a replay may also hold two arrays of a constant where the form held one).
NO_GLUE = ("layer_norm", "layer_norm without affine", "layer_norm of x by x", "rms_norm",
           "matmul", "matmul by a transpose", "matmul of a transpose", "addmm",
           "rope", "rope traditional, part")


def _canonical(*outs) -> str:
    """MLX's graph of ``outs`` as DOT text with node names replaced by their order of
    first appearance: two graphs built alike give the same text."""
    names: dict = {}
    return re.sub(r'\b\d{6,}\b|"[A-Z]+"',
                  lambda m: names.setdefault(m.group(0), f"n{len(names)}"), graph_text(*outs))


def _launches(record) -> list:
    """What each launch ran: kernel, template, output shapes, input shapes and dtypes,
    and its int32 inputs' values (programs, layouts, parameters)."""
    return [(k.name, sorted(k.template.items()), [tuple(s) for s in k.output_shapes],
             [(tuple(a.shape), a.dtype) for a in k.inputs],
             [np.array(a).tolist() for a in k.inputs if a.dtype == mx.int32])
            for k in record if k.name != "eft_selftest"]


def _run(op, state, seed, record=None, keys=None):
    """One strict block on the lazy metal path (nothing may leave double-word): the
    op on an operand in ``state``; the canonical graph of the result and its low
    word, and whether its packed words are recorded."""
    r = _operands(seed)
    with lazy_metal_executor(record):
        with mp.use_backend("metal"), mp.extended_precision(strict=True) as report:
            x = STATES[state](r)
            lo = carry.low_word(x)
            e, z = fusion.state_of(x, lo)[:2]
            # (the operand's own graph evaluated: what the op adds is compared)
            mx.eval([a for a in (x, lo, z, *(e.leaves if e else ())) if a is not None])
            for kept in (record, keys):  # (the op's launches and keys only)
                if kept is not None:
                    del kept[:]
            y = OPS[op](x, r)
            lo = carry.low_word(y)
            packed = lo is not None and fusion.packed(y, lo) is not None
            assert report.extended and not report.float32, report
            return _canonical(y, *([] if lo is None else [lo])), packed, graph_counts(
                y, *([] if lo is None else [lo]))


@pytest.fixture
def spy(monkeypatch):
    """The forms run at every call (nothing is traced) and the key of each call is
    kept: ``spy`` lists them."""
    keys: list = []
    structure = recipes._structure

    def kept(args, kw, report):
        found = structure(args, kw, report)
        keys.append(found[0])
        return found

    monkeypatch.setattr(recipes, "_structure", kept)
    monkeypatch.setattr(recipes, "REPLAY_AT", 10**9)
    return keys


@pytest.mark.parametrize("op", list(OPS))
def test_equal_keys_build_equal_graphs(op, spy):
    """Over every operand state and two sets of values, the calls whose keys are
    equal built the same graph and the same launches (a key that missed a state
    would replay one state's graph on another's operands)."""
    seen: dict = {}
    for state in STATES:
        for seed in (0, 1):
            record: list = []
            graph = _run(op, state, seed, record, spy)[:2]
            assert spy, "the op's form was not reached through its recipe"
            found = (graph, _launches(record))
            # (the keys of the op's replayable steps: equal, the same graph)
            seen.setdefault(tuple(spy), []).append((state, found))
    for key, runs in seen.items():
        first = runs[0][1]
        for state, found in runs[1:]:
            assert found == first, (op, runs[0][0], state)
    assert len(seen) >= 2  # (at least exact and carried operands told apart)


@pytest.mark.parametrize("op", list(OPS))
def test_replay_builds_the_forms_graph(op, monkeypatch):
    """The third call of a structure replays its trace: the same graph as the form
    builds (node for node where the form has no elementwise glue; elsewhere the same
    launches and other nodes, MLX's compile having fused the glue), the result's
    low word and packed words recorded as the form records them."""
    monkeypatch.setattr(recipes, "ENABLED", False)
    direct = _run(op, "sum", 0)
    monkeypatch.setattr(recipes, "ENABLED", True)
    before = len(recipes._recipes.made)
    runs = [_run(op, "sum", seed) for seed in (1, 2, 3)]
    made = list(recipes._recipes.made.values())[before:]
    assert made and all(m is not None for m in made)
    graph, packed, counts = runs[-1]
    assert packed == direct[1]
    assert counts["launches"] == direct[2]["launches"]
    if op in NO_GLUE:
        assert graph == direct[0]
    else:
        def kept(c):
            return {k: n for k, n in c["by_primitive"].items()
                    if k in ("Depends", "Slice", "Max", "Concatenate", "Reshape",
                             "Transpose", "ExpandDims")}
        assert kept(counts) == kept(direct[2])
        assert counts["glue"] <= direct[2]["glue"]


def _count_recipes(fn, backend="metal", calls=3):
    before = len(recipes._recipes.made)
    r = _operands(0)
    with lazy_metal_executor():
        for _ in range(calls):
            with mp.use_backend(backend), mp.extended_precision():
                fn(r)
    return len(recipes._recipes.made) - before


def test_what_cannot_be_keyed_runs_the_form():
    """A -0.0 argument (equal to 0.0, but another value): no trace."""
    assert _count_recipes(lambda r: mx.fast.rms_norm(r["A"] + r["B"], r["w"], -0.0)) == 0
    assert _count_recipes(lambda r: mx.fast.rms_norm(r["A"] + r["B"], r["w"], 0.0)) == 1


def test_a_structure_seen_once_is_not_traced():
    assert _count_recipes(lambda r: mx.fast.rms_norm(r["A"] * r["B"], r["w"], 1e-4),
                          calls=1) == 0


@pytest.mark.parametrize("backend", ["emulate", "cpu"])
def test_host_backends_never_replay(backend):
    """emulate's and cpu's kernels run on the host: their rules run at every call."""
    r = _operands(0)
    before = len(recipes._recipes.made)
    for _ in range(3):
        with mp.use_backend(backend), mp.extended_precision():
            mx.eval(mx.fast.layer_norm(r["A"] + r["B"], r["w"], r["b"], 1e-5))
    assert len(recipes._recipes.made) == before


def test_a_compiled_block_traces_the_form(monkeypatch):
    """Inside a function mx.compile traces, the forms run as they are (traced with
    it): the compiled graph is the same as with replays off."""
    r = _operands(0)

    def forward(x):
        with mp.use_backend("metal"), mp.extended_precision():
            return mx.fast.rms_norm(mx.softmax(x * 2.0, axis=-1), r["w"], 1e-5)

    counts = {}
    for on in (False, True):
        monkeypatch.setattr(recipes, "ENABLED", on)
        with lazy_metal_executor():
            for _ in range(3):
                forward(r["A"])  # (replays made where on)
            fn = mx.compile(forward)
            mx.eval(fn(r["A"]))
            counts[on] = _canonical(fn(r["A"]))
    assert counts[True] == counts[False]


def test_the_selftest_check_runs_its_path(lazy_metal):
    """``python -m mlx_precise selftest --backend metal`` compares each replayed
    composite rule with the rule run op by op, bit for bit (on a Mac; here the
    stand-in's values are zeros, so this runs the check's path only)."""
    from mlx_precise.extended import checks

    before = len(recipes._recipes.made)
    check = checks.check_replays("metal")
    assert check.passed and "10 of 10" in check.figure
    assert len(recipes._recipes.made) > before


def test_an_unsafe_kernel_folder_runs_the_forms(monkeypatch):
    """On the CPU (the lazy stand-in) MLX's compiled glue is loaded from its kernel
    folder: where that is not private, nothing is traced or replayed."""
    from mlx_precise.core import jit

    with monkeypatch.context() as m:
        m.setattr(jit, "folder_is_private", lambda: False)
        assert _count_recipes(lambda r: mx.fast.rms_norm(r["A"] - r["B"], r["w"], 2e-4)) == 0
    assert _count_recipes(lambda r: mx.fast.rms_norm(r["A"] - r["B"], r["w"], 2e-4)) == 1


def test_replays_are_bounded(monkeypatch):
    """Past the table's bound the oldest replay is dropped (and traced again when
    its structure comes back): the table stays bounded, the graphs the same."""
    monkeypatch.setattr(recipes._recipes, "made_max", 2)
    monkeypatch.setattr(recipes._recipes, "made", {})
    eps = (1e-5, 2e-5, 3e-5, 4e-5)
    graphs = {}
    for _ in range(2):
        for e in eps:
            graphs.setdefault(e, set()).add(_run_rms(e))
            assert len(recipes._recipes.made) <= 3
    assert all(len(g) == 1 for g in graphs.values())


def _run_rms(eps):
    r = _operands(0)
    with lazy_metal_executor():
        for _ in range(3):
            with mp.use_backend("metal"), mp.extended_precision():
                y = mx.fast.rms_norm(r["A"] + r["B"], r["w"], eps)
                out = _canonical(y, carry.low_word(y))
    return out
