"""Scatter updates inside a block: ``x.at[index].add(v)`` and its siblings
(``subtract``, ``multiply``, ``divide``, ``maximum``, ``minimum``).

An index may name one element several times (an overlap-add), so the update is a
sum (product, extremum) of many values, rounded at every step by MLX. On the cpu
backend the update runs in float64 on the operands' exact values and the result
keeps its two words. Elsewhere (no float64 on the GPU) an ``add`` / ``subtract``
at rows named by integer arrays (one, a tuple of them, after full slices or not; an
overlap-add) sums each row's values in double-word (:func:`.rules.shape.rows_add`);
the other updates run in MLX's float32 and the block reports them (``strict=True``
raises)."""

from __future__ import annotations

import numbers

import mlx.core as mx

from ..core import backends
from ..doubleword.engine64 import from64
from . import autodiff, carry
from .carry import attach_words, has_words, suspended
from .report import dropped
from .rules import shape
from .rules.base import as64, carries, is_word_array, operand_array, unbroadcast
from .constructor import ARRAY  # the class (mx.array is a stand-in inside blocks)

OPS = ("add", "subtract", "multiply", "divide", "maximum", "minimum")


class At:
    """``x.at`` inside a block: indexing it gives the updates."""

    def __init__(self, x: mx.array, getter, report):
        self._x, self._getter, self._report = x, getter, report

    def __getitem__(self, index):
        return _Indexed(self._x, self._getter, self._report, index)


class _Indexed:
    def __init__(self, x, getter, report, index):
        self._x, self._getter, self._report, self._index = x, getter, report, index

    def _update(self, op: str, value):
        """The update; while a gradient records, recorded as one op: ``add`` /
        ``subtract`` differentiated by their VJP (g to x, +-g at the index to the
        value), the others by MLX's float32 VJP of its own update (reported). Its
        steps ran with the flow off or out of the tape's sight, so a gradient
        through it was 0 on cpu and missed the value's part elsewhere."""
        if not autodiff.recording():
            return self._compute(op, value)
        with autodiff.unrecorded():
            out = self._compute(op, value)
        index = self._index
        autodiff.record(f"array.at[].{op}", _vjp(op, index),
                        lambda a, v: getattr(a.at[index], op)(v), (self._x, value), {},
                        out, self._report)
        return out

    def _compute(self, op: str, value):
        x, name = self._x, f"array.at[].{op}"
        plain = (lambda: getattr(self._getter(x)[self._index], op)(value))
        floating = is_word_array(value) or isinstance(value, (numbers.Real, numbers.Complex)) \
            and not isinstance(value, bool)
        exact_extremum = op in ("maximum", "minimum") and not (
            has_words(x) or carries(value))
        if x.dtype not in (mx.float32, mx.complex64) or not floating or exact_extremum:
            with suspended():
                return plain()  # no float32 rounding to lose
        if x.dtype == mx.float32 and (isinstance(value, complex) or (
                isinstance(value, ARRAY) and value.dtype == mx.complex64)):
            # (MLX updates a float32 x by the update cast to float32: its real part)
            with carry.reporting(self._report):
                value = value.real if isinstance(value, complex) else mx.real(value)
        complex_ = x.dtype == mx.complex64
        if backends.backend().float64_engine and not complex_:
            with suspended(), mx.stream(mx.cpu):
                v = as64(value) if isinstance(value, ARRAY) else float(value)
                wide = getattr(self._getter(as64(x))[self._index], op)(v)
                z = from64(wide)
            self._report.extended[name] += 1
            return attach_words(z.hi, z)
        named = _rows(self._index, x.shape) if op in ("add", "subtract") else None
        if named is not None:
            # rows named by integer arrays, possibly several times (an overlap-add):
            # double-word row sums, the named axes (and the value's index axes) first
            index, count, lead, k = named
            s, nd = index.ndim, x.ndim
            to_front = [*range(lead, lead + k), *range(lead), *range(lead + k, nd)]
            back = [to_front.index(d) for d in range(nd)]
            with carry.reporting(self._report):
                v = mx.broadcast_to(operand_array(value),
                                    (*x.shape[:lead], *index.shape, *x.shape[lead + k:]))
                v = mx.transpose(v, [*range(lead, lead + s), *range(lead),
                                     *range(lead + s, v.ndim)])
                acc = shape.rows_add(count, index.reshape(-1), v.reshape(index.size, -1))
                acc = mx.transpose(acc.reshape([x.shape[d] for d in to_front]), back)
                out = x + acc if op == "add" else x - acc
            self._report.extended[name] += 1
            return out
        dropped(self._report, name, "scatter updates run in float32 on this backend")
        with suspended():
            return plain()


def _vjp(op: str, index):
    """The VJP rule of ``x.at[index].<op>(v)`` for ``add`` / ``subtract`` (None for
    the others: MLX's own VJP, reported)."""
    if op not in ("add", "subtract"):
        return None

    def vjp(e, g):
        v = e.args[1]
        gv = None
        if isinstance(v, ARRAY) and mx.issubdtype(v.dtype, mx.inexact):
            taken = g[index]
            gv = unbroadcast(taken if op == "add" else -taken, v)
        return (g, gv)

    return vjp


_ALL = slice(None)


def _rows(index, shape_: tuple):
    """``(flat, count, lead, k)`` where ``index`` names whole rows of x by integer
    arrays on ``k`` axes after ``lead`` full slices (one array, a tuple of them:
    ``x[mx.arange(b), last]``, or ``x[:, i, j]``: the gradients of these gathers):
    ``flat``, the broadcast index arrays' row numbers in those axes seen as ``count``
    rows (a negative index counts from the end of its axis, as in MLX); None for any
    other index (partial slices, scalars, ``None``, ellipsis)."""
    parts = index if isinstance(index, tuple) else (index,)
    lead = 0
    while lead < len(parts) and isinstance(parts[lead], slice) and parts[lead] == _ALL:
        lead += 1
    arrays = parts[lead:]
    if not arrays or len(parts) > len(shape_) or not all(
            isinstance(p, ARRAY) and mx.issubdtype(p.dtype, mx.integer) for p in arrays):
        return None
    with suspended():
        arrays = mx.broadcast_arrays(*arrays) if len(arrays) > 1 else arrays
        flat, count = None, 1
        for p, d in zip(arrays, shape_[lead:]):
            p = p.astype(mx.int64 if p.dtype in (mx.int64, mx.uint64) else mx.int32)
            p = mx.where(p < 0, p + d, p)
            flat, count = (p if flat is None else flat * d + p), count * d
    return flat, count, lead, len(arrays)


for _op in OPS:
    setattr(_Indexed, _op, (lambda op: lambda self, value: self._update(op, value))(_op))
