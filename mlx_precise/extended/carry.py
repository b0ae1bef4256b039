"""The low words carried beside ordinary ``mx.array`` values.

Inside ``extended_precision()`` a supported op returns an ordinary ``mx.array``
``hi`` (the float32 / complex64 rounding of its double-word result) and records
the low word ``lo`` here, keyed by the identity of ``hi``: the exact value is
``hi + lo``. The entry holds only a weak reference to ``hi`` and is removed by
that reference's callback when ``hi`` is freed, so no low word outlives its
array. Dictionary operations are atomic under the interpreter lock, so threads
may attach and read concurrently.
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref

import mlx.core as mx

# The open block's report (mlx_precise.extended.dispatch.Report) in this thread /
# task; None outside blocks, inside rules and inside the package's internals.
report: contextvars.ContextVar = contextvars.ContextVar("mlx_precise_flow", default=None)


@contextlib.contextmanager
def reporting(block_report):
    """Run code with the flow on for ``block_report`` (a rule's decomposition)."""
    token = report.set(block_report)
    try:
        yield
    finally:
        report.reset(token)


@contextlib.contextmanager
def suspended():
    """Run package internals (rules, VJPs) with the flow off: MLX's ops unchanged."""
    token = report.set(None)
    try:
        yield
    finally:
        report.reset(token)


# id(hi) -> (weak reference to hi, lo)
_table: dict[int, tuple[weakref.ref, mx.array]] = {}


def attach(hi: mx.array, lo: mx.array | None) -> mx.array:
    """Record ``lo`` as the low word of ``hi`` (None: ``hi`` is exact) and
    return ``hi``."""
    key = id(hi)
    if lo is None:
        _table.pop(key, None)
        return hi

    def drop(_ref, key=key):
        _table.pop(key, None)

    _table[key] = (weakref.ref(hi, drop), lo)
    return hi


def low_word(x) -> mx.array | None:
    """The low word carried by ``x`` (an ``mx.array`` produced by a double-word op
    inside ``extended_precision()``), or None when ``x`` carries none (its value
    is exactly ``x``)."""
    entry = _table.get(id(x))
    if entry is None or entry[0]() is not x:  # a stale id: the array was freed
        return None
    return entry[1]


def carried() -> int:
    """How many arrays carry a low word now (for leak tests)."""
    return len(_table)
