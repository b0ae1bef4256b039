"""Double-word elementary functions: one engine per backend.

``unary(fn, x, backend)`` and ``binary(fn, x, y, backend)`` evaluate ``fn`` on
:class:`~mlx_precise.DoubleWord` operands (the unevaluated sums ``hi + lo`` of two
float32 words, ~48 significand bits) and return a normalised DoubleWord:

* ``metal`` / ``emulate``: the kernel ``dw_math`` (``metal/kernels/dw_math.metal``
  over ``metal/include/dw_math.h``), one thread per element, the function chosen by
  its template parameter ``FN``. Double-word arithmetic only (TwoSum, TwoProdFMA and
  the Joldes-Muller-Popescu building blocks of ``doubleword.h``); no Metal
  transcendental function; every constant computed here with mpmath and written
  into the header as exact float32 words (:func:`tables_source`).
* ``cpu``: float64 on MLX's CPU stream where MLX 0.32's float64 function is
  accurate (expm1, log, log1p, log2, log10, tanh, sqrt, rsqrt, reciprocal,
  power, arctan2, and tan as a building block); MLX's float64 exp, sin, cos,
  sigmoid and erf are only float32-accurate (measured: relative errors 2^-20,
  2^-1 at |x| ~ 1000, 2^-20, 2^-13), so exp is 1 + expm1(|x|) (its reciprocal for
  x < 0), sin and cos come from tan by half-angle formulas, sigmoid from that exp,
  and erf is scipy's (math.erf without scipy). The
  float64 result is split back into two words (``hi = RN32(v)``,
  ``lo = RN32(v - hi)``, ``lo = 0`` where ``hi`` is not finite).

Accuracy (relative error against mpmath; measured bounds asserted in
tests/doubleword/test_dwmath.py, algorithms and tables in docs/dwmath.md): <= 2^-44 for every
function on its stated domain, that is, results of magnitude >= 2^-78 (below that the
low word falls into the float32 subnormal range that Apple GPUs flush).

Special values follow float32 (C99 Annex F): NaN in, NaN out; log(0) = -Inf,
log(-1) = NaN, sqrt(-1) = NaN, exp overflows to Inf, ... (docs/dwmath.md lists
them per function). Results below 2^-126 are flushed to zero on metal / emulate,
as Apple GPUs flush float32 subnormals.

References: D. H. Bailey, Y. Hida, X. S. Li, "Algorithms for quad-double precision
floating point arithmetic", ARITH 2001 (and their QD library's dd_real); M. Joldes,
J.-M. Muller, V. Popescu, "Tight and rigorous error bounds for basic building blocks
of double-word arithmetic", ACM TOMS 44(2), 2017; P. T. P. Tang, "Table-driven
implementation of the exponential function in IEEE floating-point arithmetic", ACM
TOMS 15(2), 1989, and "... of the logarithm function", ACM TOMS 16(4), 1990;
W. J. Cody, W. Waite, "Software Manual for the Elementary Functions", 1980;
J. R. Shewchuk, "Adaptive precision floating-point arithmetic and fast robust
geometric predicates", Discrete Comput. Geom. 18, 1997 (exact expansions).
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from .words import DoubleWord, combine, from64, to64
from ..core import backends
from ..core.kernels import Kernel, elementwise_grid, same_shape

F32, C64, F64 = mx.float32, mx.complex64, mx.float64

UNARY = ("exp", "expm1", "log", "log1p", "log2", "log10", "sin", "cos", "tanh",
         "sigmoid", "erf", "sqrt", "rsqrt", "reciprocal")
BINARY = ("power", "arctan2")
FN_CODES = {name: i for i, name in enumerate(UNARY + BINARY + ("cexp",))}
"""Template value ``FN`` of the ``dw_math`` kernel per function (``cexp``: complex
exp, selected by :func:`unary` ``("exp", x)`` for a complex ``x``)."""


class DwMathError(ValueError):
    """A double-word function was called with an unknown name or unusable operands."""


def _grid(inputs, template):
    return elementwise_grid(inputs[0].size)


_IN = ("ah", "al", "bh", "bl")
DW_MATH = Kernel(
    name="dw_math",
    body="dw_math.metal",
    headers=("dw_math.h",),
    inputs=_IN,
    outputs=("zh", "zl", "wh", "wl"),
    template=("FN",),
    input_dtypes={k: (F32,) for k in _IN},
    input_shapes=same_shape(ndim=1),
    grid=_grid,
    extended=True,
    variants={"FN": tuple(FN_CODES.values()), **{k: (F32,) for k in ("zh", "zl", "wh", "wl")}},
)
"""Elementwise double-word function ``FN`` (codes: :data:`FN_CODES`). Inputs
``ah, al, bh, bl``: float32, shape ``(n,)``: the first operand ``a = (ah, al)`` and
the second ``b = (bh, bl)`` (``y`` of power / arctan2, the imaginary part of complex
exp; unary functions ignore it). Outputs ``zh, zl`` (shape ``(n,)``) the result (the
real part for complex exp), ``wh, wl`` the imaginary part of complex exp (shape
``(n,)`` there, ``(1,)`` and unwritten otherwise)."""


# ---- the constants of metal/include/dw_math.h ------------------------------------------

def _words(v, n: int) -> list:
    """``n`` float32 words of the real ``v`` (mpmath): w0 = RN32(v), w1 = RN32(v - w0),
    ...; their exact sum is within about 2^-24n |v| of v."""
    import mpmath as mp

    out, r = [], mp.mpf(v)
    for _ in range(n):
        with mp.workprec(24):  # one rounding to 24 bits (no double rounding via float64)
            w24 = +r
        w = np.float32(float(w24))
        if mp.mpf(float(w)) != w24:  # outside float32's normal range
            raise ValueError(f"word {len(out)} of {v} is not a normal float32")
        out.append(w)
        r -= mp.mpf(float(w))
    return out


def _lit(w) -> str:
    """A float32 literal that reads back as exactly ``w`` (numpy's shortest repr)."""
    s = repr(float(np.float32(w))) if np.float32(w) == 0 else str(np.float32(w))
    return s + ("" if ("e" in s or "." in s) else ".0") + "f"


def _array(name: str, values, per_line: int = 4) -> str:
    items = [_lit(v) for v in values]
    lines = [", ".join(items[i:i + per_line]) for i in range(0, len(items), per_line)]
    return (f"constant float {name}[{len(items)}] = {{\n    "
            + ",\n    ".join(lines) + "};\n")


ERF_CENTERS = 22  # x0 = 0.625 + 0.25 m, m = 0..21: |x| in [0.5, 6), |x - x0| <= 1/8
ERF_DEGREE = 13   # Taylor degree about each center (truncation < 2^-56 erf(x0))
LOG_IMIN, LOG_IMAX = -19, 27  # table index i = rint(64 (f - 1)), f in [2^-1/2, 2^1/2)


def tables_source() -> str:
    """The generated block of ``metal/include/dw_math.h``: every constant of the
    kernels as float32 words, computed with mpmath at 400 bits (a test checks that
    the header holds exactly this text)."""
    import mpmath as mp

    # a local working precision: mpmath's global one is the caller's
    with mp.workprec(400):
        dw = (lambda v: _words(v, 2))
        fact = mp.factorial
        out = ["// ---- generated by mlx_precise.doubleword.functions.tables_source() "
               "(mpmath, 400 bits); do not edit ----\n"]
        ln2 = mp.log(2)
        scal = {
            "DWM_LN2": _words(ln2, 3),
            "DWM_LN2_64": _words(ln2 / 64, 3),
            "DWM_LOG10_2": _words(mp.log10(2), 3),
            "DWM_INV_LN2": dw(1 / ln2),
            "DWM_INV_LN10": dw(1 / mp.log(10)),
            "DWM_PI": dw(mp.pi),
            "DWM_PI_2": dw(mp.pi / 2),
            "DWM_PI_4": dw(mp.pi / 4),
        }
        # pi/2 in 10 words (~240 bits, enough to reduce any float32-range argument
        # exactly): words 5..9 lie below float32's range and are stored times 2^120
        pio2 = _words(mp.pi / 2, 5)
        pio2 += _words((mp.pi / 2 - sum(mp.mpf(float(w)) for w in pio2)) * mp.mpf(2) ** 120, 5)
        scal["DWM_PIO2"] = pio2
        for k, v in scal.items():
            out.append(_array(k, v))
        out.append(f"constant constexpr float DWM_INV_LN2_64 = {_lit(64 / ln2)};\n")
        out.append(f"constant constexpr float DWM_2_PI = {_lit(2 / mp.pi)};\n")
        # exp: 2^(j/64) and 2^(j/64) - 1, j = -32..32 (Tang 1989), Taylor of expm1 (degree 6)
        t, tm1 = [], []
        for j in range(-32, 33):
            t += dw(mp.mpf(2) ** (mp.mpf(j) / 64))
            tm1 += dw(mp.mpf(2) ** (mp.mpf(j) / 64) - 1)
        out.append(_array("DWM_EXP_T", t))
        out.append(_array("DWM_EXP_TM1", tm1))
        out.append(_array("DWM_EXPM1_P", sum((dw(1 / fact(n)) for n in range(6, 0, -1)), [])))
        # log: c_i = RN32(1 / (1 + i/64)) and -ln(c_i) in 3 words (Tang 1990); log1p(t) =
        # t + t^2 P(t), P(t) = -1/2 + t/3 - ... - t^6/8
        lt = []
        for i in range(LOG_IMIN, LOG_IMAX + 1):
            c = np.float32(1 / (1 + i / 64))
            lt += [c] + _words(-mp.log(mp.mpf(float(c))), 3)
        out.append(_array("DWM_LOG_T", lt))
        out.append(_array("DWM_LOG1P_P", sum((dw(mp.mpf((-1) ** (n + 1)) / n)
                                              for n in range(8, 1, -1)), [])))
        # sin r = r S(r^2), cos r = C(r^2), |r| <= pi/4: Taylor to r^15 / r^16
        out.append(_array("DWM_SIN_P", sum((dw(mp.mpf((-1) ** n) / fact(2 * n + 1))
                                            for n in range(7, -1, -1)), [])))
        out.append(_array("DWM_COS_P", sum((dw(mp.mpf((-1) ** n) / fact(2 * n))
                                            for n in range(8, -1, -1)), [])))
        # atan: atan(j/16), j = 0..16, and the odd Taylor series to d^11 (|d| <= 1/32)
        out.append(_array("DWM_ATAN_T", sum((dw(mp.atan(mp.mpf(j) / 16)) for j in range(17)), [])))
        out.append(_array("DWM_ATAN_P", sum((dw(mp.mpf((-1) ** n) / (2 * n + 1))
                                             for n in range(5, -1, -1)), [])))
        # erf: Maclaurin series in x^2 for |x| < 1/2 (to x^25), Taylor about x0 beyond
        out.append(_array("DWM_ERF_P", sum((dw(2 / mp.sqrt(mp.pi) * (-1) ** n
                                               / (fact(n) * (2 * n + 1)))
                                            for n in range(12, -1, -1)), [])))
        et = []
        for m in range(ERF_CENTERS):
            c = mp.taylor(mp.erf, mp.mpf(0.625) + mp.mpf(0.25) * m, ERF_DEGREE)
            et += sum((dw(v) for v in reversed(c)), [])
        out.append(_array("DWM_ERF_T", et))
        out.append("// ---- end of generated constants ----\n")
    return "".join(out)


# ---- the Python API ----------------------------------------------------------------------

def _check(fn: str, names: tuple, what: str) -> None:
    if not isinstance(fn, str) or fn not in names:
        raise DwMathError(f"unknown {what} double-word function {fn!r}: expected one of "
                          + ", ".join(names))


def _operand(x, name: str, complex_ok: bool) -> DoubleWord:
    if not isinstance(x, DoubleWord):
        raise DwMathError(f"{name} must be a DoubleWord, got {type(x).__name__} "
                          "(make one with DoubleWord.from_array)")
    if x.is_complex and not complex_ok:
        raise DwMathError(f"{name} is complex (complex64 words): this function takes real "
                          "float32 DoubleWords (only exp takes complex ones)")
    return x


def _backend(backend) -> str:
    return backends.resolve(backend)


def unary(fn: str, x: DoubleWord, backend: str | None = None, stream=None) -> DoubleWord:
    """``fn(x)`` elementwise in double-word precision.

    Args:
        fn: one of :data:`UNARY` (``"exp"`` also takes a complex ``x``:
            ``exp(a + ib) = e^a (cos b + i sin b)``).
        x: a :class:`~mlx_precise.DoubleWord` of any shape, float32 words (complex64
            words for ``"exp"``).
        backend: ``"metal"``, ``"emulate"``, ``"cpu"`` or None (the active backend).
        stream: MLX stream for the kernel launch (metal / emulate).

    Returns:
        A normalised DoubleWord of ``x``'s shape and word dtype. Relative error
        <= 2^-44 for results of magnitude >= 2^-78 (docs/dwmath.md: measured bounds
        and special values per function).

    Raises:
        DwMathError: unknown ``fn``, an operand that is not a DoubleWord, or a complex
            operand for a function other than exp.
    """
    _check(fn, UNARY, "unary")
    x = _operand(x, "x", complex_ok=(fn == "exp"))
    name = _backend(backend)
    if x.is_complex:
        re, im = x.parts()
        if name == "cpu":
            return _cpu_cexp(re, im)
        zr, zi = _launch("cexp", re, im, name, stream)
        return combine(zr, zi)
    if name == "cpu":
        return _cpu_unary(fn, x)
    return _launch(fn, x, None, name, stream)


def binary(fn: str, x: DoubleWord, y: DoubleWord, backend: str | None = None,
           stream=None) -> DoubleWord:
    """``power(x, y) = x ** y`` or ``arctan2(x, y)`` (the angle of the point
    ``(y, x)``: ``x`` is the ordinate, as in ``mx.arctan2``) elementwise in
    double-word precision.

    Args:
        fn: ``"power"`` or ``"arctan2"``.
        x, y: real :class:`~mlx_precise.DoubleWord`\\ s (float32 words) whose shapes
            broadcast.
        backend, stream: as in :func:`unary`.

    Returns:
        A normalised DoubleWord (float32 words) of the broadcast shape.

    Raises:
        DwMathError: unknown ``fn`` or operands that are not real DoubleWords.
        ValueError: shapes that do not broadcast.
    """
    _check(fn, BINARY, "binary")
    x = _operand(x, "x", complex_ok=False)
    y = _operand(y, "y", complex_ok=False)
    name = _backend(backend)
    if name == "cpu":
        with mx.stream(mx.cpu):
            a, b = to64(x)[0], to64(y)[0]
            v = mx.power(a, b) if fn == "power" else mx.arctan2(a, b)
        return from64(v)
    return _launch(fn, x, y, name, stream)


# ---- metal / emulate ------------------------------------------------------------------

def _launch(fn: str, a: DoubleWord, b: DoubleWord | None, backend: str, stream):
    """Run ``dw_math`` with ``FN = FN_CODES[fn]`` over ``a`` (and ``b``) broadcast to one
    shape; the result as one DoubleWord, or ``(real, imaginary)`` for ``cexp``."""
    words = [a.hi, a.lo] + ([b.hi, b.lo] if b is not None else [])
    shape = mx.broadcast_shapes(*(tuple(w.shape) for w in words))
    size = math.prod(shape)
    two = fn == "cexp"
    if size == 0:
        zero = DoubleWord(mx.zeros(shape, F32), mx.zeros(shape, F32))
        return (zero, zero) if two else zero
    flat = [mx.broadcast_to(w, shape).reshape(-1) for w in words]
    if b is None:
        flat += flat  # the kernel ignores b: no second buffer needed
    w_shape = (size,) if two else (1,)
    zh, zl, wh, wl = DW_MATH(
        inputs=flat, template={"FN": FN_CODES[fn]},
        output_shapes=[(size,), (size,), w_shape, w_shape], output_dtypes=[F32] * 4,
        backend=backend, stream=stream)
    z = DoubleWord(zh.reshape(shape), zl.reshape(shape))
    return (z, DoubleWord(wh.reshape(shape), wl.reshape(shape))) if two else z


# ---- cpu: float64 -------------------------------------------------------------------

def _exp64(v: mx.array) -> mx.array:
    """exp in float64: 1 + expm1(|v|) (no cancellation: expm1(|v|) >= 0), its
    reciprocal for v < 0 (MLX's float64 exp is only float32-accurate; its expm1 is
    the C library's). NaN stays NaN, -0 gives 1, overflow Inf, and underflow 0."""
    e = 1.0 + mx.expm1(mx.abs(v))
    return mx.where(v >= 0, e, 1.0 / e)


def _sincos64(v: mx.array):
    """(sin v, cos v) in float64 from MLX's accurate float64 tan (MLX's sin and cos
    are float32-accurate): with t = tan(v/2), sin = 2t / (1 + t^2) (relative accuracy
    everywhere, including near multiples of pi; -0 gives -0); cos = (1 - t^2) /
    (1 + t^2) where |t| is away from 1, and sin v / tan v near the zeros of cos
    (|t| in [1/2, 2], where |sin v| >= 0.8). No finite double lies close enough to
    an odd multiple of pi for t^2 to overflow, and Inf / NaN give NaN throughout."""
    t = mx.tan(0.5 * v)
    t2 = t * t
    d = 1.0 + t2
    s = 2.0 * t / d
    a = mx.abs(t)
    near = (a >= 0.5) & (a <= 2.0)
    return s, mx.where(near, s / mx.tan(v), (1.0 - t2) / d)


def _erf64(v: mx.array) -> mx.array:
    """erf in float64: scipy's (MLX's float64 erf is float32-accurate); math.erf
    where scipy is absent. Evaluates v."""
    a = np.array(v, dtype=np.float64)
    try:
        from scipy.special import erf
        r = erf(a)
    except ImportError:  # pragma: no cover - scipy comes with the cpu backend on Linux
        r = np.vectorize(math.erf, otypes=[np.float64])(a)
    return mx.array(r, dtype=F64)


def _cpu_unary(fn: str, x: DoubleWord) -> DoubleWord:
    with mx.stream(mx.cpu):
        v = to64(x)[0]
        if fn == "exp":
            r = _exp64(v)
        elif fn in ("sin", "cos"):
            r = _sincos64(v)[fn == "cos"]
        elif fn == "sigmoid":
            e = _exp64(-mx.abs(v))
            s = 1.0 / (1.0 + e)
            r = mx.where(v >= 0, s, e * s)
        elif fn == "erf":
            r = _erf64(v)
        else:
            r = getattr(mx, fn)(v)
        return from64(r)


def _cpu_cexp(re: DoubleWord, im: DoubleWord) -> DoubleWord:
    with mx.stream(mx.cpu):
        a, b = to64(re)[0], to64(im)[0]
        s, c = _sincos64(b)
        e = _exp64(a)
        real = mx.where(b == 0, e, e * c)
        imag = mx.where(b == 0, b, e * s)
        return from64(real, imag)
