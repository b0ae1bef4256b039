"""The cpu engine of double-word arithmetic: DoubleWords to MLX float64 values and
back (:func:`to64`, :func:`from64`, lazily, keeping the float64 value for the next
cpu step), cpu results computed in float64 (:func:`from_float64_result`), fused
float64 steps (:func:`step`), and ``+ * /`` in float64 (:func:`arith64`).

A cpu step is a float64 formula of its operands' float64 values. :func:`step`
runs it as one MLX function compiled with ``mx.compile`` (MLX's cpu backend fuses
an elementwise graph into one loop): each operand is read once, in whatever form
it has (its float64 value; its float32 word alone, converted inside the loop; or
its two words, joined inside), and the float64 result written once; the high
word, its float32 rounding, is a lazy array of its own, so a chain of steps
writes no high word that nothing reads."""

from __future__ import annotations

import functools

import mlx.core as mx
import numpy as np

from ..core.plain import plain
from .hostsplit import complex_from_parts
from .types import DoubleWord

F32, F64 = mx.float32, mx.float64


def from_float64_result(y: np.ndarray, round_output: bool):
    """A cpu-backend result computed in float64: rounded once to float32 / complex64
    (overflow to Inf, as on the GPU, without numpy's warning), or split into a
    :class:`DoubleWord` when ``round_output`` is False (lazily by :func:`from64`,
    which keeps the float64 value for the next cpu step)."""
    if round_output:
        with np.errstate(over="ignore"):
            return mx.array(y.astype(np.complex64 if np.iscomplexobj(y) else np.float32))
    with mx.stream(mx.cpu):
        if np.iscomplexobj(y):
            return from64(mx.array(np.ascontiguousarray(y.real), dtype=mx.float64),
                          mx.array(np.ascontiguousarray(y.imag), dtype=mx.float64))
        return from64(mx.array(y, dtype=mx.float64))


def _zero_as_minus_zero(v: mx.array) -> mx.array:
    """v with every zero made -0 (other values unchanged): x + (-0) = x for every
    x, -0 and +0 included, so adding this keeps the sign of a zero high word."""
    return -((-v) + 0.0)


def to64(x: DoubleWord) -> tuple[mx.array, mx.array | None]:
    """``hi + lo`` as MLX float64 arrays (re, im; im None for real words), lazy:
    exact for normalised pairs, and -0 stays -0; ``x.wide`` itself when ``x`` was
    made by :func:`from64` (the same value, without a pass over the words); one
    conversion of the high word for an exact ``x``. Call on the CPU stream (MLX has
    float64 there only)."""
    return _read(*_reading(x))


def from64(re: mx.array, im: mx.array | None = None) -> DoubleWord:
    """MLX float64 values split into two words, lazily: ``hi = RN32(v)``,
    ``lo = RN32(v - hi)``, ``lo = 0`` where ``hi`` is not finite (the special-value
    rule of the kernels); complex when ``im`` is given. The result keeps ``(re,
    im)`` as its ``wide`` value, and builds its low word only when it is read.
    The low word takes no gradient (:func:`_low64`)."""
    hi = re.astype(F32)
    if im is not None:
        hi = complex_from_parts(hi, im.astype(F32))
    return DoubleWord.from_wide(hi, (re, im))


# ---- fused float64 steps ---------------------------------------------------------------
# How a step reads an operand: "w" / "W" its float64 value (real / complex: the real
# and imaginary parts), "h" / "H" its high word alone (an exact value: converted in
# the loop), "j" / "J" its two words (joined in the loop), "a" an array as it is (a
# condition, an index).
_ARRAYS = {"w": 1, "W": 2, "h": 1, "H": 1, "j": 2, "J": 2, "a": 1}

FUSE_MIN = 1 << 14
"""Elements from which a cheap step (``cheap=True``: one float64 operation) runs
compiled; smaller ones run as separate MLX ops, whose host cost is the same,
without compiling a kernel for each new shape pattern. Steps of many operations
(the elementary functions) always run compiled."""


