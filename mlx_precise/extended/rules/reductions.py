"""Reductions and scans: ``sum``, ``mean``, ``prod``, ``max`` / ``min``,
``argmax`` / ``argmin``, ``cumsum`` / ``cumprod``, ``var`` / ``std``, ``softmax``,
``logsumexp``."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from ...doubleword import engine64, functions, fusion
from ...doubleword.types import DoubleWord
from .. import arith, carry
from ..recipes import replayed
from . import float64
from ..carry import attach, has_words, low_word
from .base import (REAL, axes_of, decomposed, elementary, float64_form, is_word_array,
                   of_integers, result, words)
from ..constructor import ARRAY  # the class (mx.array is a stand-in inside blocks)


def _arg_extreme(larger: bool):
    """``argmax`` / ``argmin`` of carried real values: among the positions where the
    high word is extreme, the one whose low word is (MLX's first index on exact
    ties). A NaN high word gives MLX's answer on the high words."""

    def rule(ctx, original, a, axis=None, keepdims=False, **kw):
        if not is_word_array(a) or not has_words(a):
            return NotImplemented
        if a.dtype == mx.complex64:
            return NotImplemented
        w = words(a)
        if ctx.backend.float64_engine:  # the order of the float64 values
            with mx.stream(mx.cpu):
                return original(engine64.to64(w)[0], axis=axis, keepdims=keepdims, **kw)
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


def _reduction(kind: str):
    """``sum``, ``mean`` (the sum divided by the count in double-word) or ``prod``
    over any axes."""

    def rule(ctx, original, a, axis=None, keepdims=False, **kw):
        if not is_word_array(a):
            return NotImplemented
        axes = axes_of(a.ndim, axis)
        if axes is None:
            return NotImplemented
        s = arith.reduce_sum(words(a), axes, keepdims, ctx.backend, ctx.stream,
                             op="mul" if kind == "prod" else "add")
        if kind == "mean":
            n = math.prod([a.shape[d] for d in axes])
            s = arith.scalar_binary("div", s, n, ctx.backend, ctx.stream)
        return result(s)

    return rule


def _extreme_reduction(larger: bool):
    """``max`` / ``min`` over axes: MLX's on the high words (its NaN rule), then
    the extreme low word among the elements holding that high word (exact)."""

    def rule(ctx, original, a, axis=None, keepdims=False, **kw):
        if not is_word_array(a) or a.dtype == mx.complex64 or not has_words(a) or kw:
            return NotImplemented
        if ctx.backend.float64_engine:  # the extreme float64 value (its rounding: MLX's hi)
            with mx.stream(mx.cpu):
                v = original(engine64.to64(words(a))[0], axis=axis, keepdims=keepdims)
            return result(engine64.from64(v))
        hi = original(a, axis=axis, keepdims=True)
        fill = -np.inf if larger else np.inf
        lo = original(mx.where(a == hi, low_word(a), fill), axis=axis, keepdims=True)
        lo = mx.where(mx.isfinite(hi) & mx.isfinite(lo), lo, 0.0)
        if not keepdims:
            axes = axes_of(a.ndim, axis)
            hi, lo = (mx.squeeze(v, axis=axes) if axes else v for v in (hi, lo))
        return attach(hi, lo)

    return rule


def _scan(op: str):
    """``cumsum`` (op "add") / ``cumprod`` ("mul")."""

    def rule(ctx, original, a, axis=None, *, reverse=False, inclusive=True, dtype=None):
        if not is_word_array(a) or (dtype is not None and dtype != a.dtype):
            return NotImplemented
        if axis is not None and axes_of(a.ndim, axis) is None:
            return NotImplemented  # MLX raises its own error
        w = words(a)
        if axis is None:  # over the flattened array (both words: a.reshape here is MLX's)
            w, axis = arith._map(lambda t: t.reshape(-1), w), 0
        return result(arith.cumsum(w, int(axis) % max(w.ndim, 1), reverse, inclusive,
                                   ctx.backend, op=op))

    return rule


