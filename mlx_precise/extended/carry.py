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

import contextvars
import weakref

import mlx.core as mx

from ..core import context
from ..doubleword.engine64 import to64
from ..doubleword.types import DoubleWord
from ..doubleword.hostsplit import low_from_wide
from .constructor import ARRAY  # the class (mx.array is a stand-in inside blocks)

# The open block's report (mlx_precise.extended.dispatch.Report) in this thread /
# task; None outside blocks, inside rules and inside the package's internals.
report: contextvars.ContextVar = context.flow
suspended = context.flow_suspended  # run package internals with the flow off


def reporting(block_report):
    """Run code with the flow on for ``block_report`` (a rule's decomposition)."""
    return context.setting(report, block_report)


# id(hi) -> (weak reference to hi, [lo or None, wide or None]): on cpu the low word
# is built from the float64 value only when read (low_word)
_table: dict[int, tuple[weakref.ref, list]] = {}


def attach(hi: mx.array, lo: mx.array | None, wide: tuple | None = None) -> mx.array:
    """Record ``lo`` as the low word of ``hi`` (``lo`` and ``wide`` None: ``hi`` is
    exact) and return ``hi``. ``wide``: on the cpu backend, the float64 value ``(re,
    im or None)`` that ``hi`` was rounded from (the next float64 step reads it
    instead of joining the words again; ``lo`` may then be None, built from it
    when read); it must round to ``hi``, so anything that changes ``hi`` or ``lo``
    attaches without it."""
    key = id(hi)
    if lo is None and wide is None:
        _table.pop(key, None)
        return hi

    def drop(_ref, key=key):
        _table.pop(key, None)

    _table[key] = (weakref.ref(hi, drop), [lo, wide])
    return hi


def attach_words(hi: mx.array, w) -> mx.array:
    """Record the words ``w`` (a DoubleWord whose high word is ``hi``) as the value
    of ``hi``: with its float64 value where it has one (cpu; its low word is then
    built only when read). Returns ``hi``."""
    if w.wide is None and w._lo is None:  # exact (DoubleWord.exact)
        return attach(hi, None)
    return attach(hi, w.lo if w.wide is None else w._lo, w.wide)


def copy(src: mx.array, dst: mx.array) -> mx.array:
    """Attach ``src``'s words to ``dst`` (a new array of the same value: a copy,
    a cast to the same dtype) and return ``dst``."""
    cell = _cell(src)
    return attach(dst, None) if cell is None else attach(dst, cell[0], cell[1])


def _cell(x):
    entry = _table.get(id(x))
    if entry is None or entry[0]() is not x:  # a stale id: the array was freed
        return None
    return entry[1]


def has_words(x) -> bool:
    """True when ``x`` carries a low word (without building it)."""
    return _cell(x) is not None


def low_word(x) -> mx.array | None:
    """The low word carried by ``x`` (an ``mx.array`` produced by a double-word op
    inside ``extended_precision()``), or None when ``x`` carries none (its value
    is exactly ``x``)."""
    entry = _table.get(id(x))  # (_cell inlined: read for every operand of an op)
    if entry is None or entry[0]() is not x:
        return None
    cell = entry[1]
    if cell[0] is None:
        cell[0] = low_from_wide(cell[1])
    return cell[0]


def words_of(x, hi=None):
    """The DoubleWord ``x`` carries (its low word built lazily where ``x`` carries
    a float64 value), or None when ``x`` carries none. ``hi``: the array to hold as
    its high word (default ``x``)."""
    cell = _cell(x)
    if cell is None:
        return None
    hi = x if hi is None else hi
    return DoubleWord(hi, low_word(x)) if cell[1] is None else DoubleWord.from_wide(hi, cell[1])


def detached_words(x):
    """:func:`words_of` with an alias of ``x`` as the high word (for the package's
    input reader and for a DoubleWord handed back to the user inside a block): ``x``
    itself stands for ``hi + lo`` inside a block (the flow's ops on the DoubleWord's
    high word, ``w.hi + w.lo`` say, would count the low word twice); the low word
    built with the flow off (the package's ops, not the user's)."""
    if _cell(x) is None:
        return None
    with suspended():  # (MLX's own astype to x's dtype: a new array object, no node)
        return words_of(x, _ALIAS(x, x.dtype))


_ALIAS = ARRAY.astype


context.carried_words.append(detached_words)


def wide_value(x) -> tuple | None:
    """The float64 value ``(re, im or None)`` recorded with ``x``'s low word on the
    cpu backend, or None."""
    cell = _cell(x)
    return None if cell is None else cell[1]


def any_carried() -> bool:
    return bool(_table)


def carried() -> int:
    """How many arrays carry a low word now (for leak tests)."""
    return len(_table)


def as64(x):
    """An operand as MLX's float64 would see it: a float32 array at its exact value
    ``hi + lo`` (its carried float64 value on cpu), other values as they are."""
    if isinstance(x, ARRAY) and x.dtype == mx.float32:
        wide = wide_value(x)
        if wide is not None:
            return wide[0]
        lo = low_word(x)
        # (with the flow off: inside a block x.astype would read x's carried value,
        # and x + lo would count the low word twice)
        with suspended():
            if lo is None:
                with mx.stream(mx.cpu):
                    return x.astype(mx.float64)
            return to64(DoubleWord(x, lo))[0]  # (a -0 high word stays -0)
    return x
