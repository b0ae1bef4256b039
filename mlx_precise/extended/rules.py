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

import math
import numbers

import mlx.core as mx
import numpy as np

from ..doubleword import functions
from ..doubleword.words import DoubleWord, from64, to64
from ..linalg import gemm
from . import arith, carry, convolution, spectral
from .carry import attach, attach_words, has_words, low_word, wide_value, words_of
from .engine import words_op

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


def is_integer_array(x) -> bool:
    return isinstance(x, mx.array) and (mx.issubdtype(x.dtype, mx.integer) or x.dtype == mx.bool_)


def words(x) -> DoubleWord | None:
    """x as a DoubleWord, or None when x is not an operand a rule takes. Integer
    and bool arrays enter exactly: ``hi = RN32(a)`` and ``lo = a - hi`` (exact in
    the integer type, and a float32 value for integers below 2^48)."""
    if is_word_array(x):
        w = words_of(x)
        return arith.exact(x) if w is None else w
    if is_integer_array(x):
        hi = x.astype(mx.float32)
        if x.dtype in (mx.bool_, mx.int8, mx.uint8, mx.int16, mx.uint16):
            return arith.exact(hi)  # exact in float32
        wide = mx.int64 if x.dtype in (mx.int32, mx.int64) else mx.uint64
        return DoubleWord(hi, (x.astype(wide) - hi.astype(wide)).astype(mx.float32))
    if isinstance(x, _SCALARS) and not isinstance(x, (bool, np.bool_)):
        return arith.constant(x)
    return None


def _floating_result(x, y) -> bool:
    """MLX's promotion gives float32 / complex64: a double-word operand, or an
    integer array with a Python / numpy float or complex scalar."""
    if is_word_array(x) or is_word_array(y):
        return True
    for a, b in ((x, y), (y, x)):
        if is_integer_array(a) and isinstance(b, (float, complex, np.floating,
                                                   np.complexfloating)):
            return True
    return False


def result(z: DoubleWord) -> mx.array:
    """The array a rule returns: the high words, with the low words (and on cpu
    the float64 value) attached."""
    return attach_words(z.hi, z)


def _as64(x):
    """An operand as MLX's float64 would see it, double-word arrays at their exact
    value ``hi + lo``."""
    if is_word_array(x) and x.dtype == mx.float32:
        wide = wide_value(x)
        if wide is not None:
            return wide[0]
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
        if not _floating_result(x, y) or rest:
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
        if not any(is_word_array(a) and has_words(a) for a in items):
            return NotImplemented  # nothing carried: MLX's op is the exact answer
        if not all(is_word_array(a) for a in items) or len({a.dtype for a in items}) > 1:
            return NotImplemented
        ws = [words(a) for a in items]

        def call(new):
            a = list(args)
            a[pos] = new if listed else new[0]
            return original(*a, **kw)

        hi = call([w.hi for w in ws])
        if all(w.wide is not None for w in ws):  # cpu: move the float64 values instead
            with mx.stream(mx.cpu):
                re = call([w.wide[0] for w in ws])
                im = None if ws[0].wide[1] is None else call([w.wide[1] for w in ws])
            if isinstance(hi, (list, tuple)):
                ims = [None] * len(hi) if im is None else im
                return type(hi)(attach_words(h, DoubleWord.from_wide(h, (r, i)))
                                for h, r, i in zip(hi, re, ims))
            return attach_words(hi, DoubleWord.from_wide(hi, (re, im)))
        lo = call([w.lo for w in ws])
        if isinstance(hi, (list, tuple)):
            return type(hi)(attach(h, l_) for h, l_ in zip(hi, lo))
        return attach(hi, lo)

    return rule


def carries(v) -> bool:
    """True when ``v`` holds more than its float32 / complex64 value: an array with
    a low word, or a scalar that float32 does not represent."""
    if isinstance(v, mx.array):
        return has_words(v)
    return isinstance(v, _SCALARS) and not arith.is_float32(v)


