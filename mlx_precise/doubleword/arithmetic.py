"""DoubleWord arithmetic on every backend: the operators ``+ - * /`` of
:class:`~.types.DoubleWord` (attached here), :func:`arith` (any operands, the active
backend) and :func:`operate` (DoubleWords, a resolved backend), dispatching to the
cpu float64 engine (:mod:`.engine64`) or the kernel engine (:mod:`.kernel_engine`)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..core import backends
from . import fusion
from .engine64 import arith64
from .kernel_engine import arith_kernels
from .types import DoubleWord


def _arith_operand(v, name: str) -> DoubleWord:
    """An operand of DoubleWord arithmetic as a DoubleWord: Python numbers at
    their float64 / complex128 value (two words), float64 data split, float32 /
    complex64 arrays exactly (lo = 0)."""
    if isinstance(v, DoubleWord):
        return v
    if isinstance(v, (int, float, complex)) and not isinstance(v, bool):
        if isinstance(v, int) and float(v) != v:
            raise ValueError(f"{name} = {v} is not exactly a float64 value")
        return DoubleWord.from_float64(v)
    return DoubleWord.from_array(v, name)


def operate(op: str, x: DoubleWord, y: DoubleWord, backend: str, stream=None) -> DoubleWord:
    """``x + y`` (op "add"), ``x - y`` ("sub"), ``x * y`` ("mul") or ``x / y``
    ("div") in double-word on a resolved ``backend``: real or complex words,
    broadcasting; lazy (no autodiff of its own). Relative errors on metal /
    emulate: <= 3u^2 + 13u^3 (add, sub), 4u^2 (mul), 9.8u^2 (div), complex products
    8.66u^2 normwise (u = 2^-24, JMP / MR bounds); cpu: float64 then split. Real
    operands on metal / emulate are fused with the operations that made them
    (:mod:`.fusion`)."""
    wide = backends.of(backend).float64_engine
    if not wide:
        z = fusion.apply(op, [x, y], backend, stream)
        if z is not None:
            return z
    if op == "sub":
        op, y = "add", -y  # exact negation: x - y = x + (-y)
    if not wide:  # the kernels apply the float32 rule of complex quotients themselves
        return arith_kernels(op, x, y, backend, stream)
    z = arith64(op, x, y)
    if op == "div" and y.is_complex:
        z = _complex_div_specials(x, y, z)
    return z


def _complex_div_specials(x: DoubleWord, y: DoubleWord, z: DoubleWord) -> DoubleWord:
    """The float32 rule for complex quotients (the cpu engine's; the kernels'
    is in ``metal/kernels/cdw_div.metal``): where an operand is Inf or NaN, or
    y is 0, the result is MLX's complex64 quotient of the high words (Inf, NaN or
    0, as float32 gives) with a zero low word; a quotient that overflows float32
    is Inf with a zero low word."""
    def finite(a):  # both parts of a (real or complex) array: Inf - Inf, NaN - NaN
        return (a - a) == 0  # are NaN (two primitives, mx.isfinite of parts ~14)

    special = ~finite(x.hi) | ~finite(y.hi) | (y.hi == 0)
    hi = mx.where(special, x.hi / y.hi, z.hi)
    lo = mx.where(special | ~finite(hi), mx.array(0, z.lo.dtype), z.lo)
    return DoubleWord(hi, lo)


def arith(op: str, x, y) -> DoubleWord:
    """``x <op> y`` for op in add, sub, mul, div, one of them a DoubleWord (the
    operators of :class:`~mlx_precise.DoubleWord`), on the active backend.

    Kernel backends run the double-word algorithms of ``metal/include/doubleword.h``
    (``dw_ops`` / ``cdw_ops``): relative error <= 3u^2 + 13u^3 (add, sub), 4u^2
    (mul), 9.8u^2 (div), complex: 3u^2 + 13u^3 (add, sub) and 8.66u^2 normwise
    (mul), complex division <= 32u^2 normwise (scaled so that no intermediate
    overflows or underflows), u = 2^-24; special values as docs/api.md states. The
    ``cpu`` backend computes in float64 and splits the result (error <= 2^-53 +
    2^-48 relative).

    Args:
        x, y: DoubleWord, float32 / complex64 array, float64 / complex128 data,
            or a Python number (its float64 value); numpy broadcasting.

    Returns:
        DoubleWord of the broadcast shape; complex if either operand is.

    Raises:
        TypeError: an operand of another dtype.
        ValueError: shapes that do not broadcast.
    """
    a, b = _arith_operand(x, "x"), _arith_operand(y, "y")
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ValueError(f"operands do not broadcast: shapes {a.shape} and {b.shape}") from None
    return operate(op, a, b, backends.resolve(None))


def _operator(op: str, name: str, reflected: bool = False):
    """The operator ``self <op> other`` (``other <op> self`` when reflected) of
    DoubleWord: :func:`arith` on the active backend, with DoubleWords, float32 /
    complex64 arrays, float64 data and Python numbers (their float64 values)."""

    def method(self, other):
        return arith(op, other, self) if reflected else arith(op, self, other)

    method.__name__ = method.__qualname__ = f"__{'r' if reflected else ''}{name}__"
    method.__qualname__ = f"DoubleWord.{method.__name__}"
    return method


for _op, _name in (("add", "add"), ("sub", "sub"), ("mul", "mul"), ("div", "truediv")):
    setattr(DoubleWord, f"__{_name}__", _operator(_op, _name))
    setattr(DoubleWord, f"__r{_name}__", _operator(_op, _name, reflected=True))
