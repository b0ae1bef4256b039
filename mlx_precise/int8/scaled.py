"""W8A8 int8 inference: per-token quantization and scaled int8 GEMMs.

With ``A = s_a (Aq - z_a J)`` (int8 ``Aq``, scale ``s_a``, zero point ``z_a``) and
``B = s_b Bq``, the product ``D = A B + C`` is computed as an exact int32 product
``acc = Aq Bq`` followed by one of the scaled epilogues of CUTLASS's int8 GEMMs as
vLLM uses them (``csrc/quantization/cutlass_w8a8``; docs/int8.md):

=========================== ===================================================
ScaledEpilogue              ``D = s_a[m] * (s_b[n] * acc)``
ScaledEpilogueBias          ``D = s_a[m] * (s_b[n] * acc) + bias[n]``
ScaledEpilogueAzp           ``D = s_a * (s_b[n] * (acc - azp_adj[n])) + bias[n]``,
                            ``azp_adj = z_a * column sums of Bq``
ScaledEpilogueAzpPerToken   ``D = s_a[m] * (s_b[n] * (acc - azp[m] azp_adj[n])) + bias[n]``,
                            ``azp_adj = column sums of Bq``
=========================== ===================================================

On Metal the epilogue is fused into the GEMM kernel (``metal/include/int8_gemm.h``)
and evaluated in double-word arithmetic in that order of operations; the cpu backend
evaluates it in float64. Either way the result is rounded once to the output dtype,
so it equals the exactly rounded value of the formula except in rare near-ties
(docs/int8.md gives the measured figures).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..core import backends
from ..core.streams import streamed
from ..doubleword.types import read_input
from ..core.autodiff import _TRACED, host_guard
from .engine import check_k, device_buffer, gemm_grid
from ..core.kernels import Codes, Kernel, ParamLayout, generated_block

OUT_DTYPES = (mx.float32, mx.float16, mx.bfloat16)
_FLOAT_DTYPES = (mx.float32, mx.float16, mx.bfloat16)

EPILOGUE = Codes("INT8_EPILOGUE", ("scaled", "bias", "azp", "azp_per_token"))
"""The epilogue kinds, CUTLASS's ScaledEpilogue, ScaledEpilogueBias, ScaledEpilogueAzp
and ScaledEpilogueAzpPerToken (``INT8_EPILOGUE_SCALED`` ... in
``metal/include/int8_gemm.h``, ``Int8ScaledEpilogue::kind``)."""

INT8_SCALED_MM_PARAMS = ParamLayout("INT8_SCALED_MM", (
    "m", "n", "k",
    "sa_step", "sb_step",  # scale_a[m * sa_step], scale_b[n * sb_step] (0: per tensor)
    "epilogue",            # an EPILOGUE code
    "has_bias",
), size=8)
"""The int32 ``p`` buffer of :data:`INT8_SCALED_MM` (``INT8_SCALED_MM_M`` ... in
``metal/include/int8_gemm.h``)."""


def codes_source() -> str:
    """The second generated block of ``metal/include/int8_gemm.h`` (a test checks
    that the header holds exactly this text)."""
    return generated_block("mlx_precise.int8.scaled.codes_source()", EPILOGUE,
                           INT8_SCALED_MM_PARAMS)


INT8_SCALED_MM = Kernel(
    name="int8_scaled_mm",
    body="int8_scaled_mm.metal",
    headers=("int8_gemm.h",),
    inputs=("a", "b", "scale_a", "scale_b", "bias", "azp_adj", "azp", "p"),
    outputs=("d",),
    template=("T",),
    input_dtypes={
        "a": (mx.int8,), "b": (mx.int8,), "scale_a": (mx.float32,),
        "scale_b": (mx.float32,), "bias": (mx.float32,), "azp_adj": (mx.int32,),
        "azp": (mx.int32,), "p": (mx.int32,),
    },
    extended=True,  # double-word epilogue: needs exact TwoSum / fma on the device
    variants={"T": (mx.float32, mx.float16, mx.bfloat16), "d": "T"},
    # device_buffer and INT8_SCALED_MM_PARAMS give every input >= 8 elements
    input_forms=dict.fromkeys(("a", "b", "scale_a", "scale_b", "bias", "azp_adj", "azp", "p"), ("device",)),
)
"""The int8 GEMM with a fused scaled epilogue (``metal/kernels/int8_scaled_mm.metal``):
inputs are flat buffers (:func:`mlx_precise.int8.engine.device_buffer`), ``p`` int32
``(8,)`` (:data:`INT8_SCALED_MM_PARAMS`); output ``d`` of dtype
``T`` (float32, float16, bfloat16) ``[M, N]``."""


# ---- quantization ---------------------------------------------------------------------

_I32_LO, _I32_HI = -(2.0**31), 2.0**31


def _float_input(x, name: str) -> mx.array:
    x = read_input(x, name)
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {x.dtype}")
    return x.astype(mx.float32)  # exact


def _sat32(v: mx.array) -> mx.array:
    """rint(v) saturated to int32, as int64 (NaN -> 0, like CUDA's cvt.rni.sat)."""
    v = mx.where(mx.isnan(v), 0.0, v)
    r = mx.clip(mx.round(v), _I32_LO, _I32_HI).astype(mx.int64)
    return mx.minimum(r, 2**31 - 1)


def _sat8(q: mx.array) -> mx.array:
    return mx.clip(q, -128, 127).astype(mx.int8)


def _poison_rows(bad: mx.array, q: mx.array, s: mx.array, zp: mx.array | None):
    """Rows flagged by ``bad`` (``[..., 1]``) get scale NaN, codes 0 and zero point 0.

    int8 has no code for NaN or Inf, so the row's scale carries them: every
    dequantized value ``scale * (q - azp)`` of the row is NaN, and so is every
    output of that row of :func:`scaled_mm` (``s_a[m]`` multiplies each of them) --
    the rows a float32 product ``x @ W`` makes NaN (or Inf). Pure MLX operations on
    the values, no host read: the same result eagerly and under ``mx.compile`` /
    ``mx.vmap``."""
    q = mx.where(bad, mx.array(0, mx.int8), q)
    s = mx.where(bad, mx.array(float("nan"), mx.float32), s)
    return q, s, None if zp is None else mx.where(bad, mx.array(0, zp.dtype), zp)


def _per_row(v, name: str, rows_shape: tuple, dtype, kind: str) -> mx.array:
    """A static scale / zero point: numel 1, or one per row (shape ``[..., 1]``)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = mx.array(v, dtype=dtype)
    v = read_input(v, name)
    if v.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype} ({kind}), got {v.dtype}")
    if v.size != 1 and tuple(v.shape) != rows_shape + (1,):
        raise ValueError(
            f"{name} must have one element or shape {rows_shape + (1,)} (one per row), "
            f"got shape {tuple(v.shape)}"
        )
    return v


@streamed
def quantize_int8(x: mx.array, *, scale=None, azp=None, symmetric: bool = True, stream=None):
    """Quantize to int8, per tensor (static) or per token (dynamic, one scale per row).

    Static (``scale`` given), as vLLM's ``static_scaled_int8_quant``:
    ``q = sat8(rint(x / scale))``, or with ``azp``: ``q = sat8(sat32(rint(x / scale)) + azp)``.

    Dynamic (``scale`` None), per row of the last axis, as vLLM's
    ``dynamic_scaled_int8_quant``:

    * symmetric: ``scale = absmax / 127``, ``q = sat8(rint(x * (127 / absmax)))``
      (all-zero rows: scale 0, q 0);
    * asymmetric: ``scale = (max - min) / 255``, ``azp = rint(-128 - min / scale)``,
      ``q = sat8(sat32(rint(x / scale)) + azp)``; a constant row (``max == min``)
      uses the range ``[min(c, 0), max(c, 0)]``, and an all-zero row scale 1 and
      azp -128, so that ``scale * (q - azp)`` still reproduces it.

    Every step is one float32 operation as written (``/`` and ``*`` correctly
    rounded), ``rint`` rounds half to even, ``sat8`` / ``sat32`` saturate.
    ``x ~ scale * (q - azp)``.

    NaN and Inf: int8 has no code for them, so the row's scale carries them. A row
    holding a NaN (in dynamic mode: a NaN or an Inf) gets scale NaN, codes 0 and zero
    point 0, so that every dequantized value of the row is NaN, and so is every output
    of that row of :func:`scaled_mm` / :class:`~mlx_precise.nn.Int8Linear`: the rows
    a float32 ``x @ W`` makes NaN (with an Inf: non-finite). Other rows are unchanged.
    In static mode an Inf saturates like any value out of range. The same in eager
    and traced calls (``mx.compile``, ``mx.vmap``): no value is read on the host.

    Args:
        x: float32, float16 or bfloat16, shape ``[..., K]`` (rows: all but the last axis).
        scale: static scale, float32 (or a Python float), one element or ``[..., 1]``;
            nonzero and finite.
        azp: static zero point, int32 (or a Python int), one element or ``[..., 1]``;
            only with ``scale``.
        symmetric: dynamic mode only: False computes a zero point per row.
        stream: MLX stream or device (``mx.Stream``, ``mx.Device``) the op's MLX
            ops and kernel launches run on; None: the default stream.

    Returns:
        ``(q, scale, azp)``: int8 of ``x``'s shape; float32 scale, one per row
        (``[..., 1]``, in static mode the given scale broadcast, NaN in the rows with
        a NaN); int32 zero point (``[..., 1]`` when dynamic, as given when static) or
        None.

    Raises:
        TypeError: wrong types or dtypes.
        ValueError: ``x`` is 0-d, a dynamic row is empty, ``azp`` without ``scale``,
            ``symmetric=False`` with a static scale, scale shapes that fit neither
            form, a zero or non-finite static scale (checked in eager calls; traced,
            such a scale gives every row scale NaN).
    """
    xf = _float_input(x, "x")
    if xf.ndim == 0:
        raise ValueError("x must have at least one dimension (rows are all but the last)")
    rows = tuple(xf.shape[:-1])
    if scale is None:
        if azp is not None:
            raise ValueError("azp given without scale: static quantization needs both")
        if xf.shape[-1] == 0:
            raise ValueError("x has empty rows (last dimension 0): no dynamic scale exists")
        bad = mx.any(~mx.isfinite(xf), axis=-1, keepdims=True)
        if symmetric:
            absmax = mx.max(mx.abs(xf), axis=-1, keepdims=True)
            s = absmax / 127.0
            inv = 127.0 / absmax  # inf for an all-zero row: 0 * inf = NaN -> 0
            return _poison_rows(bad, _sat8(_sat32(xf * inv)), s, None)
        hi = mx.max(xf, axis=-1, keepdims=True)
        lo = mx.min(xf, axis=-1, keepdims=True)
        const = hi == lo
        hi = mx.where(const, mx.maximum(hi, 0.0), hi)
        lo = mx.where(const, mx.minimum(lo, 0.0), lo)
        s = (hi - lo) / 255.0
        s = mx.where(s == 0, 1.0, s)
        zp = _sat32(-128.0 - lo / s)
        q = _sat8(_sat32(xf / s) + zp)
        return _poison_rows(bad, q, s, zp.astype(mx.int32))
    if not symmetric:
        raise ValueError(
            "symmetric=False is for dynamic quantization; pass azp with a static scale")
    s = _per_row(scale, "scale", rows, mx.float32, "float32")
    valid = mx.isfinite(s) & (s != 0)
    try:
        if not bool(mx.all(valid).item()):
            raise ValueError("scale must be nonzero and finite")
    except ValueError as e:  # traced: the value is not there to check; NaN rows below
        if _TRACED not in str(e):
            raise
    # One element broadcasts as a scalar (whatever its shape); [..., 1] per row.
    s1 = mx.reshape(s, ()) if s.size == 1 else s
    v = xf / s1
    if azp is None:
        q, z = _sat8(_sat32(v)), None
    else:
        z = _per_row(azp, "azp", rows, mx.int32, "int32")
        q = _sat8(_sat32(v) + (mx.reshape(z, ()) if z.size == 1 else z).astype(mx.int64))
    bad = mx.any(mx.isnan(xf), axis=-1, keepdims=True) | ~mx.reshape(valid, s1.shape)
    q, s_rows, _ = _poison_rows(bad, q, mx.broadcast_to(s1, rows + (1,)), None)
    return q, s_rows, z


@streamed
def compute_azp_adj(b: mx.array, azp=None, *, stream=None) -> mx.array:
    """The ``azp_adj`` term of the zero-point epilogues, from the int8 weight ``b``.

    Args:
        b: int8 ``[K, N]``.
        azp: None for the per-token epilogue (``azp_adj = column sums of b``), or the
            per-tensor zero point (int, or int32 ``mx.array`` with one element):
            ``azp_adj = azp * column sums of b``.
        stream: MLX stream or device (``mx.Stream``, ``mx.Device``) the op's MLX
            ops and kernel launches run on; None: the default stream.

    Returns:
        int32 ``[N]``, exact.

    Raises:
        TypeError: ``b`` not int8, ``azp`` not an int / int32.
        ValueError: ``b`` not 2-D, ``azp`` not one element, a value outside int32.
    """
    if not isinstance(b, mx.array) or b.dtype != mx.int8:
        raise TypeError(f"b must be an int8 mx.array, got {getattr(b, 'dtype', type(b).__name__)}")
    if b.ndim != 2:
        raise ValueError(f"b must be [K, N], got shape {tuple(b.shape)}")
    sums = mx.sum(b.astype(mx.int32), axis=0)  # |sum| <= 128 K: exact
    if azp is None:
        return sums
    if isinstance(azp, mx.array):
        if azp.dtype != mx.int32:
            raise TypeError(f"azp must be int32, got {azp.dtype}")
        if azp.size != 1:
            raise ValueError(f"per-tensor azp must have one element, got shape {tuple(azp.shape)}")
        azp = int(azp.reshape(()).item())
    elif not isinstance(azp, (int, np.integer)) or isinstance(azp, bool):
        raise TypeError(f"azp must be an int or an int32 mx.array, got {type(azp).__name__}")
    adj = np.array(sums, dtype=np.int64) * int(azp)
    if adj.size and (adj.min() < -(2**31) or adj.max() >= 2**31):
        raise ValueError(f"azp * column sums of b overflows int32 (azp = {azp})")
    return mx.array(adj.astype(np.int32))


# ---- scaled_mm ----------------------------------------------------------------------


def _scale(v, name: str, n: int, shape: tuple) -> tuple[mx.array, int]:
    """(flat float32 scale, index step): step 0 for one element, 1 for ``shape``."""
    v = mx.array(v, dtype=mx.float32) if isinstance(v, float) else read_input(v, name)
    if v.dtype != mx.float32:
        raise TypeError(f"{name} must have dtype float32, got {v.dtype}")
    if v.size == 1:
        return mx.reshape(v, (1,)), 0
    if tuple(v.shape) != shape:
        raise ValueError(
            f"{name} must have one element (per tensor) or shape {shape}, got {tuple(v.shape)}"
        )
    return mx.reshape(v, (n,)), 1


def _vector(v, name: str, n: int, dtypes, what: str, shapes) -> mx.array:
    v = read_input(v, name)
    if v.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {what}, got {v.dtype}")
    if tuple(v.shape) not in shapes:
        raise ValueError(f"{name} must have shape {shapes[0]}, got {tuple(v.shape)}")
    return mx.reshape(v, (n,))


def _round_once(y: np.ndarray, out_dtype) -> mx.array:
    """float64 values rounded once to ``out_dtype``. float32: numpy's RN conversion.
    float16 / bfloat16: first to float32 "to odd" (truncate, then set the last bit
    when inexact), so that MLX's RNE float32 -> 16-bit conversion rounds the float64
    value correctly (Boldo & Melquiond 2008: 24 >= 11 + 2 significand bits)."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = y.astype(np.float32)
        if out_dtype == mx.float32:
            return mx.array(f)
        bits = f.view(np.uint32).copy()
        inexact = np.isfinite(f) & (f.astype(np.float64) != y)
        away = inexact & (np.abs(f.astype(np.float64)) > np.abs(y))
        bits[away] -= np.uint32(1)
        bits[inexact] |= np.uint32(1)
    return mx.array(bits.view(np.float32)).astype(out_dtype)


@host_guard
@streamed
def scaled_mm(a: mx.array, b: mx.array, scale_a: mx.array, scale_b: mx.array, *,
              bias: mx.array | None = None, azp_adj: mx.array | None = None,
              azp: mx.array | None = None, out_dtype=mx.float32,
              backend: str | None = None, stream=None) -> mx.array:
    """Scaled int8 matrix product with a CUTLASS / vLLM epilogue, rounded once.

    ``acc = a @ b`` exactly (int32), then, by the arguments given:

    * no ``azp_adj``: ``D = s_a[m] * (s_b[n] * acc)`` (+ ``bias[n]``);
    * ``azp_adj`` only (per-tensor zero point, ``azp_adj = z_a * colsum(b)``):
      ``D = s_a * (s_b[n] * (acc - azp_adj[n])) + bias[n]``;
    * ``azp_adj`` and ``azp`` (per-token zero points, ``azp_adj = colsum(b)``):
      ``D = s_a[m] * (s_b[n] * (acc - azp[m] * azp_adj[n])) + bias[n]``;

    evaluated in that order of operations (integer part exactly, in 64 bits), with
    more than float32 precision (double-word on Metal, float64 on cpu), and rounded
    once to ``out_dtype``. A missing bias counts as 0. See :func:`compute_azp_adj`.

    Args:
        a: int8 ``[M, K]``.
        b: int8 ``[K, N]``.
        scale_a: float32, one element (per tensor) or ``[M, 1]`` (per token).
        scale_b: float32, one element (per tensor) or ``[1, N]`` (per channel).
        bias: float32, float16 or bfloat16 ``[N]``, optional.
        azp_adj: int32 ``[N]``, optional.
        azp: int32 ``[M]`` (or ``[M, 1]``), optional; needs ``azp_adj``.
        out_dtype: ``mx.float32``, ``mx.float16`` or ``mx.bfloat16``.
        backend: ``"metal"``, ``"emulate"``, ``"cpu"`` or None (the active one).
        stream: MLX stream or device (``mx.Stream``, ``mx.Device``) the op's MLX
            ops and kernel launches run on; None: the default stream.

    Returns:
        ``out_dtype`` ``[M, N]``.

    Raises:
        TypeError: an argument has the wrong type or dtype.
        ValueError: wrong ranks or shapes, K differs between ``a`` and ``b``,
            ``azp`` without ``azp_adj``, an unsupported ``out_dtype``, K > 131071.
    """
    a, b = read_input(a, "a"), read_input(b, "b")
    for name, v in (("a", a), ("b", b)):
        if v.dtype != mx.int8:
            raise TypeError(f"{name} must have dtype int8, got {v.dtype}")
        if v.ndim != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(v.shape)}")
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise ValueError(
            f"a is [M, K] = {tuple(a.shape)} and b is [K, N] = {tuple(b.shape)}: K differs")
    check_k(k)
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype must be float32, float16 or bfloat16, got {out_dtype}")
    sa, sa_step = _scale(scale_a, "scale_a", m, (m, 1))
    sb, sb_step = _scale(scale_b, "scale_b", n, (1, n))
    if bias is not None:
        bias = _vector(bias, "bias", n, _FLOAT_DTYPES, "float32, float16 or bfloat16",
                       [(n,)]).astype(mx.float32)
    if azp is not None and azp_adj is None:
        raise ValueError("azp (per-token zero points) needs azp_adj (column sums of b)")
    if azp_adj is not None:
        azp_adj = _vector(azp_adj, "azp_adj", n, (mx.int32,), "int32", [(n,)])
    if azp is not None:
        azp = _vector(azp, "azp", m, (mx.int32,), "int32", [(m,), (m, 1)])
    kind = EPILOGUE["azp_per_token" if azp is not None else "azp" if azp_adj is not None
                    else "bias" if bias is not None else "scaled"]

    name = backends.resolve(backend)

    def product(sa, sb, *bias_):
        bias = bias_[0] if bias_ else None
        if not name.has_kernels:
            return _scaled_mm_cpu(a, b, sa, sb, bias, azp_adj, azp, kind, out_dtype)
        if m * n == 0:
            return mx.zeros((m, n), dtype=out_dtype)
        grid, tg = gemm_grid(m, n)
        dummy_f, dummy_i = mx.zeros((1,), mx.float32), mx.zeros((1,), mx.int32)
        (d,) = INT8_SCALED_MM(
            inputs=[device_buffer(a), device_buffer(b), device_buffer(sa), device_buffer(sb),
                    device_buffer(dummy_f if bias is None else bias),
                    device_buffer(dummy_i if azp_adj is None else azp_adj),
                    device_buffer(dummy_i if azp is None else azp),
                    INT8_SCALED_MM_PARAMS.pack(m=m, n=n, k=k, sa_step=sa_step,
                                               sb_step=sb_step, epilogue=kind,
                                               has_bias=bias is not None)],
            template={"T": out_dtype}, grid=grid, threadgroup=tg,
            output_shapes=[(m, n)], output_dtypes=[out_dtype], backend=name,
        )
        return d

    floats = (sa, sb) if bias is None else (sa, sb, bias)
    return _differentiable(product, a, b, azp_adj, azp)(*floats)


