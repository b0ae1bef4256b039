"""Convolutions in double-word: the depthwise short filter of Hyena.

``depthwise_conv_extended`` has exactly the semantics of PyTorch's
``Conv1d(C, C, K, groups=C, padding=K-1)`` cut to the first L steps (Hyena's short
filter): ``y[b, c, t] = bias[c] + sum_{j<K} w[c, j] * x[b, c, t + j - (K - 1)]`` with
``x = 0`` before ``t = 0``.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..core import backends
from ..core.autodiff import host_guard
from ..core.streams import on_stream, streamed
from ..doubleword import fusion
from ..doubleword.aware import precision_aware
from ..doubleword.types import DoubleWord, read_input
from ..doubleword.engine64 import from_float64_result
from ..core.plain import plain
from ..core.kernels import Kernel, per_element_of_first_input
from ..core.backends import Backend

_F32 = (mx.float32,)
_FLOAT32 = ("float32",)  # the dtype read_input takes for the convolutions' operands

DEPTHWISE = Kernel(
    name="ext_depthwise",
    body="ext_depthwise.metal",
    headers=("doubleword.h",),
    inputs=("x", "w", "bias"),
    outputs=("out_hi", "out_lo"),
    template=("TAPS", "HAS_BIAS", "ROUND"),
    input_dtypes={"x": _F32, "w": _F32, "bias": _F32},
    grid=per_element_of_first_input,
    variants={"TAPS": (0, 3), "HAS_BIAS": (False, True), "ROUND": (False, True), "out_hi": _F32, "out_lo": _F32},
)

DEPTHWISE_NLC = Kernel(
    name="ext_depthwise_nlc",
    body="ext_depthwise_nlc.metal",
    headers=("doubleword.h",),
    inputs=("x", "w"),
    outputs=("out",),
    template=("TAPS", "PAD", "DIL", "STRIDE"),
    input_dtypes={"x": _F32, "w": _F32},
    variants={"TAPS": (3,), "PAD": (2,), "DIL": (1, 3), "STRIDE": (1, 2), "out": _F32},
)
"""MLX's depthwise ``conv1d`` of a channels-last signal in double-word (see
``metal/kernels/ext_depthwise_nlc.metal``): x float32 (N, L, C), w float32
(Cout, K, 1) read in place; the geometry as template parameters; output the
packed words (2 N, Q, Cout) of the (N, Q, Cout) result. :func:`conv1d_words`
launches it."""


def conv1d_words(x: mx.array, w: mx.array, stride: int, padding: int, dilation: int,
                 backend: Backend, stream=None) -> DoubleWord:
    """``mx.conv1d(x, w, stride, padding, dilation, groups=C)`` in double-word on a
    kernel backend, unrounded: x float32 (N, L, C), w float32 (Cout, K, 1) with
    Cout a multiple of C (channel o reads input channel o // (Cout / C)), both
    read in place by one launch of :data:`DEPTHWISE_NLC`, which writes the words
    of the (N, Q, Cout) result, Q = (L + 2 padding - dilation (K - 1) - 1) //
    stride + 1 (Q < 1: MLX's ValueError). The sum of :data:`DEPTHWISE` on
    the transposed signal padded by ``padding``, the taps spread by ``dilation``,
    cut to every ``stride``-th output from K' - 1, bit for bit, without those ops
    around the launch (one graph node where they made five per word)."""
    (N, L, C), (Cout, K, _) = x.shape, w.shape
    Q = (L + 2 * padding - dilation * (K - 1) - 1) // stride + 1
    if Q < 1:  # MLX's own error for a kernel longer than the padded signal
        plain.conv1d(x, w, stride, padding, dilation, C)
    size = N * Q * Cout
    if size == 0:
        z = mx.zeros((N, Q, Cout), mx.float32)
        return DoubleWord(z, z)
    (z,) = DEPTHWISE_NLC(
        inputs=[x, w],
        template={"TAPS": K, "PAD": padding, "DIL": dilation, "STRIDE": stride},
        grid=(size, 1, 1), threadgroup=(min(size, 256), 1, 1),
        output_shapes=[fusion.packed_shape((N, Q, Cout))], output_dtypes=[mx.float32],
        backend=backend, stream=stream)
    return DoubleWord.of_words(*fusion.unpacked(z, (N, Q, Cout)))


LAYOUTS = ("NCL", "NLC")
"""Signal layouts of the convolutions: ``"NCL"`` (batch, channels, L), the default,
and ``"NLC"`` (batch, L, channels), MLX's channels-last layout (``mx.conv1d``,
``nn.Conv1d``). Filters are (channels, taps) in both."""


def check_layout(layout, fn: str) -> str:
    """``layout`` if it is one of :data:`LAYOUTS`, else ValueError naming it."""
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"{fn}(): layout must be 'NCL' (batch, channels, L) or 'NLC' "
                         f"(batch, L, channels), got {layout!r}")
    return layout


def from_ncl(y, layout: str):
    """A (batch, channels, L) result (array or DoubleWord) back in ``layout``."""
    if layout == "NCL":
        return y
    if isinstance(y, DoubleWord):
        return DoubleWord(y.hi.transpose(0, 2, 1), y.lo.transpose(0, 2, 1))
    return y.transpose(0, 2, 1)


def check_conv_operands(x, w, bias, layout: str = "NCL", names=("x", "w", "bias"),
                        taps: str = "K"):
    """Read and validate a per-channel convolution's operands: signal float32
    (batch, channels, L), or (batch, L, channels) in ``layout="NLC"``, filter
    float32 (channels, taps), per-channel vector float32 (channels,) or None; each
    read once by :func:`~mlx_precise.doubleword.types.read_input`. Returns
    ``(x, w, bias)`` with ``x`` as (batch, channels, L) (a transposed view for
    ``"NLC"``). Raises TypeError / ValueError naming the argument."""
    nx, nw, nb = names
    x, w = read_input(x, nx, "array", _FLOAT32), read_input(w, nw, "array", _FLOAT32)
    bias = None if bias is None else read_input(bias, nb, "array", _FLOAT32)
    if layout == "NLC":
        if x.ndim != 3:
            raise ValueError(f"{nx} must be (batch, L, channels) with layout='NLC', "
                             f"got shape {x.shape}")
        x = x.transpose(0, 2, 1)
    if x.ndim != 3:
        raise ValueError(f"{nx} must be (batch, channels, L), got shape {x.shape}")
    if w.ndim != 2:
        raise ValueError(f"{nw} must be (channels, {taps}), got shape {w.shape}")
    if w.shape[0] != x.shape[1]:
        raise ValueError(f"{nw} has {w.shape[0]} channels but {nx} has {x.shape[1]}")
    if bias is not None and tuple(bias.shape) != (x.shape[1],):
        raise ValueError(f"{nb} must have shape ({x.shape[1]},), got {bias.shape}")
    return x, w, bias


def _check_depthwise(x, w, bias, layout: str, fn: str, taps: int | None = None):
    """The depthwise operands read and checked (``taps``: the one K allowed)."""
    x, w, bias = check_conv_operands(x, w, bias, check_layout(layout, fn))
    if w.shape[1] < 1:
        raise ValueError("w must have K >= 1 taps")
    if taps is not None and w.shape[1] != taps:
        raise ValueError(f"{fn} needs w of shape (channels, {taps}), got {w.shape}")
    return x, w, bias


def _depthwise_float64(x, w, bias) -> np.ndarray:
    """Native float64 reference semantics (cpu backend); Inf/NaN as IEEE gives them."""
    with np.errstate(invalid="ignore", over="ignore"):
        return _depthwise_sum(np.array(x, dtype=np.float64), np.array(w, dtype=np.float64), bias)


def _depthwise_sum(xs: np.ndarray, ws: np.ndarray, bias) -> np.ndarray:
    L, K = xs.shape[2], ws.shape[1]
    xp = np.concatenate([np.zeros(xs.shape[:2] + (K - 1,)), xs], axis=2)
    y = np.zeros(xs.shape)
    if bias is not None:
        y += np.array(bias, dtype=np.float64)[None, :, None]
    for j in range(K):
        y += ws[None, :, j, None] * xp[:, :, j:j + L]
    return y


def _depthwise(x, w, bias, taps: int, layout: str, round_output: bool, backend, fn: str):
    x, w, bias = _check_depthwise(x, w, bias, layout, fn, taps or None)
    name = backends.resolve(backend)
    if round_output:
        args = (x, w) if bias is None else (x, w, bias)
        return from_ncl(_differentiable(taps, bias is not None, name)(*args), layout)
    return from_ncl(_depthwise_raw(x, w, bias, taps, False, name), layout)


_custom: dict = {}


def _differentiable(taps: int, has_bias: bool, backend: Backend):
    """The rounded extended depthwise convolution as an ``mx.custom_function``. Its
    VJP is the float32 VJP of the same convolution (``mx.conv1d``): gradients are
    plain float32, the forward value double-word."""
    key = (taps, has_bias, backend)
    if key not in _custom:

        @mx.custom_function
        def conv(x, w, *bias):
            return _depthwise_raw(x, w, bias[0] if has_bias else None, taps, True, backend)

        @conv.vjp
        def conv_vjp(primals, cotangent, output):
            _, grads = mx.vjp(_depthwise_float32, list(primals), [cotangent])
            return tuple(grads)

        _custom[key] = conv
    return _custom[key]


def _depthwise_raw(x, w, bias, taps: int, round_output: bool, name: Backend):
    if not name.has_kernels:
        y = _depthwise_float64(x, w, bias)
        return from_float64_result(y, round_output)
    shape = tuple(x.shape)
    hi, lo = DEPTHWISE(
        inputs=[x, w, bias if bias is not None else mx.zeros((1,), mx.float32)],
        template={"TAPS": taps, "HAS_BIAS": bias is not None, "ROUND": round_output},
        output_shapes=[shape, (1,) if round_output else shape],
        output_dtypes=[mx.float32, mx.float32], backend=name)  # on the caller's stream
    return hi if round_output else DoubleWord(hi, lo)


@host_guard
@streamed
def depthwise_conv_extended(x, w, bias=None, *, layout: str = "NCL", round_output: bool = True,
                            backend: str | None = None, stream=None):
    """Causal depthwise convolution accumulated in double-word, rounded once.

    Args:
        x: float32 (batch, channels, L), or (batch, L, channels) with
            ``layout="NLC"``.
        w: float32 (channels, K), K >= 1.
        bias: float32 (channels,) or None.
        layout: ``"NCL"`` (default) or ``"NLC"`` (MLX's channels-last): the layout
            of ``x`` and of the result; the same numbers either way.
        round_output: float32 result if True, else a DoubleWord.
        backend: ``"metal"``, ``"emulate"``, ``"cpu"`` or None (active backend).
        stream: MLX stream or device (``mx.Stream``, ``mx.Device``) of the ops and
            kernel launches; None: the default stream.

    Returns:
        float32 (batch, channels, L) (or ``x``'s NLC layout)
        ``y[b,c,t] = bias[c] + sum_j w[c,j] x[b,c,t+j-(K-1)]``
        (x = 0 before t = 0), or a DoubleWord. Products are exact and the sum is
        compensated: error <= 2u^2 |y| + O(K u^3 sum |terms|) before the rounding,
        so y is faithful wherever |y| >= 2^-20 sum |terms|.

    Raises:
        TypeError: non-float32 or non-array inputs, a ``stream`` that is not a
        stream or device. ValueError: wrong ranks, channel mismatch, K < 1, wrong
        bias shape, unknown ``layout``.
    """
    return _depthwise(x, w, bias, 0, layout, round_output, backend, "depthwise_conv_extended")


@host_guard
@streamed
def depthwise3_extended(x, w, bias=None, *, layout: str = "NCL", round_output: bool = True,
                        backend: str | None = None, stream=None):
    """:func:`depthwise_conv_extended` specialised to K = 3 taps (Hyena's default
    short filter, unrolled at compile time). ``w``: float32 (channels, 3)."""
    return _depthwise(x, w, bias, 3, layout, round_output, backend, "depthwise3_extended")


def _depthwise_float32(x, w, bias=None, stream=None, conv1d=plain.conv1d):
    """Plain float32 MLX: ``mx.conv1d`` with groups = channels; checked operands,
    x (batch, channels, L). ``conv1d``: MLX's own (never the extended_precision()
    dispatcher: this is the plain path and the VJP of the extended one), but for
    the flow twins (the dispatcher's, inside a block)."""
    L, K = x.shape[2], w.shape[1]
    y = conv1d(x.transpose(0, 2, 1), w[:, :, None], padding=K - 1, groups=x.shape[1],
               stream=stream)
    y = y[:, :L, :].transpose(0, 2, 1)
    return mx.add(y, bias[None, :, None], stream=stream) if bias is not None else y


def _depthwise_plain(x, w, bias, layout: str, stream, fn: str, taps: int | None = None,
                     conv1d=plain.conv1d):
    """The plain twins: ``x`` in ``layout``, on ``stream`` (both checked)."""
    with on_stream(stream, fn):
        x, w, bias = _check_depthwise(x, w, bias, layout, fn, taps)
        return from_ncl(_depthwise_float32(x, w, bias, stream, conv1d), layout)


def _flow_twin(fn: str, taps: int | None = None):
    """The plain twin's ops as the flow sees them (``mx.conv1d`` looked up at the
    call: inside a block, the dispatcher's)."""

    def flow(x, w, bias=None, *, layout: str = "NCL", stream=None):
        return _depthwise_plain(x, w, bias, layout, stream, fn, taps, mx.conv1d)

    return flow


@precision_aware(depthwise_conv_extended, _flow_twin("depthwise_conv"), words=False)
def depthwise_conv(x, w, bias=None, *, layout: str = "NCL", stream=None):
    """Causal depthwise convolution: double-word inside
    :func:`~mlx_precise.extended_precision` (:func:`depthwise_conv_extended`), plain
    float32 ``mx.conv1d`` outside (on ``stream``); ``layout`` as there."""
    return _depthwise_plain(x, w, bias, layout, stream, "depthwise_conv")


@precision_aware(depthwise3_extended, _flow_twin("depthwise3", 3), words=False)
def depthwise3(x, w, bias=None, *, layout: str = "NCL", stream=None):
    """The K = 3 case of :func:`depthwise_conv` (extended: :func:`depthwise3_extended`)."""
    return _depthwise_plain(x, w, bias, layout, stream, "depthwise3", taps=3)
