"""What every rule shares: the call's context, operands as double-word, results
with their low words attached, and the helpers families reuse.

A rule is called as ``rule(ctx, original, *args, **kwargs)`` with the original MLX
callable (the function, or the ``mx.array`` method for a method call) and the
call's arguments, ``stream`` removed (the dispatcher runs the rule on that stream,
:mod:`..dispatch`). It returns the op's result (an ordinary ``mx.array`` of MLX's
shape and dtype, its low word attached by :func:`~..carry.attach`), or
``NotImplemented`` when the operands are not for it (float16, bfloat16 or integer
arrays, no array at all): the dispatcher then calls MLX's op unchanged, and
reports it if it consumed a carried value.

Operands: float32 / complex64 arrays (their carried low word, else exact),
Python and numpy scalars at their float64 value in two words (0.1 is not rounded
to float32 first). ``mx.float64`` operands make MLX compute in float64: the
double-word operands then enter as their exact float64 values (``hi + lo``).
"""

from __future__ import annotations

import numbers

import mlx.core as mx
import numpy as np

from ...doubleword import engine64, functions, fusion
from ...doubleword.fusion import differentiating
from ...doubleword.types import DoubleWord, is_word_array
from ...doubleword.engine64 import to64
from .. import arith, autodiff, carry, recipes
# (as64, low_word, wide_value: imported by the rule families from here)
from ..carry import (as64, attach, attach_words, has_words, low_word,  # noqa: F401
                     wide_value, words_of)
from ..constructor import ARRAY  # the class (mx.array is a stand-in inside blocks)


SCALARS = (numbers.Number, np.number)


class OfOriginal:
    """A fast path made for each callable of an op (:data:`.FAST`): ``make(original)``
    returns ``fast(*args)``, which calls that callable (a function and a method of
    one op take their arguments differently)."""

    __slots__ = ("make",)

    def __init__(self, make):
        self.make = make


class Operands:
    """What a rule needs to know about its call: the backend, the stream and the
    block's report (decompositions run their sub-ops with the flow on)."""

    __slots__ = ("backend", "stream", "report")

    def __init__(self, backend: str, stream, report=None):
        self.backend, self.stream, self.report = backend, stream, report


def is_integer_array(x) -> bool:
    return isinstance(x, ARRAY) and (mx.issubdtype(x.dtype, mx.integer) or x.dtype == mx.bool_)


_HALF = (mx.float16, mx.bfloat16)


def words(x) -> DoubleWord | None:
    """x as a DoubleWord, or None when x is not an operand a rule takes. Integer
    and bool arrays enter exactly: ``hi = RN32(a)`` and ``lo = a - hi`` (exact in
    the integer type, and a float32 value for integers below 2^48); float16 and
    bfloat16 arrays as their float32 values (exact), as MLX promotes them next to
    float32 (a rule takes them only beside a double-word operand)."""
    if is_word_array(x):
        w = words_of(x)
        return arith.exact(x) if w is None else w
    if is_half_array(x):
        return arith.exact(x.astype(mx.float32))
    if is_integer_array(x):
        hi = x.astype(mx.float32)
        if x.dtype in (mx.bool_, mx.int8, mx.uint8, mx.int16, mx.uint16):
            return arith.exact(hi)  # exact in float32
        return DoubleWord(hi, _integer_low(x, hi))
    if isinstance(x, SCALARS) and not isinstance(x, (bool, np.bool_)):
        return arith.constant(x)
    return None


_OUTSIDE = {mx.int64: 2.0 ** 63, mx.uint64: 2.0 ** 64}  # a float32 hi there: outside the type


