"""The kernels of ``metal/include/doubleword.h``'s arithmetic: ``dw_ops`` (real
double-word operations and error-free transforms) and ``cdw_ops`` (complex
double-word add and multiply), with their operation codes.

The engine (:mod:`.kernel_engine`) runs DoubleWord ``+ - * /`` on them; the
self-test (:mod:`.checks`) and the tests check each operation against its bound.
The codes are defined here once, by name (:data:`DW_OP`, :data:`CDW_OP`), and
generated into ``metal/include/dw_ops.h`` (:func:`codes_source`), which the
kernels read.
"""

from __future__ import annotations

import functools

import mlx.core as mx
import numpy as np

from ..core.kernels import (Codes, Kernel, generated_block, per_element_of_first_input,
                            same_shape)

_F32 = (mx.float32,)

DW_OP = Codes("DW_OP", (
    "two_sum",       # TwoSum(xh, yh) -> (s, t)
    "fast_two_sum",  # Fast2Sum(xh, yh) -> (s, t), |xh| >= |yh|
    "two_prod",      # TwoProdFMA(xh, yh) -> (p, e)
    "add_fp",        # DW + FP: x + yh (JMP alg 4)
    "add",           # DW + DW: x + y (JMP alg 6)
    "mul_fp",        # DW * FP: x * yh (JMP alg 9)
    "mul",           # DW * DW: x * y (JMP alg 12)
    "div",           # DW / DW: x / y (JMP alg 18)
    "div_faithful",  # DW / DW from the other faithful reciprocal of yh (not RN)
    "recip_refine",  # step 0 of DW / DW alone, from both faithful reciprocals
))
"""Operation codes of the ``dw_ops`` kernel (template parameter ``OP``)."""

CDW_OP = Codes("CDW_OP", ("add", "mul"))
"""Operation codes of the ``cdw_ops`` kernel (template parameter ``OP``)."""


def codes_source() -> str:
    """The generated block of ``metal/include/dw_ops.h`` (a test checks that the
    header holds exactly this text)."""
    return generated_block("mlx_precise.doubleword.dw_kernels.codes_source()", DW_OP, CDW_OP)


DW_OPS = Kernel(
    name="dw_ops",
    body="dw_ops.metal",
    headers=("dw_ops.h",),
    inputs=("xh", "xl", "yh", "yl"),
    outputs=("zh", "zl"),
    template=("OP",),
    codes={"OP": DW_OP},
    input_dtypes={k: _F32 for k in ("xh", "xl", "yh", "yl")},
    input_shapes=same_shape(ndim=1),
    grid=per_element_of_first_input,
    extended=True,
    variants={"zh": _F32, "zl": _F32},
)
"""Elementwise double-word operation ``OP`` (a name or code of :data:`DW_OP`; see
``metal/kernels/dw_ops.metal``). Inputs ``xh, xl, yh, yl`` and outputs ``zh, zl``:
float32, shape ``(n,)``; the grid is one thread per element."""

_CDW_IN = ("xrh", "xrl", "xih", "xil", "yrh", "yrl", "yih", "yil")
CDW_OPS = Kernel(
    name="cdw_ops",
    body="cdw_ops.metal",
    headers=("dw_ops.h",),
    inputs=_CDW_IN,
    outputs=("zrh", "zrl", "zih", "zil"),
    template=("OP",),
    codes={"OP": CDW_OP},
    input_dtypes={k: _F32 for k in _CDW_IN},
    input_shapes=same_shape(ndim=1),
    grid=per_element_of_first_input,
    extended=True,
    variants={k: _F32 for k in ("zrh", "zrl", "zih", "zil")},
)
"""Elementwise complex double-word operation ``OP`` (a name or code of
:data:`CDW_OP`). Inputs and outputs: float32, shape ``(n,)`` (real hi, real lo,
imaginary hi, imaginary lo)."""

_DIV_IN = ("x_hi", "x_lo", "y_hi", "y_lo")
CDW_DIV = Kernel(
    name="cdw_div",
    body="cdw_div.metal",
    headers=("dw_ops.h",),
    inputs=_DIV_IN + ("at",),
    outputs=("z", "special"),
    input_dtypes={**{k: _F32 for k in _DIV_IN}, "at": (mx.int32,)},
    extended=True,
    variants={"z": _F32, "special": (mx.bool_,)},
    # the wrapper pads every input to 8 elements at least
    input_forms=dict.fromkeys(_DIV_IN + ("at",), ("device",)),
)
"""Complex double-word division, scaled so that no intermediate overflows or
underflows (``metal/kernels/cdw_div.metal``). Inputs: float32 interleaved (re, im)
words of x and y, n points each (a low word's words at an offset ``at[0]`` / ``at[1]``
of its buffer: packed words are one buffer passed twice), ``at`` int32 (8,) with
``at[2] = 2 n``; outputs ``z`` float32 (4 n,), the interleaved words of x / y (the
high words, then the low words: packed), ``special`` bool (n,): where float32's
rule for special operands applies (the quotient's high word is then the caller's).
Grid: one thread per point."""


@functools.lru_cache(maxsize=256)
def offsets(*values: int) -> mx.array:
    """An ``at`` input of :data:`CDW_DIV` and ``dw_math`` (int32, 8 values: a device
    buffer): the offsets of low words in their buffers and the output's, made once
    per values (data: no graph node)."""
    return mx.array(np.array(values + (0,) * (8 - len(values)), np.int32))