def _reading(x) -> tuple[str, tuple]:
    """(kind, arrays): how a step reads ``x`` (a DoubleWord or an ``mx.array``)."""
    if not isinstance(x, DoubleWord):
        return "a", (x,)
    if x.wide is not None:
        re, im = x.wide
        return ("w", (re,)) if im is None else ("W", (re, im))
    kind = "H" if x.is_complex else "h"
    if x._lo is None:
        return kind, (x.hi,)
    return kind.replace("h", "j").replace("H", "J"), (x.hi, x._lo)


def _join64(hi: mx.array, lo: mx.array) -> mx.array:
    return hi.astype(F64) + _zero_as_minus_zero(lo).astype(F64)


def _read(kind: str, arrays: tuple):
    """The float64 value (re, im or None) of an operand read as ``kind`` (an "a"
    operand: the array)."""
    if kind == "a":
        return arrays[0]
    if kind == "w":
        return arrays[0], None
    if kind == "W":
        return arrays
    if kind == "h":
        return arrays[0].astype(F64), None
    if kind == "H":
        return plain.real(arrays[0]).astype(F64), plain.imag(arrays[0]).astype(F64)
    if kind == "j":
        return _join64(*arrays), None
    hi, lo = arrays
    return (_join64(plain.real(hi), plain.real(lo)), _join64(plain.imag(hi), plain.imag(lo)))


def _evaluate(formula, kinds: tuple, rounded: bool, arrays: tuple) -> tuple:
    values, k = [], 0
    for kind in kinds:
        values.append(_read(kind, arrays[k:k + _ARRAYS[kind]]))
        k += _ARRAYS[kind]
    re, im = formula(*values)
    if rounded:
        return re.astype(F32)
    return (re,) if im is None else (re, im)


@functools.lru_cache(maxsize=None)
def _compiled(formula, kinds: tuple, rounded: bool):
    """``formula`` on operands read as ``kinds``, compiled once per formula and
    kinds (MLX compiles a kernel per shape pattern on first use and caches it on
    disk). ``rounded``: the float32 rounding of its (real) result."""
    return plain.compile(lambda *arrays: _evaluate(formula, kinds, rounded, arrays))


def _fused(formula, operands, cheap: bool):
    """(outputs, the compiled function and its arguments, or None when the formula
    ran as separate MLX ops)."""
    readings = [_reading(x) for x in operands]
    kinds = tuple(k for k, _ in readings)
    arrays = tuple(a for _, group in readings for a in group)
    with mx.stream(mx.cpu):
        if cheap and max(a.size for a in arrays) < FUSE_MIN:
            return _evaluate(formula, kinds, False, arrays), None
        return tuple(_compiled(formula, kinds, False)(*arrays)), (kinds, arrays)


def apply(formula, *operands, cheap: bool = False) -> tuple:
    """``formula`` of the operands' float64 values, fused into one loop (see the
    module's docstring): ``(re,)`` or ``(re, im)``, MLX arrays (lazy).

    Args:
        formula: ``formula(*values) -> (re, im or None)``; a DoubleWord operand
            comes in as its value ``(re, im or None)`` (MLX float64 arrays; they
            broadcast), an ``mx.array`` operand as it is. Made of MLX ops only, and
            a module-level function (kernels are cached per formula); the Python
            numbers in it are constants of the kernel, so numbers that vary from
            call to call must come in as operands.
        operands: DoubleWords and ``mx.array`` values.
        cheap: one float64 operation: below :data:`FUSE_MIN` elements it runs as
            separate MLX ops.
    """
    return _fused(formula, operands, cheap)[0]


def step(formula, *operands, cheap: bool = False) -> DoubleWord:
    """One cpu step: :func:`apply`, the result a DoubleWord that keeps its float64
    value (its low word built only when read, its high word a lazy array).

    ``cheap`` (one float64 operation, real): compiled, the high word comes from a
    kernel of its own that reads the operands (one rounding of the same operation:
    equal to the rounding of the float64 result), so that reading the high word
    writes no float64 result, and a next step reading the float64 result writes
    no high word.

    Returns:
        The DoubleWord of the result (float32 words, or complex64 where the formula
        returns an imaginary part).
    """
    wide, kernel = _fused(formula, operands, cheap)
    if not cheap or kernel is None or len(wide) == 2:
        return from64(*wide)
    kinds, arrays = kernel
    with mx.stream(mx.cpu):
        hi = _compiled(formula, kinds, True)(*arrays)
    return DoubleWord.from_wide(hi, (wide[0], None))


