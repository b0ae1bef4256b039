"""What a block ran: the :class:`Report`, and the one place where a value that
leaves double-word is counted (:func:`dropped`), raising under ``strict=True``."""

from __future__ import annotations

import collections


class PrecisionDropError(RuntimeError):
    """Raised inside ``extended_precision(strict=True)`` when a double-word value
    leaves double-word by any path: an op without a rule for its operands, an
    in-place update, a scatter, a kernel, a compiled function."""


_counter = collections.Counter.__new__


class Report:
    """What ran inside one ``extended_precision()`` block, op by op.

    Attributes:
        extended: ``Counter`` op name -> calls computed in double-word.
        float32: op name -> calls that consumed a double-word value in float32.
        plain: op name -> calls of supported ops on operands they do not extend
            (float16, bfloat16, integer arrays), run by MLX unchanged.
        strict: whether the first ``float32`` event raises.
    """

    def __init__(self, strict: bool = False):
        # (Counter.__new__: an empty Counter without Counter.__init__'s update call,
        # a third of an empty block's report cost)
        self.extended: collections.Counter = _counter(collections.Counter)
        self.float32: collections.Counter = _counter(collections.Counter)
        self.plain: collections.Counter = _counter(collections.Counter)
        self.strict = strict
        self.open = True  # False once its block ended (see core.context._Block)
        self._tape = None  # what stands for each op while the block replays (.blocks)
        self._learned = None  # what the block recorded (.blocks)

    def __repr__(self) -> str:
        def fmt(c):
            return ", ".join(f"{k}: {v}" for k, v in sorted(c.items())) or "-"

        return (f"Report(extended: {fmt(self.extended)}; float32: {fmt(self.float32)}; "
                f"plain: {fmt(self.plain)})")


def dropped(report: Report, name: str, how: str = "it has no double-word rule for these "
            "operands") -> None:
    """Count ``name`` as consuming a double-word value in float32; raise under
    ``strict=True``."""
    report.float32[name] += 1
    if report.strict:
        raise PrecisionDropError(
            f"{name} consumed a double-word value in float32 inside "
            f"extended_precision(strict=True): {how}")
