"""Q1.15 / Q1.31 fixed-point simulation: conversions as Metal kernels and on the cpu.

A Q1.15 code is an int16 ``q`` standing for ``q / 2^15`` (range [-1, 1 - 2^-15], step
2^-15); a Q1.31 code is an int32 ``q`` standing for ``q / 2^31``. Conversion from float
follows the "SF16" reference code, a Q1.15 variant of llm.c (docs/fixedpoint.md):

1. clamp ``x`` to ``[-threshold, threshold]`` (Q1.15 default 0.999, the reference's
   ``Q115_OVERFLOW_THRESHOLD``; Q1.31 default 1.0), the threshold taken as the
   nearest float32 (0.999 -> 0.99900001287...);
2. multiply by ``2^15`` (or ``2^31``), exactly;
3. round to an integer: ``"half_even"`` (default, the reference), ``"half_away"``
   (CMSIS-DSP's ``arm_float_to_q15`` with ``ARM_MATH_ROUNDING``) or ``"truncate"``
   (CMSIS-DSP's default, toward zero);
4. saturate to ``[-2^15, 2^15 - 1]`` (``[-2^31, 2^31 - 1]``).

Special values (a deliberate policy, see docs/fixedpoint.md): +-Inf clamp like any
large value (to the code of +-threshold); NaN converts to code 0 in ``float_to_q*``
(an integer has no NaN; 0 is what AArch64's saturating conversions give and is
sign-neutral, whereas the reference's clamp sends NaN to +threshold only as an
accident of argument order), and the fused ``simulate_q*`` returns NaN for NaN, so
that a diverging simulation shows up in the loss instead of continuing from a
plausible value. Signed zeros are not kept: every zero code reads back as +0.

Every function takes any shape and returns the same shape. Inputs are float32,
float16 or bfloat16 (converted to float32 exactly). ``backend`` is ``"metal"``,
``"emulate"`` (the Metal kernels of ``metal/kernels/fixedpoint_*.metal``) or
``"cpu"`` (MLX CPU float64 operations, a second, independent implementation); None
means the active backend (:func:`mlx_precise.backend`).
"""

from __future__ import annotations

import functools
import math
import numbers

import mlx.core as mx
import numpy as np

from ..core import backends
from ..core.streams import streamed
from ..doubleword.types import read_input
from ..core.autodiff import host_guard
from ..core.kernels import Codes, Kernel, ParamLayout, generated_block, per_element_of_first_input

Q115_THRESHOLD = 0.999
"""Default clamp of the Q1.15 conversions (the reference's ``Q115_OVERFLOW_THRESHOLD``)."""
Q131_THRESHOLD = 1.0
"""Default clamp of the Q1.31 conversions (the reference clamps to [-1, 1])."""
ROUNDING = Codes("FX_ROUNDING", ("half_even", "half_away", "truncate"))
"""The kernels' rounding-mode codes, by name (``FX_ROUNDING_HALF_EVEN`` ... in
``metal/include/fixedpoint.h``)."""
ROUNDING_MODES = ROUNDING.names
"""The rounding modes the functions accept."""

_FLOAT_IN = (mx.float32, mx.float16, mx.bfloat16)
_STORAGE = (mx.float32, mx.bfloat16, mx.float16)
_CODE_DTYPE = {15: mx.int16, 31: mx.int32}


FX_PARAMS = ParamLayout("FX_PARAM", (
    "threshold_bits",  # the float32 threshold's bit pattern, as an int32 (as_type<float>)
    "rounding",        # a ROUNDING code
    "bits",            # b: 15 (Q1.15) or 31 (Q1.31)
), size=8)
"""The ``params`` buffer of ``fixedpoint_quantize`` and ``fixedpoint_simulate``
(``FX_PARAM_THRESHOLD_BITS`` ... in ``metal/include/fixedpoint.h``)."""


