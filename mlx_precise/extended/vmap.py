"""``mx.vmap`` inside ``extended_precision()``: the function once per slice.

MLX's vmap traces the function on new arrays (no low word goes in, none comes out)
and the kernel backends' launches have no vmap rule. Inside a block the flow maps
instead: the function runs on each slice of the mapped inputs (``mx.take`` of the
carried arrays: their low words slice with them) and the results are stacked along
the output axes (``mx.stack``: their low words stack with them), which is what
``vmap`` means (JAX's reference semantics for ``vmap`` are this loop). Every op of
the function is then the flow's: double-word on every backend, recorded by a
gradient being taken. The cost is one call of the function per slice.

On the cpu backend, where the flow computes in MLX float64, MLX's own vmap is tried
first on the float64 values (:func:`_float64_vmap`): the function traced once on
float64 tracers that stand for the carried inputs, its float64 results batched by
MLX's vmap rules; where that trace cannot run (an op computed on the host, a value
reported, complex or non-float operands, a gradient being recorded or taken by
MLX around the block) the loop runs.
"""

from __future__ import annotations

import mlx.core as mx

from ..core import backends
from ..core.plain import plain
from ..doubleword.fusion import differentiating
from . import autodiff, carry
from .constructor import ARRAY
from .report import Report
from .rules.base import result64


def mapped(fun, in_axes, out_axes, args: tuple):
    """``mx.vmap(fun, in_axes, out_axes)(*args)`` as a loop over the slices (see
    the module). ``in_axes`` / ``out_axes``: an int, None, or a prefix tree of the
    arguments (a list or tuple with one entry per argument) / of the outputs, as
    MLX takes them. Raises ValueError as MLX does for mapped inputs of different
    sizes or no mapped input."""
    size = None
    for x, axis in _pairs(in_axes, args, "in_axes"):
        if axis is None:
            continue
        if not isinstance(x, ARRAY):
            raise ValueError(f"[vmap] The mapped input must be an array, got {type(x).__name__}")
        if not -x.ndim <= axis < x.ndim:
            raise ValueError(f"[vmap] Axis {axis} is out of bounds for an input with "
                             f"{x.ndim} dimensions")
        n = x.shape[axis]
        if size is not None and n != size:
            raise ValueError(f"[vmap] Inconsistent axis sizes: {size} and {n}")
        size = n
    if size is None:
        raise ValueError("[vmap] At least one input must be mapped (in_axes all None)")
    first = fun(*_slices(in_axes, args, 0))
    if size > 1 and backends.backend().float64_engine and not (
            autodiff.recording() or differentiating()):
        out = _float64_vmap(fun, in_axes, out_axes, args, first)
        if out is not None:
            return out
    outs = [first] + [fun(*_slices(in_axes, args, i)) for i in range(1, size)]
    return _stacked(out_axes, outs)


class _Declined(Exception):
    """The float64 trace cannot stand for the function (see :func:`_float64_vmap`)."""