def _var(a, axis=None, keepdims=False, ddof=0):
    """``mean(|a - mean(a)|^2) * n / (n - ddof)`` over ``axis`` (the two-pass
    formula: no cancellation between sums of squares)."""
    d = a - mx.mean(a, axis=axis, keepdims=True)  # (MLX's error for an invalid axis)
    n = math.prod([a.shape[k] for k in axes_of(a.ndim, axis)])
    sq = d * mx.conj(d) if a.dtype == mx.complex64 else d * d
    s = mx.sum(mx.real(sq) if a.dtype == mx.complex64 else sq, axis=axis, keepdims=keepdims)
    return s / max(n - ddof, 0)  # MLX's: ddof >= n divides by 0 (inf, or NaN for 0)


def _stopped_max(x, axis):
    """The float32 maximum of the high words, a constant shift (no rounding of the
    result depends on it: softmax and logsumexp are invariant under it)."""
    with carry.suspended():
        return mx.stop_gradient(mx.max(x.real if x.dtype == mx.complex64 else x, axis=axis,
                                       keepdims=True))


_WIDE_SHIFT = 2.0**24  # from here on a maximum's low word reaches 1 (exp(lo) is no constant)


def _shift_low(hi: mx.array, lo: mx.array | None, m: mx.array, axis) -> mx.array | None:
    """The low word of the shift ``m`` (the maximum of the high words ``hi``, 0
    where not finite): where ``|m| >= 2^24``, the largest low word among the
    elements whose high word is ``m`` (the shift is then the exact maximum), 0
    elsewhere; None where ``hi`` carries no low word. Shifting by the high words'
    maximum alone left ``x - shift`` = that element's low word, up to
    ``|x| 2^-25``: past ~2^31 its exp overflowed or vanished, and softmax gave NaN
    where float32 gives 1. Below 2^24 the shift keeps its float32 value: a zero
    low word adds exactly as none (JMP alg. 6 with y.lo = 0 is alg. 4), the same
    bits."""
    if lo is None:
        return None
    with carry.suspended():
        top = mx.max(mx.where(hi == m, lo, -math.inf), axis=axis, keepdims=True)
        return mx.stop_gradient(mx.where(mx.abs(m) >= _WIDE_SHIFT, top, 0.0))


def _shift(x, axis, infinite: bool = False):
    """softmax's and logsumexp's shift of ``x``: the maximum of the high words (0
    where it is not kept:
    :func:`~mlx_precise.doubleword.engine64.shift_kept`), with :func:`_shift_low`'s low word
    attached."""
    m = _stopped_max(x, axis)
    m = mx.where(engine64.shift_kept(m, infinite), m, 0.0)
    if x.dtype != mx.float32:
        return m
    return attach(m, _shift_low(x, low_word(x), m, axis))


def _softmax(x, axis=None, precise=False, **kw):
    if x.size == 0:
        return NotImplemented  # nothing to compute: MLX's empty result
    e = mx.exp(x - _shift(x, axis, True))
    return e / mx.sum(e, axis=axis, keepdims=True)


def _logsumexp(x, axis=None, keepdims=False, **kw):
    m = _shift(x, axis)
    s = mx.log(mx.sum(mx.exp(x - m), axis=axis, keepdims=True)) + m
    return s if keepdims else mx.squeeze(s, axis=axis) if axis is not None else s.reshape(())


def _softmax64(x, axis=None, precise=False, **kw):
    axes = axes_of(x.ndim, axis) if isinstance(x, ARRAY) else None
    if not axes or x.dtype != mx.float32 or x.size == 0:
        return NotImplemented
    return result(engine64.softmax64(words(x), axes))


def _logsumexp64(x, axis=None, keepdims=False, **kw):
    axes = axes_of(x.ndim, axis) if isinstance(x, ARRAY) else None
    if not axes or x.dtype != mx.float32 or x.size == 0:
        return NotImplemented
    return result(engine64.logsumexp64(words(x), axes, keepdims))