def _differentiable(product, a, b, azp_adj, azp):
    """``product(sa, sb[, bias])`` with its derivative in the float operands (the
    int8 and integer ones have none): D = s_a (s_b acc') + bias is linear in each,
    so the cotangent G (float32) gives dL/ds_a = sum_n G s_b acc', dL/ds_b =
    sum_m G s_a acc', dL/dbias = sum_m G, with acc' the corrected integer product
    (in float32: a gradient's precision). Without it MLX would differentiate the
    cpu path's host round trip as zero and raise for the kernel launch."""

    @mx.custom_function
    def f(*floats):
        return product(*floats)

    @f.vjp
    def f_vjp(primals, cotangent, output):
        sa, sb = primals[0], primals[1]
        g = cotangent.astype(mx.float32)
        acc = a.astype(mx.float32) @ b.astype(mx.float32)
        if azp_adj is not None:
            adj = azp_adj.astype(mx.float32)[None, :]
            acc = acc - (adj if azp is None else azp.astype(mx.float32)[:, None] * adj)
        ga = g * acc
        d_sa = (ga * sb[None, :]).sum(axis=1)
        d_sb = (ga * sa[:, None]).sum(axis=0)
        out = [d_sa if sa.size > 1 else d_sa.sum().reshape(1),
               d_sb if sb.size > 1 else d_sb.sum().reshape(1)]
        if len(primals) > 2:
            out.append(g.sum(axis=0).astype(primals[2].dtype))
        return tuple(out)

    return f


def _scaled_mm_cpu(a, b, sa, sb, bias, azp_adj, azp, kind, out_dtype) -> mx.array:
    """The cpu backend: float64 BLAS product of the int8 values (exact: integer
    partial sums below 2^53), integer corrections in int64, the epilogue in float64
    in the published order, one rounding to ``out_dtype``."""
    acc = (np.array(a, dtype=np.float64) @ np.array(b, dtype=np.float64)).astype(np.int64)
    if kind == EPILOGUE["azp"]:
        acc = acc - np.array(azp_adj, dtype=np.int64)[None, :]
    elif kind == EPILOGUE["azp_per_token"]:
        zp = np.array(azp, dtype=np.int64)[:, None]
        acc = acc - zp * np.array(azp_adj, dtype=np.int64)[None, :]
    s_a = np.array(sa, dtype=np.float64)[:, None]
    s_b = np.array(sb, dtype=np.float64)[None, :]
    with np.errstate(over="ignore", invalid="ignore"):
        y = s_a * (s_b * acc.astype(np.float64))
        if bias is not None:
            y = y + np.array(bias, dtype=np.float64)[None, :]
    return _round_once(y, out_dtype)

