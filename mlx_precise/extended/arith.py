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

import functools
import math

import mlx.core as mx
import numpy as np

from ..doubleword import engine64, fusion
from ..doubleword.arithmetic import operate
from ..doubleword.engine64 import from64, to64
from ..doubleword.types import DoubleWord, as_complex
from .constructor import ARRAY  # the class (mx.array is a stand-in inside blocks)
from ..core import backends
from ..core.backends import Backend

C64 = mx.complex64


# ---- words, parts, constants ---------------------------------------------------------

def exact(x: mx.array) -> DoubleWord:
    """A float32 / complex64 array as a DoubleWord with a zero low word (made only
    where something reads it)."""
    return DoubleWord.exact(x)


def constant(v) -> DoubleWord:
    """A Python / numpy scalar at its float64 value, split into two words (0-d):
    ``hi = RN32(v)``, ``lo = RN32(v - hi)``. Overflow gives Inf with a zero low
    word, as float32 arithmetic would (``wide``, the float64 value for cpu steps,
    is then that Inf too)."""
    if isinstance(v, (complex, np.complexfloating)):
        keys = (*scalar_key(v.real), *scalar_key(v.imag))
        hi, lo, re, im, parts = _complex_arrays(*keys)
        out = DoubleWord.from_wide(hi, (re, im))
        out._lo = lo  # the parts' low words (none from the float64 value)
        if backends.backend().has_kernels:  # fused programs hold it
            fusion.note_complex_constant(out.hi, out._lo, parts, _split_scalar(*keys[:2])[:2],
                                         _split_scalar(*keys[2:])[:2])
        return out
    hi, lo, value = _split_scalar(*scalar_key(v))
    words = _real_arrays(*scalar_key(v))
    out = DoubleWord.from_wide(words[0], (words[2], None))
    out._lo = words[1]
    if not backends.backend().has_kernels:  # (the cpu engine reads the float64 value)
        return out
    return fusion.note_constant(out, hi, lo)  # fused kernels hold it in their program


# The arrays of a constant's words (0-d data: no graph node), one set per value, kept
# (model code uses a few constants many times; no rule hands them out or updates
# them: they are operands only, as :func:`constant64`'s).

@functools.lru_cache(maxsize=1024)
def _real_arrays(f: float, sign: float) -> tuple[mx.array, mx.array, mx.array]:
    """(hi, lo) float32 and the float64 value of :func:`constant` of a real scalar."""
    hi, lo, value = _split_scalar(f, sign)
    return (ARRAY(hi, dtype=mx.float32), ARRAY(lo, dtype=mx.float32),
            ARRAY(value, dtype=mx.float64))


@functools.lru_cache(maxsize=1024)
def _complex_arrays(re: float, re_sign: float, im: float, im_sign: float) -> tuple:
    """(hi, lo) complex64, the float64 parts (re, im), and the words' parts as
    float32 (2,) arrays (hi's, lo's), of :func:`constant` of a complex scalar."""
    (rh, rl, rv), (ih, il, iv) = _split_scalar(re, re_sign), _split_scalar(im, im_sign)

    def c64(a, b):  # the words joined bit for bit, as data (no graph node)
        return ARRAY(np.array([a, b], np.float32).view(np.complex64)[0])

    return (c64(rh, ih), c64(rl, il), ARRAY(rv, dtype=mx.float64),
            ARRAY(iv, dtype=mx.float64), (ARRAY(np.array([rh, ih], np.float32)),
                                         ARRAY(np.array([rl, il], np.float32))))


def scalar_expression(v):
    """The fused programs' expression of a real scalar (:func:`fusion.constant` of
    its two words), made once per value."""
    return _scalar_expression(*scalar_key(v))


@functools.lru_cache(maxsize=1024)
def _scalar_expression(f: float, sign: float):
    return fusion.constant(*_split_scalar(f, sign)[:2])


def constant64(v) -> mx.array:
    """The float64 value of :func:`constant` of a real scalar ``v`` (0-d), alone
    (one array per value, kept: an operand only, never changed)."""
    return _constant64(*scalar_key(v))


@functools.lru_cache(maxsize=1024)
def _constant64(f: float, sign: float) -> mx.array:
    return ARRAY(_split_scalar(f, sign)[2], dtype=mx.float64)


def scalar_key(v) -> tuple[float, float]:
    """A real scalar as a cache key: its float value and its sign (-0.0 apart from 0.0)."""
    f = float(v)
    return f, math.copysign(1.0, f)


@functools.lru_cache(maxsize=1024)
def _split_scalar(f: float, sign: float) -> tuple[float, float, float]:
    """(RN32(f), RN32(f - hi), the words' float64 value), cached (model code uses
    a few constants many times); ``sign`` keys -0.0 apart from 0.0."""
    with np.errstate(over="ignore", invalid="ignore"):
        hi = np.float32(f)
        lo = np.float32(f - float(hi)) if np.isfinite(hi) else np.float32(0.0)
    return float(hi), float(lo), f if np.isfinite(hi) else float(hi)


