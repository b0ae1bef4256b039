"""Shape and movement ops: the same MLX op on the high and on the low words
(exact), indexing, assignment and iteration."""

from __future__ import annotations

import itertools
import types

import mlx.core as mx

from ...doubleword import fusion
from ...doubleword.types import DoubleWord
from ...doubleword.engine64 import to64
from ...core import backends
from ...core.kernels import Kernel
from .. import arith, autodiff, carry, recipes
from ..carry import attach, attach_words, has_words, low_word, words_of
from .base import (OfOriginal, beside_float32, carries, float64_cotangent, is_word_array,
                   kernel_form, moved, movement, unbroadcast, words)
from .linear import _swaps_last_two, note_transpose, noting_transposes
from ..constructor import ARRAY  # the class (mx.array is a stand-in inside blocks)


def _words(pos: int = 0, listed: bool = False):
    """A shape / movement op: apply it to the high and to the low words. ``pos`` is
    the position of the array argument (``listed``: a list of arrays, as in
    ``concatenate``); outputs may be one array or a list (``split``)."""

    def rule(ctx, original, *args, **kw):
        if len(args) <= pos:
            return NotImplemented
        arg = args[pos]
        listed_ = listed and isinstance(arg, (list, tuple))  # mx.stack(x) iterates x
        if not listed_:  # one array (the frequent case, without the list's tests)
            w = words_of(arg) if is_word_array(arg) else None
            if w is None:
                return NotImplemented  # nothing carried: MLX's op is the exact answer
            ws = [w]
        else:
            items = list(arg)
            if not any(is_word_array(a) and has_words(a) for a in items):
                return NotImplemented  # nothing carried: MLX's op is the exact answer
            items = beside_float32(*items)  # integer / half arrays: float32
            if not all(is_word_array(a) for a in items) or len({a.dtype for a in items}) > 1:
                return NotImplemented
            ws = [words(a) for a in items]

        def call(new):
            a = list(args)
            a[pos] = new if listed_ else new[0]
            return original(*a, **kw)

        return moved(ctx, call, ws)

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
    if autodiff.recording() and is_word_array(x) and x.ndim:  # rows the tape sees
        with carry.reporting(ctx.report):
            return iter([x[i] for i in range(x.shape[0])])
    if not is_word_array(x) or not has_words(x) or x.ndim == 0:
        return NotImplemented
    lo = low_word(x)
    return iter([attach(x[i], lo[i]) for i in range(x.shape[0])])


def _pad_pairs(pad_width, ndim: int) -> list:
    """MLX's forms of ``pad_width`` (an int, ``(n,)``, ``(before, after)``, or one
    pair per axis) as one ``(before, after)`` per axis."""
    if isinstance(pad_width, int):
        return [(pad_width, pad_width)] * ndim
    pw = list(pad_width)
    if pw and all(isinstance(p, int) for p in pw):
        return [(pw[0], pw[-1])] * ndim
    return [(p[0], p[-1]) for p in pw]


def _pad(ctx, original, a, pad_width, mode="constant", constant_values=0, **kw):
    if is_word_array(a) and mode != "constant" and has_words(a) and not kw:
        return _pad_copies(ctx, original, a, pad_width, mode)
    if not is_word_array(a) or mode != "constant" or isinstance(constant_values, ARRAY):
        return NotImplemented
    w, v = words(a), constant_values
    # complex words: the value's words as a complex constant (v + 0i: made once)
    c = arith.constant(complex(v) if arith.is_complex(w) and isinstance(v, (int, float)) else v)
    if arith.is_complex(w) != arith.is_complex(c):
        c = arith.as_complex(c)
    if not has_words(a) and arith.is_float32(constant_values):
        return NotImplemented  # exact data, exact constant: MLX's op is the answer
    if ctx.backend.float64_engine:  # the constant's float64 value pads the float64 value
        with mx.stream(mx.cpu):
            value, fill = to64(w), to64(c)
            wide = tuple(None if v is None else original(v, pad_width, mode, f, **kw)
                         for v, f in zip(value, fill))
        hi = original(w.hi, pad_width, mode, c.hi, **kw)
        return attach_words(hi, DoubleWord.from_wide(hi, wide))
    return attach(original(w.hi, pad_width, mode, c.hi, **kw),
                  original(w.lo, pad_width, mode, c.lo, **kw))


