"""The table of double-word rules: one entry per MLX op that runs extended.

A rule is called with the original MLX callable and the call's arguments. It
returns the op's result (an ordinary ``mx.array`` of MLX's shape and dtype, with
its low word attached by :func:`~mlx_precise.extended.carry.attach`), or
``NotImplemented`` when the operands are not for it (float16, bfloat16 or integer
arrays, no array at all): the dispatcher then calls MLX's op unchanged.

Rules come in families, each a small factory:

* :func:`_words` - shape and movement ops (``reshape``, slicing, ``pad``, ``take``,
  ``concatenate``, ...): the same MLX op on the high and on the low words, exact.
* :func:`_arith` - ``+ - * /`` in double-word (:mod:`.arith`).
* :func:`_exact1` - one-operand ops that are exact word by word (negation,
  conjugation, real and imaginary parts, ``abs`` of real values).
* reductions (``sum``, ``mean``) and ``where``, ``maximum`` / ``minimum``, ``square``,
  ``astype``.

Operands: float32 / complex64 arrays (their carried low word, else exact),
Python and numpy scalars at their float64 value in two words (0.1 is not rounded
to float32 first). ``mx.float64`` operands make MLX compute in float64: the
double-word operands then enter as their exact float64 values (``hi + lo``).
"""

from __future__ import annotations

import numbers

import mlx.core as mx
import numpy as np

from ..doubleword.words import DoubleWord
from . import arith, carry
from .carry import attach, low_word

_WORD_DTYPES = (mx.float32, mx.complex64)
_SCALARS = (numbers.Number, np.number)


class Operands:
    """What a rule needs to know about its call: the backend, the stream and the
    block's report (decompositions run their sub-ops with the flow on)."""

    __slots__ = ("backend", "stream", "report")

    def __init__(self, backend: str, stream, report=None):
        self.backend, self.stream, self.report = backend, stream, report


def is_word_array(x) -> bool:
    return isinstance(x, mx.array) and x.dtype in _WORD_DTYPES


def words(x) -> DoubleWord | None:
    """x as a DoubleWord, or None when x is not an operand a rule takes."""
    if is_word_array(x):
        lo = low_word(x)
        return DoubleWord(x, lo) if lo is not None else arith.exact(x)
    if isinstance(x, _SCALARS) and not isinstance(x, (bool, np.bool_)):
        return arith.constant(x)
    return None


def result(z: DoubleWord) -> mx.array:
    """The array a rule returns: the high words, with the low words attached."""
    return attach(z.hi, z.lo)


def _as64(x):
    """An operand as MLX's float64 would see it, double-word arrays at their exact
    value ``hi + lo``."""
    if is_word_array(x) and x.dtype == mx.float32:
        lo = low_word(x)
        with mx.stream(mx.cpu):
            return x.astype(mx.float64) if lo is None else x.astype(mx.float64) + lo.astype(
                mx.float64)
    return x


def _has_float64(args) -> bool:
    return any(isinstance(a, mx.array) and a.dtype == mx.float64 for a in args)


# ---- rule families -----------------------------------------------------------------

def _arith(op: str, reverse: bool = False):
    """``x op y`` (``reverse``: the operator's reflected form, ``y op x``)."""

    def rule(ctx, original, x, y, *rest, **kw):
        if _has_float64((x, y)):
            return original(_as64(x), _as64(y), *rest, **kw)
        if not (is_word_array(x) or is_word_array(y)) or rest:
            return NotImplemented
        a, b = words(x), words(y)
        if a is None or b is None:
            return NotImplemented
        if reverse:
            a, b = b, a
        return result(arith.binary(op, a, b, ctx.backend, kw.get("stream", ctx.stream)))

    return rule


def _exact1(fn):
    """A one-operand op that is exact on the words: ``fn(DoubleWord) -> DoubleWord``."""

    def rule(ctx, original, x, *rest, **kw):
        if not is_word_array(x) or rest or kw.get("stream") is not None:
            return NotImplemented
        z = fn(words(x))
        return z if z is NotImplemented else result(z)

    return rule