def _integer_low(x: mx.array, hi: mx.array) -> mx.array:
    """``x - hi`` in float32 for an integer array ``x`` (32 or 64 bits) and its
    float32 rounding ``hi``: exact in the integer type (|x - hi| <= ulp(hi) / 2, so
    a float32 value for |x| < 2^48). RN32 may round up, past ``x``: the difference
    of unsigned integers is then taken the other way round and negated (it would
    wrap), and where ``hi`` is 2^63 (int64) or 2^64 (uint64), outside the type,
    ``hi - x`` is ``(2^63 - 1 - x) + 1``, or ``0 - x`` in uint64's arithmetic
    modulo 2^64."""
    if x.dtype in (mx.int32, mx.uint32):  # both fit int64
        return (x.astype(mx.int64) - hi.astype(mx.int64)).astype(mx.float32)
    out = hi >= _OUTSIDE[x.dtype]
    h = mx.where(out, 0.0, hi).astype(x.dtype)
    up = h > x  # (False where out: h is 0 there)
    below = mx.where(up, h - x, x - h).astype(mx.float32)  # |x - h|, without a wrap
    past = (mx.array(np.iinfo(np.int64).max, mx.int64) - x) + 1 if x.dtype == mx.int64 else (
        mx.array(0, mx.uint64) - x)
    return mx.where(out, -past.astype(mx.float32), mx.where(up, -below, below))


def promoted(v):
    """``v`` as MLX promotes it next to a float32 operand: an integer, bool, float16
    or bfloat16 array as float32 words carrying its exact value (:func:`words`; the
    kernels read float32 words only), anything else unchanged."""
    return result(words(v)) if is_integer_array(v) or is_half_array(v) else v


def is_half_array(x) -> bool:
    return isinstance(x, ARRAY) and x.dtype in _HALF


def beside_float32(*operands) -> tuple:
    """The operands of an op with a float32 array among them (a product, a
    concatenation, a convolution): its integer, bool and half partners as MLX
    promotes them, in their exact words (:func:`promoted`); otherwise unchanged
    (MLX's own op or error)."""
    if any(is_word_array(o) and o.dtype == mx.float32 for o in operands):
        return tuple(promoted(o) for o in operands)
    return operands


def of_integers(rule, with_float_scalar: bool = False):
    """The rule of an op that MLX computes in floating point for integer and bool
    arrays too (float32 results: ``mx.exp(i)``, ``mx.mean(i)``, ``mx.arctan2(i,
    j)``; ``with_float_scalar``: only next to a Python float, as ``mx.clip(i, 0.5,
    2.5)``, ``i // 0.5``, where integers alone give integers): its integer and bool
    array arguments enter as their exact values (:func:`promoted`), so the result
    is double-word like any other, where MLX rounds the integers to float32, then
    the function's value. Where the rule then declines, MLX's op runs on the
    arguments as given."""

    def wrapped(ctx, original, *args, **kw):
        if _integers_promote(args, with_float_scalar):
            return rule(ctx, original, *[promoted(a) for a in args], **kw)
        return rule(ctx, original, *args, **kw)

    return wrapped


def _integers_promote(args, with_float_scalar: bool) -> bool:
    """MLX promotes the integer / bool arrays among ``args`` to float32: there is
    one and no float16 / bfloat16 array (the result would be of that type), and
    (``with_float_scalar``) a Python / numpy float or complex scalar."""
    return (any(is_integer_array(a) for a in args) and not any(is_half_array(a) for a in args)
            and (not with_float_scalar or any(
                isinstance(a, (float, complex, np.floating, np.complexfloating)) for a in args)))


def floating_result(x, y) -> bool:
    """MLX's promotion gives float32 / complex64: a double-word operand, or an
    integer array with a Python / numpy float or complex scalar."""
    return is_word_array(x) or is_word_array(y) or _integers_promote((x, y), True)


def integer_quotient(x, y) -> bool:
    """``x / y`` of integers, which MLX divides into float32 (``mx.arange(n) / n``):
    an integer array by an integer array or a Python / numpy integer, or the
    reverse."""
    if not (is_integer_array(x) or is_integer_array(y)):
        return False
    return all(is_integer_array(v) or isinstance(v, (int, np.integer)) for v in (x, y))


