"""MLX's FFTs and depthwise ``mx.conv1d`` inside the double-word flow: double-word
operands in, double-word results out, with gradients.

The intercepted calls (:mod:`mlx_precise.extended.intercept`) hand their normalised
arguments here when a block carries values. Operands enter with their carried low
words (or exactly), the double-word engines run without rounding
(:mod:`mlx_precise.fft.nd`, :func:`mlx_precise.depthwise_conv_extended`), and the
result's low word is attached to the returned array. Gradients are those of the
op's rounded (float32-accurate) form, through
:func:`~mlx_precise.extended.engine.words_op`.
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

from ..doubleword.words import DoubleWord
from ..fft import nd as fftn
from . import arith
from .carry import low_word
from .engine import words_op


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
        lambda x: fftn.transform(kind, x, s, axes, norm, **kw), [a], f"mx.fft ({kind})",
        backend != "metal")


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

    return words_op(forward, plain, [x, w], "mx.conv1d", backend != "metal")
