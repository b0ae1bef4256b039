"""``Int8Linear``: a W8A8 linear layer, and a helper that converts a model's
``nn.Linear`` layers.

Weights are quantized once, symmetrically, with one scale per output channel;
activations are quantized on every call, per token (per row), symmetrically or with
a zero point per token; the product runs as one int8 GEMM with the fused scaled
epilogue of :func:`mlx_precise.int8.scaled_mm` (ScaledEpilogueBias, or
ScaledEpilogueAzpPerToken for asymmetric activations), rounded once to the input's
dtype.

Error of one layer (derived in tests/int8/test_int8.py, asserted there): with activation
scale ``s_x`` of a row and weight scale ``s_w[n]``, rounding to the nearest integer
moves each activation by at most ``s_x / 2`` and each weight by at most
``s_w[n] / 2``, so ``|y_n - y8_n| <= (s_x / 2) sum_k |W[n, k]| + (s_w[n] / 2) sum_k |x8_k|``
(``x8``: the dequantized activations) plus the final rounding.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map_with_path

from ..int8.scaled import OUT_DTYPES, compute_azp_adj, quantize_int8, scaled_mm


class Int8Linear(nn.Module):
    """W8A8 affine map ``y = x W^T + b`` with int8 weights and activations.

    Args:
        input_dims: K, the size of the last axis of the input.
        output_dims: N, the size of the last axis of the output.
        bias: whether the layer has a bias (float32 ``[N]``).
        symmetric: symmetric per-token activation quantization (True) or one zero
            point per token (False, the ScaledEpilogueAzpPerToken path).

    Parameters (frozen; build them with :meth:`from_linear`):
        qweight: int8 ``[K, N]`` (the transposed weight, as ``scaled_mm``'s ``b``).
        weight_scale: float32 ``[1, N]`` (per output channel).
        azp_adj: int32 ``[N]``, the column sums of ``qweight``.
        bias: float32 ``[N]`` (if ``bias``).

    Call: ``x`` float32 / float16 / bfloat16 ``[..., K]`` -> ``[..., N]`` of ``x``'s
    dtype, on the active mlx_precise backend (``mlx_precise.use_backend``).
    Raises TypeError for other dtypes and ValueError when the last axis is not K.
    A row of ``x`` with a NaN or Inf gives a row of NaN (a NaN weight: a NaN output
    channel), as ``nn.Linear``'s NaN / non-finite rows (docs/int8.md); ``mx.compile``
    traces the call on the metal backend.
    """

    def __init__(self, input_dims: int, output_dims: int, bias: bool = True,
                 symmetric: bool = True):
        super().__init__()
        for name, v in (("input_dims", input_dims), ("output_dims", output_dims)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        self.symmetric = bool(symmetric)
        self.qweight = mx.zeros((input_dims, output_dims), dtype=mx.int8)
        self.weight_scale = mx.ones((1, output_dims), dtype=mx.float32)
        self.azp_adj = mx.zeros((output_dims,), dtype=mx.int32)
        if bias:
            self.bias = mx.zeros((output_dims,), dtype=mx.float32)
        self.freeze()

    @property
    def input_dims(self) -> int:
        return self.qweight.shape[0]

    @property
    def output_dims(self) -> int:
        return self.qweight.shape[1]

    def _extra_repr(self) -> str:
        return (f"input_dims={self.input_dims}, output_dims={self.output_dims}, "
                f"bias={'bias' in self}, symmetric={self.symmetric}")

    @classmethod
    def from_linear(cls, linear: nn.Linear, symmetric: bool = True) -> "Int8Linear":
        """Quantize an ``nn.Linear`` (weight ``[N, K]``, optional bias ``[N]``):
        per-output-channel symmetric int8 weights (``scale = absmax / 127``, see
        :func:`mlx_precise.int8.quantize_int8`).

        Raises:
            TypeError: ``linear`` is not an ``nn.Linear`` with a float weight.
        """
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an mlx.nn.Linear, got {type(linear).__name__}")
        w = linear.weight
        out_dims, in_dims = w.shape
        layer = cls(in_dims, out_dims, bias="bias" in linear, symmetric=symmetric)
        qw, scale, _ = quantize_int8(w)  # rows of W are the output channels
        layer.qweight = mx.contiguous(qw.T)
        layer.weight_scale = mx.reshape(scale, (1, out_dims))
        layer.azp_adj = compute_azp_adj(layer.qweight)
        if "bias" in linear:
            layer.bias = linear.bias.astype(mx.float32)
        layer.freeze()
        return layer

    def __call__(self, x: mx.array) -> mx.array:
        if not isinstance(x, mx.array) or x.dtype not in OUT_DTYPES:
            raise TypeError(
                f"Int8Linear input must be a float32, float16 or bfloat16 mx.array, "
                f"got {getattr(x, 'dtype', type(x).__name__)}"
            )
        if x.ndim == 0 or x.shape[-1] != self.input_dims:
            raise ValueError(
                f"Int8Linear expects [..., {self.input_dims}], got shape {tuple(x.shape)}"
            )
        lead = tuple(x.shape[:-1])
        x2 = mx.reshape(x, (-1, self.input_dims))
        bias = self.bias if "bias" in self else None
        if self.symmetric:
            q, s, _ = quantize_int8(x2)
            y = scaled_mm(q, self.qweight, s, self.weight_scale, bias=bias, out_dtype=x.dtype)
        else:
            q, s, zp = quantize_int8(x2, symmetric=False)
            y = scaled_mm(q, self.qweight, s, self.weight_scale, bias=bias,
                          azp_adj=self.azp_adj, azp=zp, out_dtype=x.dtype)
        return mx.reshape(y, lead + (self.output_dims,))


def convert_linear_to_int8(model: nn.Module, *, symmetric: bool = True,
                           class_predicate=None) -> nn.Module:
    """Replace, in place, every ``nn.Linear`` of ``model`` (or those for which
    ``class_predicate(path, module)`` is true) by :meth:`Int8Linear.from_linear`.

    Args:
        model: any ``mlx.nn.Module``.
        symmetric: activation quantization mode of the new layers.
        class_predicate: optional ``(path: str, module) -> bool``; it is only asked
            about ``nn.Linear`` layers.

    Returns:
        ``model`` (updated in place).

    Raises:
        TypeError: ``model`` is not an ``mlx.nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an mlx.nn.Module, got {type(model).__name__}")

    def convert(path, m):
        if isinstance(m, nn.Linear) and (class_predicate is None or class_predicate(path, m)):
            return Int8Linear.from_linear(m, symmetric=symmetric)
        return m

    leaves = tree_map_with_path(convert, model.leaf_modules(), is_leaf=nn.Module.is_module)
    model.update_modules(leaves)
    return model
