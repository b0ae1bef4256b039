"""Double-word elementwise operations: complex multiply and FFT scaling.

Each ``*_extended`` function runs a Metal kernel (backends ``metal`` / ``emulate``)
or native float64 on the ``cpu`` backend, and rounds once at the end
(``round_output=True``) or returns a :class:`~mlx_precise.DoubleWord`. The
plain-named twins (:func:`complex_multiply`, :func:`fft_scale`) follow
:func:`~mlx_precise.extended_precision`.
"""

from __future__ import annotations

from fractions import Fraction

import mlx.core as mx
import numpy as np

from ..core import backends
from ..core.arrays import as_int
from ..core.autodiff import as_tuple, host_guard
from .aware import precision_aware
from .engine64 import F64, arith64, from_float64_result
from . import fusion
from .fusion import guarded
from .types import DoubleWord, plain_input, read_input
from ..core.kernels import Kernel, per_element_of_first_input

_C64 = (mx.complex64,)
_F32 = (mx.float32,)

CMUL = Kernel(
    name="ext_cmul",
    body="ext_cmul.metal",
    headers=("doubleword.h",),
    inputs=("a_hi", "a_lo", "b_hi", "b_lo", "size"),
    outputs=("out",),
    template=("ROUND",),
    input_dtypes={"a_hi": _C64, "a_lo": _C64, "b_hi": _C64, "b_lo": _C64,
                  "size": (mx.int32,)},
    input_forms={"size": ("scalar",)},  # always a 0-d int32
    grid=per_element_of_first_input,  # (the words are broadcast to the result's shape)
    ensure_row_contiguous=False,  # broadcast operands are read through their strides
    variants={"ROUND": (False, True), "out": _C64},
)
"""The double-word complex product of broadcast complex64 words (see
``metal/kernels/ext_cmul.metal``); output the result rounded (``ROUND``), else
its packed words (:func:`~mlx_precise.doubleword.fusion.packed_shape` of the
result's shape)."""

SCALE = Kernel(
    name="ext_scale",
    body="ext_scale.metal",
    headers=("doubleword.h",),
    inputs=("x_hi", "x_lo", "s"),
    outputs=("out_hi", "out_lo"),
    template=("ROUND", "DW_IN"),
    input_dtypes={"x_hi": _F32, "x_lo": _F32, "s": _F32},
    grid=per_element_of_first_input,
    variants={"ROUND": (False, True), "DW_IN": (False, True), "out_hi": _F32, "out_lo": _F32},
)


def _words(x):
    """(hi, lo) words of an operand; lo of a plain array is a broadcast zero."""
    if isinstance(x, DoubleWord):
        return x.hi, x.lo
    return x, mx.broadcast_to(mx.zeros((), x.dtype), x.shape)


def _finish(hi: mx.array, lo: mx.array | None, round_output: bool):
    return hi if round_output else DoubleWord(hi, lo)


@host_guard
def complex_multiply_extended(a, b, *, round_output: bool = True, backend: str | None = None,
                              stream=None):
    """Complex product ``a * b`` in double-word arithmetic, rounded once.

    Args:
        a, b: complex64 ``mx.array`` or complex :class:`DoubleWord`, broadcastable
            (numpy broadcasting), any shape.
        round_output: return complex64 (one rounding) if True, else a DoubleWord.
        backend: ``"metal"``, ``"emulate"``, ``"cpu"`` or None (the active backend).

    Returns:
        complex64 ``mx.array`` of the broadcast shape, or a complex DoubleWord.
        For complex64 inputs every component is faithfully rounded (relative error
        <= 3u^2 + 13u^3 before the rounding, even under cancellation ad ~ bc).

    Raises:
        TypeError: an operand is not complex64 / a complex DoubleWord.
        ValueError: the shapes do not broadcast.
    """
    a = read_input(a, "a", "words", ("complex64",))
    b = read_input(b, "b", "words", ("complex64",))
    try:
        shape = tuple(np.broadcast_shapes(tuple(a.shape), tuple(b.shape)))
    except ValueError:
        raise ValueError(f"a and b do not broadcast: shapes {a.shape} and {b.shape}") from None
    name = backends.resolve(backend)
    if round_output and isinstance(a, mx.array) and isinstance(b, mx.array):
        return _cmul_differentiable(shape, name, stream)(a, b)
    dw = [isinstance(x, DoubleWord) for x in (a, b)]
    arrays = [w for x in (a, b) for w in ((x.hi, x.lo) if isinstance(x, DoubleWord) else (x,))]

    def run(*w):
        it = iter(w)
        xa, xb = (DoubleWord(next(it), next(it)) if d else next(it) for d in dw)
        y = _cmul(xa, xb, shape, round_output, name, stream)
        return y if round_output else (y.hi, y.lo)

    out = guarded(run, arrays, "complex_multiply_extended of a DoubleWord or with "
                  "round_output=False", name)
    return out if round_output else DoubleWord(*out)


