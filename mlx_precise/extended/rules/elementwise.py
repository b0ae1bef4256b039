"""Elementary functions: the double-word kernels of
:mod:`mlx_precise.doubleword.functions` (``exp``, ``log``, ``sin``, ``erf``, ...,
``power``, ``arctan2``) and the functions defined from them (``sinh``, ``arcsin``,
``logaddexp``, ...) as decompositions whose every step is double-word."""

from __future__ import annotations

import math

import mlx.core as mx

from ...core import backends
from ...doubleword import engine64, functions
from ...doubleword.fusion import differentiating
from .. import arith, autodiff, carry
from ..engine import words_op
from ..recipes import replayed, static
from .base import (REAL, conj, decomposed, one_op, elementary, floating_result, fused, has_float64,
                   is_word_array, kernel_form, of_integers, operand_array, promoted, result,
                   result64, small64, unbroadcast, words)
from ..constructor import ARRAY  # the class (mx.array is a stand-in inside blocks)


def function(fn: str):
    """An elementwise function of :mod:`mlx_precise.doubleword.functions`; its
    gradient is MLX's float32 derivative of the function (of the high words).
    ``exp`` also takes complex values."""

    def rule(ctx, original, x, **kw):
        if not is_word_array(x):
            return NotImplemented
        if x.dtype == mx.complex64:
            if fn != "exp":
                return NotImplemented
            if ctx.backend.float64_engine:
                z = _cexp_by_pieces(x)
                if z is not None:
                    return z
            elif kernel_form(ctx):  # (dozens of Python steps: replayed on metal)
                return _replayed_function(ctx, original, fn, x)
        return _function_words(ctx, original, fn, x)

    return rule


def _function_words(ctx, original, fn: str, x: mx.array) -> mx.array:
    """``fn(x)`` by its double-word kernel (the emulator evaluates; on cpu, erf is
    scipy's: host); its gradient MLX's derivative of ``original``."""
    return words_op(lambda X: functions.unary(fn, X, ctx.backend), original, [x],
                    ctx.backend, opaque=True)


_replayed_function = replayed(_function_words)
static(mx.exp)  # (MLX's, the complex function's ``original``: a replay holds its id)


CEXP_PIECE = 2 * engine64.PIECE
"""Elements of a piece of complex exp by pieces (:func:`_cexp_by_pieces`; from
twice as many). Measured on 2^20 elements, interleaved medians, against whole:
this size 1.09x the time, 19 MB at the peak (whole 38 MB); half of it 1.4x, 18 MB;
twice 1.1x, 21.5 MB (each piece waits for its evaluation: fewer are faster)."""