def is_float32(v) -> bool:
    """True when the scalar ``v`` is a float32 value (one word holds it)."""
    with np.errstate(over="ignore", invalid="ignore"):
        if isinstance(v, (complex, np.complexfloating)):
            return is_float32(v.real) and is_float32(v.imag)
        f = float(v)
        return float(np.float32(f)) == f or f != f


def in_two_words(f: float) -> bool:
    """True when the words of :func:`constant` hold the float ``f`` exactly (at most
    48 significant bits, or a value float32 cannot reach: its Inf)."""
    hi, lo, _ = _split_scalar(*scalar_key(f))
    return hi + lo == f or not np.isfinite(hi)


def is_complex(x: DoubleWord) -> bool:
    return x.hi.dtype == C64


def _map(f, *xs: DoubleWord) -> DoubleWord:
    """Apply an exact word-wise function to the high and the low words."""
    return DoubleWord(f(*(x.hi for x in xs)), f(*(x.lo for x in xs)))


def neg(x: DoubleWord) -> DoubleWord:
    """-x (exact): both words change sign; on a kernel backend (the active one: the
    call's), a fused negation, which the next operation reads as part of its chain."""
    z = _fused("neg", [x], backends.backend(), None)
    return -x if z is None else z


def _fused(op: str, operands: list, backend: Backend | None, stream) -> DoubleWord | None:
    """``op`` of real operands fused on a kernel backend, else None (complex
    operands, the cpu backend: the caller's word ops)."""
    if backend is None or not backend.has_kernels:
        return None
    return fusion.apply(op, operands, backend, stream)


def conj(x: DoubleWord) -> DoubleWord:
    return _map(mx.conj, x) if is_complex(x) else x


def where(cond: mx.array, x: DoubleWord, y: DoubleWord,
          backend: Backend | None = None) -> DoubleWord:
    """``x`` where ``cond`` else ``y``, exactly: on a float64 engine the float64
    values are selected."""
    if backend is not None and backend.float64_engine:
        return engine64.select(cond, x, y)
    if is_complex(x) != is_complex(y):
        x, y = as_complex(x), as_complex(y)
    return DoubleWord(*(mx.where(cond, a, b) for a, b in ((x.hi, y.hi), (x.lo, y.lo))))


def abs(x: DoubleWord, backend: Backend | None = None, stream=None) -> DoubleWord:  # noqa: A001
    """|x| of a real DoubleWord: the sign of a normalised value is that of its high
    word (a zero high word has a zero low word). On a float64 engine, of the
    float64 value; on a kernel ``backend``, fused (one launch at most:
    :mod:`~mlx_precise.doubleword.fusion`)."""
    if backend is not None and backend.float64_engine:
        return engine64.absolute(x)
    z = _fused("abs", [x], backend, stream)
    if z is not None:
        return z
    neg_ = x.hi < 0
    return DoubleWord(mx.abs(x.hi), mx.where(neg_, -x.lo, x.lo))


def extremum(x: DoubleWord, y: DoubleWord, larger: bool, backend: Backend | None = None,
             stream=None) -> DoubleWord:
    """maximum / minimum of real DoubleWords: MLX's float32 maximum / minimum of the
    high words (NaN propagates as MLX's does); on equal high words the low words
    decide. On a float64 engine, decided by the float64 values; on a kernel
    ``backend``, fused (the same words)."""
    if backend is not None and backend.float64_engine:
        return engine64.extremum(x, y, larger)
    z = _fused("max" if larger else "min", [x, y], backend, stream)
    if z is not None:
        return z
    hi = (mx.maximum if larger else mx.minimum)(x.hi, y.hi)
    pick_x = (x.hi > y.hi) if larger else (x.hi < y.hi)
    pick_y = (y.hi > x.hi) if larger else (y.hi < x.hi)
    tie = (mx.maximum if larger else mx.minimum)(x.lo, y.lo)
    lo = mx.where(pick_x, x.lo, mx.where(pick_y, y.lo, tie))
    return DoubleWord(*mx.broadcast_arrays(hi, mx.where(mx.isfinite(hi), lo, 0.0)))


# ---- the four operations ------------------------------------------------------------

def binary(op: str, x: DoubleWord, y: DoubleWord, backend: Backend,
           stream=None) -> DoubleWord:
    """``x + y`` (op "add"), ``x - y`` ("sub"), ``x * y`` ("mul") or ``x / y``
    ("div") in double-word on ``backend``; real or complex, broadcasting."""
    if not backend.float64_engine:  # kernels, fused chains, MLX-differentiable
        return fusion.binary(op, x, y, backend, stream,
                             lambda op, a, b: operate(op, a, b, backend, stream))
    if op == "sub":
        op, y = "add", -y
    if op == "div" and y.is_complex:  # float32's special values of complex quotients
        return operate(op, x, y, backend)
    return engine64.arith64(op, x, y)  # MLX float64 ops: differentiable as they are