# MLX's own astype, captured at import (before any block: inside one the array's
# methods and mx's names are the flow's stand-ins, a detour for float64 values)
_ASTYPE = ARRAY.astype


def small64(v):
    """The float64 value a one-op cpu step reads of an operand (a float32 array
    below the engine's FUSE_MIN elements: its carried float64 value, or its high
    word when exact; a Python float or int: its value as a constant), or None for
    any other operand (the rule's general path reads it)."""
    if isinstance(v, ARRAY):
        if v.dtype != mx.float32 or v.size >= engine64.FUSE_MIN:
            return None
        wide = carry.wide_value(v)
        if wide is not None:
            return wide[0]
        if has_words(v):
            return None  # words without a float64 value: joined by the general path
        return _ASTYPE(v, mx.float64, stream=mx.cpu)
    if type(v) is float or type(v) is int:
        return arith.constant64(v)
    return None


_F32, _C64 = mx.float32, mx.complex64


def fused(op: str, args: tuple, backend, fn: tuple | None = None) -> mx.array | None:
    """The frequent case of an elementwise op on a kernel backend, for the
    dispatcher to try before the rule (no keyword arguments): ``op`` of
    :func:`~mlx_precise.doubleword.fusion.apply` (``fn``: its function) on float32
    arrays (their carried low words, else exact) and Python floats / ints (their
    two words, held by the program: no array is made for them), fused with the
    operands' expressions, the result's low word attached; complex64 arrays and
    Python complex numbers too for ``+ - *`` and ``/`` by a real divisor (the
    partwise programs, scalars as :func:`~..arith.constant` makes them). What the
    rule computes, without its checks; None for any other operand, inside MLX's
    autodiff, and where the operands do not fuse (the rule decides)."""
    if differentiating():
        return None
    operands, arrays, cx = [], False, False
    for v in args:
        if isinstance(v, ARRAY):
            if v.dtype != _F32:
                if v.dtype != _C64:
                    return None
                cx = True
            if arrays and v is args[0]:  # x * x: one operand (one slot)
                operands.append(operands[0])
                continue
            operands.append((v, low_word(v)))
            arrays = True
        elif type(v) is float or type(v) is int:
            operands.append(arith.scalar_expression(v))
        elif type(v) is complex:
            cx = True
            operands.append(v)
        else:
            return None
    if not arrays:
        return None
    if not cx:
        words = fusion.apply_pairs(op, operands, backend, fn)
        return None if words is None else attach(*words)
    # complex: the rule's words, scalars as constants' DoubleWords
    if fn is not None or op not in ("add", "sub", "mul", "div") or op == "div" and (
            type(args[1]) is complex or isinstance(args[1], ARRAY) and args[1].dtype == _C64):
        return None  # (a complex quotient: the rule's cdw_div)
    if autodiff.recording():
        z = _complex_words(Operands(backend, None), op, *args)
    else:  # (a program over the parts: dozens of Python steps, replayed on metal)
        z = _replayed_complex(Operands(backend, None), op, *args)
    return None if z is NotImplemented else z


def _complex_words(ctx, op: str, *args) -> mx.array:
    """:func:`fused`'s complex ``op`` of ``args`` (float32 / complex64 arrays,
    Python numbers; two), its result or NotImplemented."""
    operands = [(v, low_word(v)) if isinstance(v, ARRAY) else v for v in args]
    if len(args) == 2 and args[1] is args[0]:
        operands[1] = operands[0]
    seen = {}
    for k, w in enumerate(operands):
        if type(w) is tuple:  # (the same pair twice: one DoubleWord, as x * x above)
            seen.setdefault(id(w), DoubleWord.exact(w[0]) if w[1] is None
                            else DoubleWord.of_words(*w))
            operands[k] = seen[id(w)]
        else:  # (args and operands align: one operand per argument)
            operands[k] = arith.constant(args[k])
    z = fusion.apply(op, operands, ctx.backend)
    return NotImplemented if z is None else attach(z.hi, z._lo)