def _exponentials(ctx, x, axis, infinite: bool):
    """The first steps of :func:`_softmax` / :func:`_logsumexp` on the words, for
    their kernel forms (inside ``fusion.deferred()``): ``(exp(x - shift), shift,
    the reduced axes)`` with ``shift`` the rule of ``mx.where(shift_kept(m,
    infinite), m, 0.0)`` on the stopped maximum ``m``; None where they decline (the
    decomposition decides)."""
    axes = axes_of(x.ndim, axis) if isinstance(x, ARRAY) else None
    if not axes or x.dtype != mx.float32 or x.size == 0:
        return None
    b, s = ctx.backend, ctx.stream
    m = _stopped_max(x, axis)
    shift = arith.where(engine64.shift_kept(m, infinite), arith.exact(m), arith.constant(0.0), b)
    w = words(x)
    low = _shift_low(w.hi, w._lo if w.wide is None else w.lo, shift.hi, axis)
    if low is not None:
        shift = DoubleWord(shift.hi, low)
    return functions.unary("exp", arith.binary("sub", w, shift, b, s), b, s), shift, axes


def _exponentials_form(finish, infinite: bool):
    """The kernel form of :func:`_softmax` / :func:`_logsumexp`: their steps called on
    the words (each the rule its op runs: the same fused programs, so the same
    bits) inside ``fusion.deferred()`` (the exponentials launched only where the sum
    reads them): :func:`_exponentials`, then ``finish(ctx, e, shift, axes, *rest,
    **kw)`` (a DoubleWord; ``rest``, ``kw``: the op's other arguments)."""

    def form(ctx, x, axis=None, *rest, **kw):
        with fusion.deferred():
            given = _exponentials(ctx, x, axis, infinite)
            if given is None:
                return NotImplemented
            return result(finish(ctx, *given, *rest, **kw))

    return form


def _softmax_finish(ctx, e, shift, axes, precise=False, **kw):
    b, s = ctx.backend, ctx.stream
    return arith.binary("div", e, arith.reduce_sum(e, axes, True, b, s), b, s)


def _logsumexp_finish(ctx, e, shift, axes, keepdims=False, **kw):
    b, s = ctx.backend, ctx.stream
    total = arith.reduce_sum(e, axes, True, b, s)
    y = arith.binary("add", functions.unary("log", total, b, s), shift, b, s)
    if not keepdims:  # (the squeeze: a movement of both words)
        y = DoubleWord.of_words(*(mx.squeeze(w, axis=axes) for w in (y.hi, y.lo)))
    return y


_softmax_words = _exponentials_form(_softmax_finish, True)
_logsumexp_words = _exponentials_form(_logsumexp_finish, False)


def _std(a, axis=None, keepdims=False, ddof=0, **kw):
    return mx.sqrt(mx.var(a, axis=axis, keepdims=keepdims, ddof=ddof))


def _lexicographic(a, axis):
    """Indices that sort carried real values along ``axis`` (None: flattened):
    by high word, ties broken by low word (the values' order, hi = RN(hi + lo)):
    MLX's stable argsort by the low word, then by the high word."""
    w = words(a)
    hi, lo = w.hi, w.lo
    with carry.suspended():
        if axis is None:
            hi, lo, axis = hi.reshape(-1), lo.reshape(-1), -1
        first = mx.argsort(lo, axis=axis)
        second = mx.argsort(mx.take_along_axis(hi, first, axis=axis), axis=axis)
        return mx.take_along_axis(first, second, axis=axis)