def _setitem(ctx, original, x, index, value):
    """``x[index] = value`` in place: the high words through MLX, the low words in
    a copy of x's low words (value's low words, or 0 where value is plain)."""
    if not is_word_array(x) or (not has_words(x) and not carries(value)):
        return NotImplemented
    lo = low_word(x) * 1 if has_words(x) else mx.zeros_like(x)  # a private copy
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
    if not is_word_array(x) or not has_words(x) or x.ndim == 0:
        return NotImplemented
    lo = low_word(x)
    return iter([attach(x[i], lo[i]) for i in range(x.shape[0])])


def _getitem(ctx, original, x, index):
    if not is_word_array(x) or not has_words(x):
        return NotImplemented
    return attach(original(x, index), original(low_word(x), index))


def _pad(ctx, original, a, pad_width, mode="constant", constant_values=0, **kw):
    if not is_word_array(a) or mode != "constant" or isinstance(constant_values, mx.array):
        return NotImplemented
    w, c = words(a), arith.constant(constant_values)
    if arith.is_complex(w) != arith.is_complex(c):
        c = arith.as_complex(c)
    if not has_words(a) and arith.is_float32(constant_values):
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
    scalars compare at their float64 value. Operands that carry nothing run MLX's
    comparison unchanged."""

    def rule(ctx, original, x, y, **kw):
        if kw.get("stream") is not None or _has_float64((x, y)):
            return NotImplemented
        if not any(is_word_array(v) and has_words(v) for v in (x, y)):
            return NotImplemented
        a, b = words(x), words(y)
        if a is None or b is None:
            return NotImplemented
        if name in ("equal", "not_equal"):
            same = mx.equal(a.hi, b.hi) & mx.equal(a.lo, b.lo)
            return same if name == "equal" else mx.logical_not(same)
        if arith.is_complex(a) or arith.is_complex(b):
            return NotImplemented  # MLX's own error / order for complex values
        strict, tie_break = _ORDER[name]
        return strict(a.hi, b.hi) | (mx.equal(a.hi, b.hi) & tie_break(a.lo, b.lo))

    return rule


def _arg_extreme(larger: bool):
    """``argmax`` / ``argmin`` of carried real values: among the positions where the
    high word is extreme, the one whose low word is (MLX's first index on exact
    ties). A NaN high word gives MLX's answer on the high words."""

    def rule(ctx, original, a, axis=None, keepdims=False, **kw):
        if kw.get("stream") is not None or not is_word_array(a) or not has_words(a):
            return NotImplemented
        if a.dtype == mx.complex64:
            return NotImplemented
        w = words(a)
        hi, lo = (w.hi, w.lo) if axis is not None else (w.hi.reshape(-1), w.lo.reshape(-1))
        ax = axis if axis is not None else 0
        m = (mx.max if larger else mx.min)(hi, axis=ax, keepdims=True)
        key = mx.where(hi == m, lo, -np.inf if larger else np.inf)
        out = original(key, axis=ax, keepdims=True)
        out = mx.where(mx.isnan(m), original(hi, axis=ax, keepdims=True), out)
        if axis is None:
            return out.reshape([1] * a.ndim) if keepdims else out.reshape(())
        return out if keepdims else mx.squeeze(out, axis=ax)

    return rule


def _axes(ndim: int, axis) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = [int(a) for a in ((axis,) if isinstance(axis, int) else axis)]
    if any(not -ndim <= a < ndim for a in axes) or len(set(a % ndim for a in axes)) < len(axes):
        return None  # out of range or repeated: the rule declines, MLX raises its error
    return tuple(sorted(a % ndim for a in axes))


def _reduction(mean: bool):
    def rule(ctx, original, a, axis=None, keepdims=False, **kw):
        if not is_word_array(a):
            return NotImplemented
        axes = _axes(a.ndim, axis)
        if axes is None:
            return NotImplemented
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
    if not is_word_array(a) or not has_words(a):
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


_real = (lambda w: arith.parts(w)[0])
_imag = (lambda w: arith.parts(w)[1])


def _abs(w: DoubleWord):
    return NotImplemented if arith.is_complex(w) else arith.abs(w)


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
    if not is_word_array(x) or kw.get("stream") is not None:
        return NotImplemented
    if x.dtype != mx.complex64:
        return result(arith.abs(words(x)))
    with carry.reporting(ctx.report):
        return _complex_abs(x)


