"""A block leaves no reference cycles behind: what the flow builds per op (replay
keys, a backward pass's structure, recorded words) is freed by reference counting
when the caller drops it. A cycle would hold the block's arrays, nodes of its lazy
graph, until Python's garbage collector ran, and each collection of them costs the
host far more than the ops that made them (about 0.2 ms per collection, every few
forward passes, before this was checked)."""

from __future__ import annotations

import contextlib
import gc
import importlib

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import pytest

import mlx_precise as mp
from mlx_precise.testing import lazy_metal_executor


def _cycles(run, calls: int) -> list:
    """The objects the garbage collector finds unreachable after ``calls`` calls of
    ``run`` (the first few calls, which trace and fill caches, not counted)."""
    for _ in range(3):
        run()
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(calls):
            run()
        gc.collect()
        return list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def _ours(garbage: list) -> list:
    """What in ``garbage`` is an MLX array or a function of this package (MLX's own
    ``Module.update`` leaves a cycle of closures per call, holding no array)."""
    return [o for o in garbage if isinstance(o, mx.array) or (
        callable(o) and "mlx_precise" in getattr(getattr(o, "__code__", None),
                                                 "co_filename", ""))]


@pytest.mark.parametrize("backend", ["metal", "cpu"])
@pytest.mark.parametrize("name", ["transformer", "hyena"])
def test_forward_and_training_step_leave_no_cycles(name, backend):
    mod = importlib.import_module(f"models.{name}")
    model, x = mod.build("small", 0)
    mx.eval(model.parameters())
    vg = nn.value_and_grad(model, lambda m, x: m(x).astype(mx.float32).sum())
    opt = optim.Adam(1e-3)
    lazy = lazy_metal_executor() if backend == "metal" else contextlib.nullcontext()

    def forward():
        with mp.use_backend(backend), mp.extended_precision():
            return model(x)

    def step():
        with mp.use_backend(backend), mp.extended_precision():
            loss, grads = vg(model, x)
            opt.update(model, grads)
            return loss

    with lazy:  # (metal: enough calls that the ops and the pass replay)
        forward_garbage = _cycles(forward, 4)
        step_garbage = _cycles(step, 4)
    assert forward_garbage == []
    assert _ours(step_garbage) == []
