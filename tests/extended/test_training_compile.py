"""mx.compile and the block in training: a compiled training step that takes and
returns the model's and optimizer's state keeps their low words across calls and
follows the uncompiled trajectory. Oracles: the uncompiled calls (themselves tested
against float64 elsewhere). Every op under mx.compile: test_compiled_ops_*.py."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

import bench_training as bt
from flow_helpers import rng_f32
import mlx_precise as mp
import training_oracle as oracle
from mlx_precise import TransformUnsupportedError
from mlx_precise.core.plain import plain
from mlx_precise.extended import low_word
from mlx_precise.extended.carry import wide_value


def test_stack_of_one_array_iterates_it():
    """``mx.stack(x)`` of an array (MLX iterates it) once x carries a low word, as
    ``mx.real`` of a float32 array leaves it (found by the sweep of compile_sweep)."""
    x = mx.array(rng_f32((3, 4)))
    with mp.extended_precision():
        mx.real(x)
        y = x / 3
        assert mx.stack(x).shape == (3, 4) and mx.stack(y).shape == (3, 4)
    np.testing.assert_array_equal(np.array(mx.stack(y)), np.array(y))


# ---- training steps --------------------------------------------------------------------


def _trainer(optimizer="adam"):
    _, p0 = bt.initial_model(0)
    model, opt = bt.model_from(p0), bt.mlx_optimizer(optimizer)
    opt.init(model.trainable_parameters())
    return model, opt, nn.value_and_grad(model, bt.mse)


def _block_step(model, opt, loss_and_grad, backend: str, ran: list | None = None):
    """A training step that opens the block on ``backend`` (``ran`` gets one entry
    per run of its Python)."""

    def step(x, y):
        if ran is not None:
            ran.append(1)
        with mp.use_backend(backend), mp.extended_precision():
            loss, grads = loss_and_grad(model, x, y)
            opt.update(model, grads)
        return loss

    return step


def _data():
    s = oracle.MLP_SIZES
    x, y = oracle.mlp_data(s["samples"], s["d_in"], s["d_out"])
    return mx.array(x), mx.array(y)


def _carried(tree):
    """Each float32 array's carried value in float64 (read inside a block)."""
    with mp.use_backend("cpu"), mp.extended_precision():
        return {k: np.array(v.astype(mx.float64)) for k, v in tree_flatten(tree)
                if isinstance(v, mx.array) and v.dtype == mx.float32}


def _train(compiled: bool, steps: int, block_outside: bool = False):
    model, opt, loss_and_grad = _trainer()
    x, y = _data()
    traced = []

    def step(x, y):
        traced.append(1)
        with mp.extended_precision():
            loss, grads = loss_and_grad(model, x, y)
            opt.update(model, grads)
        return loss

    if compiled:
        state = [model.state, opt.state]
        step = mx.compile(step, inputs=state, outputs=state)
    losses = []
    for _ in range(steps):
        if block_outside:
            with mp.extended_precision():
                loss = step(x, y)
        else:
            loss = step(x, y)
        mx.eval(loss, model.parameters(), opt.state)
        losses.append(_carried({"loss": loss})["loss"])
    return model, opt, losses, len(traced)


@pytest.mark.parametrize("block_outside", [False, True], ids=["block inside", "block outside"])
def test_compiled_training_step_follows_the_uncompiled_trajectory(block_outside):
    """``mx.compile(step, inputs=state, outputs=state)`` of a step that opens the
    block (traced twice: for the fresh float32 state, then for the state carrying
    low words; replayed without Python after), or a compiled step called inside an
    open block (its Python runs): the parameters, the optimizer's moments and the
    loss carry the uncompiled run's values, bit for bit, at every step."""
    steps = 12
    m0, o0, l0, _ = _train(False, steps)
    m1, o1, l1, traced = _train(True, steps, block_outside)
    assert traced == (steps if block_outside else 2)
    np.testing.assert_array_equal(np.array(l1), np.array(l0))
    for a, b in ((m0.parameters(), m1.parameters()), (o0.state, o1.state)):
        want, got = _carried(a), _carried(b)
        assert set(want) == set(got) and len(want) >= 6
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
    assert all(low_word(v) is not None for _, v in tree_flatten(m1.parameters()))


def test_compiled_training_step_on_emulate_raises_the_named_error():
    """The emulator runs its kernels eagerly: tracing a step raises
    TransformUnsupportedError, not MLX's evaluation error."""
    model, opt, loss_and_grad = _trainer()
    x, y = _data()

    step = _block_step(model, opt, loss_and_grad, "emulate")
    state = [model.state, opt.state]
    with pytest.raises(TransformUnsupportedError):
        mx.compile(step, inputs=state, outputs=state)(x, y)


def test_compiled_functions_without_a_block_are_mlx_own():
    """A compiled function with state that never opens a block: MLX's bits on every
    call (the first, which learns that nothing is carried, and the later ones)."""
    runs = []
    for compile_ in (plain.compile, mx.compile):
        model, opt, loss_and_grad = _trainer("sgd-momentum")
        x, y = _data()

        def step(x, y):
            loss, grads = loss_and_grad(model, x, y)
            opt.update(model, grads)
            return loss

        state = [model.state, opt.state]
        f = compile_(step, inputs=state, outputs=state)
        runs.append([np.array(f(x, y)) for _ in range(3)]
                    + [np.array(v) for _, v in tree_flatten(model.parameters())])
        assert all(low_word(v) is None for _, v in tree_flatten(model.parameters()))
    for a, b in zip(*runs):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_compiled_training_step_on_metal_replays_without_python(lazy_metal):
    """On metal the kernels are graph nodes: the step's Python runs on the first
    two calls only (fresh state, then state with low words), and the state's low
    words are outputs of the replayed graph (the lazy stand-in's values are
    meaningless: only the structure is checked)."""
    model, opt, loss_and_grad = _trainer()
    x, y = _data()
    ran = []
    step = _block_step(model, opt, loss_and_grad, "metal", ran)
    state = [model.state, opt.state]
    f = mx.compile(step, inputs=state, outputs=state)
    for _ in range(4):
        mx.eval(f(x, y), model.parameters(), opt.state)
    assert len(ran) == 2
    # low words, as the block made them: no float64 value crosses the graph (the
    # default backend here, where the step is called, is cpu)
    assert all(low_word(v) is not None for _, v in tree_flatten(model.parameters()))
    assert all(wide_value(v) is None for _, v in tree_flatten([model.parameters(), opt.state]))


def test_compiled_step_carries_the_form_its_block_makes(lazy_metal):
    """A compiled step whose block runs on cpu, called where the default backend is
    metal: its state carries the float64 values the cpu flow makes (not words split
    from them and joined again), and the trajectory is the uncompiled cpu run's, bit
    for bit, from the first call (which learns the form at its trace)."""
    steps = 5

    def run(compiled: bool):
        model, opt, loss_and_grad = _trainer()
        x, y = _data()

        step = _block_step(model, opt, loss_and_grad, "cpu")
        if compiled:
            state = [model.state, opt.state]
            step = mx.compile(step, inputs=state, outputs=state)
        for _ in range(steps):
            mx.eval(step(x, y), model.parameters(), opt.state)
        return model, opt

    with mp.use_backend("metal"):  # (the stand-in's): where the step is called
        m1, o1 = run(True)
    m0, o0 = run(False)
    assert all(wide_value(v) is not None for _, v in tree_flatten(m1.parameters()))
    for a, b in ((m0.parameters(), m1.parameters()), (o0.state, o1.state)):
        want, got = _carried(a), _carried(b)
        assert set(want) == set(got) and len(want) >= 6
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