def _pad_copies(ctx, original, a, pad_width, mode):
    """``pad`` with ``mode`` "edge", "reflect" or "symmetric": each padded element a
    copy of one of ``a``'s, so, axis by axis, a gather (``take``) at the positions
    MLX's own pad of ``arange(n)`` gives. The words move exactly, and the gradient
    sums the cotangents of an element's copies in double-word (``take``'s VJP: the
    row sums of :func:`rows_add`), where the same op on each word would round them."""
    pairs = _pad_pairs(pad_width, a.ndim)
    with carry.reporting(ctx.report):
        out = a
        for axis, (before, after) in enumerate(pairs):
            if before or after:
                with carry.suspended():
                    at = original(mx.arange(a.shape[axis]), [(before, after)], mode)
                out = mx.take(out, at, axis=axis)
    return out


def _each(ctx, original, *arrays, **kw):
    """An op of several arrays given one by one that moves each (``broadcast_arrays``,
    ``meshgrid``): the op on the high words and on the low words."""
    if not any(is_word_array(a) and has_words(a) for a in arrays):
        return NotImplemented
    if not all(is_word_array(a) for a in arrays) or len({a.dtype for a in arrays}) > 1:
        return NotImplemented
    return moved(ctx, lambda parts: original(*parts, **kw), [words(a) for a in arrays])


def _depends(ctx, original, inputs, dependencies, **kw):
    """``mx.depends``: MLX's outputs (the inputs' values, ordered after the
    dependencies), each with the words of its input."""
    items = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    if not any(isinstance(a, ARRAY) and has_words(a) for a in items):
        return NotImplemented
    out = original(inputs, dependencies, **kw)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    for a, o in zip(items, outs):
        carry.copy(a, o)
    return out


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

        def call(parts):
            a = list(args)
            for p, part in zip(positions, parts):
                a[p] = part
            return original(*a, **kw)

        return moved(ctx, call, ws)

    return rule


SHAPE_OPS = ("reshape", "transpose", "swapaxes", "moveaxis", "expand_dims", "squeeze",
             "broadcast_to", "flatten", "take", "take_along_axis", "atleast_1d",
             "atleast_2d", "atleast_3d", "repeat", "tile", "roll", "flip", "unflatten",
             "diagonal", "diag", "permute_dims", "matrix_transpose", "tril", "triu", "split",
             "unstack", "contiguous", "stop_gradient", "positive", "slice", "asarray",
             "fft.fftshift", "fft.ifftshift", "array.__copy__", "array.__deepcopy__",
             "as_strided")


def _axes(x, *args, axes=None, **kw):
    """The axis order of ``transpose(x, axes)`` / ``x.transpose(*axes)``."""
    if len(args) == 1 and isinstance(args[0], (list, tuple)) or args == (None,):
        axes = args[0]
    elif args:
        axes = args
    return list(reversed(range(x.ndim))) if axes is None else axes


def _swapped(x, axis1, axis2, **kw):
    return [axis2 if d == axis1 % x.ndim else axis1 if d == axis2 % x.ndim else d
            for d in range(x.ndim)]


_TRANSPOSES = {  # op -> its axis order (a transpose of the last two axes: see .linear)
    "transpose": _axes, "permute_dims": _axes, "swapaxes": _swapped,
    "matrix_transpose": lambda x, **kw: [*range(x.ndim - 2), -1, -2],
}

# ---- moved words read packed ----------------------------------------------------------
# On the kernel backends a movement op's result is recorded as that op of its
# operand's packed words where it leaves their first axis whole (made only when a
# kernel reads it: fusion.note_moved), and an op that keeps the row-major order of
# a complex operand's elements as the floats a kernel wrote for it (note_parts): the
# next kernel reads one view of both words, not a view of each (of complex words,
# a float32 view of a reshape).
_MLX_RESHAPE, _MLX_TRANSPOSE, _MLX_SPLIT = mx.reshape, mx.transpose, mx.split
_MLX_PAD = mx.pad


def _reshaped(x, outs, *args, **kw):
    shape = fusion.packed_shape(tuple(outs[0].shape))
    return [lambda z: _MLX_RESHAPE(z, shape)]


def _transposed(order):
    def mover(x, outs, *args, **kw):
        perm = [int(p) % x.ndim for p in order(x, *args, **kw)]
        return [lambda z: _MLX_TRANSPOSE(z, perm)] if perm and perm[0] == 0 else None
    return mover


