"""The metal / emulate engine of double-word arithmetic: ``+ * /`` of DoubleWords
(real or complex, broadcasting) by the ``dw_ops`` / ``cdw_ops`` kernels
(:mod:`.dw_kernels`), complex division scaled so that no intermediate overflows or
underflows (:func:`arith_kernels`)."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from ..core import backends
from . import fusion
from .dw_kernels import CDW_DIV, CDW_OPS, DW_OPS, offsets
from .types import DoubleWord, as_complex, combine, real_imag


def _flat8(a: mx.array, shape: tuple) -> mx.array:
    """``a`` broadcast to ``shape``, flat, padded to 8 elements at least (MLX passes
    smaller inputs in ``constant`` space: one kernel instantiation for all sizes).
    An operand of the full shape is only reshaped (the kernels are declared
    ``ensure_row_contiguous``: MLX copies a strided one)."""
    f = a.reshape(-1) if tuple(a.shape) == shape else mx.broadcast_to(a, shape).reshape(-1)
    return f if f.size >= 8 else mx.pad(f, (0, 8 - f.size))


# MLX's own array methods and functions (captured at import, before any block installs
# the flow's stand-ins, which a rule's calls would pass through to reach these)
_RESHAPE, _VIEW, _INDEX = mx.array.reshape, mx.array.view, mx.array.__getitem__
_WHERE, _DIVIDE = mx.where, mx.divide


def _complex_words(x: DoubleWord, shape: tuple) -> tuple[mx.array, mx.array, int]:
    """``(hi, lo, at)``: buffers of the float32 (re, im) words of complex ``x``
    broadcast to ``shape``, flat and padded (:func:`_flat8`), the low words at the
    offset ``at`` (floats) of ``lo``. Where x has the shape and its words are a
    kernel's (:func:`.fusion.words_of`), those floats as they are: their packed
    array where it is known (one buffer, passed as both, ``at`` its half)."""
    words = fusion.words_of(x) if tuple(x.shape) == shape and math.prod(shape) >= 8 else None
    if words is not None:
        z = fusion.packed(*words)
        if z is not None:
            return z, z, z.size // 2
        return _RESHAPE(words[0], -1), _RESHAPE(words[1], -1), 0
    return (*(_VIEW(_flat8(a, shape), mx.float32) for a in (x.hi, x.lo)), 0)


def _launch(kernel, op: str, words: list[mx.array], n_out: int, backend: str, stream):
    """An elementwise kernel over float32 words broadcast to one shape."""
    shape = tuple(mx.broadcast_shapes(*(tuple(w.shape) for w in words)))
    size = int(np.prod(shape))
    if size == 0:
        return [mx.zeros(shape, mx.float32) for _ in range(n_out)]
    # the code itself in the template (what launch observers, e.g. the benchmarks'
    # cost model, read), looked up by name
    out = kernel(inputs=[_flat8(w, shape) for w in words],
                 template={"OP": kernel.codes["OP"][op]},
                 output_shapes=[(max(size, 8),)] * n_out, output_dtypes=[mx.float32] * n_out,
                 backend=backend, stream=stream)
    return [o[:size].reshape(shape) for o in out]


def arith_kernels(op: str, x: DoubleWord, y: DoubleWord, backend: str, stream) -> DoubleWord:
    """``x + y``, ``x * y`` or ``x / y`` (op "add", "mul", "div") by the ``dw_ops`` /
    ``cdw_ops`` kernels on ``backend`` (metal or emulate); mixed real
    and complex operands part by part, complex quotients by :func:`_complex_div`."""
    real = (lambda code, a, b: DoubleWord(*_launch(DW_OPS, code, [a.hi, a.lo, b.hi, b.lo], 2,
                                                   backend, stream)))
    if not x.is_complex and not y.is_complex:
        return real(op, x, y)
    if op == "add" or (op == "mul" and x.is_complex and y.is_complex):
        (xr, xi), (yr, yi) = real_imag(as_complex(x)), real_imag(as_complex(y))
        words = [w for p in (xr, xi, yr, yi) for w in (p.hi, p.lo)]
        rh, rl, ih, il = _launch(CDW_OPS, op, words, 4, backend, stream)
        return combine(DoubleWord(rh, rl), DoubleWord(ih, il))
    if op == "mul":  # complex times real: each part times the real factor
        c, r = (x, y) if x.is_complex else (y, x)
        re, im = real_imag(c)
        return combine(real("mul", re, r), real("mul", im, r))
    if not y.is_complex:  # complex / real
        re, im = real_imag(x)
        return combine(real("div", re, y), real("div", im, y))
    return _complex_div(x, y, backend, stream)


def _complex_div(x: DoubleWord, y: DoubleWord, backend: str, stream) -> DoubleWord:
    """x / y for complex y by the ``cdw_div`` kernel (:data:`.dw_kernels.CDW_DIV`):
    x and y scaled by powers of two so that no intermediate overflows or underflows,
    for any float32 operands (normwise <= 32u^2); a quotient outside float32's range
    is Inf or rounded as float32 rounds. The float32 rule for special operands (a
    part Inf or NaN, or y = 0): MLX's complex64 quotient of the high words, with a
    zero low word."""
    shape = tuple(mx.broadcast_shapes(tuple(x.shape), tuple(y.shape)))
    size = int(np.prod(shape))
    if size == 0:
        z = mx.zeros(shape, mx.complex64)
        return DoubleWord(z, z)
    xh, xl, x_at = _complex_words(as_complex(x), shape)
    yh, yl, y_at = _complex_words(y, shape)
    n = max(size, 8)
    # the outputs declared in the quotient's shape (the interleaved words of each
    # row along its last axis, packed), so no reshape views them; a short one in 8
    floats = shape[:-1] + (2 * shape[-1],) if n == size else (2 * n,)
    # the words are float32, 8 elements at least (_complex_words): the declaration
    # holds by construction, so the launch skips the per-call checks
    z, special = CDW_DIV.unchecked(inputs=[xh, xl, yh, yl, offsets(x_at, y_at, 2 * n)],
                                   template=None, grid=(size, 1, 1),
                                   threadgroup=(min(size, 256), 1, 1),
                                   output_shapes=[fusion.packed_shape(floats),
                                                  shape if n == size else (n,)],
                                   output_dtypes=[mx.float32, mx.bool_],
                                   backend=backends.of(backend), stream=stream)
    zh, zl = fusion.unpacked(z, floats)
    if n == size:
        quotient, lo = _VIEW(zh, mx.complex64), _VIEW(zl, mx.complex64)
    else:
        zh, zl = (_INDEX(a, slice(2 * size)) for a in (zh, zl))
        quotient, lo = (_RESHAPE(_VIEW(a, mx.complex64), shape) for a in (zh, zl))
        special = _RESHAPE(_INDEX(special, slice(size)), shape)
    hi = _WHERE(special, _DIVIDE(x.hi, y.hi), quotient)
    if shape:  # a kernel reads the low words as written (the high: a view of the select)
        fusion.note_parts(hi, lo, (_VIEW(hi, mx.float32), zl))
    return DoubleWord(hi, lo)
