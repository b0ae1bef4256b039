"""Quantized weights: ``dequantize``, ``quantized_matmul``, ``gather_qmm``.

A quantized weight is exact data: integer codes (at most 8 bits) with a float32
scale and bias per group (``affine``), or small floating codes times a power of
two (``mxfp4``, ``mxfp8``, ``nvfp4`` without a global scale). Its value
``s q + b`` is computed in double-word: ``s q`` is exact (24 + 8 bits), the sum
with ``b`` rounded once (exact on cpu, where 53 bits hold it), where MLX's float32
rounds it. The matrix products are then the double-word products of the
activations with that weight (:mod:`.linear`): the dequantized weight is
materialised, a cost the cpu accepts for products rounded once.

``quantize`` is an exit into a low-precision format: it reads the float32
rounding of the value, as ``save`` does (:mod:`..registry`). ``qqmm`` /
``gather_qqmm`` quantize the activations too (low precision by design), and
``nvfp4`` with a global scale (its formula rounds in float32 in an order MLX does
not document) are left to MLX: reported when they read a carried value.
"""

from __future__ import annotations

import mlx.core as mx

from .. import carry
from .base import is_word_array


def _dequantized(w, scales, biases=None, group_size=None, bits=None, mode="affine",
                 global_scale=None, dtype=None):
    """The value of a quantized matrix (shape ``(..., rows, cols)``, float32,
    carrying its low word), or None where MLX's is the answer or no rule applies
    (float16 / bfloat16 scales or result, a global scale)."""
    if global_scale is not None or (dtype is not None and dtype != mx.float32):
        return None
    with carry.suspended():  # MLX's own dequantize, on exact data
        if mode != "affine":  # a small float times a power of two: exact in float32
            if dtype is None or dtype != mx.float32:
                return None  # MLX's bfloat16 default: exact there too
            return mx.dequantize(w, scales, biases, group_size, bits, mode, dtype=mx.float32)
        if biases is None or scales.dtype != mx.float32 or biases.dtype != mx.float32:
            return None
        # the integer codes (exact): unit scales and zero biases
        q = mx.dequantize(w, mx.ones_like(scales), mx.zeros_like(biases), group_size, bits,
                          mode)
    groups = scales.shape[-1]
    q = q.reshape(*q.shape[:-1], groups, q.shape[-1] // groups)
    return (q * mx.expand_dims(scales, -1) + mx.expand_dims(biases, -1)).reshape(
        *q.shape[:-2], -1)


def _dequantize(ctx, original, w, scales, *args, **kw):
    """``dequantize``: ``s q + b`` per group in double-word (see the module)."""
    with carry.reporting(ctx.report):
        out = _dequantized(w, scales, *args, **kw)
    return NotImplemented if out is None else out


def _weight(w, scales, biases, transpose, group_size, bits, mode, global_scale=None):
    """The dequantized weight as the right operand of a product (None: declined)."""
    weight = _dequantized(w, scales, biases, group_size, bits, mode, global_scale, mx.float32)
    if weight is None:
        return None
    return mx.swapaxes(weight, -1, -2) if transpose else weight


def _quantized_matmul(ctx, original, x, w, scales, biases=None, transpose=True,
                      group_size=None, bits=None, mode="affine"):
    """``x @ dequantize(w).T`` (``transpose``) or ``x @ dequantize(w)``: the
    double-word product of the activations (carried or exact) with the exact
    dequantized weight."""
    if not is_word_array(x) or x.dtype != mx.float32:
        return NotImplemented
    with carry.reporting(ctx.report):
        weight = _weight(w, scales, biases, transpose, group_size, bits, mode)
        return NotImplemented if weight is None else mx.matmul(x, weight)


def _gather_qmm(ctx, original, x, w, scales, biases=None, lhs_indices=None, rhs_indices=None,
                transpose=True, group_size=None, bits=None, mode="affine", global_scale=None,
                *, sorted_indices=False):
    """``gather_mm`` of the activations with the dequantized weights (the batch
    dimensions of ``w`` are its experts)."""
    if not is_word_array(x) or x.dtype != mx.float32:
        return NotImplemented
    with carry.reporting(ctx.report):
        weight = _weight(w, scales, biases, transpose, group_size, bits, mode, global_scale)
        if weight is None:
            return NotImplemented
        return mx.gather_mm(x, weight, lhs_indices, rhs_indices, sorted_indices=sorted_indices)


RULES = {"dequantize": _dequantize, "quantized_matmul": _quantized_matmul,
         "gather_qmm": _gather_qmm}
"""Op name -> rule."""
