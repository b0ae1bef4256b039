"""Arithmetic, comparisons, selection and the exact one-operand ops: ``+ - * /``
in double-word (:mod:`..arith`), ``where``, ``maximum`` / ``minimum``, exact
comparisons of carried values, negation, conjugation, real / imaginary parts,
``abs``, ``square``, ``astype``, ``clip``, the in-place operators."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ...core import backends
from ...doubleword import engine64, fusion
from ...doubleword.types import DoubleWord, real_imag
from .. import arith, autodiff, carry, recipes
from ..carry import attach, attach_words, has_words, low_word, wide_value
from .base import (_ASTYPE, as64, carries, conj, decomposed, one_op, floating_result, fused,
                   has_float64, integer_quotient, is_integer_array, is_word_array, kernel_form,
                   movement, of_integers, promoted, result, result64, small64, unbroadcast,
                   words)
from .float64 import on_cpu
from .linear import noting_transposes
from .shape import _setitem
from ..constructor import ARRAY  # the class (mx.array is a stand-in inside blocks)


# (MLX's functions, captured at import: inside a block mx's names are stand-ins)
_OPS64 = {"add": mx.add, "sub": mx.subtract, "mul": mx.multiply, "div": mx.divide}


def _fast(op: str):
    """The frequent case of ``x op y``, for the dispatcher to try before the rule
    (no keyword arguments): on a kernel backend the fused op of float32 arrays and
    Python scalars (:func:`.base.fused`); on the cpu engine both operands read by
    :func:`.base.small64`, one MLX float64 op and the float32 rounding, the float64
    value attached (x - y is x + (-y) exactly, as IEEE 754 defines it); None: the
    general path decides."""
    compute = _OPS64[op]

    def fast(x, y):
        backend = backends.backend()
        if backend.has_kernels:
            return fused(op, (x, y), backend)
        if not (isinstance(x, ARRAY) or isinstance(y, ARRAY)):
            return None
        a = small64(x)
        if a is None:
            return None
        b = small64(y)
        if b is None:
            return None
        return result64(compute(a, b, stream=mx.cpu))

    return fast


def _arith(op: str):
    """``x op y``."""

    fast = _fast(op)

    def rule(ctx, original, x, y, *rest, **kw):
        if not (rest or kw) and ctx.backend.float64_engine:  # the frequent case
            z = fast(x, y)
            if z is not None:
                return z
        if has_float64((x, y)):
            return original(as64(x), as64(y), *rest, **kw)
        if rest or not (floating_result(x, y) or op == "div" and integer_quotient(x, y)):
            return NotImplemented
        if kernel_form(ctx) and any(isinstance(v, ARRAY) and v.dtype == mx.complex64 or
                                    type(v) is complex for v in (x, y)):
            return _replayed_binary(ctx, op, x, y)  # (complex: replayed on metal)
        return _binary_words(ctx, op, x, y)

    return rule


def _binary_words(ctx, op: str, x, y) -> mx.array:
    """``x op y`` of the words (:func:`..arith.binary`), or NotImplemented."""
    a, b = words(x), words(y)
    if a is None or b is None:
        return NotImplemented
    return result(arith.binary(op, a, b, ctx.backend, ctx.stream))


_replayed_binary = recipes.replayed(_binary_words)


def _exact1(fn):
    """A one-operand op that is exact on the words: ``fn(DoubleWord) -> DoubleWord``."""

    def rule(ctx, original, x, *rest, **kw):
        if not is_word_array(x) or rest:
            return NotImplemented
        z = fn(words(x))
        return z if z is NotImplemented else result(z)

    return rule


def inplace(rule, functional):
    """``x op= y`` from the rule of ``x op y`` (``functional``: MLX's ``op``). MLX
    updates x in place (other references see it), so the double-word result is
    written into x and its low word re-attached; computed even when neither operand
    carries a low word (``h += e`` of two float32 arrays keeps the sum's exact low
    word, as ``h + e`` does). A ``y`` that broadcasts ``x`` to a larger shape, or
    makes it complex, gives x that shape and dtype, as MLX's in-place update does
    (``mask += bias``, a (L, L) mask and a (heads, L, L) bias; ``y += 1j``)."""

    def rule_(ctx, original, x, y):
        if not is_word_array(x):
            return NotImplemented
        if has_float64((y,)):
            return _into_float64(original, x, y)
        z = rule(ctx, functional, x, y)
        if z is NotImplemented or not is_word_array(z) or z.dtype != x.dtype and not (
                x.dtype == mx.float32 and z.dtype == mx.complex64):
            return NotImplemented
        if z.shape != x.shape or z.dtype != x.dtype:
            # x broadcast (and made complex) in place, its values kept (x + -0 is x:
            # also -0, infinities and NaN; the imaginary part +0 + -0 is +0); its
            # words are z's below
            attach(x, None)
            zero = complex(-0.0, -0.0) if z.dtype == mx.complex64 else -0.0
            ARRAY.__iadd__(x, mx.full(z.shape, zero, z.dtype))
        # (inside a rule the flow is off, so mx.array.__setitem__ is MLX's own)
        if ctx.backend.float64_engine and wide_value(z) is not None:
            # x now holds z's high words, the rounding of z's float64 value: x
            # carries that value (the next step reads it; no low word is built)
            mx.array.__setitem__(x, Ellipsis, z)
            carry.copy(z, x)
        elif _setitem(ctx, mx.array.__setitem__, x, Ellipsis, z) is NotImplemented:
            mx.array.__setitem__(x, Ellipsis, z)  # an exact result: no low word
            attach(x, None)
        return x

    return rule_


_SETITEM = ARRAY.__setitem__  # MLX's own (captured at import)


def _into_float64(update, x, y):
    """``x op= y`` (``update``: MLX's in-place op) with a float64 ``y``: MLX makes x
    a float64 array holding ``x op y`` (its dtype changes in place), from x's exact
    value here. x first becomes that value in place: ``x *= 1.0`` (float64: x's high
    word, exact), then ``x += v - hi`` (exact: v and hi are within half an ulp of hi,
    Sterbenz's lemma; -0.0 where they are equal or hi is not finite, which adds
    nothing and keeps a zero's sign); then MLX's update."""
    if x.dtype != mx.float32 or not has_words(x):
        return NotImplemented  # (MLX's update reads x's whole value)
    v = as64(x)
    with mx.stream(mx.cpu):
        hi = x.astype(mx.float64)
        d = mx.where((v == hi) | ~mx.isfinite(hi), -0.0, v - hi)
    mx.array.__imul__(x, mx.array(1.0, mx.float64))  # (the flow is off in a rule)
    mx.array.__iadd__(x, d)
    attach(x, None)
    return update(x, y)


def inplace_fast(fast):
    """The fast path of ``x op= y`` from that of ``x op y`` (as :func:`inplace`: the
    result written into x, which carries its float64 value); None: the rule runs.
    Not while a gradient records (the dispatcher keeps the old value for it)."""

    def fast_(x, y):
        if not backends.backend().float64_engine:
            return None  # (kernels: the rule writes the words into x)
        z = fast(x, y)
        if z is None or z.shape != x.shape:
            return None
        _SETITEM(x, Ellipsis, z)
        carry.copy(z, x)
        return x

    return fast_


def _where(ctx, original, cond, x, y, **kw):
    if has_float64((x, y)) or not floating_result(x, y):
        return NotImplemented
    a, b = words(x), words(y)
    if a is None or b is None:
        return NotImplemented
    return result(arith.where(cond, a, b, ctx.backend))


def _extremum(larger: bool):
    def rule(ctx, original, x, y, **kw):
        if has_float64((x, y)) or not floating_result(x, y):
            return NotImplemented
        a, b = words(x), words(y)
        if a is None or b is None or arith.is_complex(a) or arith.is_complex(b):
            return NotImplemented
        return result(arith.extremum(a, b, larger, ctx.backend, ctx.stream))

    return rule


# comparison name -> (strict comparison of the high words, comparison of the low words
# on a tie); == and != compare both words
_ORDER = {"less": (mx.less, mx.less), "less_equal": (mx.less, mx.less_equal),
          "greater": (mx.greater, mx.greater),
          "greater_equal": (mx.greater, mx.greater_equal)}


def _compare(name: str):
    """``x < y`` & co. of carried values, exactly: for normalised pairs the order of
    the values is that of (high word, low word) taken lexicographically (equal
    values have equal high words, both being the same rounding), so a high-word
    comparison decides except on a tie, where the low words do. Python / numpy
    scalars compare at their float64 value, whether or not the array carries a low
    word (``x == 0.1`` is False for the float32 value nearest 0.1, as ``x - 0.1`` is
    not zero in a block). Operands that carry nothing (arrays without low words,
    float32-exact scalars) run MLX's comparison unchanged."""

    def rule(ctx, original, x, y, **kw):
        if has_float64((x, y)):
            return NotImplemented
        if not any(carries(v) for v in (x, y)) or not any(is_word_array(v) for v in (x, y)):
            return NotImplemented  # exact operands: MLX's comparison is the answer
        a, b = words(x), words(y)
        if a is None or b is None:
            return NotImplemented
        if ctx.backend.float64_engine and (name in ("equal", "not_equal") or not (
                arith.is_complex(a) or arith.is_complex(b))):
            return engine64.apply(engine64.COMPARISONS[name], a, b)[0]
        if name in ("equal", "not_equal"):
            same = mx.equal(a.hi, b.hi) & mx.equal(a.lo, b.lo)
            return same if name == "equal" else mx.logical_not(same)
        if arith.is_complex(a) or arith.is_complex(b):
            return NotImplemented  # MLX's own error / order for complex values
        strict, tie_break = _ORDER[name]
        return strict(a.hi, b.hi) | (mx.equal(a.hi, b.hi) & tie_break(a.lo, b.lo))

    return rule


def _square(ctx, original, a, **kw):
    if not is_word_array(a):
        return NotImplemented
    w = words(a)
    return result(arith.binary("mul", w, w, ctx.backend, ctx.stream))


def _astype(ctx, original, a, dtype, *rest, **kw):
    """float32 -> complex64 keeps the value; -> float64 is the exact value hi + lo;
    -> an integer, bool, float16 or bfloat16 type is the exact value converted once
    (:func:`_cast_down`). An integer or bool array -> float32 / complex64 is its
    exact value (:func:`.base.promoted`: MLX rounds integers above 2^24)."""
    if is_integer_array(a) and dtype in (mx.float32, mx.complex64) and not rest and not kw:
        x = promoted(a)
        return x if dtype == mx.float32 else result(arith.as_complex(words(x)))
    if not is_word_array(a) or not has_words(a):
        return NotImplemented
    if dtype == a.dtype:  # the same value (the dispatcher returns it as a new array)
        return a
    if dtype == mx.float64 and a.dtype == mx.float32:
        return as64(a)
    if dtype == mx.complex64:
        return result(arith.as_complex(words(a)))
    if a.dtype == mx.float32 and not rest and not kw and _CASTS_DOWN(dtype):
        return _cast_down(ctx, original, a, dtype)
    return NotImplemented


def _CASTS_DOWN(dtype) -> bool:  # noqa: N802 (a predicate on dtypes, read as a set)
    return dtype in (mx.bool_, mx.float16, mx.bfloat16) or mx.issubdtype(dtype, mx.integer)


def _cast_down(ctx, original, a, dtype) -> mx.array:
    """The value ``hi + lo`` cast to ``dtype`` (integer: truncated; bool: nonzero;
    float16 / bfloat16: rounded to nearest even), where MLX's cast of the high word
    alone would be off: ``(2^24 + 1) - 0.25`` truncates to 2^24, not 2^24 + 1; an
    integer ``hi`` with a negative ``lo`` lies just below it.

    Integers: the exact truncation (``trunc``'s rule: two integer words), each word
    converted and summed in 64 bits, then narrowed as MLX narrows integers (the high
    word may round to just outside the type: 2^31 for 2^31 - 1). Bool: ``hi`` is
    zero only where the value is. Half types: ``hi`` rounded to odd first (its last
    bit set where ``lo`` is nonzero, stepping towards ``lo``), after which MLX's
    rounding to nearest is the value's: rounding to odd with two bits to spare keeps
    the information a second rounding needs (Boldo and Melquiond, "Emulation of FMA
    and correctly rounded sums: proved algorithms using rounding to odd", IEEE Trans.
    Computers 57(4), 2008)."""
    w = words(a)
    if dtype == mx.bool_ or w._lo is None and w.wide is None:
        return original(w.hi, dtype)
    if dtype not in (mx.float16, mx.bfloat16):
        z = words(_integer_part("trunc")(ctx, mx.trunc, a))
        wide = mx.uint64 if dtype == mx.uint64 else mx.int64
        with carry.suspended():
            value = original(z.hi, wide) + original(original(z.lo, mx.int64), wide)
        return value if dtype == wide else original(value, dtype)
    hi, lo = w.hi, w.lo
    with carry.suspended():
        bits = hi.view(mx.uint32)
        even = (bits & 1) == 0
        up = (lo > 0) == (hi > 0)  # a larger magnitude
        odd = mx.where(up, bits + 1, bits - 1)
        bits = mx.where((lo != 0) & even & (mx.abs(hi) < np.inf), odd, bits)
        return original(bits.view(mx.float32), dtype)


def _property(fn=None):
    """A property of ``mx.array``: ``fn`` on the words, or (None) the property
    itself read on the high and on the low words (``.T``)."""

    def rule(ctx, original, x):
        if not is_word_array(x) or not has_words(x):
            return NotImplemented
        if fn is None:
            wide = wide_value(x)
            if wide is not None:
                with mx.stream(mx.cpu):
                    wide = tuple(None if v is None else original(v) for v in wide)
                hi = original(x)
                return attach_words(hi, DoubleWord.from_wide(hi, wide))
            return attach(original(x), original(low_word(x)))
        return result(fn(words(x)))

    return rule


def _part(take, k: int):
    """Part ``k`` (0 real, 1 imaginary) of DoubleWord words, exact: of complex
    kernel-backend words (no float64 value) ``take`` (MLX's own mx.real / mx.imag,
    captured at import) of that part's words alone (real_imag makes both parts'
    words); else :func:`~mlx_precise.doubleword.types.real_imag`'s."""

    def part(w: DoubleWord) -> DoubleWord:
        if not w.is_complex or w.wide is not None:
            return real_imag(w)[k]
        p = fusion.part(w, k)  # a kernel's floats: a view of them (of both words at once)
        if p is not None:
            return p
        hi = take(w.hi)
        return DoubleWord.exact(hi) if w._lo is None else DoubleWord(hi, take(w._lo))

    return part


_real = _part(mx.real, 0)


_imag = _part(mx.imag, 1)


def _complex_abs(z):
    """``|re + i im| = s sqrt((re/s)^2 + (im/s)^2)`` with ``s`` the power of two
    nearest the larger part's high word (exact scalings: no overflow or underflow
    of the squares, as MLX's float32 hypot avoids them)."""
    with carry.suspended():  # the scale: built from the high words' float32 bits
        m = mx.maximum(mx.abs(mx.real(z)), mx.abs(mx.imag(z)))
        e = (m.view(mx.int32) >> 23) & 0xFF  # biased exponent (0: zero or subnormal)
        e = mx.clip(e, 1, 254)
        inv = ((254 - e) << 23).view(mx.float32)  # 2^(127 - e): exact
        scale = (e << 23).view(mx.float32)  # 2^(e - 127)
        scale, inv = mx.stop_gradient(scale), mx.stop_gradient(inv)
    re, im = mx.real(z) * inv, mx.imag(z) * inv
    return mx.sqrt(re * re + im * im) * scale


def _abs_rule(ctx, original, x, **kw):
    """``abs``: exact for real values, double-word ``hypot`` for complex ones."""
    if not is_word_array(x):
        return NotImplemented
    if x.dtype != mx.complex64:
        return result(arith.abs(words(x), ctx.backend, ctx.stream))
    with carry.reporting(ctx.report):
        return _complex_abs(x)


def _clip(a, a_min=None, a_max=None, **kw):
    """``mx.clip``: ``minimum(maximum(a, a_min), a_max)`` (exact on the words);
    a None bound leaves that side open."""
    if a_min is not None:
        a = mx.maximum(a, a_min)
    return a if a_max is None else mx.minimum(a, a_max)


def _nan_to_num(ctx, original, a, *args, **kw):
    """Finite values keep both words; NaN and infinities become MLX's
    replacements (decided by the high word, exact)."""
    if not is_word_array(a) or not has_words(a):
        return NotImplemented
    w = words(a)
    hi = original(w.hi, *args, **kw)
    return attach(hi, mx.where(mx.isfinite(w.hi), w.lo, mx.zeros_like(w.lo)))


def _diff(a, n=1, axis=-1, prepend=None, append=None):
    """``n``-th differences along ``axis``, each a double-word subtraction."""
    parts = [v for v in (prepend, a, append) if v is not None]
    if len(parts) > 1 or n < 1:
        return NotImplemented  # MLX's broadcasting of prepend / append; n = 0
    for _ in range(n):
        k = a.shape[axis]
        a = mx.take(a, mx.arange(1, k), axis=axis) - mx.take(a, mx.arange(0, k - 1), axis=axis)
    return a


def _integer_part(kind: str):
    """``floor`` / ``ceil`` / ``trunc`` / ``round`` (to an integer, half to even) of
    carried real values, exactly. A high word that is not an integer lies at least
    an ulp from every integer (and from every half-integer it is not), farther
    than the low word reaches: its own rounding decides, but for a high word at a
    half-integer, where the low word's sign does. An integer high word adds the
    low word's own rounding (a half-integer low word, |hi| < 2^24: towards the even
    neighbour). The result is the sum of two integers, in double-word (exact)."""

    def rule(ctx, original, a, *rest, **kw):
        if kind == "round" and (rest or kw) and is_word_array(a) and a.dtype == mx.float32:
            return _round_to(ctx, a, *rest, **kw)
        if not is_word_array(a) or a.dtype == mx.complex64 or not has_words(a) or rest or kw:
            return NotImplemented  # exact values (MLX's op)
        w = words(a)
        hi, lo = w.hi, w.lo
        with carry.suspended():
            if kind == "ceil":
                hi, lo = -hi, -lo
            if kind == "trunc":
                neg = hi < 0
                hi, lo = mx.where(neg, -hi, hi), mx.where(neg, -lo, lo)
            integral = mx.floor(hi) == hi
            if kind == "round":
                r = mx.round(hi)
                at_half = mx.abs(hi - mx.floor(hi) - 0.5) == 0
                base = mx.where(at_half, mx.where(lo > 0, mx.floor(hi) + 1,
                                                  mx.where(lo < 0, mx.floor(hi), r)), r)
                odd = mx.remainder(hi, 2) != 0
                fix = mx.where((mx.abs(lo) == 0.5) & odd, mx.sign(lo), 0.0)
                extra = mx.where(integral, mx.round(lo) + fix, 0.0)
            else:
                base = mx.floor(hi)
                extra = mx.where(integral, mx.floor(lo), 0.0)
            finite = mx.abs(hi) < np.inf
            extra = mx.where(finite, extra, 0.0)
            base = mx.where(integral, hi, base)
        z = arith.binary("add", arith.exact(base), arith.exact(extra), ctx.backend, ctx.stream)
        if kind in ("ceil", "trunc"):
            z = arith.neg(z) if kind == "ceil" else arith.where(neg, arith.neg(z), z)
        with carry.suspended():  # a zero has the operand's sign (IEEE 754: round(-0.3) = -0;
            hi = mx.where(z.hi == 0, w.hi * 0.0, z.hi)  # the sum above made it +0)
        exact = z._lo is None and z.wide is None
        return result(DoubleWord.exact(hi) if exact else DoubleWord(hi, z.lo))

    return rule


def _round_to(ctx, a, decimals=0, **kw):
    """``mx.round(a, decimals)``: MLX's ``round(a 10^d) / 10^d`` (``round(a / 10^-d)
    10^-d`` for d < 0, where 10^d is no double) in ops of the flow: the scaling, the
    rounding to an integer (half to even, of the exact value) and the division each
    double-word, so the result is ``a`` to ``d`` decimals, rounded once (MLX's float32
    steps round the product and the quotient: round(x, 2) 0.5 ulp off and more)."""
    if kw or not isinstance(decimals, int) or isinstance(decimals, bool):
        return NotImplemented  # (MLX's op or its error)
    with carry.reporting(ctx.report):
        if decimals == 0:
            return mx.round(a)
        scale = 10.0 ** abs(decimals)
        return mx.round(a * scale) / scale if decimals > 0 else mx.round(a / scale) * scale


def _divmod64(a, b):
    """numpy's divmod of float64 values (``npy_divmod``) in MLX float64 ops (called
    with the flow off): the truncated remainder (exact: MLX's remainder of the magnitudes, with
    a's sign), the quotient ``(a - fmod) / b``, one step down where the signs
    differ (the remainder then ``fmod + b``, one rounding), the floor rounded up
    where the division left it just below an integer; zero remainders take b's
    sign, a zero quotient that of ``a / b``."""
    m = mx.remainder(mx.abs(a), mx.abs(b)) * mx.sign(a)
    div = (a - m) / b
    fix = (m != 0) & ((b < 0) != (m < 0))
    mod = mx.where(fix, m + b, mx.where(m == 0, 0.0 * b, m))
    div = mx.where(fix, div - 1, div)
    low = mx.floor(div)
    low = mx.where(div - low > 0.5, low + 1, low)
    return mx.where(div == 0, 0.0 * (a / b), low), mod


def _complex(a, b) -> bool:
    return any(isinstance(v, ARRAY) and v.dtype == mx.complex64 or isinstance(v, complex)
               for v in (a, b))


def _divmod_words(a, b):
    """(floor(a / b), a - b floor(a / b)) of real carried values, numpy's
    convention (the remainder has b's sign), from the operands' exact values in
    float64 on the CPU stream (:func:`_divmod64`; on ``metal`` / ``emulate`` the
    words joined there): exact where the truncated remainder is (always, for
    values of at most 53 significant bits) and rounded once where the signs
    differ, for every quotient (a double-word ``a - floor(a / b) b`` is exact only
    for small ones: 1 % 1e-30 gave 2.2e-16, 1 // -1e30 gave 0). The flow records
    ``floor_divide`` and ``remainder`` as one op each (VJPS: MLX's derivatives, 0
    and ``(1, -floor(a / b))``). Non-finite operands and b = 0 give MLX's
    values."""
    if _complex(a, b):
        return NotImplemented
    with carry.suspended():  # (the operands' exact values, read with the flow off)
        out = on_cpu(_divmod64, (a, b), {})
        if out is NotImplemented:
            return out
        q, r = out
        ordinary = mx.isfinite(a) & mx.isfinite(b) & (b != 0)
        q_mlx, r_mlx = mx.floor_divide(a, b), mx.remainder(a, b)
    return mx.where(ordinary, q, q_mlx), mx.where(ordinary, r, r_mlx)


def _floor_divide(a, b):
    out = _divmod_words(a, b)
    return out if out is NotImplemented else out[0]


def _remainder(a, b):
    out = _divmod_words(a, b)
    return out if out is NotImplemented else out[1]


def _isclose(a, b, rtol=1e-05, atol=1e-08, *, equal_nan=False):
    """``|a - b| <= atol + rtol |b|`` of the carried values (Python constants at
    their float64 value); infinities equal when of one sign, NaN as ``equal_nan``."""
    if any(isinstance(v, ARRAY) and v.dtype == mx.complex64 for v in (a, b)):
        return NotImplemented
    close = mx.abs(a - b) <= atol + rtol * mx.abs(b)
    with carry.suspended():
        same_inf = mx.isinf(a) & (a == b)
        both_nan = mx.isnan(a) & mx.isnan(b) if equal_nan else mx.zeros_like(same_inf)
    return close | same_inf | both_nan


def _array_equal(a, b, equal_nan=False):
    """Same shape and equal carried values (high words, then low words)."""
    if not (isinstance(a, ARRAY) and isinstance(b, ARRAY)):
        return NotImplemented
    if a.shape != b.shape:
        return mx.array(False)
    same = a == b
    if equal_nan:
        with carry.suspended():
            same = same | (mx.isnan(a) & mx.isnan(b))
    return mx.all(same)


def _fast_fused(op: str):
    """The fast path of an exact op of the words on a kernel backend (op "max",
    "min": ``maximum`` / ``minimum``; "neg", "abs": of one real operand): the fused
    op of float32 arrays and Python scalars (:func:`.base.fused`), as the rule's
    :mod:`..arith` function runs it; None elsewhere (the rule decides)."""

    def fast(*args):
        backend = backends.backend()
        return fused(op, args, backend) if backend.has_kernels else None

    return fast


FAST = {"add": _fast("add"), "subtract": _fast("sub"), "multiply": _fast("mul"),
        "divide": _fast("div"), "maximum": _fast_fused("max"), "minimum": _fast_fused("min"),
        "negative": _fast_fused("neg"), "abs": _fast_fused("abs")}
FAST["square"] = lambda x, multiply=FAST["multiply"]: multiply(x, x)
"""Op name -> a fast path the dispatcher tries first (None: the rule runs)."""

def _int(ctx, original, x):
    """``int(x)`` of a carried float32 value of one element: its exact value
    truncated, as ``astype`` to an integer type converts it (``int`` of the float32
    rounding would give 3 for 3 - 2^-30, whose integer part is 2)."""
    if not (is_word_array(x) and x.dtype == mx.float32 and x.size == 1 and carries(x)):
        return NotImplemented
    return int(_cast_down(ctx, _ASTYPE, x, mx.int64).item())


RULES = {
    "add": _arith("add"), "subtract": _arith("sub"), "multiply": _arith("mul"),
    "divide": _arith("div"), "negative": _exact1(arith.neg),
    "conjugate": _exact1(arith.conj), "real": _exact1(_real), "imag": _exact1(_imag),
    "abs": _abs_rule, "square": _square, "maximum": _extremum(True),
    "minimum": _extremum(False), "where": _where, "astype": _astype,
    "clip": of_integers(decomposed(_clip), True), "nan_to_num": _nan_to_num, "diff": decomposed(_diff),
    **{kind: _integer_part(kind) for kind in ("floor", "ceil", "trunc", "round")},
    "isclose": decomposed(_isclose), "array_equal": decomposed(_array_equal),
    "floor_divide": of_integers(one_op(_floor_divide), True),
    "remainder": of_integers(one_op(_remainder), True),
    "divmod": of_integers(decomposed(lambda a, b: NotImplemented if _complex(a, b) else [
        mx.floor_divide(a, b), mx.remainder(a, b)]), True),
    "allclose": decomposed(lambda a, b, rtol=1e-05, atol=1e-08, *, equal_nan=False: mx.all(
        _isclose(a, b, rtol, atol, equal_nan=equal_nan))),
    **{name: _compare(name) for name in ("less", "less_equal", "greater", "greater_equal",
                                         "equal", "not_equal")},
    "array.__int__": _int,
    "array.real": _property(_real), "array.imag": _property(_imag), "array.T": noting_transposes(_property(), lambda x: reversed(range(x.ndim))),
    "array.mT": noting_transposes(_property(), lambda x: [*range(x.ndim - 2), -1, -2]),
}
"""Op name -> rule (``array.``: ``mx.array`` properties)."""


# ---- derivatives ---------------------------------------------------------------------


def _real_operands(e) -> bool:
    """Real operands and result (complex ones: MLX's VJP, its conjugation rules)."""
    return e.out.dtype != mx.complex64 and not any(
        isinstance(a, complex) or isinstance(a, ARRAY) and a.dtype == mx.complex64
        for a in e.args)


def _binary_vjp(fx, fy, complex_ok=False):
    """The VJP of ``x op y`` from the partial derivatives times g (``fx(g, x, y,
    out)``), each summed to its operand's shape (a real operand of a complex op
    takes the real part: MLX's convention). ``complex_ok``: the formulas hold for
    complex values (holomorphic ops: ``g conj(f')``); otherwise MLX's VJP."""

    def vjp(e, g):
        if not (complex_ok or _real_operands(e)) or len(e.args) < 2:
            return NotImplemented
        x, y = e.args[:2]
        return (unbroadcast(fx(g, x, y, e.out), x) if isinstance(x, ARRAY) else None,
                unbroadcast(fy(g, x, y, e.out), y) if isinstance(y, ARRAY) else None)

    return vjp


def _unary_vjp(f):
    def vjp(e, g):
        return (f(g, e.args[0], e.out),) if _real_operands(e) else NotImplemented

    return vjp


VJPS = {
    "add": _binary_vjp(lambda g, x, y, o: g, lambda g, x, y, o: g, True),
    "subtract": _binary_vjp(lambda g, x, y, o: g, lambda g, x, y, o: -g, True),
    "multiply": _binary_vjp(lambda g, x, y, o: g * conj(y), lambda g, x, y, o: g * conj(x),
                            True),
    "divide": _binary_vjp(lambda g, x, y, o: g / conj(y),
                          lambda g, x, y, o: -(g * conj(o)) / conj(y), True),
    "conjugate": lambda e, g: (mx.conj(g),),
    "real": lambda e, g: (g.astype(mx.complex64),) if e.args[0].dtype == mx.complex64
    else (g,),
    "imag": lambda e, g: (g * 1j,) if e.args[0].dtype == mx.complex64 else (g * 0.0,),
    # MLX's: the cotangent times the mask, a tie to y, a NaN operand to neither (the
    # mask's complement gave it to y: leaky_relu'(NaN) was 1), a NaN cotangent to
    # both (a where dropped it: celu'(NaN) and huber'(NaN) were 0)
    "maximum": _binary_vjp(lambda g, x, y, o: g * (x > y), lambda g, x, y, o: g * (y >= x)),
    "minimum": _binary_vjp(lambda g, x, y, o: g * (x < y), lambda g, x, y, o: g * (y <= x)),
    "negative": _unary_vjp(lambda g, x, o: -g),
    "abs": _unary_vjp(lambda g, x, o: g * mx.sign(x)),
    "square": _unary_vjp(lambda g, x, o: g * (x * 2.0)),
    "nan_to_num": _unary_vjp(lambda g, x, o: mx.where(mx.isfinite(x), g, 0.0)),
    "where": lambda e, g: (None, unbroadcast(mx.where(e.args[0], g, 0.0), e.args[1]),
                           unbroadcast(mx.where(e.args[0], 0.0, g), e.args[2]))
    if _real_operands(e) else NotImplemented,
    "astype": lambda e, g: (g,) if e.out.dtype == e.args[0].dtype else NotImplemented,
    **{kind: (lambda e, g: (mx.zeros_like(g),)) for kind in ("floor", "ceil", "trunc", "round")},
    # MLX's derivatives: none for floor_divide; 1 and -floor(a / b) for remainder (the
    # flow's exact floor; MLX's float64 one in the float64 backward)
    "floor_divide": lambda e, g: (None, None),
    "remainder": _binary_vjp(lambda g, x, y, o: g, lambda g, x, y, o: -(g * mx.floor_divide(x, y))),
    "array.T": movement, "array.mT": movement,
    "array.real": lambda e, g: VJPS["real"](e, g), "array.imag": lambda e, g: VJPS["imag"](e, g),
}
"""Op name -> VJP rule (see :mod:`.base`)."""