def _cmul_differentiable(shape: tuple, name: str, stream):
    """The rounded product of two complex64 arrays of broadcast shape ``shape`` with
    its VJP (MLX's convention: da = g conj(b), db = g conj(a), summed over broadcast
    axes), each product by this same differentiable function (its operands then
    broadcast to ``shape`` too), so derivatives of any order exist."""

    @mx.custom_function
    def f(a, b):
        return _cmul(a, b, shape, True, name, stream)

    @f.vjp
    def f_vjp(primals, cotangent, output):
        a, b = primals
        g = as_tuple(cotangent)[0]
        return tuple(_sum_to(f(g, mx.conj(other)), tuple(x.shape)) for x, other in ((a, b), (b, a)))

    return f


def _sum_to(g: mx.array, shape: tuple) -> mx.array:
    """Sum ``g`` over the axes broadcasting added to an operand of ``shape``."""
    lead = g.ndim - len(shape)
    axes = list(range(lead)) + [lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1]
    return (mx.sum(g, axis=axes, keepdims=True) if axes else g).reshape(shape)


def _cmul(a, b, shape: tuple, round_output: bool, name: str, stream):
    """The product on a resolved backend (no autodiff)."""
    if name.float64_engine:
        fa = a.to_float64() if isinstance(a, DoubleWord) else np.array(a).astype(np.complex128)
        fb = b.to_float64() if isinstance(b, DoubleWord) else np.array(b).astype(np.complex128)
        with np.errstate(invalid="ignore", over="ignore"):  # Inf/NaN as IEEE gives them
            return from_float64_result(fa * fb, round_output)
    kshape = shape or (1,)  # kernels index 1-D at least
    words = [mx.broadcast_to(w, kshape) for x in (a, b) for w in _words(x)]
    n = int(np.prod(kshape))
    (out,) = CMUL(
        inputs=[*words, mx.array(n, dtype=mx.int32)], template={"ROUND": round_output},
        output_shapes=[kshape if round_output else fusion.packed_shape(kshape)],
        output_dtypes=[mx.complex64], backend=name, stream=stream)
    hi, lo = (out, None) if round_output else fusion.unpacked(out, kshape)
    return _finish(hi.reshape(shape), None if round_output else lo.reshape(shape), round_output)


def reciprocal_words(n: int) -> tuple[float, float]:
    """``(hi, lo)`` float32 words of 1/n, split from the exact rational: hi =
    RN32(1/n), lo = RN32(1/n - hi); |1/n - hi - lo| <= u^2 / n."""
    k = as_int(n)
    if k is None or k < 1:
        raise ValueError(f"n must be an integer >= 1 (an int, numpy integer or 0-d "
                         f"integer array), got {n!r}")
    exact = Fraction(1, k)
    hi = rn32_rational(exact)
    return float(hi), float(rn32_rational(exact - Fraction(float(hi))))


