"""Shape and movement ops: the same MLX op on the high and on the low words
(exact), indexing, assignment and iteration."""

from __future__ import annotations

import mlx.core as mx

from ...doubleword.words import DoubleWord
from .. import arith
from ..carry import attach, attach_words, has_words, low_word
from .base import carries, is_word_array, words


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


def _each(ctx, original, *arrays, **kw):
    """An op of several arrays given one by one that moves each (``broadcast_arrays``,
    ``meshgrid``): the op on the high words and on the low words."""
    if not any(is_word_array(a) and has_words(a) for a in arrays):
        return NotImplemented
    if not all(is_word_array(a) for a in arrays) or len({a.dtype for a in arrays}) > 1:
        return NotImplemented
    ws = [words(a) for a in arrays]
    hi = original(*(w.hi for w in ws), **kw)
    lo = original(*(w.lo for w in ws), **kw)
    return type(hi)(attach(h, l_) for h, l_ in zip(hi, lo))


def _update(*positions):
    """A functional update (``slice_update``, ``put_along_axis``): the arrays at
    ``positions`` (the target and the values) by their words, the same update on
    the high and on the low words (exact: each element is one word's copy)."""

    def rule(ctx, original, *args, **kw):
        items = [args[p] for p in positions if p < len(args)]
        if len(items) != len(positions) or not is_word_array(args[positions[0]]):
            return NotImplemented
        if not any(carries(v) for v in items):
            return NotImplemented
        ws = [words(v) for v in items]
        if any(w is None or arith.is_complex(w) != (args[positions[0]].dtype == mx.complex64)
               for w in ws):
            return NotImplemented

        def call(part):
            a = list(args)
            for p, w in zip(positions, ws):
                a[p] = getattr(w, part)
            return original(*a, **kw)

        return attach(call("hi"), call("lo"))

    return rule


SHAPE_OPS = ("reshape", "transpose", "swapaxes", "moveaxis", "expand_dims", "squeeze",
             "broadcast_to", "flatten", "take", "take_along_axis", "atleast_1d",
             "atleast_2d", "atleast_3d", "repeat", "tile", "roll", "flip", "unflatten",
             "diagonal", "diag", "permute_dims", "matrix_transpose", "tril", "triu", "split",
             "unstack", "contiguous", "stop_gradient", "positive", "slice", "asarray",
             "fft.fftshift", "fft.ifftshift", "array.__copy__", "array.__deepcopy__")

RULES = {
    **{name: _words() for name in SHAPE_OPS},
    "concatenate": _words(listed=True), "stack": _words(listed=True),
    "broadcast_arrays": _each, "meshgrid": _each, "pad": _pad,
    "slice_update": _update(0, 1), "put_along_axis": _update(0, 2),
    "array.__getitem__": _getitem, "array.__setitem__": _setitem, "array.__iter__": _iter,
}
"""Op name -> rule (``fft.`` / ``array.`` prefixes: ``mx.fft`` functions and
``mx.array``-only methods)."""