def _add(x, y):
    (xr, xi), (yr, yi) = x, y
    return xr + yr, (None if xi is None and yi is None else
                     yi if xi is None else xi if yi is None else xi + yi)


def _mul(x, y):
    (xr, xi), (yr, yi) = x, y
    if xi is None or yi is None:
        s, (a, b) = (xr, (yr, yi)) if xi is None else (yr, (xr, xi))
        return a * s, None if b is None else b * s
    return xr * yr - xi * yi, xr * yi + xi * yr


def _div(x, y):
    (xr, xi), (yr, yi) = x, y
    if yi is None:
        return xr / yr, None if xi is None else xi / yr
    d = yr * yr + yi * yi
    xi = mx.zeros_like(xr) if xi is None else xi  # (+0: the signs of zero parts)
    return (xr * yr + xi * yi) / d, (xi * yr - xr * yi) / d


_ARITH = {"add": _add, "mul": _mul, "div": _div}


def arith64(op: str, x: DoubleWord, y: DoubleWord) -> DoubleWord:
    """``x + y``, ``x * y`` or ``x / y`` (op "add", "mul", "div") by MLX float64 on
    the CPU stream (complex as pairs of float64 arrays: MLX has no complex128), one
    fused step (:func:`step`)."""
    return step(_ARITH[op], x, y, cheap=not (x.is_complex or y.is_complex))


# ---- float64 elementary functions ----------------------------------------------------
# MLX 0.32's float64 exp, sin, cos, sigmoid and erf are only float32-accurate (relative
# errors near 2^-20, and 2^-1 for sin at |x| ~ 1000), and its accurate ones (expm1,
# tan, ...) call the C library one element at a time. These are single float64
# evaluations made of MLX arithmetic, fused by mx.compile: exp by Cody and Waite's
# reduction x = k ln2 + r (ln 2 in two parts, the first exact times any k in range),
# e^r by its Taylor polynomial to r^13 (|r| <= ln2 / 2: truncation below 2^-57), and
# 2^k as exponent bits; sin and cos by the reduction x = k pi/2 + r carried in two
# doubles (pi/2 in four parts of which the first three are exact times k < 2^20, the
# differences by Knuth's TwoSum) and Taylor polynomials to r^19 / r^20 on |r| <= pi/4,
# cos's leading 1 - r^2/2 with its rounding error added back (as fdlibm's __kernel_cos
# does); arguments of 2^20 and more (where k pi/2 would need more parts) take the
# half-angle formulas of MLX's correctly reduced float64 tan.
# References: W. J. Cody, W. Waite, "Software Manual for the Elementary Functions",
# 1980; D. E. Knuth, TAOCP vol. 2, 4.2.2; K. C. Ng, "Argument reduction for huge
# arguments: good to the last bit", Sun Microsystems, 1992 (fdlibm).

_MAGIC = 6755399441055744.0  # 1.5 * 2^52: (y + M) - M is y rounded to an integer (|y| < 2^51)
_TRIG_LIMIT = 2.0**20


def _split_bits(v, bits: int) -> float:
    """The float64 with the leading ``bits`` significant bits of the mpmath value v."""
    import mpmath as mp

    e = int(mp.floor(mp.log(abs(v), 2)))
    return float(mp.floor(v * mp.mpf(2) ** (bits - 1 - e)) * mp.mpf(2) ** (e + 1 - bits))