def _full(i) -> bool:
    return type(i) is slice and i.start is None and i.stop is None and i.step is None


def _indexed(x, outs, index):
    """``x[index]`` as the same index of the packed words: basic indices that leave
    the first axis whole (a whole slice there, or an ``...`` that stands for it)."""
    items = index if type(index) is tuple else (index,)
    if not all(i is None or i is Ellipsis or type(i) is int or (
            type(i) is slice and all(v is None or type(v) is int
                                     for v in (i.start, i.stop, i.step))) for i in items):
        return None
    explicit = sum(1 for i in items if i is not None and i is not Ellipsis)
    first = items[0] if items else Ellipsis
    if not (_full(first) or (first is Ellipsis and explicit < x.ndim)):
        return None
    return [lambda z: _GETITEM(z, index)]


def _split(x, outs, indices_or_sections=None, axis=0, **kw):
    axis = int(axis) % x.ndim
    if axis == 0 or kw:
        return None
    made = []

    def part(k):
        def move(z):
            if not made:
                made.append(_MLX_SPLIT(z, indices_or_sections, axis=axis))
            return made[0][k]
        return move

    return [part(k) for k in range(len(outs))]


def _padded(x, outs, pad_width, mode="constant", constant_values=0, **kw):
    widths = _pad_pairs(pad_width, x.ndim)
    if (mode != "constant" or kw or type(constant_values) not in (int, float)
            or constant_values != 0 or tuple(widths[0]) != (0, 0)):
        return None
    return [lambda z: _MLX_PAD(z, widths)]


# ops that keep their operand's elements in row-major order (a reshape, new or
# removed axes of size 1)
_ORDER_KEEPING = ("reshape", "expand_dims", "squeeze", "flatten", "unflatten", "atleast_1d",
                  "atleast_2d", "atleast_3d")


def _keeps_order(x, *args, **kw) -> bool:
    return True


def _plain_index(x, index, *args, **kw) -> bool:
    """``x[index]`` keeps x's elements in row-major order: new axes, ``...`` and
    whole slices only."""
    items = index if isinstance(index, tuple) else (index,)
    return all(i is None or i is Ellipsis or _full(i) for i in items)


def _packing(rule, mover, order=None):
    """``rule`` of a movement op, which on the kernel backends also records how a
    kernel reads its result's words: ``mover(x, outs, *args, **kw)`` the function of
    x's packed words that gives each output's (None: the op moves their first
    axis; :func:`~mlx_precise.doubleword.fusion.note_moved`), and where ``order(x,
    *args, **kw)`` (the op keeps the row-major order of x's elements) a complex
    result's words as the floats a kernel wrote for x's
    (:func:`~mlx_precise.doubleword.fusion.note_parts`)."""

    def noted(ctx, original, x, *args, **kw):
        if (not kw and type(x) is ARRAY and x.dtype == _COMPLEX64 and has_words(x)
                and kernel_form(ctx) and recipes.held(original)):
            # (complex words: their parts recorded, dozens of Python steps; replayed
            # on metal)
            out = _replayed_move(ctx, body, original, x, *args)
            if out is not NotImplemented:
                return out
        return body(ctx, original, x, *args, **kw)

    def body(ctx, original, x, *args, **kw):
        out = rule(ctx, original, x, *args, **kw)
        if out is NotImplemented or type(x) is not ARRAY or not ctx.backend.has_kernels:
            return out
        lo = low_word(x)
        if lo is None:
            return out
        if order is not None and x.dtype == mx.complex64 and order(x, *args, **kw):
            floats = fusion.words_of(DoubleWord(x, lo))
            if floats is not None and type(out) is ARRAY:
                fusion.note_parts(out, low_word(out), floats)
        _note_moves(mover, x, lo, out if isinstance(out, (list, tuple)) else (out,), args, kw)
        return out

    recipes.static(body)  # (made once per op: a replay's structure holds its id)
    return noted


