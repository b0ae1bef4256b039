"""Double-word values carried through ``extended_precision()``.

Inside a block, MLX ops with a double-word rule (:mod:`.rules`: arithmetic,
shape and movement ops, reductions, FFTs) return ordinary ``mx.array``\\ s that
hold the float32 / complex64 rounding of their double-word result and carry the
low word beside them (:mod:`.carry`); the next op reads it. A chain of such ops
is computed in double-word and rounded once, where its value leaves the chain.

Public names: :class:`Report` (what a block ran), :class:`PrecisionDropError`
(``extended_precision(strict=True)``), :func:`low_word` (the low word an array
carries), :func:`carried` (how many arrays carry one).
"""

from __future__ import annotations

from ..core.context import register_block_hook
from .carry import carried, low_word, suspended
from .dispatch import active, block
from .report import PrecisionDropError, Report
from . import checks  # noqa: F401 (registers the self-test's checks)

register_block_hook(block)

__all__ = ["PrecisionDropError", "Report", "active", "carried", "low_word", "suspended"]