def _words(pos: int = 0, listed: bool = False):
    """A shape / movement op: apply it to the high and to the low words. ``pos`` is
    the position of the array argument (``listed``: a list of arrays, as in
    ``concatenate``); outputs may be one array or a list (``split``)."""

    def rule(ctx, original, *args, **kw):
        if len(args) <= pos:
            return NotImplemented
        arg = args[pos]
        items = list(arg) if listed and isinstance(arg, (list, tuple)) else [arg]
        if not any(is_word_array(a) and low_word(a) is not None for a in items):
            return NotImplemented  # nothing carried: MLX's op is the exact answer
        if not all(is_word_array(a) for a in items) or len({a.dtype for a in items}) > 1:
            return NotImplemented
        ws = [words(a) for a in items]

        def call(k):
            new = [w.hi if k == 0 else w.lo for w in ws]
            a = list(args)
            a[pos] = new if listed else new[0]
            return original(*a, **kw)

        hi, lo = call(0), call(1)
        if isinstance(hi, (list, tuple)):
            return type(hi)(attach(h, l_) for h, l_ in zip(hi, lo))
        return attach(hi, lo)

    return rule


def carries(v) -> bool:
    """True when ``v`` holds more than its float32 / complex64 value: an array with
    a low word, or a scalar that float32 does not represent."""
    if isinstance(v, mx.array):
        return low_word(v) is not None
    return isinstance(v, _SCALARS) and not arith.is_float32(v)


def _setitem(ctx, original, x, index, value):
    """``x[index] = value`` in place: the high words through MLX, the low words in
    a copy of x's low words (value's low words, or 0 where value is plain)."""
    if not is_word_array(x) or (low_word(x) is None and not carries(value)):
        return NotImplemented
    lo = mx.zeros_like(x) if low_word(x) is None else low_word(x) * 1  # a private copy
    w = words(value)
    if w is None or (arith.is_complex(w) and x.dtype != mx.complex64):
        original(x, index, value)  # MLX's assignment (or its error); no low word there
        original(lo, index, 0.0)
    else:
        original(x, index, w.hi)
        original(lo, index, w.lo)
    attach(x, lo)
    return None


def _inplace(op: str):
    """``x op= y``: MLX updates x in place (other references see it), so the
    double-word result is written into x and its low word re-attached."""
    compute = _arith(op)

    def rule(ctx, original, x, y):
        if not is_word_array(x) or not (carries(x) or carries(y)) or _has_float64((y,)):
            return NotImplemented
        z = compute(ctx, None, x, y)
        if z is NotImplemented or z.dtype != x.dtype or z.shape != x.shape:
            return NotImplemented
        # (inside a rule the flow is off, so mx.array.__setitem__ is MLX's own)
        _setitem(ctx, mx.array.__setitem__, x, Ellipsis, z)
        return x

    return rule


def _iter(ctx, original, x):
    if not is_word_array(x) or low_word(x) is None or x.ndim == 0:
        return NotImplemented
    lo = low_word(x)
    return iter([attach(x[i], lo[i]) for i in range(x.shape[0])])


def _getitem(ctx, original, x, index):
    if not is_word_array(x) or low_word(x) is None:
        return NotImplemented
    return attach(original(x, index), original(low_word(x), index))


def _pad(ctx, original, a, pad_width, mode="constant", constant_values=0, **kw):
    if not is_word_array(a) or mode != "constant" or isinstance(constant_values, mx.array):
        return NotImplemented
    w, c = words(a), arith.constant(constant_values)
    if arith.is_complex(w) != arith.is_complex(c):
        c = arith.as_complex(c)
    if low_word(a) is None and arith.is_float32(constant_values):
        return NotImplemented  # exact data, exact constant: MLX's op is the answer
    return attach(original(w.hi, pad_width, mode, c.hi, **kw),
                  original(w.lo, pad_width, mode, c.lo, **kw))