@functools.lru_cache(maxsize=None)
def _constants() -> dict:
    """ln 2 and pi/2 in parts, 2/pi, 1/ln 2 and the Taylor coefficients (mpmath, 200
    bits, rounded once to float64)."""
    import mpmath as mp

    with mp.workprec(200):
        ln2, pio2 = mp.log(2), mp.pi / 2
        ln2_hi = _split_bits(ln2, 32)  # k ln2_hi is exact for |k| < 2^21
        parts, rest = [], pio2
        for _ in range(3):  # k * part exact for |k| < 2^20
            parts.append(_split_bits(rest, 33))
            rest -= mp.mpf(parts[-1])
        fact = mp.factorial
        return {
            "inv_ln2": float(1 / ln2), "ln2": (ln2_hi, float(ln2 - mp.mpf(ln2_hi))),
            "two_over_pi": float(2 / mp.pi), "pio2": (*parts, float(rest)),
            # e^r = 1 + r + r^2 (1/2 + r/6 + ... + r^11/13!)
            "exp": [float(1 / fact(n)) for n in range(13, 1, -1)],
            # sin r = r + r^3 S(r^2), S = -1/3! + r^2/5! - ... (to r^19)
            "sin": [float((-1) ** n / fact(2 * n + 1)) for n in range(9, 0, -1)],
            # cos r = 1 - r^2/2 + r^4 C(r^2), C = 1/4! - r^2/6! + ... (to r^20)
            "cos": [float((-1) ** n / fact(2 * n)) for n in range(10, 1, -1)],
        }


def _horner(coefficients, z):
    p = coefficients[0]
    for c in coefficients[1:]:
        p = p * z + c
    return p


def _round_to_integer(y):
    return (y + _MAGIC) - _MAGIC


def _exp_parts(x):
    """(m, bits): e^x = m * 2^j with bits = the float64 bits of 2^j (a normal number;
    a result near the ends of the range moves a power of two into m, exactly)."""
    c = _constants()
    x = mx.clip(x, -746.0, 710.0)  # beyond: 0 and Inf (NaN propagates)
    k = _round_to_integer(x * c["inv_ln2"])
    r = (x - k * c["ln2"][0]) - k * c["ln2"][1]
    m = 1.0 + (r + r * r * _horner(c["exp"], r))
    high, low = k > 1023, k < -1021  # 2^k itself would not be a normal number
    m = m * mx.where(high, 2.0, mx.where(low, 2.0**-54, 1.0))
    j = k - mx.where(high, 1.0, mx.where(low, -54.0, 0.0))
    return m, (j + 1023.0).astype(mx.int64) << 52


_exp_kernel = functools.lru_cache(maxsize=None)(lambda: plain.compile(_exp_parts))


def exp64(x: mx.array) -> mx.array:
    """e^x of MLX float64 values (lazy, CPU stream): within about one ulp; NaN stays
    NaN, overflow is Inf, underflow gradual (subnormal, then 0)."""
    m, bits = _exp_kernel()(x)
    return m * bits.view(F64)


def _sincos_reduced(x):
    """(sin x, cos x) for |x| < 2^20."""
    c = _constants()
    p1, p2, p3, p4 = c["pio2"]
    k = _round_to_integer(x * c["two_over_pi"])
    a = x - k * p1  # exact (Sterbenz): k p1 is exact and within a factor 2 of x

    def two_sum(u, v):
        s = u + v
        t = s - u
        return s, (u - (s - t)) + (v - t)

    s, e = two_sum(a, -(k * p2))
    s, e2 = two_sum(s, -(k * p3))
    e = (e + e2) - k * p4
    rh = s + e  # r = rh + rl, |rl| <= ulp(rh) / 2
    rl = (s - rh) + e
    z = rh * rh
    sin_r = rh + (rl * (1.0 - 0.5 * z) + rh * z * _horner(c["sin"], z))
    hz = 0.5 * z
    w = 1.0 - hz
    cos_r = w + (((1.0 - w) - hz) + (z * z * _horner(c["cos"], z) - rh * rl))
    q = k - 4.0 * _round_to_integer(k * 0.25 - 0.375)  # the quadrant, 0 .. 3
    odd = (q == 1.0) | (q == 3.0)
    sin_x, cos_x = mx.where(odd, cos_r, sin_r), mx.where(odd, sin_r, cos_r)
    return (mx.where(q >= 2.0, -sin_x, sin_x),
            mx.where((q == 1.0) | (q == 2.0), -cos_x, cos_x))


