"""The plumbing every engine-backed rule shares: operands in (with their carried
low words), a double-word engine, the result's low word attached, and gradients."""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

from ..doubleword.words import DoubleWord
from .carry import attach, check_traceable, low_word, suspended


def words_op(forward: Callable, plain: Callable, operands: list[mx.array], what: str,
             host: bool) -> mx.array:
    """Run a double-word op on ``operands`` (float32 / complex64 arrays, each with
    its carried low word or exact) and attach the result's low word.

    Args:
        forward: ``forward(*DoubleWord) -> DoubleWord``, the double-word op.
        plain: ``plain(*mx.array) -> mx.array``, a differentiable form of the same
            op on the high words (its VJP is the op's VJP).
        operands: the op's array operands.
        what: the op's name (errors name it).
        host: True where ``forward`` evaluates its operands on the host (the
            emulator, numpy): operands from a nested gradient are then refused
            (:func:`~mlx_precise.extended.carry.check_traceable`).

    Returns:
        the high words of the result (MLX's shape and dtype), low words attached.
        ``mx.grad`` through it gives ``plain``'s VJP for the high words (the low
        words are constants of relative size u).
    """
    if host:
        check_traceable(operands, what)
    n = len(operands)
    lows = [low_word(a) for a in operands]
    lows = [mx.zeros_like(a) if lo is None else lo for a, lo in zip(operands, lows)]

    @mx.custom_function
    def f(*w):
        z = forward(*(DoubleWord(w[i], w[n + i]) for i in range(n)))
        return z.hi, z.lo

    @f.vjp
    def f_vjp(primals, cotangents, outputs):
        with suspended():
            _, grads = mx.vjp(plain, list(primals[:n]), [cotangents[0]])
            return (*grads, *(mx.zeros_like(lo) for lo in primals[n:]))

    hi, lo = f(*operands, *lows)
    return attach(hi, lo)