def codes_source() -> str:
    """The generated block of ``metal/include/fixedpoint.h`` (a test checks that the
    header holds exactly this text)."""
    return generated_block("mlx_precise.fixedpoint.qformat.codes_source()", ROUNDING,
                           FX_PARAMS)


FX_QUANTIZE = Kernel(
    name="fixedpoint_quantize",
    body="fixedpoint_quantize.metal",
    headers=("fixedpoint.h",),
    inputs=("x", "params"),
    outputs=("q",),
    input_dtypes={"x": _FLOAT_IN, "params": (mx.int32,)},
    grid=per_element_of_first_input,
    extended=False,
    variants={"q": (mx.int16, mx.int32)},
)
"""float -> Q1.b codes. Inputs ``x`` (float32/float16/bfloat16, ``(n,)``) and
``params`` (int32 ``(8,)``, :data:`FX_PARAMS`); output ``q``
(int16 for b = 15, int32 for b = 31), ``(n,)``."""

FX_DEQUANTIZE = Kernel(
    name="fixedpoint_dequantize",
    body="fixedpoint_dequantize.metal",
    headers=("fixedpoint.h",),
    inputs=("q",),
    outputs=("y",),
    template=("BITS",),
    input_dtypes={"q": (mx.int16, mx.int32)},
    grid=per_element_of_first_input,
    extended=False,
    variants={"BITS": (15, 31), "y": (mx.float32,)},
)
"""Q1.b codes -> float32. Input ``q`` (int16 with ``BITS=15``, int32 with
``BITS=31``), ``(n,)``; output ``y`` float32 ``(n,)``."""

FX_SIMULATE = Kernel(
    name="fixedpoint_simulate",
    body="fixedpoint_simulate.metal",
    headers=("fixedpoint.h",),
    inputs=("x", "params"),
    outputs=("y",),
    template=("T",),
    input_dtypes={"x": _FLOAT_IN, "params": (mx.int32,)},
    grid=per_element_of_first_input,
    extended=False,
    variants={"T": _FLOAT_IN, "y": "T"},
)
"""Fused float -> Q1.b -> float. Inputs as :data:`FX_QUANTIZE`; output ``y`` of
dtype ``T`` (float32, bfloat16 or float16), ``(n,)``."""


# ---- argument checks ---------------------------------------------------------


def _check_float(x, fn: str) -> mx.array:
    x = read_input(x, f"{fn}: x")
    if x.dtype not in _FLOAT_IN:
        raise TypeError(
            f"{fn}: x must have dtype float32, float16 or bfloat16, got {x.dtype}"
        )
    return x


def _check_code(q, bits: int, fn: str) -> mx.array:
    want = _CODE_DTYPE[bits]
    q = read_input(q, f"{fn}: q")
    if q.dtype != want:
        raise TypeError(f"{fn}: q must have dtype {want} (Q1.{bits} codes), got {q.dtype}")
    return q


def _check_threshold(threshold, fn: str) -> np.float32:
    """The threshold as the nearest float32, which must lie in (0, 1]."""
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real):
        raise TypeError(
            f"{fn}: threshold must be a real number in (0, 1], got {type(threshold).__name__}"
        )
    t = float(threshold)
    if not (0.0 < t <= 1.0) or np.float32(t) == 0:
        raise ValueError(f"{fn}: threshold must lie in (0, 1], got {threshold!r}")
    return np.float32(t)


def _check_rounding(rounding, fn: str) -> int:
    if not isinstance(rounding, str) or rounding not in ROUNDING:
        raise ValueError(
            f"{fn}: rounding must be one of {', '.join(map(repr, ROUNDING_MODES))}, "
            f"got {rounding!r}"
        )
    return ROUNDING[rounding]


def _check_storage(storage_dtype, fn: str) -> mx.Dtype:
    if storage_dtype is None:
        return mx.float32
    if storage_dtype not in _STORAGE:
        raise ValueError(
            f"{fn}: storage_dtype must be None, mx.float32, mx.bfloat16 or mx.float16, "
            f"got {storage_dtype!r}"
        )
    return storage_dtype


