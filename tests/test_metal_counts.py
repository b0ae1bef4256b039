"""The Metal-path counts of the benchmarks (lazy stand-in for the kernels; no Apple
GPU here): what a launch reads and writes, and the training step's Metal section of
benchmarks/bench_training.py."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

import bench_models as bm
import bench_training as bt
import mlx_precise as mp
from mlx_precise.testing import graph_counts, lazy_metal_executor


def test_launch_bytes_count_each_array_once():
    """x * y of two (100,) float32 arrays is one dw_fused launch (dw_fused4: two
    leaves): it reads x, y and its program (the slots it does not use repeat x) and
    writes two (100,) words."""
    x, y = mx.arange(100, dtype=mx.float32), mx.ones((100,), mx.float32)
    record: list = []
    with lazy_metal_executor(record):
        with mp.use_backend("metal"), mp.extended_precision():
            z = x * y
        mx.eval(z)
    (launch,) = [k for k in record if k.name != "eft_selftest"]
    prog = launch.inputs[-1]
    assert launch.name == "dw_fused4" and prog.dtype == mx.int32
    assert len(launch.inputs) == 5  # the four slots and the program
    assert launch.nbytes() == 400 + 400 + prog.nbytes + 2 * 400


# The graph one call of each model's compiled forward replays on the metal path
# (benchmarks/bench_models.py, size "large"; the lazy stand-in: one node per launch),
# views included, and the outputs of its nodes beyond their first: a compiled call's
# host cost grows with both (a node of two outputs costs MLX's replay about three
# views more than a node of one). Counts are deterministic: a change that adds glue
# between the kernels fails here, not only in a timing.
COMPILED_NODES = {"hyena": (82, 2), "s4d": (74, 2), "fno": (94, 0),
                  "logmel": (385, 0), "vocoder": (18, 0), "transformer": (44, 2),
                  "llama": (99, 0)}


@pytest.mark.parametrize("name", sorted(COMPILED_NODES))
def test_compiled_forward_graph_nodes(name):
    """At most the nodes and extra outputs counted since the double-word kernels
    write packed words (one output each; the halves are a slice each, read only
    where an MLX op reads a word, and the next of these kernels reads the packed
    output itself, also through the model's views of a carried value that leave the
    packed words' first axis whole): vocoder, FNO, log-mel and llama have no node of
    several outputs left (the others: the model's own split of a carried value, one
    split of its packed words, and S4D's complex division, its packed words and
    its special-value flags).
    No ``CustomTransforms`` node is left (the FFTs and complex products stopped
    wrapping themselves in a custom function outside MLX's autodiff), and the
    launches are the flow's."""
    g = bm.compiled_graph(name)
    nodes, extra = COMPILED_NODES[name]
    assert g["nodes"] <= nodes and g["extra_outputs"] <= extra, g["by_primitive"]
    assert g["by_primitive"].get("CustomTransforms", 0) == 0, g["by_primitive"]
    assert g["launches"] >= 10


def test_training_step_metal_section():
    """The compiled step replays without Python; the uncompiled step launches the
    double-word kernels (at least one per parameter update) and moves bytes."""
    g = bt.metal_step("sgd-momentum", rounds=1, calls=2)
    assert g["replays"] is True
    n_params = 4  # l1, l2 weight and bias; LayerNorm's weight and bias make 6
    assert g["launches"] >= n_params and g["bytes"] > 0
    assert g["plain_ops"] > 0 and g["build"] > 0 and g["compiled"] > 0


def test_compiled_adam_step_reads_its_scalars_in_place():
    """The graph one call of the MLP's compiled Adam step replays on the metal path
    (parameters, gradients and state in double-word): at most 141 nodes (151 while
    the step's scalars, the bias corrections and step sizes, were sliced, reshaped
    and broadcast to every update that reads them: each is now read at element 0 of
    the 8 copies its kernel wrote, or through one 8-element view)."""
    from mlx.utils import tree_flatten

    _, p0 = bt.initial_model(0)
    x, y = (mx.array(a) for a in bt.oracle.mlp_data(
        bt.MLP_SIZES["samples"], bt.MLP_SIZES["d_in"], bt.MLP_SIZES["d_out"]))
    with lazy_metal_executor():
        model, opt = bt.model_from(p0), bt.mlx_optimizer("adam")
        opt.init(model.trainable_parameters())
        step = bt._compiled_step(model, opt, "metal")
        for _ in range(2):
            mx.eval(step(x, y), model.parameters(), opt.state)
        loss = step(x, y)
        leaves = [loss] + [v for _, v in tree_flatten([model.parameters(), opt.state])
                           if isinstance(v, mx.array)]
        leaves += [lo for lo in map(mp.extended.low_word, leaves) if lo is not None]
        g = graph_counts(*leaves)
    nodes = sum(g["by_primitive"].values())
    assert nodes <= 141 and g["extra_outputs"] == 0, g["by_primitive"]


@pytest.mark.parametrize("v", [1 / 3 + 2j / 3, complex(math.inf, 1 / 3), complex(-0.0, 1e300)])
def test_complex_constant_words_are_data(v):
    """A Python complex in a block is two words per part: hi = RN32(part), lo =
    RN32(part - hi) (0 where hi is not finite), as numpy splits them; the words
    are data (no graph nodes), so a product with it launches alone."""
    from mlx_precise.extended import arith

    with mp.extended_precision():
        w = arith.constant(v)
    for part, hi, lo in ((v.real, np.array(w.hi).real, np.array(w.lo).real),
                         (v.imag, np.array(w.hi).imag, np.array(w.lo).imag)):
        with np.errstate(over="ignore"):
            want_hi = np.float32(part)
        want_lo = np.float32(part - float(want_hi)) if np.isfinite(want_hi) else 0.0
        assert np.float32(hi).tobytes() == want_hi.tobytes()
        assert np.float32(lo).tobytes() == np.float32(want_lo).tobytes()
    x = mx.ones((4, 8), mx.float32)
    mx.eval(x)
    with lazy_metal_executor():
        with mp.use_backend("metal"), mp.extended_precision():
            y = 2j / 3 * x
        g = graph_counts(y)
    assert g["launches"] == 1 and g["glue"] == 0


@pytest.mark.parametrize("a_shape, b_shape", [((5, 7), (7, 3)), ((2, 4, 6), (6, 3)),
                                              ((3, 1, 4, 8), (2, 8, 5))])
def test_gemm_instruction_count(a_shape, b_shape):
    """bench_models' FP-instruction model of one dw_gemm launch reads M, N, K and
    the batch from the parameter buffer by the layout's names: batch x M x N x
    (21 K + 10), counted here from the shapes alone."""
    import bench_models

    a, b = mx.ones(a_shape, mx.float32), mx.ones(b_shape, mx.float32)
    record: list = []
    with lazy_metal_executor(record):
        with mp.use_backend("metal"), mp.extended_precision():
            c = (a * 1.5) @ (b * 1.5)
        mx.eval(c)
    (k,) = [k for k in record if k.name.startswith("dw_gemm")]
    M, K, N = a_shape[-2], a_shape[-1], b_shape[-1]
    batch = math.prod(c.shape[:-2])
    want = batch * M * N * (21 * K + 10)
    assert bench_models.fp_instructions(k.name, k.template, k.inputs, k.output_shapes) == want


@pytest.mark.parametrize("bad", [(), ([1, 2],), (mx.ones(3), 2.0)])
def test_graph_helpers_refuse_what_is_not_an_array(bad):
    """graph_text / graph_counts of nothing, a list or a number: a clear TypeError
    (an empty graph would count as zero launches)."""
    from mlx_precise.testing import graph_text

    for helper in (graph_text, graph_counts):
        with pytest.raises(TypeError, match="one mx.array or more"):
            helper(*bad)