def _note_moves(mover, x, lo, outs, args, kw) -> None:
    """Record each of ``outs`` (the results of a movement op of the words ``x``,
    ``lo``) as that move of x's packed words where x's are packed
    (:func:`~mlx_precise.doubleword.fusion.note_moved`; ``mover(x, outs, *args,
    **kw)`` the moves, None where the op moves their first axis)."""
    if not fusion.has_packed(x, lo):
        return
    try:
        moves = mover(x, outs, *args, **kw)
    except (TypeError, ValueError, IndexError):  # arguments MLX refuses
        return
    for o, move in zip(outs, moves or ()):
        o_lo = low_word(o) if type(o) is ARRAY else None
        if o_lo is not None:
            fusion.note_moved(o, o_lo, x, lo, move)


def _moved_words(ctx, body, original, x, *args):
    """``body(ctx, original, x, *args)``: :func:`_packing`'s rule (replayed on metal)."""
    return body(ctx, original, x, *args)


_replayed_move = recipes.replayed(_moved_words)
_COMPLEX64 = mx.complex64


_GETITEM = ARRAY.__getitem__  # MLX's own (captured at import: inside a block a stand-in)


def _fast_move(mover, order=None):
    """The fast path of a movement op on the kernel backends (:class:`.base.OfOriginal`):
    of a float32 array that carries a low word, what the rule (:func:`_packing` of
    :func:`_words`) computes, the op on each word and the result's packed words
    recorded as ``mover`` moves the operand's, without the rule's checks; None
    (the rule decides) for other operands. A transpose (``order``: the op's axis
    order; the dispatcher passes the block's report first, ``fast.with_report``)
    of the last two axes of a float32 array, exact or carrying a low word, is also
    noted for the GEMM (:func:`.linear.note_transpose`), as its rule notes it."""

    def make(original):
        def fast(x, *args):
            if type(x) is not ARRAY or x.dtype != _FLOAT32 or not backends.backend().has_kernels:
                return None
            lo = low_word(x)
            if lo is None:
                return None
            return moved(x, lo, args)

        def moved(x, lo, args):
            out = original(x, *args)
            if out is x:  # (MLX returns a new array; else the rule's snapshot)
                return None
            out_lo = original(lo, *args)
            outs, los = (out, out_lo) if type(out) is list else ((out,), (out_lo,))
            for o, o_lo in zip(outs, los):
                attach(o, o_lo)
            _note_moves(mover, x, lo, outs, args, {})
            return out

        def transposed(report, x, *args):
            if type(x) is not ARRAY or x.dtype != _FLOAT32 or not backends.backend().has_kernels:
                return None
            try:
                swaps = _swaps_last_two(x.ndim, order(x, *args))
            except (TypeError, ValueError):  # arguments MLX refuses: the rule's error
                return None
            lo = low_word(x)
            if not swaps:
                return None if lo is None else moved(x, lo, args)
            out = original(x, *args) if lo is None else moved(x, lo, args)
            if out is None or out is x:
                return None
            note_transpose(out, x, lo, report)
            return out

        if order is None:
            return fast
        transposed.with_report = True
        return transposed

    return OfOriginal(make)


_FLOAT32 = mx.float32


def _fast_index(original):
    """``x[index]``: of a float32 / complex64 array that carries no low word MLX's
    op, the exact answer (what the rule leaves to MLX), without the flow's checks
    (a framing loop slices its input hundreds of times); of a float32 array that
    carries one, :func:`_fast_move`'s; None: the rule decides."""
    moved_ = _fast_move(_indexed).make(original)

    def fast(x, index):
        if is_word_array(x) and not has_words(x):
            return _GETITEM(x, index)
        return moved_(x, index)

    return fast


FAST = {"array.__getitem__": OfOriginal(_fast_index), "split": _fast_move(_split),
        **{name: _fast_move(_reshaped) for name in _ORDER_KEEPING},
        **{name: _fast_move(_transposed(perm), perm) for name, perm in _TRANSPOSES.items()}}
"""Op name -> its fast path (the dispatcher tries it before the rule)."""

RULES = {
    **{name: _words() for name in SHAPE_OPS},
    **{name: _packing(_words(), _reshaped, _keeps_order) for name in _ORDER_KEEPING},
    **{name: noting_transposes(_packing(_words(), _transposed(perm)), perm)
       for name, perm in _TRANSPOSES.items()},
    "split": _packing(_words(), _split), "pad": _packing(_pad, _padded),
    "concatenate": _words(listed=True), "stack": _words(listed=True),
    "broadcast_arrays": _each, "meshgrid": _each, "depends": _depends,
    "slice_update": _update(0, 1), "put_along_axis": _update(0, 2),
    "array.__getitem__": _packing(_words(), _indexed, _plain_index),
    "array.__setitem__": _setitem, "array.__iter__": _iter,
}
"""Op name -> rule (``fft.`` / ``array.`` prefixes: ``mx.fft`` functions and
``mx.array``-only methods)."""