@functools.lru_cache(maxsize=64)  # reused by every boundary of an SF16 model
def _params(t: np.float32, rounding: int, bits: int) -> mx.array:
    return FX_PARAMS.pack(threshold_bits=np.float32(t).view(np.int32), rounding=rounding,
                          bits=bits)


# ---- the cpu backend: MLX CPU float64 ----------------------------------------


def _cpu_rounded(x: mx.array, t: np.float32, rounding: int, bits: int) -> mx.array:
    """float64 integral codes (NaN where x is NaN) computed on the CPU stream.

    Every step is exact in float64: clamping, scaling a float32 by 2^b, rounding
    (mx.round rounds half to even), and y - trunc(y)."""
    v = x.astype(mx.float64)
    y = mx.clip(v, -float(t), float(t)) * float(2**bits)
    if rounding == ROUNDING["half_even"]:
        r = mx.round(y)
    elif rounding == ROUNDING["truncate"]:
        r = mx.trunc(y)
    else:
        tr = mx.trunc(y)
        r = mx.where(mx.abs(y - tr) >= 0.5, tr + mx.sign(y), tr)
    return mx.minimum(r, float(2**bits - 1))  # NaN stays NaN


def _cpu_codes(x, t, rounding, bits) -> mx.array:
    with mx.stream(mx.cpu):
        r = _cpu_rounded(x, t, rounding, bits)
        return mx.where(mx.isnan(r), 0.0, r).astype(_CODE_DTYPE[bits])


def _cpu_values(q: mx.array, bits: int) -> mx.array:
    with mx.stream(mx.cpu):
        # q / 2^b is exact in float64; one rounding to float32 (RN).
        return (q.astype(mx.float64) * 2.0**-bits).astype(mx.float32)


def _cpu_simulate(x, t, rounding, bits, storage) -> mx.array:
    with mx.stream(mx.cpu):
        r = _cpu_rounded(x, t, rounding, bits)
        r = mx.where(r == 0, 0.0, r)  # code 0 reads as +0, as in the kernel
        y = (r * 2.0**-bits).astype(mx.float32)  # NaN propagates
        return y.astype(storage)


# ---- one launch path ---------------------------------------------------------


def _launch(kernel: Kernel, x: mx.array, out_dtype, backend: str, params=None, template=None):
    inputs = [x.reshape(-1)] + ([params] if params is not None else [])
    (out,) = kernel(
        inputs=inputs, template=template, output_shapes=[(x.size,)],
        output_dtypes=[out_dtype], backend=backend,
    )
    return out.reshape(x.shape)


def _to_codes(x, threshold, rounding, bits, backend, fn):
    x = _check_float(x, fn)
    t = _check_threshold(threshold, fn)
    r = _check_rounding(rounding, fn)
    name = backends.resolve(backend)
    if x.size == 0:
        return mx.zeros(x.shape, _CODE_DTYPE[bits])
    if not name.has_kernels:
        return _cpu_codes(x, t, r, bits)
    return _launch(FX_QUANTIZE, x, _CODE_DTYPE[bits], name, params=_params(t, r, bits))


def _to_values(q, bits, backend, fn):
    q = _check_code(q, bits, fn)
    name = backends.resolve(backend)
    if q.size == 0:
        return mx.zeros(q.shape, mx.float32)
    if not name.has_kernels:
        return _cpu_values(q, bits)
    return _launch(FX_DEQUANTIZE, q, mx.float32, name, template={"BITS": bits})


def _simulate(x, threshold, rounding, storage_dtype, bits, backend, fn):
    x = _check_float(x, fn)
    t = _check_threshold(threshold, fn)
    r = _check_rounding(rounding, fn)
    storage = _check_storage(storage_dtype, fn)
    name = backends.resolve(backend)
    if x.size == 0:
        return mx.zeros(x.shape, storage)
    if not name.has_kernels:
        return _cpu_simulate(x, t, r, bits, storage)
    return _simulate_kernel(storage, name)(x, _params(t, r, bits))