def _where(ctx, original, cond, x, y, **kw):
    if _has_float64((x, y)) or not (is_word_array(x) or is_word_array(y)):
        return NotImplemented
    a, b = words(x), words(y)
    if a is None or b is None:
        return NotImplemented
    return result(arith.where(cond, a, b))


def _extremum(larger: bool):
    def rule(ctx, original, x, y, **kw):
        if _has_float64((x, y)) or not (is_word_array(x) or is_word_array(y)):
            return NotImplemented
        a, b = words(x), words(y)
        if a is None or b is None or arith.is_complex(a) or arith.is_complex(b):
            return NotImplemented
        return result(arith.extremum(a, b, larger))

    return rule


def _axes(ndim: int, axis) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    return tuple(sorted({int(a) % ndim for a in axes})) if ndim else ()


def _reduction(mean: bool):
    def rule(ctx, original, a, axis=None, keepdims=False, **kw):
        if not is_word_array(a):
            return NotImplemented
        axes = _axes(a.ndim, axis)
        s = arith.reduce_sum(words(a), axes, keepdims, ctx.backend, kw.get("stream", ctx.stream))
        if mean:
            n = int(np.prod([a.shape[d] for d in axes]))
            s = arith.binary("div", s, arith.constant(n), ctx.backend, ctx.stream)
        return result(s)

    return rule


def _square(ctx, original, a, **kw):
    if not is_word_array(a):
        return NotImplemented
    w = words(a)
    return result(arith.binary("mul", w, w, ctx.backend, kw.get("stream", ctx.stream)))


def _astype(ctx, original, a, dtype, *rest, **kw):
    """float32 -> complex64 keeps the value; -> float64 is the exact value hi + lo;
    a narrower type is a rounding exit (MLX's cast of the high word)."""
    if not is_word_array(a) or low_word(a) is None:
        return NotImplemented
    if dtype == a.dtype:
        return a
    if dtype == mx.float64 and a.dtype == mx.float32:
        return _as64(a)
    if dtype == mx.complex64:
        return result(arith.as_complex(words(a)))
    return NotImplemented


def _property(fn=None):
    """A property of ``mx.array``: ``fn`` on the words, or (None) the property
    itself read on the high and on the low words (``.T``)."""

    def rule(ctx, original, x):
        if not is_word_array(x) or low_word(x) is None:
            return NotImplemented
        if fn is None:
            return attach(original(x), original(low_word(x)))
        return result(fn(words(x)))

    return rule


_real = (lambda w: arith.parts(w)[0])
_imag = (lambda w: arith.parts(w)[1])


def _abs(w: DoubleWord):
    # |re + i im| needs a double-word square root: not a rule yet.
    return NotImplemented if arith.is_complex(w) else arith.abs(w)


def _decomposed(fn):
    """An op defined by a composition of ops that have rules (as PyTorch's
    decompositions): ``fn`` runs with the flow on, so every sub-op is double-word
    and the result is rounded once. ``fn`` takes the op's arguments."""

    def rule(ctx, original, *args, **kw):
        if not any(is_word_array(a) for a in args) or kw.get("stream") is not None:
            return NotImplemented
        with carry.reporting(ctx.report):
            return fn(*args, **kw)

    return rule


def _var(a, axis=None, keepdims=False, ddof=0):
    """``mean(|a - mean(a)|^2) * n / (n - ddof)`` over ``axis`` (the two-pass
    formula: no cancellation between sums of squares)."""
    axes = _axes(a.ndim, axis)
    n = int(np.prod([a.shape[d] for d in axes]))
    d = a - mx.mean(a, axis=axis, keepdims=True)
    sq = d * mx.conj(d) if a.dtype == mx.complex64 else d * d
    s = mx.sum(mx.real(sq) if a.dtype == mx.complex64 else sq, axis=axis, keepdims=keepdims)
    return s / max(n - ddof, 0) if n - ddof > 0 else s * float("nan")


