"""The cpu engine of double-word arithmetic: DoubleWords to MLX float64 values and
back (:func:`to64`, :func:`from64`, lazily, keeping the float64 value for the next
cpu step), cpu results computed in float64 (:func:`from_float64_result`), and
``+ * /`` in float64 (:func:`arith64`)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .hostsplit import complex_from_parts
from .types import DoubleWord, real_imag


def from_float64_result(y: np.ndarray, round_output: bool):
    """A cpu-backend result computed in float64: rounded once to float32 / complex64
    (overflow to Inf, as on the GPU, without numpy's warning), or split into a
    :class:`DoubleWord` when ``round_output`` is False (lazily by :func:`from64`,
    which keeps the float64 value for the next cpu step)."""
    if round_output:
        with np.errstate(over="ignore"):
            return mx.array(y.astype(np.complex64 if np.iscomplexobj(y) else np.float32))
    with mx.stream(mx.cpu):
        if np.iscomplexobj(y):
            return from64(mx.array(np.ascontiguousarray(y.real), dtype=mx.float64),
                          mx.array(np.ascontiguousarray(y.imag), dtype=mx.float64))
        return from64(mx.array(y, dtype=mx.float64))


def _zero_as_minus_zero(v: mx.array) -> mx.array:
    """v with every zero made -0 (other values unchanged): x + (-0) = x for every
    x, -0 and +0 included, so adding this keeps the sign of a zero high word."""
    return -((-v) + 0.0)


def to64(x: DoubleWord) -> tuple[mx.array, mx.array | None]:
    """``hi + lo`` as MLX float64 arrays (re, im; im None for real words), lazy:
    exact for normalised pairs, and -0 stays -0; ``x.wide`` itself when ``x`` was
    made by :func:`from64` (the same value, without a pass over the words). Call
    on the CPU stream (MLX has float64 there only)."""
    if x.wide is not None:
        return x.wide
    if x._lo is None:  # exact (DoubleWord.exact): one conversion of the high word
        if not x.is_complex:
            return x.hi.astype(mx.float64), None
        return mx.real(x.hi).astype(mx.float64), mx.imag(x.hi).astype(mx.float64)

    def join64(w: DoubleWord) -> mx.array:
        return w.hi.astype(mx.float64) + _zero_as_minus_zero(w.lo).astype(mx.float64)

    re, im = real_imag(x)
    return join64(re), (join64(im) if x.is_complex else None)


def from64(re: mx.array, im: mx.array | None = None) -> DoubleWord:
    """MLX float64 values split into two words, lazily: ``hi = RN32(v)``,
    ``lo = RN32(v - hi)``, ``lo = 0`` where ``hi`` is not finite (the special-value
    rule of the kernels); complex when ``im`` is given. The result keeps ``(re,
    im)`` as its ``wide`` value, and builds its low word only when it is read.
    The low word takes no gradient (:func:`_low64`)."""
    hi = re.astype(mx.float32)
    if im is not None:
        hi = complex_from_parts(hi, im.astype(mx.float32))
    return DoubleWord.from_wide(hi, (re, im))


def arith64(op: str, x: DoubleWord, y: DoubleWord) -> DoubleWord:
    """``x + y``, ``x * y`` or ``x / y`` (op "add", "mul", "div") by MLX float64 on the CPU stream (complex as pairs of float64
    arrays: MLX has no complex128), split back into two words."""
    with mx.stream(mx.cpu):
        (xr, xi), (yr, yi) = to64(x), to64(y)
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
        return from64(re, im)