def rn32_rational(x: Fraction) -> np.float32:
    """float32 nearest the rational ``x`` (ties to even). ``float(x)`` rounds once
    to float64; rounding that again to float32 can be off (double rounding), so
    its neighbours are compared exactly."""
    guess = np.float32(float(x))
    cands = [np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))]
    return min(cands, key=lambda v: (abs(Fraction(float(v)) - x), int(np.array(v).view(np.uint32)) & 1))


@host_guard
def fft_scale_extended(x, n: int, *, round_output: bool = True, backend: str | None = None,
                       stream=None):
    """``x * (1/n)`` in double-word, 1/n computed on the host from the exact rational.

    Args:
        x: float32 or complex64 ``mx.array``, or a DoubleWord, any shape;
            float64 / complex128 data enters at full precision (split into a
            DoubleWord, :func:`~mlx_precise.doubleword.types.read_input`).
        n: integer >= 1: an int, a numpy integer or a 0-d integer array.
        round_output: return x's dtype (one rounding) if True, else a DoubleWord.

    Returns:
        ``x / n`` rounded once (exact for powers of two unless it underflows), or a
        DoubleWord. Relative error before rounding <= 3u^2 (float input) / 5u^2
        (DoubleWord input), including the representation error of 1/n.

    Raises:
        ValueError: n is not an integer >= 1. TypeError: wrong dtype.
    """
    s_hi, s_lo = reciprocal_words(n)  # validates n
    return _scale(x, s_hi, s_lo, ("div", float(as_int(n))), round_output, backend, stream)


@host_guard
def scale_extended(x, factor: Fraction, *, round_output: bool = True,
                   backend: str | None = None, stream=None):
    """``x * factor`` in double-word for a positive rational ``factor`` (given
    exactly, or to far more than 48 bits, e.g. 1/sqrt(n) for FFT norms), rounded
    once. The factor's words are split from the rational (:func:`rn32_rational`).

    Args:
        x: float32 or complex64 ``mx.array``, or a DoubleWord, any shape.
        factor: ``fractions.Fraction`` (or int) > 0.
        round_output, backend, stream: as :func:`fft_scale_extended`.

    Returns:
        x's dtype rounded once, or a DoubleWord; relative error before rounding
        <= 3u^2 / 5u^2 as :func:`fft_scale_extended` (plus the factor's own).
    """
    factor = Fraction(factor)
    if factor <= 0:
        raise ValueError(f"factor must be > 0, got {factor}")
    hi = rn32_rational(factor)
    lo = rn32_rational(factor - Fraction(float(hi)))
    return _scale(x, float(hi), float(lo), ("mul", float(factor)), round_output, backend,
                  stream)


def _scale(x, s_hi: float, s_lo: float, cpu_op: tuple, round_output, backend, stream):
    """x times the double-word constant (s_hi, s_lo): the SCALE kernel, or on the
    cpu backend ``cpu_op = (op, c)``, the float64 ``x * c`` or ``x / c`` (op "mul" /
    "div", c a float) of x's float64 value, lazily by MLX float64 ops
    (:func:`~.engine64.arith64`: one IEEE operation, so ``x / n`` is the correctly
    rounded quotient, as numpy's). A rounded result of an ``mx.array`` is
    differentiable (the VJP scales the cotangent the same way); otherwise a
    gradient raises."""
    x = read_input(x, "x", "words", ("float32", "complex64"))
    name = backends.resolve(backend)
    args = (s_hi, s_lo, cpu_op, name, stream)
    if round_output and isinstance(x, mx.array):

        @mx.custom_function
        def f(a):
            return _scale_raw(a, *args, True)

        @f.vjp
        def f_vjp(primals, cotangent, output):  # linear: the same scaling, any order
            g = as_tuple(cotangent)[0]
            return (f(g),)

        return f(x)
    form, words = _pack(x) if isinstance(x, DoubleWord) else (None, [x])

    def run(*w):
        y = _scale_raw(w[0] if form is None else _unpack(form, w), *args, round_output)
        if round_output:
            return y
        nonlocal out_form
        out_form, out = _pack(y)
        return tuple(out)

    out_form = None
    out = guarded(run, words, "a double-word scaling of a DoubleWord or with round_output=False",
                  name)
    return out if round_output else _unpack(out_form, out)


