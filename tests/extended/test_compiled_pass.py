"""The float64 backward pass replayed as one compiled MLX function (cpu backend): a
tape whose structure was seen before gives the gradients of the op-by-op pass bit for
bit, reads each call's own values (arrays and indices), and a tape that cannot be
traced (an op without a double-word VJP) still runs op by op and is reported on every
call. Oracles: numpy float64 (exact sums here) and the float64 gradients of
benchmarks/training_oracle.py."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

import bench_training as bt
import mlx_precise as mp
from mlx_precise.extended import PrecisionDropError, autodiff, recipes
from flow_helpers import rng_f32


def carried(a) -> np.ndarray:
    """The float64 value an array carries (read inside a cpu block)."""
    return np.array(a.astype(mx.float64))


@pytest.fixture
def traces(monkeypatch):
    """The number of times a float64 pass was traced for compiling, and a clean
    memory of structures (a structure another test compiled is not reused)."""
    monkeypatch.setattr(autodiff, "_passes", recipes.Sightings(seen_max=256, made_max=64))
    count = [0]
    trace = autodiff._Pass._trace

    def counted(self, *values):
        count[0] += 1
        return trace(self, *values)

    monkeypatch.setattr(autodiff._Pass, "_trace", counted)
    return count


@pytest.mark.parametrize("case", ["arith chain", "exp", "log", "tanh", "erf", "matmul",
                                  "conv1d", "layer_norm", "softmax", "attention", "cumsum",
                                  "param used n times", "MLP (GELU, LayerNorm)"])
def test_replayed_pass_is_the_op_by_op_pass(case, traces, monkeypatch):
    """Calls of the same gradient: op by op, then seen, traced, replayed; the
    carried gradients are the same bits each time, and within 1/100 of the floor
    of the float64 oracle."""
    spec = bt.GRAD_CASES[case]
    inputs = bt.case_inputs(case, 40)
    ref = bt.flat(spec.grad(inputs), spec.wrt)
    got = []
    for compiled in (False, *[True] * (autodiff.COMPILE_AT + 1)):
        monkeypatch.setattr(autodiff, "COMPILED_PASS", compiled)
        run = bt.MLX_CASES[case]({k: mx.array(v) for k, v in inputs.items()}, spec.wrt)
        with mp.use_backend("cpu"), mp.extended_precision() as rep:
            g = run()
            got.append(bt.flat({k: carried(g[k]) for k in spec.wrt}, spec.wrt))
        assert not rep.float32, rep.float32
    assert traces[0] == 1
    for g in got[1:]:
        np.testing.assert_array_equal(g, got[0])
    assert bt.normwise(got[0], ref) <= bt.floor(ref) / 100


def test_replay_reads_each_calls_arrays_and_indices(traces):
    """d/dx sum(x[i]^2) with other x and other indices at every call (a repeated
    index sums its two terms): 2 x[i] summed, exact in float64."""
    for step in range(autodiff.COMPILE_AT + 2):
        x = rng_f32(8, step)
        idx = np.array([step % 8, (3 * step + 1) % 8, step % 8], np.int32)
        with mp.use_backend("cpu"), mp.extended_precision():
            g = carried(mx.grad(lambda t: (t[mx.array(idx)] ** 2).sum())(mx.array(x)))
        want = np.zeros(8)
        np.add.at(want, idx, 2 * x[idx].astype(np.float64))
        np.testing.assert_array_equal(g, want)
    assert traces[0] == 1


def test_a_changed_constant_is_another_structure(traces):
    """d/dx sum(x * c) = c: a Python constant of the tape that changes at every call
    is part of its structure (nothing is compiled with the old one); -0.0 keeps its
    sign (a tape with it is not compiled: MLX's compiled kernels write it as 0)."""
    x = mx.array(rng_f32(6, 1))
    for c in (1.5, 2.5) + (0.5, -0.0, 0.0) * (autodiff.COMPILE_AT + 1):
        with mp.use_backend("cpu"), mp.extended_precision():
            g = carried(mx.grad(lambda t: (t * c).sum())(x))
        np.testing.assert_array_equal(g, np.full(6, c))
        assert np.signbit(g[0]) == np.signbit(c)
    assert traces[0] == 2  # 0.5 and 0.0, each replayed


def test_the_seed_itself_as_the_gradient(traces):
    """mx.grad of the identity: the cotangent is the seed, an input of the compiled
    function returned as it is."""
    for v in range(autodiff.COMPILE_AT + 2):
        with mp.use_backend("cpu"), mp.extended_precision():
            assert float(mx.grad(lambda t: t)(mx.array(float(v)))) == 1.0
    assert traces[0] == 1


def test_a_pass_that_cannot_be_traced_is_reported_at_every_call(traces):
    """An op without a double-word VJP (minmax: MLX's float32 VJP): each call's block
    reports it, and strict raises after them as at the first."""
    x = mx.array(rng_f32(8, 3))
    f = (lambda a: mx.minmax(a * 3.0)[1] * 2.0)
    for _ in range(autodiff.COMPILE_AT + 2):
        with mp.use_backend("cpu"), mp.extended_precision() as rep:
            g = mx.grad(f)(x)
        assert rep.float32["minmax (gradient)"] == 1
        np.testing.assert_array_equal(np.array(g), np.array(mx.grad(f)(x)))
    with pytest.raises(PrecisionDropError):
        with mp.use_backend("cpu"), mp.extended_precision(strict=True):
            mx.grad(f)(x)


@pytest.mark.parametrize("name", ["sgd-momentum", "adam"])
def test_training_steps_replay_bit_for_bit(name, traces, monkeypatch):
    """COMPILE_AT + 4 steps of the benchmark MLP, each in its block: the parameters (their
    carried float64 values) are the same bits with the pass compiled and op by op."""
    _, p0 = bt.initial_model(0)
    x, y = (mx.array(a) for a in bt.oracle.mlp_data(bt.MLP_SIZES["samples"],
                                                      bt.MLP_SIZES["d_in"],
                                                      bt.MLP_SIZES["d_out"]))
    out = []
    for compiled in (False, True):
        monkeypatch.setattr(autodiff, "COMPILED_PASS", compiled)
        model, opt = bt.model_from(p0), bt.mlx_optimizer(name)
        loss_and_grad = nn.value_and_grad(model, bt.mse)
        for _ in range(autodiff.COMPILE_AT + 4):
            with mp.use_backend("cpu"), mp.extended_precision():
                _, g = loss_and_grad(model, x, y)
                opt.update(model, g)
                mx.eval(model.parameters(), opt.state)
        with mp.use_backend("cpu"), mp.extended_precision():
            out.append({k: carried(v) for k, v in tree_flatten(model.parameters())})
    assert traces[0] == 1
    for k, v in out[0].items():
        np.testing.assert_array_equal(out[1][k], v, err_msg=k)


def test_compiled_passes_are_bounded(traces, monkeypatch):
    """Past the table's bound the oldest compiled pass is dropped; each gradient
    is still d/dx sum(x^2) = 2x (exact)."""
    monkeypatch.setattr(autodiff, "COMPILE_AT", 1)
    monkeypatch.setattr(autodiff._passes, "made_max", 2)
    for n in range(1, 6):
        x = rng_f32(n, n)
        with mp.use_backend("cpu"), mp.extended_precision():
            g = carried(mx.grad(lambda t: (t * t).sum())(mx.array(x)))
        np.testing.assert_array_equal(g, 2 * x.astype(np.float64))
    assert len(autodiff._passes.made) == 2 and traces[0] == 5