@functools.cache
def _simulate_kernel(storage, backend):
    """The simulation's launch on a kernel backend as a function of ``(x, params)``
    with the derivative MLX gives the cpu path's ops (clip, scaling, ``mx.round``):
    zero, as a rounding's derivative is (MLX has no derivative of a kernel launch:
    ``mx.grad`` would raise for one backend what it computes on another)."""

    @mx.custom_function
    def simulate(x, params):
        return _launch(FX_SIMULATE, x, storage, backend, params=params,
                       template={"T": storage})

    @simulate.vjp
    def simulate_vjp(primals, cotangents, outputs):
        return tuple(mx.zeros_like(p) for p in primals)

    return simulate


# ---- public API --------------------------------------------------------------


@host_guard
@streamed
def float_to_q115(x, threshold: float = Q115_THRESHOLD, rounding: str = "half_even", *,
                  backend: str | None = None, stream=None) -> mx.array:
    """Q1.15 codes of ``x``: clamp to +-threshold, multiply by 2^15, round, saturate
    to [-32768, 32767]. NaN -> 0; +-Inf -> the code of +-threshold.

    Args:
        x: float32, float16 or bfloat16 ``mx.array``, any shape.
        threshold: clamp bound, a real number in (0, 1], used as the nearest float32.
        rounding: ``"half_even"`` (default), ``"half_away"`` or ``"truncate"``.
        backend: ``"metal"``, ``"emulate"``, ``"cpu"`` or None (the active backend).
        stream: MLX stream or device (``mx.Stream``, ``mx.Device``) the op's MLX
            ops and kernel launches run on; None: the default stream.

    Returns:
        int16 ``mx.array`` of ``x``'s shape.

    Raises:
        TypeError: ``x`` is not an ``mx.array`` of dtype float32, float16 or
            bfloat16, or ``threshold`` is not a real number.
        ValueError: ``threshold`` outside (0, 1], unknown ``rounding`` or ``backend``.
        BackendUnavailableError: the requested backend cannot run here.
    """
    return _to_codes(x, threshold, rounding, 15, backend, "float_to_q115")


@host_guard
@streamed
def float_to_q131(x, threshold: float = Q131_THRESHOLD, rounding: str = "half_even", *,
                  backend: str | None = None, stream=None) -> mx.array:
    """Q1.31 codes of ``x``: clamp to +-threshold (default 1), multiply by 2^31,
    round, saturate to [-2^31, 2^31 - 1]. NaN -> 0; +-Inf -> the code of +-threshold.

    Args, Raises: as :func:`float_to_q115`.

    Returns:
        int32 ``mx.array`` of ``x``'s shape.
    """
    return _to_codes(x, threshold, rounding, 31, backend, "float_to_q131")


@host_guard
@streamed
def q115_to_float(q, *, backend: str | None = None, stream=None) -> mx.array:
    """Values ``q / 2^15`` of Q1.15 codes (exact in float32).

    Args:
        q: int16 ``mx.array``, any shape.
        backend: ``"metal"``, ``"emulate"``, ``"cpu"`` or None (the active backend).
        stream: MLX stream or device (``mx.Stream``, ``mx.Device``) the op's MLX
            ops and kernel launches run on; None: the default stream.

    Returns:
        float32 ``mx.array`` of ``q``'s shape.

    Raises:
        TypeError: ``q`` is not an int16 ``mx.array``.
        ValueError, BackendUnavailableError: as :func:`float_to_q115` for ``backend``.
    """
    return _to_values(q, 15, backend, "q115_to_float")