def _pack(x: DoubleWord) -> tuple[str, list]:
    """(form, arrays): the arrays ``x`` is made of as they are (its float64 value
    where it carries one, its high word alone where it is exact), so that passing
    them through a custom function builds no low word; :func:`_unpack` inverts."""
    if x.wide is not None:
        return "wide", [x.hi, *(v for v in x.wide if v is not None)]
    if x._lo is None:
        return "exact", [x.hi]
    return "words", [x.hi, x._lo]


def _unpack(form: str, arrays) -> DoubleWord:
    if form == "wide":
        return DoubleWord.from_wide(arrays[0], (arrays[1], arrays[2] if len(arrays) > 2 else None))
    return DoubleWord.exact(arrays[0]) if form == "exact" else DoubleWord(*arrays)


def _scale_raw(x, s_hi, s_lo, cpu_op, name, stream, round_output):
    dw_in = isinstance(x, DoubleWord)
    shape, dtype = tuple(x.shape), x.dtype
    if name.float64_engine:
        op, c = cpu_op
        with mx.stream(mx.cpu):  # (MLX has float64 on the CPU only)
            constant = DoubleWord.from_wide(mx.array(c, mx.float32), (mx.array(c, F64), None))
        y = arith64(op, x if dw_in else DoubleWord.exact(x), constant)
        return y.hi if round_output else y
    hi, lo = _words(x) if dw_in else (x, None)
    flat_hi = _as_f32_flat(hi)
    flat_lo = _as_f32_flat(lo) if dw_in else mx.zeros((1,), mx.float32)
    m = flat_hi.size
    out_hi, out_lo = SCALE(
        inputs=[flat_hi, flat_lo, mx.array([s_hi, s_lo], dtype=mx.float32)],
        template={"ROUND": round_output, "DW_IN": dw_in},
        output_shapes=[(m,), (1,) if round_output else (m,)],
        output_dtypes=[mx.float32, mx.float32], backend=name, stream=stream)
    out_hi = _from_f32_flat(out_hi, shape, dtype)
    return _finish(out_hi, None if round_output else _from_f32_flat(out_lo, shape, dtype), round_output)


def _as_f32_flat(x: mx.array) -> mx.array:
    """float32 1-D view of float32 or complex64 data (complex as interleaved pairs)."""
    x = x.reshape(-1)
    return x.view(mx.float32) if x.dtype == mx.complex64 else x


def _from_f32_flat(x: mx.array, shape, dtype) -> mx.array:
    return (x.view(mx.complex64) if dtype == mx.complex64 else x).reshape(shape)


# ---- precision-aware entry points ------------------------------------------


@precision_aware(complex_multiply_extended)
def complex_multiply(a, b, *, stream=None):
    """``a * b`` for complex arrays: double-word inside
    :func:`~mlx_precise.extended_precision` (see :func:`complex_multiply_extended`),
    plain complex64 ``mx.multiply`` outside (operands read as the extended twin
    reads them, DoubleWord and float64 ones then rounded once)."""
    a, b = (plain_input(x, name, ("complex64",)) for x, name in ((a, "a"), (b, "b")))
    return mx.multiply(a, b, stream=stream)


def _fft_scale_flow(x, n: int, *, stream=None):
    """``x / n`` with MLX's divide (inside a block: the flow's, in double-word)."""
    reciprocal_words(n)  # validates n
    return mx.divide(plain_input(x, "x", ("float32", "complex64")), as_int(n),
                     stream=stream)


@precision_aware(fft_scale_extended, _fft_scale_flow)
def fft_scale(x, n: int, *, stream=None):
    """``x / n``: double-word inside :func:`~mlx_precise.extended_precision` (see
    :func:`fft_scale_extended`), plain float32 MLX ``x * (1/n)`` outside."""
    reciprocal_words(n)  # validates n
    x = plain_input(x, "x", ("float32", "complex64"))
    return mx.multiply(x, 1.0 / as_int(n), stream=stream)


