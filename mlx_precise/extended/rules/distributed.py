"""Collectives of ``mx.distributed`` on values the block carries.

MLX's collectives move and reduce float32 words: an ``all_sum`` of carried values
would sum their high words across the processes and round the sum (the gradient
averaging of data-parallel training). Here each collective moves both words and
reduces the exact values:

* ``all_gather``: the high and the low words gathered (two gathers): exact;
* ``all_sum``, ``sum_scatter``: the words of every process gathered, then summed
  in double-word on each process (the flow's ``sum`` over the process axis; on cpu
  in float64): ``P`` times the data of a ring all-reduce moves, the price of a sum
  rounded once instead of ``P - 1`` times;
* ``all_max``, ``all_min``: gathered, then the flow's exact ``max`` / ``min``.

Operands without a low word and a single process take the same path: the sum of
``P`` float32 values is a double-word value too. ``send`` of a carried value sends
its float32 value (the receiver's ``recv`` has no low word to take): reported.
"""

from __future__ import annotations

import mlx.core as mx

from .. import carry
from .base import is_word_array

# MLX's own collectives, captured at import (inside a block the names are stand-ins)
_ALL_GATHER, _INIT = mx.distributed.all_gather, mx.distributed.init


def _gather(x, lo, group, stream, stacked: bool = False):
    """MLX's ``all_gather`` of each word (``x`` and its low word ``lo`` or None), the
    gathered low words attached; ``stacked``: of ``x[None]``, every process's ``x``
    on a leading process axis, ``(P, *x.shape)``. (A rule runs with the flow off:
    these are MLX's ops.)"""
    words = [w[None] if stacked else w for w in (x, lo) if w is not None]
    hi, *rest = [_ALL_GATHER(w, group=group, stream=stream) for w in words]
    return carry.attach(hi, rest[0] if rest else None)


def _gathered(x, group, stream):
    """Every process's ``x`` on a leading process axis, with its words; None for
    operands left to MLX."""
    if not is_word_array(x):
        return None
    return _gather(x, carry.low_word(x), group, stream, stacked=True)


def _reduction(reduce_name: str):
    """``all_sum`` / ``all_max`` / ``all_min``: the flow's ``reduce`` over the
    gathered process axis."""

    def rule(ctx, original, x, *, group=None, stream=None):
        g = _gathered(x, group, stream)
        if g is None:
            return NotImplemented
        with carry.reporting(ctx.report):
            return getattr(mx, reduce_name)(g, axis=0)

    return rule


def _all_gather(ctx, original, x, *, group=None, stream=None):
    """Both words gathered (exact)."""
    if not is_word_array(x):
        return NotImplemented
    lo = carry.low_word(x)
    if lo is None:
        return NotImplemented  # (MLX's gather of exact values is exact)
    return _gather(x, lo, group, stream)


def _sum_scatter(ctx, original, x, *, group=None, stream=None):
    """``all_sum`` of the process's rows, this process's block of them."""
    g = _gathered(x, group, stream)
    if g is None:
        return NotImplemented
    group = group if group is not None else _INIT()
    size, rank = group.size(), group.rank()
    if x.ndim == 0 or x.shape[0] % size:
        return NotImplemented  # MLX's error for rows it cannot split
    m = x.shape[0] // size
    with carry.reporting(ctx.report):
        return mx.sum(g, axis=0)[rank * m:(rank + 1) * m]


RULES = {"distributed.all_sum": _reduction("sum"), "distributed.all_max": _reduction("max"),
         "distributed.all_min": _reduction("min"), "distributed.all_gather": _all_gather,
         "distributed.sum_scatter": _sum_scatter}
"""Op name -> rule."""