def _ordering(values: bool, kth: bool):
    """``argsort`` / ``sort`` (and ``argpartition`` / ``partition``, for which a full
    sort is a valid partition) of carried values, in the values' exact order."""

    def rule(ctx, original, a, *args, **kw):
        if not is_word_array(a) or a.dtype == mx.complex64 or not has_words(a):
            return NotImplemented  # exact values: MLX's order is the answer
        ref = original(a, *args, **kw)  # MLX's argument checks (kth, axis)
        axis = (args[1] if len(args) > 1 else kw.get("axis", -1)) if kth else (
            args[0] if args else kw.get("axis", -1))
        idx = _lexicographic(a, axis)
        if not values:
            return idx.astype(ref.dtype)
        with carry.reporting(ctx.report):
            src = a.reshape(-1) if axis is None else a
            return mx.take_along_axis(src, idx, axis=-1 if axis is None else axis)

    return rule


def _topk(ctx, original, a, k, axis=-1, **kw):
    """The ``k`` largest carried values along ``axis``, in increasing order (a
    valid order of MLX's partition)."""
    if not is_word_array(a) or a.dtype == mx.complex64 or not has_words(a):
        return NotImplemented
    original(a, k, axis, **kw)  # MLX's argument checks
    idx = _lexicographic(a, axis)
    with carry.reporting(ctx.report):
        src = a.reshape(-1) if axis is None else a
        ax = -1 if axis is None else axis
        top = mx.take(idx, mx.arange(idx.shape[ax] - k, idx.shape[ax]), axis=ax)
        return mx.take_along_axis(src, top, axis=ax)


def _along(axis: int):
    """An index selecting ``s`` along ``axis``: ``_along(axis)(s)``."""
    return lambda s: (slice(None),) * axis + (s,)


def _flipped(v, axis: int):
    return v[_along(axis)(slice(None, None, -1))]


def _shifted(v, k: int, axis: int, fill: float):
    """``v`` moved ``k`` places along ``axis``, ``fill`` in front."""
    front = mx.full([k if d == axis else v.shape[d] for d in range(v.ndim)], fill)
    return mx.concatenate([front, v[_along(axis)(slice(0, v.shape[axis] - k))]], axis=axis)


def _log_scan(combine, identity: float):
    """An inclusive scan (``reverse``, ``inclusive=False`` as MLX's) by Hillis-Steele
    steps: each prefix combined with the one 2^k before it, k = 0, 1, ... (ceil(log2
    n) steps of ``combine``, an op of the flow; ``identity`` fills in front)."""

    def scan(a, axis=None, *, reverse=False, inclusive=True):
        if a.dtype != mx.float32:
            return NotImplemented
        if axis is None:
            a, axis = a.reshape(-1), 0
        if not -a.ndim <= axis < a.ndim:
            return NotImplemented  # MLX's error
        axis %= a.ndim
        n = a.shape[axis]
        y = _flipped(a, axis) if reverse else a
        k = 1
        while k < n:
            y = combine(y, _shifted(y, k, axis, identity))
            k *= 2
        if not inclusive and n:
            y = _shifted(y, 1, axis, identity)
        return _flipped(y, axis) if reverse else y

    return scan


# logcumsumexp: a scan of double-word logaddexp, so no prefix is scaled by a
# maximum it does not contain (exp(x - max) of a whole row would underflow the early
# prefixes to -inf)
_logcumsumexp = _log_scan(lambda a, b: mx.logaddexp(a, b), -np.inf)


def _running_extreme(larger: bool):
    """``cummax`` / ``cummin``: on cpu MLX's float64 scan of the exact values, else
    a log-depth scan of the flow's ``maximum`` / ``minimum`` (exact selections;
    NaN propagates as MLX's)."""
    name = "maximum" if larger else "minimum"
    scan = decomposed(_log_scan(lambda a, b: getattr(mx, name)(a, b),
                                -np.inf if larger else np.inf))

    def rule(ctx, original, a, *args, **kw):
        out = float64.in_float64(ctx, original, a, *args, **kw)
        if out is not NotImplemented or not is_word_array(a) or not has_words(a):
            return out  # exact values: MLX's scan is exact
        return scan(ctx, original, a, *args, **kw)

    return rule