_replayed_complex = recipes.replayed(_complex_words)


def result64(re: mx.array) -> mx.array:
    """The array a cpu fast path returns for the float64 value ``re``: its float32
    rounding, carrying ``re`` (what :func:`result` of ``engine64.from64(re)``
    returns, without the DoubleWord)."""
    return attach(_ASTYPE(re, mx.float32, stream=mx.cpu), None, (re, None))


def result(z: DoubleWord) -> mx.array:
    """The array a rule returns: the high words, with the low words (and on cpu
    the float64 value) attached."""
    return attach_words(z.hi, z)


def moved(ctx, call, ws: list) -> mx.array | list:
    """The result of an op that only moves or selects values (the same op on any
    dtype, exact), ``call(parts)`` with one array per operand, on the DoubleWords
    ``ws`` (of one dtype): MLX's op on the high words (its result and its errors),
    and on cpu on the float64 values (exact operands converted once), elsewhere on
    the low words. One array or a list of them, the low words attached."""
    hi = call([w.hi for w in ws])
    many = isinstance(hi, (list, tuple))
    if ctx.backend.float64_engine:
        with mx.stream(mx.cpu):
            values = [to64(w) for w in ws]
            re = call([v[0] for v in values])
            im = call([v[1] for v in values]) if ws[0].is_complex else (
                [None] * len(hi) if many else None)
        if many:
            return type(hi)(attach_words(h, DoubleWord.from_wide(h, (r, i)))
                            for h, r, i in zip(hi, re, im))
        return attach_words(hi, DoubleWord.from_wide(hi, (re, im)))
    lo = call([w.lo for w in ws])
    return type(hi)(attach(h, l_) for h, l_ in zip(hi, lo)) if many else attach(hi, lo)


def has_float64(args) -> bool:
    return any(isinstance(a, ARRAY) and a.dtype == mx.float64 for a in args)


def carries(v) -> bool:
    """True when ``v`` holds more than its float32 / complex64 value: an array with
    a low word, or a scalar that float32 does not represent."""
    if isinstance(v, ARRAY):
        return has_words(v)
    return isinstance(v, SCALARS) and not arith.is_float32(v)


def axes_of(ndim: int, axis) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = [int(a) for a in ((axis,) if isinstance(axis, int) else axis)]
    if any(not -ndim <= a < ndim for a in axes) or len(set(a % ndim for a in axes)) < len(axes):
        return None  # out of range or repeated: the rule declines, MLX raises its error
    return tuple(sorted(a % ndim for a in axes))


def decomposed(fn):
    """An op defined by a composition of ops that have rules (as PyTorch's
    decompositions): ``fn`` runs with the flow on, so every sub-op is double-word
    and the result is rounded once. ``fn`` takes the op's arguments."""

    def rule(ctx, original, *args, **kw):
        if not any(is_word_array(a) for a in args):
            return NotImplemented
        with carry.reporting(ctx.report):
            return fn(*args, **kw)

    return rule


def one_op(fn):
    """The rule of a composition (see :func:`decomposed`) recorded as one op, which
    its VJP rule (its family's ``VJPS``) differentiates, where the composition's
    own derivative would lose what the function keeps: ``logaddexp`` at ``a == b``
    ((0, 1): ``max`` and ``|.|`` pick sides; MLX's is (1/2, 1/2)), cosh near 0 (the
    difference of two e^(-+x - 1) cotangents cancels: 0 for sinh(1e-30)),
    ``arcsinh`` and ``arccosh`` of NaN (the unselected branch's derivative masked
    it: 0), ``erfinv`` at and beyond +-1 (0 for +Inf and NaN), ``arcsin``,
    ``arccos``, ``arctanh``, ``arccosh`` at +-1 (NaN for float32's +-Inf: a square
    root's infinite derivative times 0), ``remainder`` and ``floor_divide`` (their
    float64 steps run with the flow off)."""

    def rule(ctx, original, *args, **kw):
        if not any(is_word_array(a) for a in args):
            return NotImplemented
        with carry.reporting(ctx.report), autodiff.unrecorded():
            return fn(*args, **kw)

    return rule