def _float64_vmap(fun, in_axes, out_axes, args, first):
    """On the cpu backend: MLX's vmap of the function on the float64 values of the
    real float32 inputs (each float64 tracer standing for a float32 array that
    carries it), the float64 results rounded once and carrying their values; the
    output structure is the first slice's (``first``, computed by the caller).
    None where it does not apply: a complex or float64 leaf, an output that is not
    a float32 or integer array, a trace that evaluates on the host or reports a
    value leaving double-word (then the loop runs, and reports)."""
    pairs = list(_pairs(in_axes, args, "in_axes"))
    out_leaves = leaves(first)
    if any(isinstance(x, ARRAY) and x.dtype in (mx.complex64, mx.float64) for x, _ in pairs) or (
            not all(isinstance(o, ARRAY) and (o.dtype == mx.float32 or not mx.issubdtype(
                o.dtype, mx.inexact)) for o in out_leaves)):
        return None
    inputs = [carry.as64(x) if isinstance(x, ARRAY) and x.dtype == mx.float32 else x
              for x, _ in pairs]
    out_axes_flat = [axis for _, axis in _pairs(out_axes, first, "out_axes")]
    if any(axis is None for axis in out_axes_flat):
        return None  # (MLX 0.32's vmap broadcasts such an output: the loop's is the first)
    report = carry.report.get()
    scratch = Report(report.strict)

    def traced(*values):
        rebuilt = []
        for v, (x, _) in zip(values, pairs):
            if isinstance(x, ARRAY) and x.dtype == mx.float32:
                v = result64(v)
            rebuilt.append(v)
        with carry.reporting(scratch):
            out = fun(*_rebuild(tuple(args), iter(rebuilt)))
        if scratch.float32:
            raise _Declined
        flat = leaves(out)
        if len(flat) != len(out_leaves):
            raise _Declined
        return tuple(carry.as64(o) if o.dtype == mx.float32 else o for o in flat)

    try:
        with carry.suspended():
            results = plain.vmap(traced, in_axes=tuple(axis for _, axis in pairs),
                                 out_axes=tuple(out_axes_flat))(*inputs)
            results = [result64(r) if o.dtype == mx.float32 else r
                       for r, o in zip(results, out_leaves)]
    except Exception:  # (the loop runs instead: a genuine error of the function recurs there)
        return None
    report.extended.update(scratch.extended)
    report.plain.update(scratch.plain)
    return _rebuild(first, iter(results))


def _pairs(axes, tree, what: str):
    """(leaf, axis) for every leaf of ``tree`` under the prefix tree ``axes``."""
    if axes is None or isinstance(axes, int):
        for leaf in leaves(tree):
            yield leaf, axes
        return
    if isinstance(axes, (list, tuple)) and isinstance(tree, (list, tuple)):
        if len(axes) != len(tree):
            raise ValueError(f"[vmap] {what} has {len(axes)} entries for {len(tree)} "
                             "inputs" if what == "in_axes" else
                             f"[vmap] {what} has {len(axes)} entries for {len(tree)} outputs")
        for a, t in zip(axes, tree):
            yield from _pairs(a, t, what)
        return
    if isinstance(axes, dict) and isinstance(tree, dict):
        for k, t in tree.items():
            yield from _pairs(axes[k], t, what)
        return
    raise ValueError(f"[vmap] {what} is not a prefix of the tree it maps")


def leaves(tree):
    """The leaves of a tree of lists, tuples and dicts, in order."""
    if isinstance(tree, (list, tuple)):
        return [x for t in tree for x in leaves(t)]
    if isinstance(tree, dict):
        return [x for t in tree.values() for x in leaves(t)]
    return [tree]


def _rebuild(tree, values):
    """``tree`` with its leaves replaced, in order, from the iterator ``values``."""
    if isinstance(tree, (list, tuple)):
        return type(tree)(_rebuild(t, values) for t in tree)
    if isinstance(tree, dict):
        return {k: _rebuild(t, values) for k, t in tree.items()}
    return next(values)


def _slices(in_axes, args: tuple, i: int) -> tuple:
    """The arguments of the ``i``-th call: each mapped leaf's slice ``i`` along its
    axis (a carried value's low word goes with it)."""
    taken = iter([x if axis is None else mx.take(x, i, axis=axis)
                  for x, axis in _pairs(in_axes, args, "in_axes")])
    return _rebuild(tuple(args), taken)


def _stacked(out_axes, outs: list):
    """The calls' outputs (trees of one structure) stacked leaf by leaf along
    their ``out_axes`` (None: the first call's leaf, unmapped)."""
    first = outs[0]
    columns = [list(c) for c in zip(*(leaves(o) for o in outs))]
    axes = [axis for _, axis in _pairs(out_axes, first, "out_axes")]
    stacked = iter([col[0] if axis is None else mx.stack(col, axis=axis)
                    for col, axis in zip(columns, axes)])
    return _rebuild(first, stacked)