def _extreme_reduction(larger: bool):
    """``max`` / ``min`` over axes: MLX's on the high words (its NaN rule), then
    the extreme low word among the elements holding that high word (exact)."""

    def rule(ctx, original, a, axis=None, keepdims=False, **kw):
        if not is_word_array(a) or a.dtype == mx.complex64 or not has_words(a) or kw:
            return NotImplemented
        hi = original(a, axis=axis, keepdims=True)
        fill = -np.inf if larger else np.inf
        lo = original(mx.where(a == hi, low_word(a), fill), axis=axis, keepdims=True)
        lo = mx.where(mx.isfinite(hi) & mx.isfinite(lo), lo, 0.0)
        if not keepdims:
            axes = _axes(a.ndim, axis)
            hi, lo = (mx.squeeze(v, axis=axes) if axes else v for v in (hi, lo))
        return attach(hi, lo)

    return rule


def _sdpa(q, k, v, *, scale, mask=None, sinks=None, force_fused=False, stream=None):
    """``mx.fast.scaled_dot_product_attention``: ``softmax(q k^T scale + mask) v``
    with grouped-query heads repeated (MLX's definition), each op double-word."""
    heads, kv_heads = q.shape[-3], k.shape[-3]
    if heads != kv_heads:
        k, v = (mx.repeat(t, heads // kv_heads, axis=-3) for t in (k, v))
    s = (q * scale) @ mx.swapaxes(k, -1, -2)
    if isinstance(mask, str):  # "causal": query i sees keys j <= i + (S - L)
        L, S = s.shape[-2], s.shape[-1]
        with carry.suspended():
            keep = mx.arange(S)[None, :] <= mx.arange(L)[:, None] + (S - L)
        s = mx.where(keep, s, -np.inf)
    elif mask is not None and mask.dtype == mx.bool_:
        s = mx.where(mask, s, -np.inf)
    elif mask is not None:
        s = s + mask
    return mx.softmax(s, axis=-1) @ v


def _rope(a, dims, *, traditional, base, scale, offset, freqs=None, **kw):
    """``mx.fast.rope`` by its definition (MLX's reference form): positions
    ``(arange(T) + offset) scale`` along axis -2, inverse frequencies
    ``base^(-i / (dims/2))`` (in float64 on the host, two words) or ``1 / freqs``,
    angles ``theta = positions x inverse frequencies`` and their double-word cos / sin,
    then each pair (the halves of the first ``dims`` features, or neighbours with
    ``traditional``) rotated; features past ``dims`` pass through."""
    T, half = a.shape[-2], dims // 2
    if freqs is None:
        inv = _grid(np.exp(-np.arange(half) * (math.log(base) / half)), None)
    else:
        inv = 1.0 / freqs
    positions = (mx.arange(T, dtype=mx.float32) + offset) * scale
    theta = positions[:, None] * inv[None, :]
    c, s = mx.cos(theta), mx.sin(theta)
    if traditional:
        x1, x2 = a[..., 0:dims:2], a[..., 1:dims:2]
    else:
        x1, x2 = a[..., :half], a[..., half:dims]
    y1, y2 = x1 * c - x2 * s, x1 * s + x2 * c
    if traditional:
        y = mx.stack([y1, y2], axis=-1).reshape(*a.shape[:-1], dims)
    else:
        y = mx.concatenate([y1, y2], axis=-1)
    return y if dims == a.shape[-1] else mx.concatenate([y, a[..., dims:]], axis=-1)


def _rope_rule(ctx, original, a, dims, **kw):
    offset, freqs = kw.get("offset", 0), kw.get("freqs")
    if kw.get("stream") is not None or not is_word_array(a) or a.dtype != mx.float32:
        return NotImplemented
    if dims % 2 or dims > a.shape[-1] or a.ndim < 2 or (
            isinstance(offset, mx.array) and offset.size != 1):
        return NotImplemented  # MLX's own errors / per-batch offsets: plain MLX
    if freqs is not None and not (is_word_array(freqs) and freqs.shape == (dims // 2,)):
        return NotImplemented
    if isinstance(offset, mx.array):
        kw["offset"] = offset.reshape(())
    with carry.reporting(ctx.report):
        return _rope(a, dims, **kw)


def _sdpa_rule(ctx, original, q, k, v, **kw):
    if kw.get("sinks") is not None or kw.get("stream") is not None or kw.get("mask") not in (
            None, "causal") and not isinstance(kw.get("mask"), mx.array):
        return NotImplemented
    if not all(is_word_array(t) and t.dtype == mx.float32 for t in (q, k, v)):
        return NotImplemented
    with carry.reporting(ctx.report):
        return _sdpa(q, k, v, **kw)


def _scan(op: str):
    """``cumsum`` (op "add") / ``cumprod`` ("mul")."""

    def rule(ctx, original, a, axis=None, *, reverse=False, inclusive=True, dtype=None,
             stream=None):
        if not is_word_array(a) or stream is not None or (
                dtype is not None and dtype != a.dtype):
            return NotImplemented
        if axis is not None and _axes(a.ndim, axis) is None:
            return NotImplemented  # MLX raises its own error
        w = words(a)
        if axis is None:  # over the flattened array (both words: a.reshape here is MLX's)
            w, axis = arith._map(lambda t: t.reshape(-1), w), 0
        return result(arith.cumsum(w, int(axis) % max(w.ndim, 1), reverse, inclusive,
                                   ctx.backend, op=op))

    return rule


def _prod(ctx, original, a, axis=None, keepdims=False, **kw):
    if not is_word_array(a) or kw.get("stream") is not None:
        return NotImplemented
    axes = _axes(a.ndim, axis)
    if axes is None:
        return NotImplemented
    return result(arith.reduce_sum(words(a), axes, keepdims, ctx.backend,
                                   ctx.stream, op="mul"))


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
    d = a - mx.mean(a, axis=axis, keepdims=True)  # (MLX's error for an invalid axis)
    n = int(np.prod([a.shape[k] for k in _axes(a.ndim, axis)]))
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


def _operand_array(v):
    """An operand of an engine rule as an array: a scalar becomes a 0-d constant
    carrying its second word."""
    if isinstance(v, mx.array):
        return v
    c = arith.constant(v)
    return attach(c.hi, c.lo)


def _function(fn: str):
    """An elementwise function of :mod:`mlx_precise.doubleword.functions`; its
    gradient is MLX's float32 derivative of the function (of the high words).
    ``exp`` also takes complex values."""

    def rule(ctx, original, x, **kw):
        if not is_word_array(x) or kw.get("stream") is not None:
            return NotImplemented
        if x.dtype == mx.complex64 and fn != "exp":
            return NotImplemented
        # the emulator evaluates; on cpu, erf is scipy's (host)
        host = ctx.backend == "emulate" or (ctx.backend == "cpu" and fn == "erf")
        return words_op(lambda X: functions.unary(fn, X, ctx.backend), original, [x],
                        f"mx.{fn}", host, ctx.backend)

    return rule


def _power(reverse: bool = False):
    """``x ** y`` (``mx.power``, ``**``): small integer and half exponents by the
    exact-rounding arithmetic rules, the rest by the double-word ``power``."""

    def rule(ctx, original, x, y, **kw):
        if reverse:
            x, y = y, x
        if kw.get("stream") is not None or not (is_word_array(x) or is_word_array(y)):
            return NotImplemented
        if any(isinstance(v, mx.array) and v.dtype == mx.complex64 for v in (x, y)):
            return NotImplemented
        if words(x) is None or words(y) is None or _has_float64((x, y)):
            return NotImplemented
        if isinstance(y, (int, float)) and not isinstance(y, bool) and is_word_array(x):
            w = words(x)
            if y == 1:
                return result(w)
            if y == 2:
                return result(arith.binary("mul", w, w, ctx.backend, ctx.stream))
            if y == 0.5:
                return _function("sqrt")(ctx, mx.sqrt, x)
            if y == -1:
                return _function("reciprocal")(ctx, mx.reciprocal, x)
        a, b = _operand_array(x), _operand_array(y)
        return words_op(lambda X, Y: functions.binary("power", X, Y, ctx.backend),
                        lambda p, q: original(p, q) if not reverse else original(q, p),
                        [a, b], "power", ctx.backend == "emulate", ctx.backend)

    return rule


def _arctan2(ctx, original, a, b, **kw):
    if kw.get("stream") is not None or not (is_word_array(a) or is_word_array(b)):
        return NotImplemented
    if words(a) is None or words(b) is None or _has_float64((a, b)) or any(
            isinstance(v, mx.array) and v.dtype == mx.complex64 for v in (a, b)):
        return NotImplemented
    return words_op(lambda X, Y: functions.binary("arctan2", X, Y, ctx.backend), original,
                    [_operand_array(a), _operand_array(b)], "arctan2", ctx.backend == "emulate",
                    ctx.backend)


def _matmul(reverse: bool = False):
    """``a @ b`` (``mx.matmul``): the double-word GEMM of :mod:`mlx_precise.linalg`
    (Dot2-style accumulation of exact products on metal / emulate, float64 on
    cpu); the gradient is MLX's float32 matmul VJP."""

    def rule(ctx, original, a, b, **kw):
        if reverse:
            a, b = b, a
        if kw.get("stream") is not None or not (is_word_array(a) and is_word_array(b)):
            return NotImplemented
        plain = (lambda p, q: original(q, p)) if reverse else original
        return words_op(lambda A, B: gemm.matmul(A, B, ctx.backend), plain, [a, b], "matmul",
                        ctx.backend == "emulate", ctx.backend)

    return rule


def _addmm(c, a, b, alpha=1.0, beta=1.0):
    """``mx.addmm``: ``alpha (a @ b) + beta c`` (nn.Linear's bias term)."""
    ab = a @ b
    ab = ab if alpha == 1 else ab * alpha
    return ab + (c if beta == 1 else c * beta)


def _stopped_max(x, axis):
    """The float32 maximum of the high words, a constant shift (no rounding of the
    result depends on it: softmax and logsumexp are invariant under it)."""
    with carry.suspended():
        return mx.stop_gradient(mx.max(x.real if x.dtype == mx.complex64 else x, axis=axis,
                                       keepdims=True))


def _softmax(x, axis=None, precise=False, **kw):
    m = _stopped_max(x, axis)
    e = mx.exp(x - mx.where(mx.isfinite(m), m, 0.0))
    return e / mx.sum(e, axis=axis, keepdims=True)


def _logsumexp(x, axis=None, keepdims=False, **kw):
    m = mx.where(mx.isfinite(_stopped_max(x, axis)), _stopped_max(x, axis), 0.0)
    s = mx.log(mx.sum(mx.exp(x - m), axis=axis, keepdims=True)) + m
    return s if keepdims else mx.squeeze(s, axis=axis) if axis is not None else s.reshape(())


def _clip(a, a_min=None, a_max=None, **kw):
    """``mx.clip``: ``minimum(maximum(a, a_min), a_max)`` (exact on the words);
    a None bound leaves that side open."""
    if a_min is not None:
        a = mx.maximum(a, a_min)
    return a if a_max is None else mx.minimum(a, a_max)


_LN2 = math.log(2.0)  # its float64 value enters in two words


_HALF_E = math.e / 2  # its float64 value enters in two words


def _sinh(x, **kw):
    """``(e^(x - 1) - e^(-x - 1)) e/2`` for |x| >= 1 (x - 1 is exact there, and
    nothing overflows before float32's own sinh does), ``(expm1(x) - expm1(-x)) /
    2`` below (no cancellation: the terms have opposite signs)."""
    small = (mx.expm1(x) - mx.expm1(-x)) * 0.5
    large = (mx.exp(x - 1) - mx.exp(-x - 1)) * _HALF_E
    with carry.suspended():
        near = mx.abs(x) < 1
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
    """``log(e^a + e^b) = max + log1p(e^(-|a - b|))``."""
    m = mx.maximum(a, b)
    return m + mx.log1p(mx.exp(-mx.abs(a - b)))


def _std(a, axis=None, keepdims=False, ddof=0, **kw):
    return mx.sqrt(mx.var(a, axis=axis, keepdims=keepdims, ddof=ddof))


def _layer_norm(x, weight, bias, eps):
    """``mx.fast.layer_norm`` over the last axis: two-pass mean and variance."""
    mean = mx.mean(x, axis=-1, keepdims=True)
    d = x - mean
    y = d * mx.rsqrt(mx.mean(d * d, axis=-1, keepdims=True) + eps)
    y = y if weight is None else y * weight
    return y if bias is None else y + bias


def _rms_norm(x, weight, eps):
    y = x * mx.rsqrt(mx.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if weight is None else y * weight


def _tensordot(a, b, axes=2, **kw):
    """Contract the last ``axes`` axes of a with the first of b (or the listed
    pairs) by one double-word matmul."""
    if isinstance(axes, int):
        ax_a = list(range(a.ndim - axes, a.ndim))
        ax_b = list(range(axes))
    else:
        ax_a = [int(v) % a.ndim for v in axes[0]]
        ax_b = [int(v) % b.ndim for v in axes[1]]
    free_a = [d for d in range(a.ndim) if d not in ax_a]
    free_b = [d for d in range(b.ndim) if d not in ax_b]
    k = int(np.prod([a.shape[d] for d in ax_a]))
    A = mx.transpose(a, free_a + ax_a).reshape(-1, k)
    B = mx.transpose(b, ax_b + free_b).reshape(k, -1)
    return (A @ B).reshape([a.shape[d] for d in free_a] + [b.shape[d] for d in free_b])


def _inner(a, b, **kw):
    return _tensordot(a, b, axes=([-1], [-1])) if a.ndim and b.ndim else a * b


def _outer(a, b, **kw):
    return a.reshape(-1, 1) * b.reshape(1, -1)


def _einsum_plan(spec: str, ndims: tuple[int, ...]):
    """Batch / contracted / free letters of a two-operand einsum without ellipsis or
    repeated letters within an operand; None when it is not of that kind."""
    if "..." in spec or "->" not in spec:
        return None
    ins, out = spec.replace(" ", "").split("->")
    terms = ins.split(",")
    if len(terms) != 2 or any(len(set(t)) != len(t) for t in terms + [out]):
        return None
    ta, tb = terms
    if (len(ta), len(tb)) != ndims:
        return None
    batch = [c for c in out if c in ta and c in tb]
    contract = [c for c in ta if c in tb and c not in out]
    fa = [c for c in ta if c not in tb]
    fb = [c for c in tb if c not in ta]
    if any(c not in out for c in fa + fb) or set(out) != set(batch + fa + fb):
        return None
    return ta, tb, out, batch, contract, fa, fb


def _einsum(spec, *operands, **kw):
    """Two-operand contractions as one batched double-word matmul (others: MLX)."""
    if len(operands) != 2 or kw:
        return NotImplemented
    a, b = operands
    plan = _einsum_plan(spec, (a.ndim, b.ndim))
    if plan is None:
        return NotImplemented
    ta, tb, out, batch, contract, fa, fb = plan
    size = {**dict(zip(ta, a.shape)), **dict(zip(tb, b.shape))}
    dims = (lambda letters: [size[c] for c in letters])
    A = mx.transpose(a, [ta.index(c) for c in batch + fa + contract])
    B = mx.transpose(b, [tb.index(c) for c in batch + contract + fb])
    n_b = int(np.prod(dims(batch)))
    m, k, n = (int(np.prod(dims(x))) for x in (fa, contract, fb))
    C = A.reshape(n_b, m, k) @ B.reshape(n_b, k, n)
    C = C.reshape(dims(batch) + dims(fa) + dims(fb))
    order = batch + fa + fb
    return mx.transpose(C, [order.index(c) for c in out]) if order != list(out) else C


def _einsum_rule(ctx, original, spec, *operands, **kw):
    if not isinstance(spec, str) or not all(is_word_array(o) for o in operands):
        return NotImplemented
    if len(operands) != 2 or kw or _einsum_plan(spec, tuple(o.ndim for o in operands)) is None:
        return NotImplemented
    with carry.reporting(ctx.report):
        return _einsum(spec, *operands)


def _conv1d(ctx, original, input, weight, stride=1, padding=0, dilation=1, groups=1,
            stream=None):
    """``mx.conv1d``: depthwise convolutions through the double-word depthwise
    kernel (spectral.depthwise), words in and out; the others by
    :mod:`.convolution` (one double-word GEMM over the gathered taps)."""
    if stream is not None or not spectral.is_depthwise(input, weight, groups):
        return convolution.RULES["conv1d"](ctx, original, input, weight, stride, padding,
                                           dilation, groups, stream=stream)
    geometry = (int(stride), int(padding), int(dilation))
    plain = mx.conv1d if original is None else original
    if ctx.backend == "cpu":  # one float64 sum over the taps of the operands' values
        return words_op(
            lambda X, W: from64(spectral.depthwise64(to64(X)[0], to64(W)[0], *geometry)),
            lambda x, w: plain(x, w, *geometry, groups), [input, weight], "mx.conv1d",
            False, "cpu")
    return spectral.conv(
        lambda x, w: spectral.depthwise(x, w, *geometry, ctx.backend, None, False),
        lambda x, w: plain(x, w, *geometry, groups), input, weight, ctx.backend, None)


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
    "abs": _abs_rule, "square": _square, "cumsum": _scan("add"),
    "cumprod": _scan("mul"), "prod": _prod,
    "max": _extreme_reduction(True), "min": _extreme_reduction(False),
    "maximum": _extremum(True), "minimum": _extremum(False), "where": _where,
    "sum": _reduction(False), "mean": _reduction(True),
    "var": _decomposed(_var), "linspace": _linspace, "arange": _arange,
    **convolution.RULES, "conv1d": _conv1d,
    **{fn: _function(fn) for fn in functions.UNARY},
    "power": _power(), "arctan2": _arctan2, "atan2": _arctan2,
    "matmul": _matmul(), "addmm": _decomposed(_addmm), "tensordot": _decomposed(_tensordot),
    "inner": _decomposed(_inner), "outer": _decomposed(_outer), "einsum": _einsum_rule,
    "softmax": _decomposed(_softmax), "logsumexp": _decomposed(_logsumexp),
    "logaddexp": _decomposed(_logaddexp), "std": _decomposed(_std),
    "clip": _decomposed(_clip), "tril": _words(), "triu": _words(),
    **{name: _compare(name) for name in ("less", "less_equal", "greater", "greater_equal",
                                         "equal", "not_equal")},
    "argmax": _arg_extreme(True), "argmin": _arg_extreme(False),
    **{name: _decomposed(fn) for name, fn in (
        ("sinh", _sinh), ("cosh", _cosh), ("tan", _tan), ("arctan", _arctan),
        ("arcsin", _arcsin), ("arccos", _arccos), ("arctanh", _arctanh),
        ("arcsinh", _arcsinh), ("arccosh", _arccosh))},
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
    "__neg__": _exact1(arith.neg), "__abs__": _abs_rule, "abs": _abs_rule,
    "cumsum": _scan("add"), "cumprod": _scan("mul"), "prod": _prod,
    "__lt__": _compare("less"), "__le__": _compare("less_equal"),
    "__gt__": _compare("greater"), "__ge__": _compare("greater_equal"),
    "__eq__": _compare("equal"), "__ne__": _compare("not_equal"),
    "argmax": _arg_extreme(True), "argmin": _arg_extreme(False),
    "max": _extreme_reduction(True), "min": _extreme_reduction(False),
    "conj": _exact1(arith.conj), "square": _square,
    "sum": _reduction(False), "mean": _reduction(True), "var": _decomposed(_var),
    "std": _decomposed(_std), "logsumexp": _decomposed(_logsumexp),
    "__pow__": _power(), "__rpow__": _power(reverse=True),
    "__matmul__": _matmul(), "__rmatmul__": _matmul(reverse=True),
    **{fn: _function(fn) for fn in ("exp", "log", "log1p", "log2", "log10", "sin", "cos", "sqrt",
                                    "rsqrt", "reciprocal")},
    "__getitem__": _getitem, "__setitem__": _setitem, "__iter__": _iter,
    "__iadd__": _inplace("add"), "__isub__": _inplace("sub"), "__imul__": _inplace("mul"),
    "__itruediv__": _inplace("div"), "astype": _astype, "split": _words(),
    **{name: _words() for name in ("reshape", "transpose", "swapaxes", "moveaxis", "squeeze",
                                   "flatten", "diagonal")},
}

# mx.fast function name -> rule
FAST = {"layer_norm": _decomposed(_layer_norm), "rms_norm": _decomposed(_rms_norm),
        "scaled_dot_product_attention": _sdpa_rule, "rope": _rope_rule}

# mx.array property name -> rule
PROPERTIES = {"real": _property(_real), "imag": _property(_imag), "T": _property(),
              "mT": _property()}