@host_guard
@streamed
def q131_to_float(q, *, backend: str | None = None, stream=None) -> mx.array:
    """Values ``q / 2^31`` of Q1.31 codes, rounded to the nearest float32 (ties to
    even; exact for ``|q| < 2^24``). The code ``2^31 - 1`` reads as ``1.0``.

    Args:
        q: int32 ``mx.array``, any shape.
        backend: ``"metal"``, ``"emulate"``, ``"cpu"`` or None (the active backend).
        stream: MLX stream or device (``mx.Stream``, ``mx.Device``) the op's MLX
            ops and kernel launches run on; None: the default stream.

    Returns:
        float32 ``mx.array`` of ``q``'s shape.

    Raises:
        TypeError: ``q`` is not an int32 ``mx.array``.
        ValueError, BackendUnavailableError: as :func:`float_to_q115` for ``backend``.
    """
    return _to_values(q, 31, backend, "q131_to_float")


@host_guard
@streamed
def simulate_q115(x, threshold: float = Q115_THRESHOLD, rounding: str = "half_even",
                  storage_dtype=None, *, backend: str | None = None, stream=None) -> mx.array:
    """Fused round trip ``q115_to_float(float_to_q115(x))`` in one pass (one read and
    one write per element), except that NaN stays NaN.

    Args:
        x, threshold, rounding, backend: as :func:`float_to_q115`.
        storage_dtype: None or ``mx.float32``: float32 output, the exact simulated
            value. ``mx.bfloat16`` or ``mx.float16``: that value rounded once more,
            to nearest even, as the reference stores activations in bf16 (with
            bf16, values near the threshold can round up to 1.0).
        stream: MLX stream or device (``mx.Stream``, ``mx.Device``) the op's MLX
            ops and kernel launches run on; None: the default stream.

    Returns:
        ``mx.array`` of ``x``'s shape, dtype ``storage_dtype`` (float32 for None).

    Raises:
        TypeError, ValueError, BackendUnavailableError: as :func:`float_to_q115`;
            ValueError also for a ``storage_dtype`` not listed above.
    """
    return _simulate(x, threshold, rounding, storage_dtype, 15, backend, "simulate_q115")


@host_guard
@streamed
def simulate_q131(x, threshold: float = Q131_THRESHOLD, rounding: str = "half_even",
                  storage_dtype=None, *, backend: str | None = None, stream=None) -> mx.array:
    """Fused round trip ``q131_to_float(float_to_q131(x))`` in one pass, except that
    NaN stays NaN. For ``|x| >= 2^-8`` every float32 is already on the Q1.31 grid,
    so only clamping acts there; below, values round to multiples of 2^-31.

    Args, Returns, Raises: as :func:`simulate_q115` (threshold default 1.0).
    """
    return _simulate(x, threshold, rounding, storage_dtype, 31, backend, "simulate_q131")


# ---- self-test ---------------------------------------------------------------


def exact_code(x: float, threshold: float, rounding: str, bits: int) -> int:
    """Reference code of one float (NaN -> 0) in exact integer arithmetic, written
    independently of both implementations (for the CLI self-test): ``x`` and the
    float32 threshold as ratios n / d with d a power of two, then floor division."""
    if math.isnan(x):
        return 0
    tn, td = float(np.float32(threshold)).as_integer_ratio()
    n, d = (tn if x > 0 else -tn, td) if math.isinf(x) else x.as_integer_ratio()
    if n * td > tn * d:  # clamp to [-t, t]
        n, d = tn, td
    elif n * td < -tn * d:
        n, d = -tn, td
    num = n << bits  # y = num / d
    fl, rem = divmod(num, d)  # floor(y), 0 <= rem < d
    if rounding == "truncate":
        q = fl + (rem != 0 and num < 0)
    elif 2 * rem != d:
        q = fl + (2 * rem > d)
    elif rounding == "half_even":
        q = fl + (fl % 2)
    else:  # ties away from zero
        q = fl + (num > 0)
    return max(-(2**bits), min(2**bits - 1, q))