def kernel_form(ctx) -> bool:
    """Whether a rule runs its kernel form (its decomposition's steps called on the
    words): on a kernel backend, outside gradient recording (the tape records the
    decomposition's ops) and MLX's autodiff (it differentiates them)."""
    return not (ctx.backend.float64_engine or autodiff.recording() or differentiating())


def float64_form(fast, decomposition, kernels=None):
    """The rule of an op defined by ``decomposition`` (see :func:`decomposed`) that
    the cpu backend computes by ``fast(*args, **kw)`` instead, a float64 formula
    of the same operations in the same order (the same bits, without the
    decomposition's full-size intermediates). ``fast`` returns NotImplemented for
    the operands it does not take. While a gradient records, the op is recorded
    as one op (its VJP rule, declared in its family's ``VJPS``, differentiates
    it) unless an array is passed by keyword (the tape differentiates keyword
    arrays by MLX's float32 VJP: the decomposition's ops are recorded instead), on
    every backend (on emulate / metal the decomposition runs unrecorded). Under
    MLX's own autodiff (:func:`~mlx_precise.doubleword.fusion.differentiating`)
    the decomposition runs: its steps are what MLX can differentiate.

    ``kernels``: the kernel backends' form, ``kernels(ctx, *args, **kw)``, the
    decomposition's steps called on the words (the same bits, without the flow's
    work per step), or NotImplemented; the decomposition runs instead while a
    gradient records (the tape records its steps) and under MLX's autodiff."""
    slow = decomposed(decomposition)

    def rule(ctx, original, *args, **kw):
        if differentiating():
            return slow(ctx, original, *args, **kw)
        if ctx.backend.float64_engine:
            if not (autodiff.recording() and any(isinstance(v, ARRAY) for v in kw.values())):
                out = fast(*args, **kw)
                if out is not NotImplemented:
                    return out
        elif kernels is not None and kernel_form(ctx):
            out = kernels(ctx, *args, **kw)
            if out is not NotImplemented:
                return out
        elif autodiff.recording() and not any(isinstance(v, ARRAY) for v in kw.values()):
            # recorded as one op on the kernel backends too (its VJP rule, in ops of
            # the flow): the decomposition's tape differed from it at special values
            # (logsumexp of a row holding +Inf: 0 beside the NaN); its value by the
            # kernel form (the decomposition's bits, without its ops' dispatch)
            with autodiff.unrecorded():
                out = NotImplemented if kernels is None else kernels(ctx, *args, **kw)
                return slow(ctx, original, *args, **kw) if out is NotImplemented else out
        return slow(ctx, original, *args, **kw)

    return rule


def operand_array(v):
    """An operand of an engine rule as an array: a scalar becomes a 0-d constant
    carrying its second word."""
    if isinstance(v, ARRAY):
        return v
    c = arith.constant(v)
    # (an alias of the constant's array, which is shared: the alias carries the word)
    return attach(_ASTYPE(c.hi, c.hi.dtype), c.lo)


# ---- helpers of the VJP rules ---------------------------------------------------------
# A VJP rule is called as ``vjp(entry, g)`` with the recorded op (``entry.args``,
# ``entry.kwargs``, ``entry.out``, ``entry.original``) and the cotangent ``g`` of its
# output (a list for several outputs); it returns the cotangents of ``entry.args``,
# position by position (None: no gradient; a list for a list argument), or
# NotImplemented (MLX's float32 VJP then runs, reported). It is called two ways
# (:mod:`..autodiff`): with the flow on and the op's own arrays (its ops are then
# double-word), or, on the cpu backend, with the flow off and every float32 array
# replaced by its float64 value (its ops are then MLX's float64 ops, and
# :func:`elementary` the engine's accurate float64 functions).

