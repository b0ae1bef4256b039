"""Checks that need a real Apple GPU (skipped elsewhere; the emulator tests cover
the same kernels on every machine). On a Mac: ``python -m pytest tests/core/test_metal.py``."""

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise
from mlx_precise.tools import selftest

pytestmark = [
    pytest.mark.metal,
    pytest.mark.skipif(not mlx_precise.metal_available(), reason="needs an Apple GPU (Metal)"),
]


def test_selftest_passes_on_metal():
    checks = selftest.run("metal", verbose=False)
    assert checks and all(c.passed for c in checks), [c.line() for c in checks if not c.passed]


@pytest.mark.parametrize("op", range(8))
def test_metal_and_emulator_agree_bit_for_bit(op):
    """Every double-word operation is a fixed sequence of IEEE float32 operations,
    so the GPU and the emulator must return identical bits."""
    from mlx_precise.doubleword.dw_kernels import DW_OPS

    rng = np.random.default_rng(op)
    n = 1 << 16
    hi = (rng.standard_normal((2, n)) * 2.0 ** rng.integers(-30, 30, (2, n))).astype(np.float32)
    lo = (hi * rng.uniform(-2**-25, 2**-25, (2, n))).astype(np.float32)
    ins = [mx.array(hi[0]), mx.array(lo[0]), mx.array(hi[1]), mx.array(lo[1])]
    outs = {}
    for b in ("metal", "emulate"):
        zh, zl = DW_OPS(inputs=ins, template={"OP": op}, output_shapes=[(n,), (n,)],
                        output_dtypes=[mx.float32, mx.float32], backend=b)
        outs[b] = (np.array(zh).view(np.uint32), np.array(zl).view(np.uint32))
    assert (outs["metal"][0] == outs["emulate"][0]).all()
    assert (outs["metal"][1] == outs["emulate"][1]).all()