for _name in (*_ORDER_KEEPING, *_TRANSPOSES, "split", "pad", "__getitem__"):
    for _owner in (mx, ARRAY):  # (MLX's callables of the ops _packing records: the
        if hasattr(_owner, _name):  # ``original`` of their replays, held by id)
            recipes.static(getattr(_owner, _name))


# ---- derivatives ---------------------------------------------------------------------


def _basic(index) -> bool:
    """An index of ints, slices, None and Ellipsis only: each element is read once."""
    items = index if isinstance(index, tuple) else (index,)
    return all(isinstance(i, (int, slice)) or i is None or i is Ellipsis for i in items)


def _getitem_vjp(e, g):
    x, index = e.args[:2]
    if _basic(index):
        return movement(e, g)
    # an array index may read an element several times: its cotangents add up
    return (mx.zeros_like(x).at[index].add(g), None)


_F32, _I32 = (mx.float32,), (mx.int32,)

ROWS_ADD = Kernel(
    name="dw_rows_add",
    body="dw_rows_add.metal",
    headers=("doubleword.h",),
    inputs=("rows", "order", "v_hi", "v_lo"),
    outputs=("out_hi", "out_lo"),
    input_dtypes={"rows": _I32, "order": _I32, "v_hi": _F32, "v_lo": _F32},
    variants={"out_hi": _F32, "out_lo": _F32},
)
"""Double-word row sums by row number (``metal/kernels/dw_rows_add.metal``): rows
int32 (N,) sorted, order int32 (N,) the stable sorting permutation, v_hi / v_lo
float32 (N, M); out_hi / out_lo float32 (R, M). Grid: one thread per (column,
sorted position)."""


def rows_add(rows: int, indices, values):
    """``zeros((rows, m)).at[indices].add(values)`` (values (len(indices), m)) in
    double-word: on cpu a float64 scatter; elsewhere the row sums of
    :data:`ROWS_ADD` (each row's values summed in their order, compensated), after
    a stable sort of the row numbers. A negative index counts from the end, as in
    MLX's gathers and scatters; one outside the rows adds nothing."""
    backend = backends.backend()
    if backend.float64_engine:
        if values.dtype == mx.complex64:  # (the float64 scatter of each part)
            return (rows_add(rows, indices, mx.real(values))
                    + 1j * rows_add(rows, indices, mx.imag(values)))
        return mx.zeros((rows, values.shape[1]), values.dtype).at[indices].add(values)
    n = indices.size
    if n >= 2**31 or rows >= 2**31:
        raise ValueError(f"a scatter-add of {n} values into {rows} rows is too large for "
                         "the row-sum kernel (at most 2^31 - 1 of each)")
    w = words(values)
    hi, lo = w.hi, w.lo
    if w.is_complex:  # (sums of the real and imaginary parts: columns of floats)
        hi, lo = hi.view(mx.float32), lo.view(mx.float32)
    with carry.suspended():
        # (keys up to (rows + 1) n: 64 bits where int32 would overflow)
        r = indices.reshape(-1).astype(mx.int64 if (rows + 1) * n >= 2**31 else mx.int32)
        r = mx.where(r < 0, r + rows, r)
        r = mx.where((r >= 0) & (r < rows), r, -1)
        # a stable order: the key breaks ties between equal rows by position
        order = mx.argsort((r + 1) * n + mx.arange(n, dtype=r.dtype)).astype(mx.int32)
        r = mx.take(r, order).astype(mx.int32)
        m = hi.shape[1]
        out_hi, out_lo = ROWS_ADD(
            inputs=[r, order, hi, lo], output_shapes=[(rows, m), (rows, m)],
            output_dtypes=[mx.float32, mx.float32], grid=(m, n, 1),
            threadgroup=(min(m, 256), 1, 1), init_value=0.0, backend=backend)
    if w.is_complex:
        out_hi, out_lo = out_hi.view(mx.complex64), out_lo.view(mx.complex64)
    return attach_words(out_hi, DoubleWord(out_hi, out_lo))


