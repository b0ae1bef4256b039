"""The Metal-path counts of the benchmarks (lazy stand-in for the kernels; no Apple
GPU here): what a launch reads and writes, and the training step's Metal section of
benchmarks/bench_training.py."""

from __future__ import annotations

import mlx.core as mx

import bench_training as bt
import mlx_precise as mp
from mlx_precise.testing import lazy_metal_executor


def test_launch_bytes_count_each_array_once():
    """x * y of two (100,) float32 arrays is one dw_fused launch: it reads x, y and
    its program (the slots it does not use repeat x) and writes two (100,) words."""
    x, y = mx.arange(100, dtype=mx.float32), mx.ones((100,), mx.float32)
    record: list = []
    with lazy_metal_executor(record):
        with mp.use_backend("metal"), mp.extended_precision():
            z = x * y
        mx.eval(z)
    (launch,) = [k for k in record if k.name != "eft_selftest"]
    prog = launch.inputs[-1]
    assert launch.name == "dw_fused" and prog.dtype == mx.int32
    assert launch.nbytes() == 400 + 400 + prog.nbytes + 2 * 400


def test_training_step_metal_section():
    """The compiled step replays without Python; the uncompiled step launches the
    double-word kernels (at least one per parameter update) and moves bytes."""
    g = bt.metal_step("sgd-momentum", rounds=1, calls=2)
    assert g["replays"] is True
    n_params = 4  # l1, l2 weight and bias; LayerNorm's weight and bias make 6
    assert g["launches"] >= n_params and g["bytes"] > 0
    assert g["plain_ops"] > 0 and g["build"] > 0 and g["compiled"] > 0
