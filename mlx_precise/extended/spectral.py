"""MLX's FFTs and depthwise ``mx.conv1d`` inside the double-word flow: double-word
operands in, double-word results out, with gradients.

The intercepted calls (:mod:`mlx_precise.extended.intercept`) hand their normalised
arguments here when a block carries values. Operands enter with their carried low
words (or exactly), the double-word engines run without rounding
(:mod:`mlx_precise.fft.nd`, :func:`mlx_precise.conv.depthwise.conv1d_words`), and the
result's low word is attached to the returned array. Gradients are those of the
op's rounded (float32-accurate) form, through
:func:`~mlx_precise.extended.engine.words_op`.
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

from ..conv.depthwise import conv1d_words
from ..doubleword.fusion import differentiating
from ..doubleword.types import DoubleWord, real_imag
from ..fft import nd as fftn
from . import arith
from .carry import attach, low_word
from .engine import words_op
from ..core.backends import Backend
from .constructor import ARRAY  # the class (mx.array is a stand-in inside blocks)


def _cast(x: DoubleWord, kind: str) -> DoubleWord:
    """MLX's input cast for ``kind`` on both words (exact: float32 -> complex64)."""
    if kind == "rfft":
        return x if x.dtype == mx.float32 else real_imag(x)[0]
    return arith.as_complex(x)


def transform(kind: str, a: mx.array, s, axes, norm: str, backend: Backend,
              stream) -> mx.array:
    """The double-word N-D transform ``kind`` of ``a`` (float32 / complex64, with
    or without a carried low word)."""
    s, axes = tuple(s), tuple(axes)
    if not backend.float64_engine and not differentiating():
        # the kernel backends' frequent case: words_op's steps there (operand words in,
        # the transform's words attached), without its layers
        lo = low_word(a)
        y = fftn.kernel_words(kind, _cast(DoubleWord.exact(a) if lo is None else
                                          DoubleWord(a, lo), kind), s, axes, norm, backend,
                              stream)
        return attach(y.hi, y.lo)
    kw = dict(backend=backend, stream=stream)
    return words_op(
        lambda x: fftn.transform(kind, _cast(x, kind), s, axes, norm, round_output=False, **kw),
        lambda x: fftn.transform(kind, mx.real(x) if kind == "rfft" and x.dtype == mx.complex64
                                 else x, s, axes, norm, **kw), [a], backend, opaque=True)


def is_depthwise(x, w, groups) -> bool:
    """MLX's ``conv1d`` arguments of a depthwise convolution of float32 values
    (x (N, L, C), w (m C, K, 1), groups = C): the double-word kernel's case."""
    return (isinstance(x, ARRAY) and isinstance(w, ARRAY)
            and x.dtype == mx.float32 and w.dtype == mx.float32
            and x.ndim == 3 and w.ndim == 3 and groups == x.shape[2]
            and w.shape[2] == 1 and w.shape[0] % groups == 0)


def depthwise(x, w, stride: int, padding: int, dilation: int, backend: Backend,
              stream) -> DoubleWord:
    """MLX's ``conv1d(x, w, stride, padding, dilation, groups=C)`` with
    x (N, L, C) float32 and w (m C, K, 1) float32 in double-word on a kernel
    backend, unrounded: one launch reading both in place
    (:func:`~mlx_precise.conv.depthwise.conv1d_words`)."""
    return conv1d_words(x, w, stride, padding, dilation, backend, stream)


def taps(x: mx.array, w: mx.array, stride: int, padding: int, dilation: int) -> mx.array:
    """Depthwise ``conv1d`` as the sum over its K taps of strided slices of x (N, L,
    C) times the tap weights of w (m C, K, 1) (channel multiplier m), in whatever
    arithmetic the operands' ops run: float64 values on the CPU stream (the cpu
    engine, :func:`depthwise64`), or carried float32 values through the flow (a
    gradient differentiates each tap)."""
    C, (Cout, K, _) = x.shape[2], w.shape
    if Cout != C:  # channel multiplier m: output channel o reads input channel o // m
        x = mx.repeat(x, Cout // C, axis=2)
    if padding:
        x = mx.pad(x, [(0, 0), (padding, padding), (0, 0)])
    out = (x.shape[1] - dilation * (K - 1) - 1) // stride + 1
    y = None
    for k in range(K):
        tap = x[:, k * dilation:k * dilation + (out - 1) * stride + 1:stride] * w[:, k, 0]
        y = tap if y is None else y + tap
    return y


def depthwise64(x: mx.array, w: mx.array, stride: int, padding: int,
                dilation: int) -> mx.array:
    """:func:`depthwise` in MLX float64 on the CPU (the cpu backend's engine):
    x (N, L, C) and w (m C, K, 1) float64 values, the sum over the K taps in float64
    (error <= K u64 relative to the sum of |terms|); lazy. (MLX's own float64
    ``conv1d`` is only float32-accurate.)"""
    with mx.stream(mx.cpu):
        return taps(x, w, stride, padding, dilation)


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

    return words_op(forward, plain, [x, w], backend)
