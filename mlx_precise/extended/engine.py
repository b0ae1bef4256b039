"""The plumbing every engine-backed rule shares: operands in (with their carried
low words), a double-word engine, the result's low word attached, and gradients."""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

from ..core.plain import plain as originals  # MLX's own functions (mx.* dispatch in a block)
from ..doubleword.fusion import words_op as kernel_words_op
from ..doubleword.words import complex_from_parts, from64, to64
from .carry import attach, attach_words, low_word, suspended, words_of
from ..core.backends import Backend


def words_op(forward: Callable, plain: Callable, operands: list[mx.array],
             backend: Backend) -> mx.array:
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

    Returns:
        the high words of the result (MLX's shape and dtype), low words attached.
        ``mx.grad`` through it gives ``plain``'s VJP for the high words (the low
        words are constants of relative size u).
    """
    if backend.float64_engine:
        return _wide_op(forward, plain, operands)
    return attach(*kernel_words_op(forward, plain, operands, [low_word(a) for a in operands]))


def _wide_op(forward: Callable, plain: Callable, operands: list[mx.array]) -> mx.array:
    """The cpu form of :func:`words_op`: a custom function from the operands'
    float64 values (real and imaginary parts) to the result's, whose VJP is
    ``plain``'s in float32 / complex64 (MLX's convention: the cotangent of a
    complex value is ``d/d re + i d/d im``). The result's words are split from its
    float64 value lazily, so a next float64 step that reads the value never
    evaluates them."""
    ops = []
    with mx.stream(mx.cpu):
        for a in operands:
            w = words_of(a)
            if w is not None:
                ops.append(to64(w))  # its float64 value, or its words joined
            else:  # exact: the float64 value of the word itself
                ops.append((a.astype(mx.float64), None) if a.dtype != mx.complex64 else
                           (originals.real(a).astype(mx.float64),
                            originals.imag(a).astype(mx.float64)))
    counts = [1 if im is None else 2 for _, im in ops]
    flat = [v for re, im in ops for v in ((re,) if im is None else (re, im))]

    @mx.custom_function
    def f(*values):
        with mx.stream(mx.cpu):
            args, k = [], 0
            for c in counts:
                args.append(from64(*values[k:k + c]))
                k += c
            re, im = to64(forward(*args))
        return (re,) if im is None else (re, im)

    @f.vjp
    def f_vjp(primals, cotangents, outputs):
        with suspended():
            g = (cotangents[0].astype(mx.float32) if len(cotangents) == 1 else
                 complex_from_parts(cotangents[0].astype(mx.float32),
                                    cotangents[1].astype(mx.float32)))
            _, grads = mx.vjp(plain, list(operands), [g])
            out = []
            for grad, c in zip(grads, counts):
                if c == 1:
                    out.append((originals.real(grad) if grad.dtype == mx.complex64 else grad)
                               .astype(mx.float64))
                else:
                    out += [originals.real(grad).astype(mx.float64),
                            originals.imag(grad).astype(mx.float64)]
            return tuple(out)

    values = f(*flat)
    with mx.stream(mx.cpu):
        z = from64(*values)
    return attach_words(z.hi, z)
