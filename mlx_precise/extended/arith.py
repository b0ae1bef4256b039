"""Double-word arithmetic on :class:`~mlx_precise.DoubleWord` operands, one engine
per backend.

Every function takes DoubleWord operands (real: float32 words, complex: complex64
words) whose shapes broadcast, and returns a normalised DoubleWord of the
broadcast shape. Operations that are exact in any arithmetic (negation,
conjugation, real / imaginary parts, selection, comparison-based max / min) act on
the words directly. The others run:

* ``metal`` / ``emulate``: the double-word kernels of ``metal/include/doubleword.h``
  (accurate DW + DW, JMP alg. 6, <= 3u^2 + 13u^3; DW * DW, JMP alg. 12, <= 4u^2
  (Muller-Rideau); DW / DW, JMP alg. 18, <= 9.8u^2; complex products from exact
  FMA products and accurate sums), lazily, as MLX primitives on ``metal``;
* ``cpu``: MLX's float64 arithmetic on the CPU stream (lazy, differentiable),
  complex values as pairs of float64 arrays (MLX has no complex128), then split
  back into two words (the float32 rounding and the rounded remainder).

Special values follow float32 (the rule of ``doubleword.h``): a non-finite high
word is the result and its low word is 0.

References: M. Joldes, J.-M. Muller, V. Popescu, "Tight and rigorous error bounds
for basic building blocks of double-word arithmetic", ACM TOMS 44(2), 2017;
J.-M. Muller, L. Rideau, "Formalization of double-word arithmetic", ACM TOMS 48(1),
2022.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..doubleword.words import CDW_OPS, DW_OPS, DoubleWord
from .carry import check_traceable, suspended

F32, C64, F64 = mx.float32, mx.complex64, mx.float64
_DW_ADD, _DW_MUL, _DW_DIV = 4, 6, 7  # OP codes of the dw_ops kernel
_CDW_ADD, _CDW_MUL = 0, 1  # OP codes of the cdw_ops kernel


# ---- words, parts, constants ---------------------------------------------------------

def exact(x: mx.array) -> DoubleWord:
    """A float32 / complex64 array as a DoubleWord with a zero low word."""
    return DoubleWord(x, mx.zeros_like(x))


def constant(v) -> DoubleWord:
    """A Python / numpy scalar at its float64 value, split into two words (0-d):
    ``hi = RN32(v)``, ``lo = RN32(v - hi)``. Overflow gives Inf with a zero low
    word, as float32 arithmetic would."""
    if isinstance(v, (complex, np.complexfloating)):
        re, im = constant(v.real), constant(v.imag)
        return combine(re, im)
    f = float(v)
    with np.errstate(over="ignore", invalid="ignore"):
        hi = np.float32(f)
        lo = np.float32(f - float(hi)) if np.isfinite(hi) else np.float32(0.0)
    return DoubleWord(mx.array(hi), mx.array(lo))


def is_float32(v) -> bool:
    """True when the scalar ``v`` is a float32 value (one word holds it)."""
    with np.errstate(over="ignore", invalid="ignore"):
        if isinstance(v, (complex, np.complexfloating)):
            return is_float32(v.real) and is_float32(v.imag)
        f = float(v)
        return float(np.float32(f)) == f or f != f


def is_complex(x: DoubleWord) -> bool:
    return x.hi.dtype == C64


def parts(x: DoubleWord) -> tuple[DoubleWord, DoubleWord]:
    """Real and imaginary parts (exact; a real x has a zero imaginary part)."""
    if not is_complex(x):
        return x, DoubleWord(mx.zeros_like(x.hi), mx.zeros_like(x.lo))
    return (DoubleWord(mx.real(x.hi), mx.real(x.lo)),
            DoubleWord(mx.imag(x.hi), mx.imag(x.lo)))


@mx.custom_function
def _complex_bits(re: mx.array, im: mx.array) -> mx.array:
    return mx.stack([re, im], axis=-1).view(C64).reshape(re.shape)


@_complex_bits.vjp
def _complex_vjp(primals, cotangent, output):
    g = cotangent[0] if isinstance(cotangent, (list, tuple)) else cotangent
    with suspended():
        return mx.real(g), mx.imag(g)


def _complex(re: mx.array, im: mx.array) -> mx.array:
    """complex64 from float32 parts, bit for bit (``re + 1j * im`` can change the
    sign of a zero and turns an infinite part into NaN)."""
    return _complex_bits(*mx.broadcast_arrays(re, im))


def combine(re: DoubleWord, im: DoubleWord) -> DoubleWord:
    """The complex DoubleWord ``re + i im`` (exact)."""
    return DoubleWord(*(_complex(a, b) for a, b in ((re.hi, im.hi), (re.lo, im.lo))))


def as_complex(x: DoubleWord) -> DoubleWord:
    """x as a complex DoubleWord (exact)."""
    if is_complex(x):
        return x
    zero = mx.zeros_like(x.hi)
    return combine(x, DoubleWord(zero, zero))


def _map(f, *xs: DoubleWord) -> DoubleWord:
    """Apply an exact word-wise function to the high and the low words."""
    return DoubleWord(f(*(x.hi for x in xs)), f(*(x.lo for x in xs)))


def neg(x: DoubleWord) -> DoubleWord:
    return _map(mx.negative, x)


def conj(x: DoubleWord) -> DoubleWord:
    return _map(mx.conj, x) if is_complex(x) else x


def where(cond: mx.array, x: DoubleWord, y: DoubleWord) -> DoubleWord:
    if is_complex(x) != is_complex(y):
        x, y = as_complex(x), as_complex(y)
    return DoubleWord(*(mx.where(cond, a, b) for a, b in ((x.hi, y.hi), (x.lo, y.lo))))


def abs(x: DoubleWord) -> DoubleWord:  # noqa: A001  (the op's name)
    """|x| of a real DoubleWord: the sign of a normalised value is that of its high
    word (a zero high word has a zero low word)."""
    neg_ = x.hi < 0
    return DoubleWord(mx.abs(x.hi), mx.where(neg_, -x.lo, x.lo))


def extremum(x: DoubleWord, y: DoubleWord, larger: bool) -> DoubleWord:
    """maximum / minimum of real DoubleWords: MLX's float32 maximum / minimum of the
    high words (NaN propagates as MLX's does); on equal high words the low words
    decide."""
    hi = (mx.maximum if larger else mx.minimum)(x.hi, y.hi)
    pick_x = (x.hi > y.hi) if larger else (x.hi < y.hi)
    pick_y = (y.hi > x.hi) if larger else (y.hi < x.hi)
    tie = (mx.maximum if larger else mx.minimum)(x.lo, y.lo)
    lo = mx.where(pick_x, x.lo, mx.where(pick_y, y.lo, tie))
    return DoubleWord(*mx.broadcast_arrays(hi, mx.where(mx.isfinite(hi), lo, 0.0)))


# ---- cpu engine: float64 ------------------------------------------------------------

def _to64(x: DoubleWord):
    """(re, im) float64 arrays of x (im None for real x)."""
    re, im = parts(x)
    as64 = (lambda w: w.hi.astype(F64) + w.lo.astype(F64))
    return as64(re), (as64(im) if is_complex(x) else None)


def _split64(v: mx.array) -> DoubleWord:
    hi = v.astype(F32)
    lo = (v - hi.astype(F64)).astype(F32)
    return DoubleWord(hi, mx.where(mx.isfinite(hi), lo, mx.zeros_like(lo)))


def _from64(re: mx.array, im: mx.array | None) -> DoubleWord:
    r = _split64(re)
    return r if im is None else combine(r, _split64(im))


def _cpu(op: str, x: DoubleWord, y: DoubleWord) -> DoubleWord:
    with mx.stream(mx.cpu):
        (xr, xi), (yr, yi) = _to64(x), _to64(y)
        if op == "add":
            re = xr + yr
            im = None if xi is None and yi is None else (
                yi if xi is None else xi if yi is None else xi + yi)
        elif op == "mul":
            if xi is None or yi is None:
                s, (a, b) = (xr, (yr, yi)) if xi is None else (yr, (xr, xi))
                re, im = a * s, None if b is None else b * s
            else:
                re, im = xr * yr - xi * yi, xr * yi + xi * yr
        else:  # div
            if yi is None:
                re, im = xr / yr, None if xi is None else xi / yr
            else:
                d = yr * yr + yi * yi
                xi0 = mx.zeros_like(xr) if xi is None else xi
                re, im = (xr * yr + xi0 * yi) / d, (xi0 * yr - xr * yi) / d
        return _from64(re, im)


# ---- metal / emulate engine: the double-word kernels --------------------------------

def _launch(kernel, op: int, words: list[mx.array], n_out: int, backend: str, stream):
    """Run an elementwise kernel over words broadcast to one shape (float32)."""
    shape = mx.broadcast_shapes(*(tuple(w.shape) for w in words))
    size = int(np.prod(shape))
    if size == 0:
        return [mx.zeros(shape, F32) for _ in range(n_out)]
    flat = [mx.broadcast_to(w, shape).reshape(-1) for w in words]
    out = kernel(inputs=flat, template={"OP": op}, output_shapes=[(size,)] * n_out,
                 output_dtypes=[F32] * n_out, backend=backend, stream=stream)
    return [o.reshape(shape) for o in out]


def _real_op(op: int, x: DoubleWord, y: DoubleWord, backend, stream) -> DoubleWord:
    return DoubleWord(*_launch(DW_OPS, op, [x.hi, x.lo, y.hi, y.lo], 2, backend, stream))


def _complex_op(op: int, x: DoubleWord, y: DoubleWord, backend, stream) -> DoubleWord:
    (xr, xi), (yr, yi) = parts(x), parts(y)
    words = [w for p in (xr, xi, yr, yi) for w in (p.hi, p.lo)]
    rh, rl, ih, il = _launch(CDW_OPS, op, words, 4, backend, stream)
    return combine(DoubleWord(rh, rl), DoubleWord(ih, il))


def _kernels(op: str, x: DoubleWord, y: DoubleWord, backend: str, stream) -> DoubleWord:
    cx, cy = is_complex(x), is_complex(y)
    real = (lambda code, a, b: _real_op(code, a, b, backend, stream))
    if not cx and not cy:
        return real({"add": _DW_ADD, "mul": _DW_MUL, "div": _DW_DIV}[op], x, y)
    if op == "add":
        return _complex_op(_CDW_ADD, as_complex(x), as_complex(y), backend, stream)
    if op == "mul" and cx and cy:
        return _complex_op(_CDW_MUL, x, y, backend, stream)
    if op == "mul":  # complex times real: each part times the real factor
        c, r = (x, y) if cx else (y, x)
        re, im = parts(c)
        return combine(real(_DW_MUL, re, r), real(_DW_MUL, im, r))
    if not cy:  # complex / real
        re, im = parts(x)
        return combine(real(_DW_DIV, re, y), real(_DW_DIV, im, y))
    # x / y = x conj(y) / |y|^2 (|y|^2 in double-word; overflows where |y| > ~1.8e19)
    yr, yi = parts(y)
    d = real(_DW_ADD, real(_DW_MUL, yr, yr), real(_DW_MUL, yi, yi))
    nr, ni = parts(_kernels("mul", as_complex(x), conj(y), backend, stream))
    return combine(real(_DW_DIV, nr, d), real(_DW_DIV, ni, d))


def _sum_to(g: mx.array, like: mx.array) -> mx.array:
    """A cotangent summed over the axes broadcasting added to ``like``, real where
    ``like`` is real (MLX's convention for a real operand of a complex op)."""
    lead = g.ndim - like.ndim
    axes = list(range(lead)) + [lead + i for i, n in enumerate(like.shape)
                                if n == 1 and g.shape[lead + i] != 1]
    if axes:
        g = mx.sum(g, axis=axes, keepdims=True)
    g = g.reshape(like.shape)
    return mx.real(g) if like.dtype != C64 and g.dtype == C64 else g.astype(like.dtype)


def _differentiable(op: str, backend: str, stream):
    """The kernel path of ``op`` on words ``(xh, xl, yh, yl) -> (zh, zl)`` with the
    float32 derivative of the high words as its VJP (MLX's conventions for complex
    values: d(x y) = g conj(y); the low words are constants of size u |x|)."""

    @mx.custom_function
    def f(xh, xl, yh, yl):
        z = _kernels(op, DoubleWord(xh, xl), DoubleWord(yh, yl), backend, stream)
        return z.hi, z.lo

    @f.vjp
    def f_vjp(primals, cotangents, outputs):
        xh, xl, yh, yl = primals
        g = cotangents[0]
        with suspended():
            if op == "add":
                gx, gy = g, g
            elif op == "mul":
                gx, gy = g * mx.conj(yh), g * mx.conj(xh)
            else:
                gx = g / mx.conj(yh)
                gy = -gx * mx.conj(outputs[0])  # d(x/y)/dy = -z/y: -g conj(z / y)
            return (_sum_to(gx, xh), mx.zeros_like(xl), _sum_to(gy, yh), mx.zeros_like(yl))

    return f


# ---- the four operations ------------------------------------------------------------

def binary(op: str, x: DoubleWord, y: DoubleWord, backend: str, stream=None) -> DoubleWord:
    """``x + y`` (op "add"), ``x - y`` ("sub"), ``x * y`` ("mul") or ``x / y``
    ("div") in double-word on ``backend``; real or complex, broadcasting."""
    if op == "sub":
        op, y = "add", neg(y)
    if backend == "cpu":
        return _cpu(op, x, y)
    if backend != "metal":  # the emulator evaluates its inputs
        check_traceable((x.hi, x.lo, y.hi, y.lo), f"double-word {op} on {backend!r}")
    return DoubleWord(*_differentiable(op, backend, stream)(x.hi, x.lo, y.hi, y.lo))


def reduce_sum(x: DoubleWord, axes: tuple[int, ...], keepdims: bool, backend: str,
               stream=None) -> DoubleWord:
    """The sum over ``axes`` (normalised, distinct): float64 on cpu; elsewhere a
    pairwise tree of accurate double-word additions (ceil(log2 n) launches; the
    error grows like log2(n) (3u^2) |sum of |x||)."""
    keep = [d for d in range(x.ndim) if d not in axes]
    out_shape = [1 if d in axes else x.shape[d] for d in range(x.ndim)] if keepdims else \
        [x.shape[d] for d in keep]
    if backend == "cpu":
        with mx.stream(mx.cpu):
            re, im = _to64(x)
            s = _from64(*(None if v is None else mx.sum(v, axis=list(axes), keepdims=keepdims)
                          for v in (re, im)))
        return s
    if backend != "metal":  # the emulator evaluates its inputs
        check_traceable((x.hi, x.lo), f"double-word sum on {backend!r}")
    order = keep + list(axes)
    m = int(np.prod([x.shape[d] for d in keep]))
    n = int(np.prod([x.shape[d] for d in axes]))
    w = _map(lambda a: mx.transpose(a, order).reshape(m, n), x)
    if n == 0:
        w = _map(lambda a: mx.zeros((m, 1), a.dtype), w)
    while w.hi.shape[1] > 1:
        k = w.hi.shape[1]
        if k % 2:
            w = _map(lambda a: mx.pad(a, [(0, 0), (0, 1)]), w)
            k += 1
        w = binary("add", _map(lambda a: a[:, : k // 2], w), _map(lambda a: a[:, k // 2:], w),
                   backend, stream)
    return _map(lambda a: a.reshape(out_shape), w)


def cumsum(x: DoubleWord, axis: int, reverse: bool, inclusive: bool, backend: str,
           stream=None) -> DoubleWord:
    """The running sum along ``axis`` (normalised): float64 on cpu; elsewhere the
    Hillis-Steele scan, ceil(log2 n) steps of accurate double-word additions of
    the array and its shifted copy (each output's error grows like
    log2(n) (3u^2) sum |x|)."""
    if reverse:
        x = _map(lambda a: mx.flip(a, axis=axis), x)
    n = x.shape[axis]
    if backend == "cpu":
        with mx.stream(mx.cpu):
            re, im = _to64(x)
            s = _from64(*(None if v is None else mx.cumsum(v, axis=axis) for v in (re, im)))
    else:
        check_traceable((x.hi, x.lo), f"double-word cumsum on {backend!r}")
        s, d = x, 1
        while d < n:
            widths = [(0, 0)] * x.ndim
            widths[axis] = (d, 0)
            cut = [slice(None)] * x.ndim
            cut[axis] = slice(0, n)
            shifted = _map(lambda a: mx.pad(a, widths)[tuple(cut)], s)
            s = binary("add", s, shifted, backend, stream)
            d *= 2
    if not inclusive:  # shift by one: 0, x0, x0 + x1, ...
        widths = [(0, 0)] * x.ndim
        widths[axis] = (1, 0)
        cut = [slice(None)] * x.ndim
        cut[axis] = slice(0, n)
        s = _map(lambda a: mx.pad(a, widths)[tuple(cut)], s)
    return _map(lambda a: mx.flip(a, axis=axis), s) if reverse else s