def _grid(values: np.ndarray, dtype) -> mx.array | object:
    """A float32 grid computed in float64 on the host, in two words."""
    if dtype is not None and dtype != mx.float32:
        return NotImplemented
    with np.errstate(over="ignore", invalid="ignore"):
        hi = values.astype(np.float32)
        lo = np.where(np.isfinite(hi), values - hi.astype(np.float64), 0).astype(np.float32)
    return attach(mx.array(hi), mx.array(lo))


def _linspace(ctx, original, start, stop, num=50, endpoint=True, dtype=mx.float32, **kw):
    """``mx.linspace`` with each point ``start + i (stop - start) / (num - 1)``
    exact in float64 (numpy's formula), not accumulated in float32."""
    if kw.get("stream") is not None or not isinstance(num, int) or num < 0:
        return NotImplemented
    return _grid(np.linspace(float(start), float(stop), num, endpoint=endpoint), dtype)


def _arange(ctx, original, *args, dtype=None, **kw):
    """``mx.arange`` with a float start or step: ``start + i step`` in float64."""
    if kw.get("stream") is not None or not any(isinstance(v, float) for v in args):
        return NotImplemented
    start, stop, step = (0.0, args[0], 1.0) if len(args) == 1 else (
        (args[0], args[1], 1.0) if len(args) == 2 else args[:3])
    if step is None:
        step = 1.0
    n = max(int(np.ceil((float(stop) - float(start)) / float(step))), 0)
    return _grid(float(start) + np.arange(n) * float(step), dtype)


# ---- the table -----------------------------------------------------------------------

SHAPE_OPS = ("reshape", "transpose", "swapaxes", "moveaxis", "expand_dims", "squeeze",
             "broadcast_to", "flatten", "take", "take_along_axis", "atleast_1d",
             "atleast_2d", "atleast_3d", "repeat", "tile", "roll", "flip", "unflatten",
             "diagonal", "permute_dims", "matrix_transpose")

# MLX function name -> rule (functions of mx)
FUNCTIONS = {
    "add": _arith("add"), "subtract": _arith("sub"), "multiply": _arith("mul"),
    "divide": _arith("div"),
    "negative": _exact1(arith.neg), "conjugate": _exact1(arith.conj),
    "conj": _exact1(arith.conj), "real": _exact1(_real), "imag": _exact1(_imag),
    "abs": _exact1(_abs), "square": _square,
    "maximum": _extremum(True), "minimum": _extremum(False), "where": _where,
    "sum": _reduction(False), "mean": _reduction(True),
    "var": _decomposed(_var), "linspace": _linspace, "arange": _arange,
    "pad": _pad, "split": _words(), "concatenate": _words(listed=True),
    "concat": _words(listed=True), "stack": _words(listed=True),
    **{name: _words() for name in SHAPE_OPS},
}

# mx.array method / operator name -> rule
METHODS = {
    "__add__": _arith("add"), "__radd__": _arith("add", reverse=True),
    "__sub__": _arith("sub"), "__rsub__": _arith("sub", reverse=True),
    "__mul__": _arith("mul"), "__rmul__": _arith("mul", reverse=True),
    "__truediv__": _arith("div"), "__rtruediv__": _arith("div", reverse=True),
    "__neg__": _exact1(arith.neg), "__abs__": _exact1(_abs), "abs": _exact1(_abs),
    "conj": _exact1(arith.conj), "square": _square,
    "sum": _reduction(False), "mean": _reduction(True), "var": _decomposed(_var),
    "__getitem__": _getitem, "__setitem__": _setitem, "__iter__": _iter,
    "__iadd__": _inplace("add"), "__isub__": _inplace("sub"), "__imul__": _inplace("mul"),
    "__itruediv__": _inplace("div"), "astype": _astype, "split": _words(),
    **{name: _words() for name in ("reshape", "transpose", "swapaxes", "moveaxis", "squeeze",
                                   "flatten", "diagonal")},
}

# mx.array property name -> rule
PROPERTIES = {"real": _property(_real), "imag": _property(_imag), "T": _property(),
              "mT": _property()}
