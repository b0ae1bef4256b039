"""Constructors whose values float32 cannot hold exactly: ``linspace`` and
``arange`` with float steps, computed in float64 and kept in two words; and
``mx.array(x)``, ``mx.full(shape, x)``, ``mx.full_like(a, x)`` of a carried array,
which keep its words."""

from __future__ import annotations

import functools

import mlx.core as mx
import numpy as np

from .. import carry
from ..carry import attach, has_words
from .base import is_word_array, moved, words
from ..constructor import ARRAY  # the class (mx.array is a stand-in inside blocks)


def grid(values: np.ndarray, dtype) -> mx.array | object:
    """A float32 grid computed in float64 on the host, in two words."""
    if dtype is not None and dtype != mx.float32:
        return NotImplemented
    return attach(*(mx.array(w) for w in _split(values)))


def _split(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The float32 words (hi, lo) of float64 ``values``."""
    with np.errstate(over="ignore", invalid="ignore"):
        hi = values.astype(np.float32)
        lo = np.where(np.isfinite(hi), values - hi.astype(np.float64), 0).astype(np.float32)
    return hi, lo


@functools.lru_cache(maxsize=256)
def _grid_words(kind: str, *key) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_split` of the float64 grid ``kind`` of ``args`` (``"linspace"``:
    numpy's; ``"arange"``: ``start + i step``; ``"fftfreq"`` / ``"rfftfreq"``),
    cached: model code builds the same grids at every call (mx.array copies the
    words: the cached ones are never handed out). Floats are keyed by their hex
    form (-0.0 apart from 0.0, a NaN equal to itself)."""
    args = [float.fromhex(v) if isinstance(v, str) else v for v in key]
    if kind == "linspace":
        values = np.linspace(*args)
    elif kind == "arange":
        start, step, n = args
        values = start + np.arange(n) * step
    else:
        values = getattr(np.fft, kind)(*args)
    return _split(values)


def _cached_grid(dtype, kind: str, *args):
    if dtype is not None and dtype != mx.float32:
        return NotImplemented
    key = tuple([float(v).hex() if isinstance(v, float) else v for v in args])
    return attach(*(_ALIAS(w, mx.float32) for w in _grid_arrays(kind, *key)))


_ALIAS = mx.array.astype  # MLX's own: to the same dtype a new array of the same data


@functools.lru_cache(maxsize=256)
def _grid_arrays(kind: str, *key) -> tuple[mx.array, mx.array]:
    """:func:`_grid_words` as MLX arrays, made once: each call hands out aliases (a
    new array object over the same data, which an in-place update of it replaces,
    never writes)."""
    return tuple(mx.array(w) for w in _grid_words(kind, *key))


def _linspace(ctx, original, start, stop, num=50, endpoint=True, dtype=mx.float32, **kw):
    """``mx.linspace`` with each point ``start + i (stop - start) / (num - 1)``
    exact in float64 (numpy's formula), not accumulated in float32."""
    if not isinstance(num, int) or num < 0:
        return NotImplemented
    return _cached_grid(dtype, "linspace", float(start), float(stop), num, bool(endpoint))


def _arange(ctx, original, *args, dtype=None, **kw):
    """``mx.arange`` with a float start or step: ``start + i step`` in float64. The
    dtype may come positionally (``arange(0, 10, 2.5, mx.int32)``)."""
    if args and isinstance(args[-1], mx.Dtype):
        *args, dtype = args
    if not any(isinstance(v, float) for v in args):
        return NotImplemented
    start, stop, step = (0.0, args[0], 1.0) if len(args) == 1 else (
        (args[0], args[1], 1.0) if len(args) == 2 else args[:3])
    if step is None:
        step = 1.0
    n = max(int(np.ceil((float(stop) - float(start)) / float(step))), 0)
    return _cached_grid(dtype, "arange", float(start), float(step), n)


def _frequencies(kind: str):
    """``mx.fft.fftfreq`` / ``rfftfreq``: ``k / (n d)`` in float64, in two words."""

    def rule(ctx, original, n, d=1.0, **kw):
        if not isinstance(n, int) or n <= 0 or not isinstance(d, (int, float)):
            return NotImplemented
        return _cached_grid(None, kind, n, float(d))

    return rule


def _array(ctx, original, val, dtype=None, **kw):
    """``mx.array(x)`` of a carried array: MLX's copy with x's words, or with
    another dtype ``x.astype(dtype)`` (its rule: the exact value in float64, the
    exact value converted once to a narrower type); carried arrays inside a list: declines
    (reported). Host data is MLX's array: a Python float becomes its float32
    rounding there, as in MLX's own float64 runs of the same code (an optimizer's
    learning rate, ``mx.full(shape, 0.3)``), where a float in an op enters at its
    float64 value."""
    if not (is_word_array(val) and has_words(val)):
        return NotImplemented
    if dtype is None or dtype == val.dtype:
        return carry.copy(val, original(val, **kw))
    with carry.reporting(ctx.report):
        return val.astype(dtype)


def _array_vjp(e, g):
    val = e.args[0]
    return (g,) if isinstance(val, ARRAY) and e.out.dtype == val.dtype else NotImplemented


def _full(ctx, original, shape, vals, dtype=None, **kw):
    """``mx.full(shape, vals)`` of a carried array ``vals``: broadcast with its words
    (MLX's op on the high and on the low words); to another dtype, that array's
    ``astype`` first (its rule). Host data: MLX's op (see :func:`_array`)."""
    if not (is_word_array(vals) and has_words(vals)):
        return NotImplemented
    if dtype is not None and dtype != vals.dtype:
        with carry.reporting(ctx.report):
            vals = vals.astype(dtype)
        if not (is_word_array(vals) and has_words(vals)):  # float64, or rounded
            return original(shape, vals, **kw)
    return moved(ctx, lambda parts: original(shape, parts[0], **kw), [words(vals)])


_FULL = mx.full  # MLX's own (captured at import: inside a block a stand-in)


def _full_like(ctx, original, a, vals, dtype=None, **kw):
    """``mx.full_like(a, vals)``: :func:`_full` of ``a``'s shape, in ``a``'s dtype
    where none is given (MLX's ``full``: on cpu the words' float64 value is
    broadcast in float64, which ``full_like`` would cast to ``a``'s dtype)."""
    return _full(ctx, _FULL, a.shape, vals, a.dtype if dtype is None else dtype, **kw)


RULES = {"array": _array, "full": _full, "full_like": _full_like, "linspace": _linspace, "arange": _arange, "fft.fftfreq": _frequencies("fftfreq"),
         "fft.rfftfreq": _frequencies("rfftfreq")}
"""Op name -> rule."""

VJPS = {"array": _array_vjp}
"""Op name -> VJP rule (see :mod:`.base`)."""
