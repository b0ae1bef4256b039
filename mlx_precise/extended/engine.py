"""The plumbing every engine-backed rule shares: operands in (with their carried
low words), a double-word engine, the result's low word attached, and gradients."""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

from ..doubleword.fusion import differentiating, words_op as kernel_words_op
from ..doubleword.types import DoubleWord
from .carry import attach, attach_words, low_word, words_of
from ..core.backends import Backend


def words_op(forward: Callable, plain: Callable, operands: list[mx.array],
             backend: Backend, opaque: bool = False) -> mx.array:
    """Run a double-word op on ``operands`` (float32 / complex64 arrays, each with
    its carried low word or exact) and attach the result's low word.

    Args:
        forward: ``forward(*DoubleWord) -> DoubleWord``, the double-word op.
        plain: ``plain(*mx.array) -> mx.array``, a differentiable form of the same
            op on the high words (its VJP is the op's VJP).
        operands: the op's array operands.
        backend: the resolved backend; on a float64 engine (cpu) the operands
            enter as their float64 values and the result leaves as one
            (:func:`_wide_op`).
        opaque: MLX's autodiff cannot differentiate the cpu ``forward`` (the FFTs
            run on the host; the elementary functions build powers of two from
            exponent bits, a view).

    Returns:
        the high words of the result (MLX's shape and dtype), low words attached.
        ``mx.grad`` through it (MLX's, where a block opens inside a function it
        differentiates; inside a block gradients are the flow's) gives ``plain``'s
        VJP for the high words on the kernel backends (the low words are constants
        of relative size u), and MLX's derivative of the float64 computation on
        cpu (``opaque``: ``plain``'s VJP there too; the result then carries its
        two words, not its float64 value).
    """
    if backend.float64_engine and not (opaque and differentiating()):
        return _wide_op(forward, operands)
    return attach(*kernel_words_op(forward, plain, operands, [low_word(a) for a in operands]))


def _wide_op(forward: Callable, operands: list[mx.array]) -> mx.array:
    """The cpu form of :func:`words_op`: ``forward`` on the operands' words (their
    float64 values where they carry them), the result's float64 value kept."""
    args = [words_of(a) for a in operands]
    with mx.stream(mx.cpu):
        z = forward(*(DoubleWord.exact(a) if w is None else w for a, w in zip(operands, args)))
    return attach_words(z.hi, z)
