"""MLX's FFTs and depthwise ``mx.conv1d`` inside the double-word flow: double-word
operands in, double-word results out, with gradients.

The intercepted calls (:mod:`mlx_precise.extended.intercept`) hand their normalised
arguments here when a block carries values. Operands enter with their carried low
words (or exactly), the double-word engines run without rounding
(:mod:`mlx_precise.fft.nd`, :func:`mlx_precise.depthwise_conv_extended`), and the
result's low word is attached to the returned array. Gradients are those of the
op's rounded (float32-accurate) form, through :func:`words_op`.
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

from ..fft import nd as fftn
from ..doubleword.words import DoubleWord
from . import arith
from .carry import attach, check_traceable, low_word, suspended


def words_op(forward: Callable, plain: Callable, operands: list[mx.array], what: str = "",
             backend: str = "metal") -> mx.array:
    """Run a double-word op on ``operands`` (float32 / complex64 arrays, each with
    its carried low word or exact) and attach the result's low word.

    Args:
        forward: ``forward(*DoubleWord) -> DoubleWord``, the double-word op.
        plain: ``plain(*mx.array) -> mx.array``, a differentiable form of the same
            op on the high words (its VJP is the op's VJP).
        operands: the op's array operands.

        what, backend: the op's name and backend (errors name them); on a backend
            that computes on the host, operands from a nested gradient are refused
            (:func:`~mlx_precise.extended.carry.check_traceable`).

    Returns:
        the high words of the result (MLX's shape and dtype), low words attached.
        ``mx.grad`` through it gives ``plain``'s VJP for the high words (the low
        words are constants of relative size u).
    """
    if backend != "metal":
        check_traceable(operands, what, backend)
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


def _cast(x: DoubleWord, kind: str) -> DoubleWord:
    """MLX's input cast for ``kind`` on both words (exact: float32 -> complex64)."""
    if kind == "rfft":
        return x if x.dtype == mx.float32 else arith.parts(x)[0]
    return arith.as_complex(x)


def transform(kind: str, a: mx.array, s, axes, norm: str, backend: str, stream) -> mx.array:
    """The double-word N-D transform ``kind`` of ``a`` (float32 / complex64, with
    or without a carried low word)."""
    s, axes = tuple(s), tuple(axes)
    kw = dict(backend=backend, stream=stream)
    return words_op(
        lambda x: fftn.transform(kind, _cast(x, kind), s, axes, norm, round_output=False, **kw),
        lambda x: fftn.transform(kind, x, s, axes, norm, **kw), [a], f"mx.fft ({kind})", backend)


def conv(words_forward: Callable, plain: Callable, x: mx.array, w: mx.array,
         backend: str, stream) -> mx.array:
    """A convolution, bilinear in (x, w), from its double-word form on float32
    operands ``words_forward(x, w) -> DoubleWord``: ``x w = xh wh + xl wh + xh wl``
    (the ``xl wl`` term is below u^2 |x| |w|), each in double-word, added in
    double-word. Terms with a zero low word are skipped."""
    carried = (low_word(x) is not None, low_word(w) is not None)

    def forward(X: DoubleWord, W: DoubleWord) -> DoubleWord:
        y = words_forward(X.hi, W.hi)
        for use, a, b in ((carried[0], X.lo, W.hi), (carried[1], X.hi, W.lo)):
            if use:
                y = arith.binary("add", y, words_forward(a, b), backend, stream)
        return y

    return words_op(forward, plain, [x, w], "mx.conv1d", backend)
