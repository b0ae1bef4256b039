"""The double-word arithmetic's nested-gradient guards (extended.arith): binary,
reduce_sum and cumsum all refuse an operand from a gradient nested in another one
exactly where the engine evaluates on the host (Backend.host_evaluated: the
emulator), and accept it on metal (graph nodes) and cpu (MLX float64 ops)."""

import mlx.core as mx
import numpy as np
import pytest

from mlx_precise import TransformUnsupportedError
from mlx_precise.core import backends
from mlx_precise.doubleword.words import DoubleWord
from mlx_precise.extended import arith, carry


def _operand(complex_: bool = False) -> DoubleWord:
    x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    hi = mx.array(x + 1j * x if complex_ else x)
    w = DoubleWord(hi, mx.zeros_like(hi))
    carry.tag_nested(w.hi)  # as if computed by a gradient inside another one
    return w


def _calls(w: DoubleWord, backend):
    return {
        "binary": lambda: arith.binary("add", w, w, backend),
        "reduce_sum": lambda: arith.reduce_sum(w, (1,), False, backend),
        "reduce_prod": lambda: arith.reduce_sum(w, (1,), False, backend, op="mul"),
        "cumsum": lambda: arith.cumsum(w, 1, False, True, backend),
        "cumprod": lambda: arith.cumsum(w, 1, False, True, backend, op="mul"),
    }


@pytest.mark.parametrize("complex_", [False, True])
def test_emulate_refuses_nested_operands_everywhere(complex_):
    w = _operand(complex_)
    for what, call in _calls(w, backends.get("emulate")).items():
        with pytest.raises(TransformUnsupportedError, match="on 'emulate'"):
            call()


@pytest.mark.parametrize("complex_", [False, True])
def test_cpu_accepts_nested_operands(complex_):
    w = _operand(complex_)
    for what, call in _calls(w, backends.get("cpu")).items():
        mx.eval(call().hi)


def test_metal_accepts_nested_operands(lazy_metal):
    """The kernels are graph nodes on metal: no guard (cumsum used to refuse)."""
    w = _operand()
    for what, call in _calls(w, backends.get("metal")).items():
        mx.eval(call().hi)