def scalar_binary(op: str, x: DoubleWord, v, backend: Backend, stream=None) -> DoubleWord:
    """:func:`binary` of ``x`` and the real scalar ``v`` (:func:`constant`'s words):
    on a kernel backend the fused program holds ``v`` (no array is made for it)."""
    if backend.has_kernels and not x.is_complex:
        z = fusion.apply(op, [x, scalar_expression(v)], backend, stream)
        if z is not None:
            return z
    return binary(op, x, constant(v), backend, stream)


_NEUTRAL = {"add": 0.0, "mul": 1.0}
_REDUCE64 = {"add": "sum", "mul": "prod"}
_SCAN64 = {"add": "cumsum", "mul": "cumprod"}


def reduce_sum(x: DoubleWord, axes: tuple[int, ...], keepdims: bool, backend: Backend,
               stream=None, op: str = "add") -> DoubleWord:
    """The sum (``op="add"``) or product (``"mul"``) over ``axes`` (normalised,
    distinct): float64 on cpu (complex products: the tree below, in float64 steps);
    elsewhere a pairwise tree of double-word additions /
    products (ceil(log2 n) launches; the error grows like log2(n) (3u^2) |sum of
    |x|| for sums, log2(n) 4u^2 relative for products). Empty: 0 / 1."""
    keep = [d for d in range(x.ndim) if d not in axes]
    out_shape = [1 if d in axes else x.shape[d] for d in range(x.ndim)] if keepdims else \
        [x.shape[d] for d in keep]
    if backend.float64_engine and not (op == "mul" and is_complex(x)):
        with mx.stream(mx.cpu):
            f = getattr(mx, _REDUCE64[op])
            return from64(*(None if v is None else f(v, axis=list(axes), keepdims=keepdims)
                            for v in to64(x)))
    if backend.has_kernels:  # one launch over x's expression, the tree's bits
        z = fusion.reduce(op, x, axes, keepdims, backend, stream)
        if z is not None:
            return z
    return _tree(x, axes, keep, out_shape, backend, stream, op)


def _tree(x: DoubleWord, axes, keep, out_shape, backend: str, stream, op: str) -> DoubleWord:
    order = keep + list(axes)
    m = math.prod([x.shape[d] for d in keep])
    n = math.prod([x.shape[d] for d in axes])
    w = _map(lambda a: mx.transpose(a, order).reshape(m, n), x)
    if n == 0:
        w = DoubleWord(mx.full((m, 1), _NEUTRAL[op], w.hi.dtype), mx.zeros((m, 1), w.hi.dtype))
    while w.hi.shape[1] > 1:
        k = w.hi.shape[1]
        if k % 2:
            w = DoubleWord(mx.pad(w.hi, [(0, 0), (0, 1)], constant_values=_NEUTRAL[op]),
                           mx.pad(w.lo, [(0, 0), (0, 1)]))
            k += 1
        w = binary(op, _map(lambda a: a[:, : k // 2], w), _map(lambda a: a[:, k // 2:], w),
                   backend, stream)
    return _map(lambda a: a.reshape(out_shape), w)


def _shift(x: DoubleWord, d: int, axis: int, fill: float = 0.0) -> DoubleWord:
    """x moved ``d`` places along ``axis``, ``fill`` entering (exact)."""
    widths = [(0, 0)] * x.ndim
    widths[axis] = (d, 0)
    cut = [slice(None)] * x.ndim
    cut[axis] = slice(0, x.shape[axis])
    return DoubleWord(mx.pad(x.hi, widths, constant_values=fill)[tuple(cut)],
                      mx.pad(x.lo, widths)[tuple(cut)])


def cumsum(x: DoubleWord, axis: int, reverse: bool, inclusive: bool, backend: Backend,
           stream=None, op: str = "add") -> DoubleWord:
    """The running sum (``op="add"``) or product (``"mul"``) along ``axis``
    (normalised): float64 on cpu; elsewhere the Hillis-Steele scan, ceil(log2 n)
    steps of double-word additions / products of the array and its shifted copy
    (each output's error grows like log2(n) (3u^2) sum |x| for sums, log2(n) 4u^2
    relative for products)."""
    if reverse:
        x = _map(lambda a: mx.flip(a, axis=axis), x)
    n = x.shape[axis]
    fill = _NEUTRAL[op]
    if backend.float64_engine and not (op == "mul" and is_complex(x)):
        with mx.stream(mx.cpu):
            re, im = to64(x)
            f = getattr(mx, _SCAN64[op])
            s = from64(*(None if v is None else f(v, axis=axis) for v in (re, im)))
    else:
        s, d = x, 1
        while d < n:
            s = binary(op, s, _shift(s, d, axis, fill), backend, stream)
            d *= 2
    if not inclusive:  # shift by one: neutral, x0, x0 (op) x1, ...
        s = _shift(s, 1, axis, fill)
    return _map(lambda a: mx.flip(a, axis=axis), s) if reverse else s