def _cexp_by_pieces(x: mx.array) -> mx.array | None:
    """``exp(x)`` of a complex64 ``x`` of at least 2 :data:`CEXP_PIECE` elements
    on the float64 engine (cpu), piece by piece: each piece's float64
    value is written into the result's planes (re, im) and evaluated before the
    next. None inside a function transformation (nothing can be evaluated there):
    the rule's whole path then runs.

    Why: complex exp evaluates its sine and cosine as it is called anyway
    (:func:`engine64.sincos64`); whole, its float64 temporaries (reduced
    arguments, both polynomials, both selections, exp's pieces: more than ``x``'s
    float64 size again, beside the result) were the peak of a model's memory
    (S4D's Vandermonde kernel). By pieces they are piece-size, and the result is
    the only full-size array made. The same operations on each element: the same
    bits as whole."""
    piece = CEXP_PIECE
    if x.size < 2 * piece:
        return None
    with mx.stream(mx.cpu):
        value = engine64.to64(words(x))
        # pieces of whole leading rows where a row fits in a piece: a broadcast x
        # (S4D's exp(dtA[..., None] * arange(L))) is then made by rows, never whole
        row = x.size // x.shape[0] if x.ndim > 1 else piece + 1
        count, step = (x.shape[0], piece // row) if row <= piece else (x.size, piece)
        flat = None if row <= piece else [v.reshape(-1) for v in value]
        out = [mx.zeros((x.size,), mx.float64) for _ in value]
        for i in range(0, count, step):
            part = ([v[i:i + step] for v in flat] if flat is not None else
                    [v.reshape(-1) for v in engine64.rows(value, i, i + step)])
            z = engine64.cexp64(*(engine64.from64(v) for v in part))
            # (out's buffers are donated from update to update: written in place)
            at = mx.array([i if flat is not None else i * row])
            out = [mx.slice_update(o, w, at, [0]) for o, w in zip(out, z.wide)]
            del z
            if not engine64._settle(*out):
                return None
        return result(engine64.from64(*(o.reshape(x.shape) for o in out)))


def _fast_function(fn: str):
    """The fast path of ``fn(x)``: on a kernel backend the fused function of a
    float32 array (:func:`.base.fused`); on cpu the float64 engine's evaluation
    (:func:`..functions.value64`) of the value :func:`.base.small64` reads, as the
    rule computes it, without its DoubleWords."""
    code = ("fn", functions.FN[fn])

    def fast(x):
        backend = backends.backend()
        if backend.has_kernels:
            return fused("fn", (x,), backend, fn=code)
        if not isinstance(x, ARRAY) or differentiating():  # (MLX's autodiff: the rule's
            return None                                    # custom function)
        a = small64(x)
        if a is None:
            return None
        with mx.stream(mx.cpu):
            return result64(functions.value64(fn, a))

    return fast


def _power(ctx, original, x, y, **kw):
    """``x ** y`` (``mx.power``, ``**``): small integer and half exponents by the
    exact-rounding arithmetic rules, the rest by the double-word ``power`` (a
    Python float to an integer array's power too: Adam's ``0.999 ** t``)."""
    if not floating_result(x, y) or has_float64((x, y)):
        return NotImplemented
    if any(isinstance(v, ARRAY) and v.dtype == mx.complex64 for v in (x, y)):
        return NotImplemented
    if words(x) is None or words(y) is None:
        return NotImplemented
    if isinstance(y, (int, float)) and not isinstance(y, bool) and is_word_array(x):
        w = words(x)
        if y == 1:  # x's value (the dispatcher returns it as a new array)
            return result(w)
        if y == 2:
            return result(arith.binary("mul", w, w, ctx.backend, ctx.stream))
        if y == 0.5:  # pow's special values: (-0) ** 0.5 = +0, (-inf) ** 0.5 = +inf
            r = words(function("sqrt")(ctx, mx.sqrt, x))
            with carry.suspended():
                special = (x == 0) | (x == -math.inf)
            return result(arith.where(special, arith.exact(mx.abs(x)), r))
        if y == -1:
            return function("reciprocal")(ctx, mx.reciprocal, x)
    if _wide_base(x) and (is_word_array(y) or isinstance(y, ARRAY)):
        # b ** y = exp(y log b), log b from the host in float64: b itself has more
        # bits than two float32 words hold, and entering it rounded to 48 would
        # perturb the result by |y| 2^-49 (0.99999 ** 1e5: 3e-11 relative); here
        # the error is |y log b| 2^-48, that of the result's own exp
        t = promoted(y)
        with carry.reporting(ctx.report):
            return mx.exp(t * math.log(x))
    return words_op(lambda X, Y: functions.binary("power", X, Y, ctx.backend), original,
                    [operand_array(promoted(x)), operand_array(promoted(y))], ctx.backend)


def _wide_base(x) -> bool:
    """A Python float base, positive and finite, whose float64 value two float32 words
    cannot hold exactly (more than 48 significant bits)."""
    return isinstance(x, float) and 0.0 < x < math.inf and not arith.in_two_words(x)


def _arctan2(ctx, original, a, b, **kw):
    if not (is_word_array(a) or is_word_array(b)):
        return NotImplemented
    if words(a) is None or words(b) is None or has_float64((a, b)) or any(
            isinstance(v, ARRAY) and v.dtype == mx.complex64 for v in (a, b)):
        return NotImplemented
    return words_op(lambda X, Y: functions.binary("arctan2", X, Y, ctx.backend), original,
                    [operand_array(promoted(a)), operand_array(promoted(b))], ctx.backend)


_LN2 = math.log(2.0)  # its float64 value enters in two words


_HALF_E = math.e / 2  # its float64 value enters in two words


def _sinh(x, **kw):
    """``(e^(x - 1) - e^(-x - 1)) e/2`` for |x| >= 1 (x - 1 is exact there, and
    nothing overflows before float32's own sinh does), ``(expm1(x) - expm1(-x)) /
    2`` below (no cancellation: the terms have opposite signs), on x set to 0
    where it is not taken (so that it stays finite, and MLX's derivative of the
    composition too: 0 times an infinite e^x was NaN)."""
    with carry.suspended():
        near = mx.abs(x) < 1
    t = mx.where(near, x, 0.0)
    small = (mx.expm1(t) - mx.expm1(-t)) * 0.5
    large = (mx.exp(x - 1) - mx.exp(-x - 1)) * _HALF_E
    return mx.where(near, small, large)


def _cosh(x, **kw):
    return (mx.exp(x - 1) + mx.exp(-x - 1)) * _HALF_E


def _tan(x, **kw):
    return mx.sin(x) / mx.cos(x)


def _arctan(x, **kw):
    return mx.arctan2(x, 1.0)


def _arcsin(x, **kw):
    """``arctan2(x, sqrt((1 - x)(1 + x)))``: 1 - x is exact near 1."""
    return mx.arctan2(x, mx.sqrt((1 - x) * (1 + x)))


def _arccos(x, **kw):
    return mx.arctan2(mx.sqrt((1 - x) * (1 + x)), x)


def _arctanh(x, **kw):
    """``log1p(2x / (1 - x)) / 2`` (small x: no cancellation)."""
    return mx.log1p(2 * x / (1 - x)) * 0.5


_HUGE = 2.0**26  # above it asinh(a), acosh(a) = log(2a) to 2^-54 relative


def _arcsinh(x, **kw):
    """``log1p(a + a^2 / (1 + sqrt(1 + a^2)))`` with a = |x| (no cancellation), or
    ``log(a) + ln 2`` above 2^26 (a^2 would overflow), signed as x (-0 kept).
    Each branch reads a clamped argument, so the unselected one stays finite
    (finite gradients too)."""
    with carry.suspended():
        huge, neg, zero = mx.abs(x) > _HUGE, x < 0, x == 0
    a = mx.abs(x)
    s = mx.minimum(a, _HUGE)
    r = mx.where(huge, mx.log(mx.maximum(a, 1.0)) + _LN2,
                 mx.log1p(s + s * s / (1 + mx.sqrt(1 + s * s))))
    return mx.where(zero, x, mx.where(neg, -r, r))


def _arccosh(x, **kw):
    """``log1p(t + sqrt(t (t + 2)))`` with t = x - 1 (exact near 1), or ``log(x) +
    ln 2`` above 2^26; NaN below 1 (the square root of a negative)."""
    with carry.suspended():
        huge = x > _HUGE
    t = mx.minimum(x, _HUGE) - 1
    return mx.where(huge, mx.log(mx.maximum(x, 1.0)) + _LN2,
                    mx.log1p(t + mx.sqrt(t * (t + 2))))


def _logaddexp(a, b, **kw):
    """``log(e^a + e^b) = max + log1p(e^(-|a - b|))`` (equal infinities: ``a``, as
    MLX, not ``inf - inf``)."""
    m = mx.maximum(a, b)
    return m + mx.log1p(mx.exp(-mx.abs(mx.where(a == b, 0.0, a - b))))


_HALF_SQRT_PI = math.sqrt(math.pi) / 2


def _erfinv(x, **kw):
    """Two Newton steps on the double-word ``erf`` from MLX's float32 ``erfinv``
    (quadratic convergence: 2^-23 -> ~2^-46 -> below the double-word error):
    ``y <- y - (erf(y) - x) sqrt(pi)/2 e^(y^2)``. |x| >= 1 and NaN: MLX's values."""
    if x.dtype != mx.float32:
        return NotImplemented
    with carry.suspended():
        y = mx.erfinv(x)
        inside = mx.abs(x) < 1
        y0 = mx.where(inside, y, 0.0)
    step = y0
    for _ in range(2):
        step = step - (mx.erf(step) - x) * mx.exp(step * step) * _HALF_SQRT_PI
    return mx.where(inside, step, y)


_DEGREES = 180 / math.pi  # float64 values, entering in two words
_RADIANS = math.pi / 180


def _fast_power(x, y):
    """``x ** 2`` of a float32 array on a kernel backend: the fused square, as the
    rule computes it (``x * x`` on one operand); None elsewhere (the rule decides)."""
    backend = backends.backend()
    if backend.has_kernels and (type(y) is int or type(y) is float) and y == 2 and (
            isinstance(x, ARRAY) and x.dtype == mx.float32):
        return fused("mul", (x, x), backend)
    return None


FAST = {**{fn: _fast_function(fn) for fn in functions.UNARY}, "power": _fast_power}
"""Op name -> its fast path (the dispatcher tries it before the rule)."""

RULES = {
    **{fn: of_integers(function(fn)) for fn in functions.UNARY},
    "power": _power, "arctan2": of_integers(_arctan2),
    **{name: of_integers(decomposed(fn)) for name, fn in (
        ("tan", _tan), ("arctan", _arctan),
        ("degrees", lambda x: x * _DEGREES), ("radians", lambda x: x * _RADIANS))},
    **{name: of_integers(one_op(fn)) for name, fn in (
        ("sinh", _sinh), ("cosh", _cosh), ("arcsinh", _arcsinh), ("erfinv", _erfinv),
        ("arcsin", _arcsin), ("arccos", _arccos), ("arctanh", _arctanh),
        ("arccosh", _arccosh), ("logaddexp", _logaddexp))},
}
"""Op name -> rule. The functions take integer and bool arrays as their exact values
(MLX's results are float32 there too; :func:`.base.of_integers`); ``power`` of
integers is an integer."""


# ---- derivatives ---------------------------------------------------------------------
_TWO_OVER_SQRT_PI = 2 / math.sqrt(math.pi)
_LN10 = math.log(10.0)

def _bell(x, k: float):
    """t / (1 + t)^2 with t = exp(-k |x|): sigmoid'(x) for k = 1, tanh'(x) / 4 for
    k = 2. Not from the result o as o (1 - o) and 1 - o^2: near saturation o holds
    1 - o only to o's own accuracy (~2^-48 of 1 in double-word, 2^-53 in float64),
    so those lose all of a derivative below that (tanh' at |x| = 15 was 2e3 float32
    ulps off, 0 at 30), where float32's own VJP is faithful."""
    t = elementary("exp", mx.abs(x) * -k)
    return t / ((1.0 + t) * (1.0 + t))


_DERIVATIVES = {  # f'(x) times g, from x and the result o, in ops of the flow
    "exp": lambda g, x, o: g * conj(o),  # exp also takes complex values
    "expm1": lambda g, x, o: g * (o + 1.0),
    "log": lambda g, x, o: g / x,
    "log1p": lambda g, x, o: g / (x + 1.0),
    "log2": lambda g, x, o: g / (x * _LN2),
    "log10": lambda g, x, o: g / (x * _LN10),
    "sin": lambda g, x, o: g * elementary("cos", x),
    "cos": lambda g, x, o: -(g * elementary("sin", x)),
    "tanh": lambda g, x, o: g * (_bell(x, 2.0) * 4.0),
    "sigmoid": lambda g, x, o: g * _bell(x, 1.0),
    "erf": lambda g, x, o: g * (elementary("exp", -(x * x)) * _TWO_OVER_SQRT_PI),
    "sqrt": lambda g, x, o: g * 0.5 / o,
    "rsqrt": lambda g, x, o: -(g * 0.5) * o / x,
    "reciprocal": lambda g, x, o: -(g * o) * o,
}


def _function_vjp(fn: str, d):
    """The VJP rule of a function of one operand, ``d(g, x, o)`` (real operands; exp
    also complex ones)."""

    def vjp(e, g):
        x = e.args[0]
        if not isinstance(x, ARRAY) or (
                x.dtype not in REAL and not (fn == "exp" and x.dtype == mx.complex64)):
            return NotImplemented
        return (d(g, x, e.out),)

    return vjp


def _power_vjp(e, g):
    x, y = e.args[:2]
    if any(isinstance(v, ARRAY) and v.dtype == mx.complex64 for v in (x, y)):
        return NotImplemented
    gx = gy = None
    if isinstance(x, ARRAY) and mx.issubdtype(x.dtype, mx.inexact):
        gx = unbroadcast(g * y * (x ** (y - 1)), x)
    if isinstance(y, ARRAY) and mx.issubdtype(y.dtype, mx.inexact):
        # x^y log x, and 0 where x^y is 0 (MLX's: 0^y, and a negative base whose
        # power underflowed, where log x is -Inf or NaN)
        gy = unbroadcast(mx.where(e.out == 0, 0.0, g * e.out * mx.log(x)), y)
    return (gx, gy)


def _arctan2_vjp(e, g):
    a, b = e.args[:2]
    r = a * a + b * b
    return (unbroadcast(g * b / r, a), unbroadcast(-(g * a) / r, b))


def _logaddexp_vjp(e, g):
    """``d/da = sigmoid(a - b)``, ``d/db = sigmoid(b - a)`` (MLX's form)."""
    a, b = e.args[:2]
    d = a - b
    s = elementary("sigmoid", d if isinstance(d, ARRAY) else mx.array(d))
    return (unbroadcast(g * s, a), unbroadcast(g * (1.0 - s), b))


def _arcsinh_derivative(g, x, o):
    """``g / sqrt(1 + x^2)``, ``g / |x|`` above 2^26 (x^2 would overflow), each on
    an argument clamped to its branch (NaN stays NaN)."""
    a = mx.abs(x)
    return g * mx.where(a > _HUGE, 1 / mx.maximum(a, _HUGE),
                        mx.rsqrt(1 + mx.square(mx.minimum(a, _HUGE))))


def _arccosh_derivative(g, x, o):
    """``g / sqrt((x - 1)(x + 1))``, ``g / x`` above 2^26 (the product would
    overflow), each on an argument clamped to its branch (NaN stays NaN)."""
    t = mx.minimum(x, _HUGE)
    # (+ 0.0: the product at x = -1 is -0, whose rsqrt is -Inf; MLX's is +Inf)
    return g * mx.where(x > _HUGE, 1 / mx.maximum(x, _HUGE),
                        mx.rsqrt((t - 1) * (t + 1) + 0.0))


# the functions recorded as one op (their decompositions' derivatives lost these)
_DERIVATIVES.update({
    "sinh": lambda g, x, o: g * mx.cosh(x),
    "cosh": lambda g, x, o: g * mx.sinh(x),
    "arcsinh": _arcsinh_derivative,
    # 1 / sqrt(1 - x^2) from (1 - x)(1 + x) (exact near +-1): +Inf at +-1
    "arcsin": lambda g, x, o: g * mx.rsqrt((1 - x) * (1 + x)),
    "arccos": lambda g, x, o: -(g * mx.rsqrt((1 - x) * (1 + x))),
    "arctanh": lambda g, x, o: g / ((1 - x) * (1 + x)),
    "arccosh": _arccosh_derivative,
    # sqrt(pi)/2 e^(erfinv(x)^2): +Inf at +-1, NaN beyond (the result's)
    "erfinv": lambda g, x, o: g * (elementary("exp", o * o) * _HALF_SQRT_PI),
})

VJPS = {**{fn: _function_vjp(fn, d) for fn, d in _DERIVATIVES.items()},
        "power": _power_vjp, "arctan2": _arctan2_vjp, "logaddexp": _logaddexp_vjp}
"""Op name -> VJP rule (see :mod:`.base`)."""