REAL = (mx.float32, mx.float64)  # a real operand's dtype in either call


def elementary(fn: str, x: mx.array) -> mx.array:
    """``mx.<fn>(x)`` (``fn`` one of the double-word functions) in a VJP rule:
    float64 values (the float64 backward) by the cpu engine's float64 function
    (MLX's float64 exp, sin, cos, erf are only float32-accurate), others by the
    flow's rule."""
    if x.dtype == mx.float64:
        return functions.value64(fn, x)
    return getattr(mx, fn)(x)


def conj(v):
    """The complex conjugate of an array or scalar (real ones unchanged): a VJP of
    a holomorphic op is ``g conj(f')`` (MLX's convention for complex values)."""
    if isinstance(v, ARRAY):
        return mx.conj(v) if v.dtype == mx.complex64 else v
    return v.conjugate() if isinstance(v, complex) else v


def unbroadcast(g, like):
    """``g`` summed down to the shape of the operand ``like`` (numpy broadcasting);
    None when ``like`` is not an array. ``like`` may also have more (leading, unit)
    axes than ``g``: a value assigned into a slot drops them (``e[0, i] = v``, v of
    shape (1, n, d) into a slot of shape (n, d))."""
    if not isinstance(like, ARRAY) or not mx.issubdtype(like.dtype, mx.inexact):
        return None
    if g.shape == like.shape:
        return g
    lead = g.ndim - like.ndim
    if lead < 0:
        g, lead = g.reshape((1,) * -lead + tuple(g.shape)), 0
    axes = list(range(lead)) + [lead + i for i, s in enumerate(like.shape)
                                if s == 1 and g.shape[lead + i] != 1]
    return (mx.sum(g, axis=axes, keepdims=True) if axes else g).reshape(like.shape)


def float64_cotangent(g) -> bool:
    """``g`` (a cotangent, or a list of them) is the float64 backward pass's (on
    cpu: exact float64 values, no words)."""
    return all(c.dtype == mx.float64 for c in (g if isinstance(g, (list, tuple)) else [g]))


def movement(e, g):
    """The VJP of an op that only moves values (a permutation, a selection, zero
    fill: reshape, transpose, slicing, concatenation, ...): MLX's VJP of the op on
    the high and on the low words of the cotangent, each exact, joined."""
    slots = [(i, j) for i, a in enumerate(e.args) for j, b in (
        enumerate(a) if isinstance(a, (list, tuple)) else [(None, a)])
        if isinstance(b, ARRAY) and mx.issubdtype(b.dtype, mx.inexact)]
    if not slots:
        return [None] * len(e.args)
    primals = [e.args[i] if j is None else e.args[i][j] for i, j in slots]

    def f(*arrays):
        args = list(e.args)
        for (i, j), a in zip(slots, arrays):
            if j is None:
                args[i] = a
            else:
                items = list(args[i])
                items[j] = a
                args[i] = type(e.args[i])(items)
        return e.original(*args, **e.kwargs)

    gs = g if isinstance(g, (list, tuple)) else [g]
    with carry.suspended():
        if float64_cotangent(gs):  # the float64 backward: one pass
            _, cots = mx.vjp(f, primals, list(gs))
        else:
            parts = [words(c) for c in gs]
            _, his = mx.vjp(f, primals, [w.hi for w in parts])
            _, los = mx.vjp(f, primals, [w.lo for w in parts])
            cots = [attach(h, l_) for h, l_ in zip(his, los)]
    out = [None] * len(e.args)
    for (i, j), c in zip(slots, cots):
        if j is None:
            out[i] = c
        else:
            if out[i] is None:
                out[i] = [None] * len(e.args[i])
            out[i][j] = c
    return out