def _take_vjp(e, g):
    x, indices = e.args[:2]
    if not isinstance(indices, ARRAY):  # a Python int (mx.take(x, 3, axis)): 0-d
        indices = mx.array(indices, dtype=mx.int32)
    axis = e.args[2] if len(e.args) > 2 else e.kwargs.get("axis")
    if axis is None:
        flat = rows_add(x.size, indices.reshape(-1), g.reshape(-1, 1))
        return (flat.reshape(x.shape), None)
    axis = axis % x.ndim
    # the taken axis leads: x' = moveaxis(x, axis, 0), g' rows follow the indices
    k = indices.ndim
    order = [*range(axis, axis + k), *range(axis), *range(axis + k, g.ndim)]
    gm = mx.transpose(g, order).reshape(indices.size, -1)
    acc = rows_add(x.shape[axis], indices.reshape(-1), gm)
    rest = [x.shape[d] for d in range(x.ndim) if d != axis]
    return (mx.moveaxis(acc.reshape(x.shape[axis], *rest), 0, axis), None)


def _broadcast_to_vjp(e, g):
    return (unbroadcast(g, e.args[0]),)


def _repeat_vjp(e, g):
    x, repeats = e.args[:2]
    axis = e.args[2] if len(e.args) > 2 else e.kwargs.get("axis")
    if not isinstance(repeats, int):
        return NotImplemented
    if axis is None:
        return (mx.sum(g.reshape(x.size, repeats), axis=1).reshape(x.shape),)
    axis = axis % x.ndim
    shape = list(x.shape)
    shape.insert(axis + 1, repeats)
    return (mx.sum(g.reshape(shape), axis=axis + 1),)


def _tile_vjp(e, g):
    x, reps = e.args[:2]
    reps = [reps] if isinstance(reps, int) else list(reps)
    nd = max(x.ndim, len(reps))
    reps = [1] * (nd - len(reps)) + reps
    xs = [1] * (nd - x.ndim) + list(x.shape)
    g = g.reshape([v for r, s in zip(reps, xs) for v in (r, s)])
    return (mx.sum(g, axis=list(range(0, 2 * nd, 2))).reshape(x.shape),)


def _setitem_vjp(e, g):
    """``x[index] = v`` as a function of (x, v): x's cotangent is g with the
    assigned elements zeroed, v's is g there."""
    x, index, value = e.args[:3]
    gx = g * 1.0
    gx[index] = 0.0
    return (gx, None, unbroadcast(g[index], value) if isinstance(value, ARRAY) else None)


def _injective(shape, strides) -> bool:
    """Every index of an ``as_strided`` window of ``shape`` / ``strides`` (in
    elements) reads its own element: with the axes of more than one element by
    increasing |stride|, each stride is past the span of the smaller ones."""
    span = 0
    for n, st in sorted(((n, abs(st)) for n, st in zip(shape, strides) if n > 1),
                        key=lambda t: t[1]):
        if st <= span:
            return False
        span += st * (n - 1)
    return True


_MAX_SUBWINDOWS = 64


def _overlap_sum(e, g, shape, strides):
    """The VJP of an overlapping window as a double-word sum of injective ones:
    the axes kept (largest first, while the window stays injective) move ``g``'s
    words exactly (:func:`movement`), one window per index of the other axes
    (pooling: one per kernel tap); None past ``_MAX_SUBWINDOWS`` of them."""
    kept, loop = [], []
    for ax in sorted(range(len(shape)), key=lambda i: -shape[i]):
        ok = _injective([shape[i] for i in kept + [ax]], [strides[i] for i in kept + [ax]])
        (kept if ok else loop).append(ax)
    kept.sort()
    count = 1
    for ax in loop:
        count *= shape[ax]
    if count > _MAX_SUBWINDOWS:
        return None
    a = e.args[0]
    offset = e.args[3] if len(e.args) > 3 else e.kwargs.get("offset", 0)
    acc = None
    for idx in itertools.product(*(range(shape[ax]) for ax in loop)):
        at = [slice(None)] * len(shape)
        for ax, i in zip(loop, idx):
            at[ax] = i
        sub = types.SimpleNamespace(
            args=(a, [shape[i] for i in kept], [strides[i] for i in kept],
                  offset + sum(i * strides[ax] for ax, i in zip(loop, idx))),
            kwargs={}, original=e.original)
        part = movement(sub, g[tuple(at)])[0]
        acc = part if acc is None else acc + part
    return acc