def _median(a, axis=None, keepdims=False):
    """The middle value (the mean of the two middle values for an even count) of
    the exactly ordered values along one axis, or all of them."""
    if isinstance(axis, (list, tuple)):
        return NotImplemented  # several axes: MLX's
    if axis is None:
        s, ax = mx.sort(a.reshape(-1)), 0
    else:
        s, ax = mx.sort(a, axis=axis), axis
    n = s.shape[ax]
    if n == 0:
        return NotImplemented
    lo_mid = mx.take(s, (n - 1) // 2, axis=ax)
    m = lo_mid if n % 2 else (lo_mid + mx.take(s, n // 2, axis=ax)) * 0.5
    if keepdims:
        m = m.reshape([1] * a.ndim) if axis is None else mx.expand_dims(m, ax)
    return m


RULES = {
    "sum": _reduction("sum"), "mean": of_integers(_reduction("mean")), "prod": _reduction("prod"),
    "max": _extreme_reduction(True), "min": _extreme_reduction(False),
    "argmax": _arg_extreme(True), "argmin": _arg_extreme(False),
    "cumsum": _scan("add"), "cumprod": _scan("mul"), "var": of_integers(decomposed(_var)),
    "std": of_integers(decomposed(_std)),
    "softmax": float64_form(_softmax64, _softmax, replayed(_softmax_words)),
    "logsumexp": of_integers(float64_form(_logsumexp64, _logsumexp, replayed(_logsumexp_words))),
    "argsort": _ordering(False, False), "sort": _ordering(True, False),
    "argpartition": _ordering(False, True), "partition": _ordering(True, True),
    "topk": _topk, "median": decomposed(_median), "logcumsumexp": of_integers(decomposed(_logcumsumexp)),
    "cummax": _running_extreme(True), "cummin": _running_extreme(False),
}
"""Op name -> rule (``mean``, ``var``, ``std``, ``logsumexp`` and ``logcumsumexp``
take integer and bool arrays as their exact values, :func:`.base.of_integers`: MLX's
results are float32 there; ``sum``, ``prod`` and the scans of integers are integers)."""


# ---- derivatives ---------------------------------------------------------------------


def _reduced(e):
    """(x, the reduced axes, g reshaped with those axes kept) of a reduction."""
    x = e.args[0]
    axis = e.args[1] if len(e.args) > 1 else e.kwargs.get("axis")
    return x, axes_of(x.ndim, axis)


def _kept(v, x, axes, keepdims):
    return v if keepdims or not axes else mx.expand_dims(v, axes)


def _keepdims(e):
    return e.args[2] if len(e.args) > 2 else e.kwargs.get("keepdims", False)


def _sum_vjp(kind: str):
    def vjp(e, g):
        x, axes = _reduced(e)
        if x.dtype not in REAL:
            return NotImplemented
        g = mx.broadcast_to(_kept(g, x, axes, _keepdims(e)), x.shape)
        if kind == "mean":
            g = g / math.prod(x.shape[d] for d in axes)
        return (g,)

    return vjp


def _extreme_vjp(e, g):
    """MLX's convention: the cotangent is shared equally among the elements that
    hold the extreme value."""
    x, axes = _reduced(e)
    keep = _keepdims(e)
    hit = x == _kept(e.out, x, axes, keep)
    count = mx.sum(hit, axis=list(axes), keepdims=True)
    # (times the mask, as MLX: a NaN row, where nothing equals its NaN extreme, is
    # NaN throughout, 0 times g / 0; a where made it 0)
    return (hit * (_kept(g, x, axes, keep) / count),)


def _prod_vjp(e, g):
    """Each element's cotangent is g times the product of the others (exclusive
    products from both ends, so zeros need no division)."""
    x, axes = _reduced(e)
    if x.dtype not in REAL or not axes:
        return NotImplemented
    others = [d for d in range(x.ndim) if d not in axes]
    xt = mx.transpose(x, others + list(axes))
    flat = xt.reshape(*[x.shape[d] for d in others], -1)
    rest = (mx.cumprod(flat, axis=-1, inclusive=False)
            * mx.cumprod(flat, axis=-1, reverse=True, inclusive=False))
    gk = _kept(g, x, axes, _keepdims(e))
    gt = mx.transpose(mx.broadcast_to(gk, x.shape), others + list(axes)).reshape(flat.shape)
    inverse = np.argsort(others + list(axes)).tolist()
    return (mx.transpose((gt * rest).reshape(xt.shape), inverse),)


def _scan_call(e):
    """(x, axis, reverse, inclusive) of a recorded scan."""
    return (e.args[0], e.args[1] if len(e.args) > 1 else e.kwargs.get("axis"),
            e.kwargs.get("reverse", False), e.kwargs.get("inclusive", True))


def _cumsum_vjp(e, g):
    x, axis, reverse, inclusive = _scan_call(e)
    if x.dtype not in REAL:
        return NotImplemented
    if axis is None:
        return (mx.cumsum(g, 0, reverse=not reverse, inclusive=inclusive).reshape(x.shape),)
    return (mx.cumsum(g, axis, reverse=not reverse, inclusive=inclusive),)


def _scan_vjp(forward):
    """The VJP of a scan (``cumprod``, ``cummax``, ``cummin``) from ``forward(x, g,
    axis)``, the VJP of its inclusive forward form along ``axis``: ``axis=None``
    flattens, ``reverse`` flips x and g (and the result back), and the exclusive
    scan is the inclusive one moved a place (``y_i = Y_{i-1}``), so its cotangent
    is g moved a place back (``g'_m = g_{m+1}``, 0 last)."""

    def vjp(e, g):
        x, axis, reverse, inclusive = _scan_call(e)
        if x.dtype not in REAL:
            return NotImplemented
        xs, gs, ax = (x.reshape(-1), g.reshape(-1), 0) if axis is None else (x, g, axis % x.ndim)
        if reverse:
            xs, gs = _flipped(xs, ax), _flipped(gs, ax)
        if not inclusive and xs.shape[ax]:
            gs = _flipped(_shifted(_flipped(gs, ax), 1, ax, 0.0), ax)
        out = forward(xs, gs, ax)
        return ((_flipped(out, ax) if reverse else out).reshape(x.shape),)

    return vjp


def _cumprod_forward(x, g, axis):
    """d/dx_k of sum_i g_i prod_{j<=i} x_j: ``sum_{i>=k} g_i y_i / x_k`` before the
    row's first zero; at the first zero the same sum with that zero read as 1 (its
    cofactors); 0 after it (a zero among the cofactors)."""
    zero = x == 0
    seen = mx.cumsum(zero.astype(mx.int32), axis=axis)  # zeros at or before k
    before, first = seen == 0, zero & (seen == 1)
    tail = (lambda v: mx.cumsum(g * mx.cumprod(v, axis=axis), axis=axis, reverse=True))
    return mx.where(before, tail(x) / mx.where(before, x, 1.0),
                    mx.where(first, tail(mx.where(first, 1.0, x)), 0.0))


def _running_forward(larger: bool):
    """MLX's convention for ``cummax`` / ``cummin``: each output's cotangent goes to
    the last position at or before it that holds the running extreme (x_j = y_j):
    position j gets ``sum_{j<=i<n(j)} g_i`` (n(j): the next such position), the
    difference of two reverse prefix sums (double-word: 2^-48 of the larger sum)."""
    name = "cummax" if larger else "cummin"

    def forward(x, g, axis):
        holds = x == getattr(mx, name)(x, axis=axis)
        n = x.shape[axis]
        pos = mx.arange(n).reshape([n if d == axis else 1 for d in range(x.ndim)])
        nxt = mx.cummin(mx.where(holds, pos, n), axis=axis, reverse=True, inclusive=False)
        tail = mx.cumsum(g, axis=axis, reverse=True)  # sum_{i>=k} g_i
        pad = mx.zeros([1 if d == axis else x.shape[d] for d in range(x.ndim)], tail.dtype)
        after = mx.take_along_axis(mx.concatenate([tail, pad], axis=axis),
                                   mx.minimum(nxt, n), axis=axis)
        return mx.where(holds, tail - after, 0.0)

    return forward


def _selection_vjp(indices):
    """The VJP of a selection of the sorted order (``partition``, ``topk``) of exact
    values (carried values are sorted by a gather, recorded as such): g put back
    at ``indices(src, e, axis)``, MLX's own positions (``argpartition``: ties go
    where MLX's float32 VJP sends them)."""

    def vjp(e, g):
        x = e.args[0]
        if x.dtype not in REAL:
            return NotImplemented
        axis = _selection_axis(e)
        src, ax = (x.reshape(-1), -1) if axis is None else (x, axis)
        back = mx.put_along_axis(mx.zeros(src.shape, g.dtype), indices(src, e, ax), g, axis=ax)
        return (back.reshape(x.shape),)

    return vjp


def _selection_axis(e):
    """The axis argument of a recorded ``partition(a, kth, axis)`` / ``topk(a, k,
    axis)``."""
    return e.args[2] if len(e.args) > 2 else e.kwargs.get("axis", -1)


def _partition_indices(src, e, axis):
    return mx.argpartition(src, e.args[1], axis=axis)


def _topk_indices(src, e, axis):
    """MLX's topk is the last k of ``argpartition(a, -k)`` (in that order)."""
    k = e.args[1]
    idx = mx.argpartition(src, -k, axis=axis)
    return idx[_along(axis % src.ndim)(slice(src.shape[axis] - k, None))]


def _sort_vjp(e, g):
    """The sort's permutation undone: g put back where each value came from (the
    sort of values that carry a low word is recorded as its gather instead)."""
    x = e.args[0]
    axis = e.args[1] if len(e.args) > 1 else e.kwargs.get("axis", -1)
    if x.dtype not in REAL:
        return NotImplemented
    src = x.reshape(-1) if axis is None else x
    ax = -1 if axis is None else axis
    back = mx.put_along_axis(mx.zeros_like(g), mx.argsort(src, axis=ax), g, axis=ax)
    return (back.reshape(x.shape),)


def _softmax_vjp(e, g):
    """``y (g - sum(g y))`` over the softmax's axes, from its output ``y`` (recorded
    as one op where the cpu backend computes softmax by its float64 formula)."""
    x, axes = _reduced(e)
    if x.dtype not in REAL:
        return NotImplemented
    y = e.out
    return (y * (g - mx.sum(g * y, axis=list(axes), keepdims=True)),)


def _logsumexp_vjp(e, g):
    """``g exp(x - logsumexp(x))`` (the softmax of x; where the result is +Inf, NaN
    throughout, as MLX's softmax of such a row: the exponentials alone are NaN at
    the Inf and 0 elsewhere)."""
    x, axes = _reduced(e)
    if x.dtype not in REAL:
        return NotImplemented
    keep = _keepdims(e)
    out = _kept(e.out, x, axes, keep)
    g = _kept(g, x, axes, keep) * mx.where(out == mx.inf, mx.nan, 1.0)
    return (g * elementary("exp", x - out),)


VJPS = {"sum": _sum_vjp("sum"), "mean": _sum_vjp("mean"), "prod": _prod_vjp,
        "max": _extreme_vjp, "min": _extreme_vjp, "cumsum": _cumsum_vjp, "sort": _sort_vjp,
        "softmax": _softmax_vjp, "logsumexp": _logsumexp_vjp,
        "cumprod": _scan_vjp(_cumprod_forward), "cummax": _scan_vjp(_running_forward(True)),
        "cummin": _scan_vjp(_running_forward(False)),
        "partition": _selection_vjp(_partition_indices), "topk": _selection_vjp(_topk_indices)}
"""Op name -> VJP rule (see :mod:`.base`)."""
