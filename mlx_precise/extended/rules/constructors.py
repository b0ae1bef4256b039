"""Constructors whose values float32 cannot hold exactly: ``linspace`` and
``arange`` with float steps, computed in float64 and kept in two words;
``mx.array(x)`` of a carried array, a copy that keeps the words; and arrays made
from host data wider than float32 (``mx.array(0.1)``, ``mx.array(np_float64)``,
``mx.full(shape, 1 / 3)``): MLX's float32 / complex64 rounding carrying the rest,
as a Python scalar in an op enters at its float64 value."""

from __future__ import annotations

import functools

import mlx.core as mx
import numpy as np

from .. import carry
from ..carry import attach, has_words
from ..constructor import ARRAY  # the class (mx.array is a stand-in inside blocks)
from .base import is_word_array, moved, words


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
    key = [float(v).hex() if isinstance(v, float) else v for v in args]
    return attach(*(mx.array(w) for w in _grid_words(kind, *key)))


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


_WIDE = (np.dtype(np.float64), np.dtype(np.complex128))
_NARROW = {np.dtype(np.float64): mx.float32, np.dtype(np.complex128): mx.complex64}


def _numbers(val) -> bool:
    """Python numbers in (nested) lists / tuples only."""
    if isinstance(val, (list, tuple)):
        return all(_numbers(v) for v in val)
    return isinstance(val, (int, float, complex))


def host_wide(val, dtype) -> np.ndarray | None:
    """Host data from which MLX makes a float32 / complex64 array (``dtype`` None
    or that) that it rounds: a Python float or complex, a numpy float64 /
    complex128 scalar or array, nested lists / tuples of Python numbers holding one,
    as its float64 / complex128 numpy array; None for anything else (integers and
    float32 data, which MLX keeps exactly; arrays inside lists; another dtype)."""
    if isinstance(val, (bool, np.bool_)) or not (
            isinstance(val, (float, complex, np.ndarray, np.generic)) or _numbers(val)):
        return None
    v = np.asarray(val)
    if v.dtype not in _WIDE:
        return None
    return v if dtype is None or dtype == _NARROW[v.dtype] or (
        dtype == mx.complex64 and v.dtype.kind == "f") else None


def _rest(v: np.ndarray, hi: mx.array) -> mx.array | None:
    """The low word of host values ``v`` whose MLX rounding is ``hi`` (the same
    shape): ``RN(v - hi)``, 0 where ``hi`` is not finite (the kernels' rule); None
    where it is 0 throughout (``hi`` is exact)."""
    h = np.array(hi)
    with np.errstate(over="ignore", invalid="ignore"):
        lo = np.where(np.isfinite(h), v - h, 0).astype(h.dtype)
    return mx.array(lo) if lo.any() else None


def host_array(original, val, dtype, **kw):
    """``mx.array(val, dtype)`` / ``mx.asarray`` of host data :func:`host_wide`
    reads: MLX's array (its rounding: the high words) carrying the rest;
    NotImplemented for other data (MLX's array is then exact, or holds what the
    dtype asks)."""
    v = host_wide(val, dtype)
    if v is None:
        return NotImplemented
    hi = original(val, **kw) if dtype is None else original(val, dtype, **kw)
    return attach(hi, _rest(v, hi))


def _array(ctx, original, val, dtype=None, **kw):
    """``mx.array(x)`` of a carried array: MLX's copy with x's words, or with
    another dtype ``x.astype(dtype)`` (its rule: the exact value in float64, a
    reported rounding to a narrower type); carried arrays inside a list: declines
    (reported); host data wider than float32: :func:`host_array`."""
    if not (is_word_array(val) and has_words(val)):
        return host_array(original, val, dtype, **kw)
    if dtype is None or dtype == val.dtype:
        return carry.copy(val, original(val, **kw))
    with carry.reporting(ctx.report):
        return val.astype(dtype)


def _array_vjp(e, g):
    val = e.args[0]
    if not isinstance(val, mx.array):
        return (None,)  # host data: a constant
    return (g,) if e.out.dtype == val.dtype else NotImplemented


def _full(ctx, original, shape, vals, dtype=None, **kw):
    """``mx.full(shape, vals)``: ``vals`` broadcast to ``shape`` with its words (a
    carried array: MLX's op on the high and on the low words; host data wider than
    float32: its rest, :func:`host_array`'s, broadcast the same way); to another
    dtype than a carried array's, that array's ``astype`` first (its rule)."""
    if is_word_array(vals) and has_words(vals):
        if dtype is not None and dtype != vals.dtype:
            with carry.reporting(ctx.report):
                vals = vals.astype(dtype)
            if not (is_word_array(vals) and has_words(vals)):  # float64, or rounded
                return original(shape, vals, **kw)
        return moved(ctx, lambda parts: original(shape, parts[0], **kw), [words(vals)])
    v = host_wide(vals, dtype)
    if v is None:
        return NotImplemented
    hi = original(shape, vals, **kw) if dtype is None else original(shape, vals, dtype, **kw)
    lo = _rest(v, ARRAY(vals) if dtype is None else ARRAY(vals, dtype))
    return attach(hi, None if lo is None else original(shape, lo, **kw))


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
