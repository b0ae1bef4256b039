"""The :class:`DoubleWord` type: an array of double-word numbers as two float32
(or complex64) word arrays, its constructors and views (exact), and the checking
of operands that may be DoubleWords (:func:`as_words`, :func:`operand`). Its
arithmetic operators are attached by :mod:`.arithmetic`."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

_ARRAY = mx.array  # the class, bound at import (a faster isinstance than a stand-in)

from ..core.arrays import as_array, float64_data, is_wide
from .hostsplit import complex_from_parts, join, low_from_wide, split


class DoubleWord:
    """An array of double-word numbers: the unevaluated sum ``hi + lo`` of two
    float32 (or two complex64) ``mx.array``\\ s of one shape, normalised
    (``hi = RN(hi + lo)``). About 48 significand bits within float32's range.

    Extended pipelines pass ``DoubleWord`` values between kernels so that nothing
    is rounded in between; :meth:`round` rounds once to float32 / complex64.

    Construct with :meth:`from_float32`, :meth:`from_complex64`,
    :meth:`from_float64` (float64 / complex128 numpy data or float64 MLX CPU
    arrays), or :meth:`from_array` (any of these, by dtype).
    """

    # wide: on the cpu backend, the float64 value (re, im or None) the words were
    # split from, kept so the next float64 step reads it instead of re-joining the
    # words (see to64); None elsewhere and whenever the words were made otherwise.
    # Words made from a wide value build their low word only when it is read.
    __slots__ = ("hi", "_lo", "wide")
    # numpy defers to the reflected operators below (x - d with a numpy x calls
    # d.__rsub__) instead of treating a DoubleWord as an object scalar.
    __array_ufunc__ = None

    def __init__(self, hi: mx.array, lo: mx.array):
        if not isinstance(hi, _ARRAY) or not isinstance(lo, _ARRAY):
            raise TypeError("DoubleWord(hi, lo) takes two mx.arrays")
        if hi.dtype not in (mx.float32, mx.complex64) or lo.dtype != hi.dtype:
            raise TypeError(
                f"DoubleWord words must both be float32 or both complex64, got {hi.dtype} "
                f"and {lo.dtype}"
            )
        if hi.shape != lo.shape:
            raise ValueError(f"DoubleWord words must have one shape, got {hi.shape} and {lo.shape}")
        self.hi = hi
        self._lo = lo
        self.wide = None

    @classmethod
    def from_wide(cls, hi: mx.array, wide: tuple) -> "DoubleWord":
        """Words of the float64 value ``wide = (re, im or None)`` (MLX float64
        arrays) whose float32 / complex64 rounding is ``hi``; the low word is built
        from ``wide`` when first read (:func:`low_from_wide`)."""
        w = cls.__new__(cls)
        w.hi, w._lo, w.wide = hi, None, wide
        return w

    @classmethod
    def exact(cls, hi: mx.array) -> "DoubleWord":
        """``hi`` exactly (a zero low word, made only when read: a float64 step
        converts ``hi`` alone, :func:`to64`)."""
        w = cls.__new__(cls)
        w.hi, w._lo, w.wide = hi, None, None
        return w

    @property
    def lo(self) -> mx.array:
        """The low word (float32 / complex64, the shape of ``hi``)."""
        if self._lo is None:
            self._lo = mx.zeros_like(self.hi) if self.wide is None else low_from_wide(self.wide)
        return self._lo

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.hi.shape)

    @property
    def dtype(self) -> mx.Dtype:
        """The dtype of the words (and of :meth:`round`): float32 or complex64."""
        return self.hi.dtype

    @property
    def ndim(self) -> int:
        return self.hi.ndim

    @property
    def size(self) -> int:
        return self.hi.size

    @property
    def is_complex(self) -> bool:
        return self.hi.dtype == mx.complex64

    def __repr__(self) -> str:
        """The values, as MLX prints an array: ``hi + lo`` in float64 (exact for
        the pairs :func:`split` makes) to 15 significant digits, and the words'
        dtype. Evaluates the words."""
        fmt = {"float_kind": lambda v: f"{v:.15g}",
               "complex_kind": lambda v: f"{v.real:.15g}{v.imag:+.15g}j"}
        with np.errstate(invalid="ignore", over="ignore"):
            body = np.array2string(self.to_float64(), separator=", ", formatter=fmt,
                                   prefix="DoubleWord(")
        return f"DoubleWord({body}, dtype={str(self.dtype).split('.')[-1]})"

    # The arithmetic operators + - * / (and their reflected forms) run on the
    # active backend's engine, which builds DoubleWords itself: :mod:`.arithmetic`
    # defines them and attaches them to this class (the package imports it first,
    # so every DoubleWord has them).

    def __neg__(self) -> "DoubleWord":
        """-x, exact: both words change sign (and the float64 value, where the words
        carry one: it is the more precise value)."""
        if self.wide is not None:
            with mx.stream(mx.cpu):
                wide = tuple(None if v is None else -v for v in self.wide)
            return DoubleWord.from_wide(-self.hi, wide)
        if self._lo is None:
            return DoubleWord.exact(-self.hi)
        return DoubleWord(-self.hi, -self._lo)

    @classmethod
    def _exact(cls, x, dtype, what: str) -> "DoubleWord":
        x = as_array(x, "x")
        if x.dtype != dtype:
            raise TypeError(f"{what} expects {str(dtype).split('.')[-1]} data, got {x.dtype}")
        return cls(x, mx.zeros_like(x))

    @classmethod
    def from_float32(cls, x) -> "DoubleWord":
        """Exact: ``hi = x``, ``lo = 0`` for float32 data."""
        return cls._exact(x, mx.float32, "from_float32")

    @classmethod
    def from_complex64(cls, x) -> "DoubleWord":
        """Exact: ``hi = x``, ``lo = 0`` for complex64 data."""
        return cls._exact(x, mx.complex64, "from_complex64")

    @classmethod
    def from_float64(cls, x) -> "DoubleWord":
        """Split float64 (or complex128) data, including lists and Python numbers
        (their float64 / complex128 values): see :func:`split` for the accuracy
        and the errors raised."""
        x = float64_data(x, "x")
        if isinstance(x, (np.ndarray, np.generic)) and x.dtype == np.complex128:
            x = np.asarray(x)
            rh, rl = split(np.array(x.real))  # a contiguous copy that keeps 0-d
            ih, il = split(np.array(x.imag))
            return cls(complex_from_parts(rh, ih), complex_from_parts(rl, il))
        return cls(*split(x))

    @classmethod
    def from_array(cls, x) -> "DoubleWord":
        """A DoubleWord from float32, complex64, float64 or complex128 data (numpy
        or MLX); a DoubleWord is returned as is."""
        if isinstance(x, DoubleWord):
            return x
        x = as_words(x, "x")  # float64 / complex128: split
        if isinstance(x, DoubleWord):
            return x
        if x.dtype == mx.float32:
            return cls.from_float32(x)
        if x.dtype == mx.complex64:
            return cls.from_complex64(x)
        raise TypeError(
            f"cannot make a DoubleWord from dtype {x.dtype}: expected float32, complex64, "
            "float64 or complex128 data"
        )

    def round(self) -> mx.array:
        """One rounding of ``hi + lo`` to float32 / complex64 (lazy)."""
        return self.hi + self.lo

    def to_float64(self) -> np.ndarray:
        """``hi + lo`` in float64 (complex128 for complex words), on the CPU (the
        float64 value itself where the words carry one)."""
        if self.wide is not None:
            re, im = (None if v is None else np.array(v) for v in self.wide)
            if im is None:
                return re
            z = np.empty(re.shape, np.complex128)
            z.real, z.imag = re, im  # (re + 1j im would make 0 * inf a NaN)
            return z
        if not self.is_complex:
            return join(self.hi, self.lo)
        # complex64 -> complex128 is exact per part, and one complex128 addition
        # rounds each part's exact sum once (as join does for real words)
        return np.array(self.hi).astype(np.complex128) + np.array(self.lo)

    def parts(self) -> tuple["DoubleWord", "DoubleWord"]:
        """Real and imaginary parts of a complex DoubleWord (exact)."""
        if not self.is_complex:
            raise TypeError("parts() needs a complex DoubleWord")
        return real_imag(self)


def as_words(x, name: str):
    """``x`` as the double-word ops read their inputs: :func:`~mlx_precise.core.arrays.as_array`,
    except that float64 / complex128 data is split into a :class:`DoubleWord`
    (``hi = RN32(x)``, ``lo = RN32(x - hi)``), so it enters at full precision
    (docs/api.md, "Inputs")."""
    if is_wide(x):
        return DoubleWord.from_float64(x)
    return as_array(x, name)


def operand(x, name: str, kinds: tuple[str, ...]):
    """(DoubleWord or mx.array, is_doubleword) after checking the dtype."""
    allowed = {"complex64": mx.complex64, "float32": mx.float32}
    if isinstance(x, DoubleWord):
        if x.dtype in [allowed[k] for k in kinds]:
            return x
        raise TypeError(f"{name}: DoubleWord of {x.dtype} not accepted here (expected {', '.join(kinds)})")
    x = as_words(x, name)  # float64 data: a DoubleWord, full precision
    if isinstance(x, DoubleWord):
        return operand(x, name, kinds)
    if x.dtype not in [allowed[k] for k in kinds]:
        raise TypeError(f"{name} has dtype {x.dtype}, expected {' or '.join(kinds)}, "
                        "float64 / complex128 data or a DoubleWord")
    return x


def real_imag(x: DoubleWord) -> tuple[DoubleWord, DoubleWord]:
    """Real and imaginary parts (exact; a real x has a zero imaginary part)."""
    if not x.is_complex:
        return x, DoubleWord(mx.zeros_like(x.hi), mx.zeros_like(x.lo))
    if x.wide is not None:  # the parts of the float64 value (cpu), their own roundings
        with mx.stream(mx.cpu):
            return tuple(DoubleWord.from_wide(v.astype(mx.float32), (v, None))
                         for v in x.wide)
    if x._lo is None:  # exact: the parts of the high word
        return DoubleWord.exact(mx.real(x.hi)), DoubleWord.exact(mx.imag(x.hi))
    return (DoubleWord(mx.real(x.hi), mx.real(x.lo)),
            DoubleWord(mx.imag(x.hi), mx.imag(x.lo)))


def combine(re: DoubleWord, im: DoubleWord) -> DoubleWord:
    """The complex DoubleWord ``re + i im`` (exact; with the parts' float64 values
    where both carry one, exact where both are)."""
    hi = complex_from_parts(re.hi, im.hi)
    if re.wide is not None and im.wide is not None:
        return DoubleWord.from_wide(hi, (re.wide[0], im.wide[0]))
    if re.wide is None and im.wide is None and re._lo is None and im._lo is None:
        return DoubleWord.exact(hi)
    return DoubleWord(hi, complex_from_parts(re.lo, im.lo))


def as_complex(x: DoubleWord) -> DoubleWord:
    """x as a complex DoubleWord (exact)."""
    if x.is_complex:
        return x
    zero = mx.zeros_like(x.hi)
    if x.wide is not None:  # a zero imaginary part of its float64 value
        with mx.stream(mx.cpu):
            return combine(x, DoubleWord.from_wide(zero, (mx.zeros_like(x.wide[0]), None)))
    return combine(x, DoubleWord.exact(zero))