def _as_strided_vjp(e, g):
    """A window that reads each element once moves values (:func:`movement`); an
    overlapping one (im2col, frames, pooling) adds the cotangents of an element
    read several times: exact on the float64 pass, elsewhere a double-word sum of
    injective windows (:func:`_overlap_sum`), or past its count MLX's float32 VJP
    (reported as ``as_strided (gradient)``)."""
    a = e.args[0]
    shape = e.args[1] if len(e.args) > 1 else e.kwargs.get("shape")
    strides = e.args[2] if len(e.args) > 2 else e.kwargs.get("strides")
    shape = a.shape if shape is None else shape
    if strides is None:  # (MLX: row-contiguous strides of shape)
        strides, acc = [], 1
        for n in reversed(shape):
            strides.insert(0, acc)
            acc *= n
    if _injective(shape, strides) or float64_cotangent(g):
        return movement(e, g)
    acc = _overlap_sum(e, g, list(shape), list(strides))
    return NotImplemented if acc is None else (acc,)


def _take_along_axis_vjp(e, g):
    """A selection (distinct indices along the axis) moves the cotangent's words;
    repeated indices add the cotangents of an element read several times: exact
    on the float64 pass, elsewhere the double-word scatter-add at each read's index
    tuple (where x broadcasts against the indices, MLX's float32 VJP, reported). Telling the two apart reads the indices: inside a transformation
    (nothing can be evaluated) the reported VJP runs."""
    if float64_cotangent(g):
        return movement(e, g)
    x, indices = e.args[:2]
    axis = e.args[2] if len(e.args) > 2 else e.kwargs.get("axis")
    try:
        with carry.suspended():
            if axis is None:  # (MLX: the flattened x)
                idx, axis, n, xs = indices.reshape(-1), 0, x.size, (x.size,)
            else:
                axis, xs = axis % x.ndim, tuple(x.shape)
                shape = list(xs)
                shape[axis] = indices.shape[axis]
                idx = mx.broadcast_to(indices, mx.broadcast_shapes(tuple(shape), indices.shape))
                n = xs[axis]
            idx = idx % n  # (negative indices count from the end)
            ordered, k = mx.sort(idx, axis=axis), idx.shape[axis]
            repeated = k > 1 and bool(mx.any(mx.take(ordered, mx.arange(1, k), axis) ==
                                              mx.take(ordered, mx.arange(k - 1), axis)))
    except ValueError:  # (a function transformation: indices unknown)
        return NotImplemented
    if not repeated:
        return movement(e, g)
    if tuple(idx.shape[:axis] + idx.shape[axis + 1:]) != xs[:axis] + xs[axis + 1:]:
        return NotImplemented
    # each cotangent entry lands on x's element (its position, the index along the
    # axis): a scatter-add at that index tuple (the overlap-add of the reads)
    with carry.suspended():
        at = tuple(idx if d == axis else mx.arange(s).reshape(
            [s if e == d else 1 for e in range(len(xs))]) for d, s in enumerate(xs))
    gx = mx.zeros(xs, g.dtype).at[at].add(g.reshape(idx.shape))
    return (gx.reshape(x.shape), None)


def _each_vjp(e, g):
    return tuple(unbroadcast(gi, a) for gi, a in zip(g, e.args))


VJPS = {
    **{name: movement for name in SHAPE_OPS if name not in (
        "take", "take_along_axis", "broadcast_to", "repeat", "tile", "stop_gradient",
        "as_strided")},
    "as_strided": _as_strided_vjp,
    "take": _take_vjp, "take_along_axis": _take_along_axis_vjp, "broadcast_to": _broadcast_to_vjp,
    "repeat": _repeat_vjp, "tile": _tile_vjp, "stop_gradient": lambda e, g: (None,),
    "concatenate": movement, "stack": movement, "pad": movement, "slice_update": movement,
    "put_along_axis": movement, "broadcast_arrays": _each_vjp,
    "array.__getitem__": _getitem_vjp, "array.__setitem__": _setitem_vjp,
}
"""Op name -> VJP rule (see :mod:`.base`). ``put_along_axis`` replaces: its
cotangent moves whatever the indices."""