def _sincos_half_angle(x):
    """(sin x, cos x) from MLX's float64 tan: t = tan(x/2), sin = 2t / (1 + t^2)
    (relative accuracy everywhere, -0 gives -0); cos = (1 - t^2) / (1 + t^2) where
    |t| is away from 1, sin x / tan x near the zeros of cos (|t| in [1/2, 2], where
    |sin x| >= 0.8). Inf and NaN give NaN."""
    t = mx.tan(0.5 * x)
    t2 = t * t
    d = 1.0 + t2
    s = 2.0 * t / d
    a = mx.abs(t)
    return s, mx.where((a >= 0.5) & (a <= 2.0), s / mx.tan(x), (1.0 - t2) / d)


def sincos64_formula(x):
    """(sin x, cos x) of MLX float64 values: the reduction for |x| < 2^20, the
    half-angle formulas beyond and for Inf (evaluated on 0 elsewhere: the C
    library's tan returns at once); NaN stays NaN."""
    big = mx.abs(x) >= _TRIG_LIMIT
    s, c = _sincos_reduced(mx.where(big, 0.0, x))
    sb, cb = _sincos_half_angle(mx.where(big, x, 0.0))
    s = mx.where(x == 0.0, x, s)  # sin(-0) = -0 (the reduction's sums give +0)
    return mx.where(big, sb, s), mx.where(big, cb, c)


def _erf64(v: mx.array) -> mx.array:
    """erf in float64: scipy's (MLX's float64 erf is float32-accurate); math.erf
    where scipy is absent. Evaluates v."""
    import math

    a = np.array(v, dtype=np.float64)
    try:
        from scipy.special import erf
        r = erf(a)
    except ImportError:  # pragma: no cover - scipy comes with the cpu backend on Linux
        r = np.vectorize(math.erf, otypes=[np.float64])(a)
    return mx.array(r, dtype=F64)


def _sigmoid(x, e):
    """1 / (1 + e^-x) from e = e^-|x|, without overflow."""
    v = x[0]
    s = 1.0 / (1.0 + e)
    return mx.where(v >= 0.0, s, e * s), None


def _cexp(b, e):
    """e^(a + ib) = e^a (cos b + i sin b) from b and e = e^a; b = 0 gives e^a and
    b exactly (the signs of zeros, and Inf * 0 avoided)."""
    b = b[0]
    s, c = sincos64_formula(b)
    return mx.where(b == 0.0, e, e * c), mx.where(b == 0.0, b, e * s)


@functools.lru_cache(maxsize=None)
def _function(name: str):
    """The formula of the elementwise function ``name`` on one operand's value:
    sin / cos by :func:`sincos64_formula`, the rest MLX's accurate float64 ones."""
    if name in ("sin", "cos"):
        i = name == "cos"
        return lambda x: (sincos64_formula(x[0])[i], None)
    f = getattr(mx, name)
    return lambda x: (f(x[0]), None)


@functools.lru_cache(maxsize=None)
def _binary_function(name: str):
    f = getattr(mx, name)
    return lambda x, y: (f(x[0], y[0]), None)


def unary64(fn: str, x: DoubleWord) -> DoubleWord:
    """The elementwise function ``fn`` (one of
    :data:`mlx_precise.doubleword.functions.UNARY`) of a real DoubleWord in float64
    (lazy but for erf, scipy's on the host)."""
    if fn == "exp":
        with mx.stream(mx.cpu):
            return from64(exp64(to64(x)[0]))
    if fn == "sigmoid":
        with mx.stream(mx.cpu):
            return step(_sigmoid, x, exp64(-mx.abs(to64(x)[0])))
    if fn == "erf":
        with mx.stream(mx.cpu):
            return from64(_erf64(to64(x)[0]))
    return step(_function(fn), x)


def binary64(fn: str, x: DoubleWord, y: DoubleWord) -> DoubleWord:
    """``mx.power`` or ``mx.arctan2`` (``fn``) of real DoubleWords in float64 (both
    accurate in MLX 0.32)."""
    return step(_binary_function(fn), x, y)


def cexp64(re: DoubleWord, im: DoubleWord) -> DoubleWord:
    """e^(re + i im) of real DoubleWords: a complex DoubleWord."""
    with mx.stream(mx.cpu):
        return step(_cexp, im, exp64(to64(re)[0]))
