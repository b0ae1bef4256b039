"""The metal / emulate engine of double-word arithmetic: ``+ * /`` of DoubleWords
(real or complex, broadcasting) by the ``dw_ops`` / ``cdw_ops`` kernels
(:mod:`.dw_kernels`), complex division scaled so that no intermediate overflows or
underflows (:func:`arith_kernels`)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from . import fusion
from .dw_kernels import CDW_OPS, DW_OPS
from .fusion import _from_parts, _parts
from .types import DoubleWord, as_complex, combine, real_imag


def _flat8(a: mx.array, shape: tuple) -> mx.array:
    """``a`` broadcast to ``shape``, flat, padded to 8 elements at least (MLX passes
    smaller inputs in ``constant`` space: one kernel instantiation for all sizes).
    An operand of the full shape is only reshaped (the kernels are declared
    ``ensure_row_contiguous``: MLX copies a strided one)."""
    f = a.reshape(-1) if tuple(a.shape) == shape else mx.broadcast_to(a, shape).reshape(-1)
    return f if f.size >= 8 else mx.concatenate([f, mx.zeros((8 - f.size,), f.dtype)])


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
    return _complex_div(x, y, real, backend, stream)


def _pow2(e: mx.array) -> mx.array:
    """2^e in float32 for int32 ``e`` in [-126, 127] (the biased exponent e + 127
    shifted into place: int32 bits; lazy)."""
    return ((e + 127) << 23).view(mx.float32)


def _exponent(w: DoubleWord) -> mx.array:
    """floor(log2 max(|Re|, |Im|)) of the high words, int32, clipped to [-126, 127]
    (zero and subnormal: -126; Inf and NaN: 127)."""
    big = mx.abs(w.hi) if not w.is_complex else mx.max(mx.abs(_parts(w.hi)), axis=-1)
    field = big.view(mx.int32) >> 23  # big >= 0 (a NaN too: abs clears its sign)
    return mx.clip(field, 1, 254) - 127


def _times(a: mx.array, f: mx.array) -> mx.array:
    """a * f for float32 f of a's shape; complex ``a`` part by part (through its
    float32 view: no cast of f, one multiply)."""
    if a.dtype != mx.complex64:
        return a * f
    return _from_parts(_parts(a) * f[..., None])


def _scale(w: DoubleWord, e: mx.array, parts: int) -> DoubleWord:
    """w 2^e (exact barring over/underflow of the result) as ``parts`` factors of
    one sign, each a normal float32 (|e| <= 126 parts)."""
    for k in range(parts, 0, -1):
        ek = e // k if k > 1 else e
        f = _pow2(ek)
        w = DoubleWord(_times(w.hi, f), _times(w.lo, f))
        e = e - ek
    return w


def _complex_div(x: DoubleWord, y: DoubleWord, real, backend: str, stream) -> DoubleWord:
    """x / y for complex y by the double-word kernels. x and y are first scaled by
    the powers of two 2^-ex, 2^-ey that bring their larger parts into [1, 2), so
    ``x' conj(y')``, ``|y'|^2`` and ``q' = x' conj(y') / |y'|^2`` (|q'| in [1/3, 3])
    neither overflow nor lose their low words to underflow, for any float32
    operands (complex product <= 8.66u^2 normwise, the sum of squares and the
    quotient by JMP alg. 6, 12, 18); then ``q = q' 2^(ex - ey)``, applied as three
    factors of one sign (exact unless q itself leaves float32's range). A zero y
    gives Inf / NaN as float32 division does."""
    ex, ey = _exponent(x), _exponent(y)
    xs, ys = _scale(as_complex(x), -ex, 2), _scale(y, -ey, 2)
    q = fusion.complex_quotient(xs, ys, backend, stream)  # the same bits, one launch
    if q is not None:
        return _scale(q, ex - ey, 3)
    yr, yi = real_imag(ys)
    d = real("add", real("mul", yr, yr), real("mul", yi, yi))
    conj_y = DoubleWord(mx.conj(ys.hi), mx.conj(ys.lo))
    nr, ni = real_imag(arith_kernels("mul", xs, conj_y, backend, stream))
    q = combine(real("div", nr, d), real("div", ni, d))
    return _scale(q, ex - ey, 3)
