"""``mlx.nn`` layers whose convolutions follow :func:`~mlx_precise.extended_precision`.

* :class:`FFTConv`: a long convolution with an explicit filter and a skip weight.
* :class:`Int8Linear` / :func:`convert_linear_to_int8`: W8A8 int8 linear layers
  (defined in :mod:`mlx_precise.nn.int8`).
* :class:`HyenaOperator`: the Hyena operator (Poli et al., "Hyena Hierarchy", 2023;
  the safari ``HyenaOperator``): input projection, short depthwise filter, an
  implicit long filter (positional features -> small MLP with sine activations ->
  exponential decay window), gating, and output projection.

Inside ``with extended_precision():`` their convolutions run in double-word
(:func:`~mlx_precise.hyena_conv_extended`, :func:`~mlx_precise.depthwise3_extended`)
and are differentiable; outside they are plain float32 MLX.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

from ..doubleword.types import read_input
from ..conv.depthwise import check_layout, depthwise3, depthwise_conv
from ..conv.hyena import fftconv


_FLOAT_INPUTS = (mx.float32, mx.float16, mx.bfloat16)


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _layer_input(u, layer: str, layout: str, width_axis: int, width: int, max_len: int,
                 length_axis: int) -> mx.array:
    """Check a layer's 3-D input (array-likes accepted) and widen it to float32 (exact from float16 and
    bfloat16: the layers compute in float32 or double-word and return float32, as
    an MLX layer with float32 weights does by type promotion)."""
    u = read_input(u, f"{layer} input {layout}")
    if u.ndim != 3:
        raise ValueError(f"{layer} input must be 3-D {layout}, got shape {tuple(u.shape)}")
    if u.dtype not in _FLOAT_INPUTS:
        raise TypeError(f"{layer} input must be float32, float16 or bfloat16, got {u.dtype}")
    if u.shape[width_axis] != width:
        raise ValueError(f"{layer} input {layout} must have {width} on axis {width_axis}, "
                         f"got shape {tuple(u.shape)}")
    if u.shape[length_axis] > max_len:
        raise ValueError(f"input length {u.shape[length_axis]} exceeds max_len={max_len}")
    return u.astype(mx.float32)


class FFTConv(nn.Module):
    """Long convolution with an explicit filter: ``y = fftconv(u, k[:, :L], D)``.

    Args:
        channels: number of channels C.
        max_len: longest input length (filter length).
        skip: learn a per-channel skip weight D (``y += D u``).
        layout: ``"NCL"`` (default): inputs (batch, C, L); ``"NLC"``: MLX's
            channels-last (batch, L, C), as ``nn.Conv1d`` and :class:`HyenaOperator`
            take. The same numbers either way.

    Input ``u``: float32, float16 or bfloat16 (batch, C, L) (or (batch, L, C)) with
    L <= max_len (widened exactly to float32). Output: float32, same shape.
    """

    def __init__(self, channels: int, max_len: int, skip: bool = True, layout: str = "NCL"):
        super().__init__()
        self.channels = _positive_int("channels", channels)
        self.max_len = _positive_int("max_len", max_len)
        self.layout = check_layout(layout, "FFTConv")
        # Decaying random filter: a long convolution that starts close to local.
        decay = mx.exp(-mx.arange(max_len, dtype=mx.float32) / max(max_len / 8, 1.0))
        self.k = mx.random.normal((channels, max_len)) * decay / math.sqrt(max_len)
        if skip:
            self.D = mx.random.normal((channels,))

    def _extra_repr(self) -> str:
        return (f"channels={self.channels}, max_len={self.max_len}, skip={'D' in self}, "
                f"layout={self.layout!r}")

    def __call__(self, u: mx.array) -> mx.array:
        if self.layout == "NLC":
            u = _layer_input(u, "FFTConv", "(batch, L, channels)", 2, self.channels,
                             self.max_len, 1)
        else:
            u = _layer_input(u, "FFTConv", "(batch, channels, L)", 1, self.channels,
                             self.max_len, 2)
        L = u.shape[1 if self.layout == "NLC" else 2]
        return fftconv(u, self.k[:, :L], self.get("D"), layout=self.layout)


class Sin(nn.Module):
    """``sin(freq * x)`` with a learnable per-feature frequency (Hyena's filter MLP)."""

    def __init__(self, dim: int, w: float = 1.0):
        super().__init__()
        self.freq = w * mx.ones((dim,))

    def _extra_repr(self) -> str:
        return f"dim={self.freq.shape[0]}"

    def __call__(self, x: mx.array) -> mx.array:
        return mx.sin(self.freq * x)


class HyenaFilter(nn.Module):
    """Implicit long filter: positional features of t in [0, 1], an MLP with sine
    activations, and an exponential decay window with per-channel rates.

    ``order`` filters: returns filters (order, channels, L) and skip weights
    (order, channels).
    """

    def __init__(self, channels: int, order: int, max_len: int, emb_dim: int = 3,
                 filter_order: int = 64, w: float = 1.0, fast_decay_pct: float = 0.3,
                 slow_decay_pct: float = 1.5, target: float = 1e-2):
        super().__init__()
        if emb_dim < 3 or emb_dim % 2 == 0:
            raise ValueError(f"emb_dim must be odd and >= 3, got {emb_dim}")
        self.channels, self.order, self.max_len, self.emb_dim = channels, order, max_len, emb_dim
        self.mlp = nn.Sequential(
            nn.Linear(emb_dim, filter_order), Sin(filter_order, w),
            nn.Linear(filter_order, filter_order), Sin(filter_order, w),
            nn.Linear(filter_order, order * channels, bias=False),
        )
        max_decay = math.log(target) / fast_decay_pct
        min_decay = math.log(target) / slow_decay_pct
        self.deltas = mx.linspace(min_decay, max_decay, channels)
        self.bias = mx.random.normal((order, channels))
        self.freeze(keys=["deltas"], recurse=False)

    def _extra_repr(self) -> str:
        return (f"channels={self.channels}, order={self.order}, max_len={self.max_len}, "
                f"emb_dim={self.emb_dim}, filter_order={self.mlp.layers[0].weight.shape[0]}")

    def features(self, L: int) -> tuple[mx.array, mx.array]:
        """(t, z): t (L, 1) in [0, 1]; z (L, emb_dim): t and sin/cos bands."""
        t = mx.linspace(0, 1, self.max_len)[:L, None]
        bands = (self.emb_dim - 1) // 2
        f = mx.linspace(1e-4, bands - 1, bands)[None]
        angle = 2 * math.pi * f * mx.arange(L, dtype=mx.float32)[:, None] / self.max_len
        return t, mx.concatenate([t, mx.cos(angle), mx.sin(angle)], axis=-1)

    def __call__(self, L: int) -> tuple[mx.array, mx.array]:
        t, z = self.features(L)
        h = self.mlp(z)  # (L, order * channels)
        h = h * mx.exp(-t * mx.abs(mx.tile(self.deltas, self.order)))
        return h.T.reshape(self.order, self.channels, L), self.bias


class HyenaOperator(nn.Module):
    """The Hyena operator on (batch, L, d_model) inputs.

    Args:
        d_model: model width.
        max_len: longest sequence length.
        order: depth of the recurrence, >= 2 (order - 1 long convolutions and
            order gates, as in safari).
        filter_order: width of the implicit filter MLP.
        short_filter_order: taps of the short depthwise filter (3: Hyena's default,
            which runs the unrolled 3-tap kernel).
    """

    def __init__(self, d_model: int, max_len: int, order: int = 2, filter_order: int = 64,
                 short_filter_order: int = 3):
        super().__init__()
        for name, value in (("d_model", d_model), ("max_len", max_len),
                            ("filter_order", filter_order),
                            ("short_filter_order", short_filter_order)):
            _positive_int(name, value)
        if isinstance(order, bool) or not isinstance(order, int) or order < 2:
            raise ValueError(f"order must be an int >= 2, got {order!r}")
        self.d_model, self.order, self.max_len = d_model, order, max_len
        width = (order + 1) * d_model
        self.in_proj = nn.Linear(d_model, width)
        self.out_proj = nn.Linear(d_model, d_model)
        scale = 1 / math.sqrt(short_filter_order)
        self.short_w = mx.random.uniform(-scale, scale, (width, short_filter_order))
        self.short_b = mx.random.uniform(-scale, scale, (width,))
        self.filter = HyenaFilter(d_model, order - 1, max_len, filter_order=filter_order)

    def _extra_repr(self) -> str:
        return (f"d_model={self.d_model}, max_len={self.max_len}, order={self.order}, "
                f"filter_order={self.filter.mlp.layers[0].weight.shape[0]}, "
                f"short_filter_order={self.short_w.shape[1]}")

    def __call__(self, u: mx.array) -> mx.array:
        """``u``: float32, float16 or bfloat16 (batch, L, d_model), L <= max_len
        (widened exactly to float32); returns float32 (batch, L, d_model)."""
        u = _layer_input(u, "HyenaOperator", "(batch, L, d_model)", 2, self.d_model,
                         self.max_len, 1)
        L = u.shape[1]
        z = self.in_proj(u).transpose(0, 2, 1)  # (B, (order + 1) d, L)
        short = depthwise3 if self.short_w.shape[1] == 3 else depthwise_conv
        z = short(z, self.short_w, self.short_b)
        *x, v = mx.split(z, self.order + 1, axis=1)
        k, bias = self.filter(L)
        for o, x_i in enumerate(reversed(x[1:])):
            v = fftconv(v * x_i, k[o], bias[o])
        y = (v * x[0]).transpose(0, 2, 1)
        return self.out_proj(y)
