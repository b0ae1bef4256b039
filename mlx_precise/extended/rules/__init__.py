"""The double-word rules, one family per module, each declared next to its op.

Families: :mod:`.arithmetic` (``+ - * /``, comparisons, ``where``, ``abs``,
``astype``, in-place operators), :mod:`.shape` (shape and movement ops,
indexing, assignment, functional updates), :mod:`.reductions`,
:mod:`.elementwise` (elementary functions), :mod:`.linear` (matrix products,
contractions), :mod:`.float64` (``mx.linalg`` and the ops exact in float64, on cpu), :mod:`.fft`,
:mod:`.convolution`, :mod:`.fast` (``mx.fast``), :mod:`.constructors`,
:mod:`.sampling` (``mx.random`` with carried parameters), :mod:`.quantized`
(quantized weights), :mod:`.distributed` (``mx.distributed``'s collectives). What a
rule receives and returns: :mod:`.base`.

:data:`TABLE` joins the families' tables: qualified op name (``"add"``,
``"fft.rfft"``, ``"linalg.solve"``, ``"fast.rope"``; ``"array.<attr>"`` for
``mx.array``-only methods and properties) -> rule. Aliases, methods and operators
are derived from it by :mod:`..registry`.
"""

from __future__ import annotations

from . import (arithmetic, constructors, convolution, distributed, elementwise, fast, fft,
               float64, linear, quantized, reductions, sampling, shape)
from .arithmetic import inplace, inplace_fast
from .base import Operands, is_word_array

_FAMILIES = (arithmetic, shape, reductions, elementwise, linear, float64, fft, convolution,
             fast, constructors, sampling, quantized, distributed)


def _join() -> dict:
    table: dict = {}
    for family in _FAMILIES:
        clash = table.keys() & family.RULES.keys()
        if clash:
            raise AssertionError(f"ops with two rules: {sorted(clash)}")
        table.update(family.RULES)
    return table


TABLE = _join()

VJPS = {name: vjp for family in _FAMILIES for name, vjp in getattr(family, "VJPS", {}).items()}
"""Op name -> VJP rule (:mod:`.base`): the derivative of the op in double-word."""

FAST = {name: fast for family in _FAMILIES for name, fast in getattr(family, "FAST", {}).items()}
"""Op name -> a fast path ``fast(*args) -> mx.array | None`` the dispatcher tries
before the rule when a call has no keyword arguments and no gradient records it
(None: the rule runs); the same result as the rule. An :class:`~.base.OfOriginal`
makes one per callable of the op."""

__all__ = ["TABLE", "VJPS", "FAST", "Operands", "inplace", "inplace_fast", "is_word_array"]
