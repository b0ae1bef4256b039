"""The :class:`DoubleWord` type: an array of double-word numbers as two float32
(or complex64) word arrays, its constructors and views (exact), and
:func:`read_input`, the one reading of every public op's array inputs (docs/api.md,
"Inputs"). Its arithmetic operators are attached by :mod:`.arithmetic`."""

from __future__ import annotations

import functools

import mlx.core as mx
import numpy as np

_ARRAY = mx.array  # the class, bound at import (a faster isinstance than a stand-in)

from ..core.context import carried_words
from .hostsplit import complex_from_parts, join, low_from_wide, split_float64


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
    def of_words(cls, hi: mx.array, lo: mx.array) -> "DoubleWord":
        """``DoubleWord(hi, lo)`` without its checks, for the engines whose words are
        float32 (or complex64) arrays of one shape by construction (a kernel's
        outputs): the checks cost about a microsecond per operation."""
        w = cls.__new__(cls)
        w.hi, w._lo, w.wide = hi, lo, None
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
    def from_float32(cls, x) -> "DoubleWord":
        """Exact: ``hi = x``, ``lo = 0`` for float32 data (an ``mx.array`` that
        carries a low word, made inside ``extended_precision()``: its words)."""
        return cls._exact(read_input(x, "x", "array", ("float32",)))

    @classmethod
    def from_complex64(cls, x) -> "DoubleWord":
        """Exact: ``hi = x``, ``lo = 0`` for complex64 data (carried words as
        :meth:`from_float32`)."""
        return cls._exact(read_input(x, "x", "array", ("complex64",)))

    @classmethod
    def _exact(cls, x: mx.array) -> "DoubleWord":
        words = _carried(x)
        return words if words is not None else cls(x, mx.zeros_like(x))

    @classmethod
    def from_float64(cls, x) -> "DoubleWord":
        """Split float64 (or complex128) data, including lists and Python numbers
        (their float64 / complex128 values): see :func:`split` for the accuracy
        and the errors raised."""
        return _split(read_input(x, "x", "float64", ("float64", "complex128")))

    @classmethod
    def from_array(cls, x, name: str = "x") -> "DoubleWord":
        """A DoubleWord from float32, complex64, float64 or complex128 data (numpy
        or MLX, lists); a DoubleWord is returned as is. ``name``: the argument's
        name in the errors (:func:`read_input`)."""
        x = read_input(x, name, "words", ("float32", "complex64"))
        return x if isinstance(x, DoubleWord) else cls(x, mx.zeros_like(x))

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


class InputError(TypeError, ValueError):
    """An input a public op does not take (its type or its dtype), named in the
    message. A TypeError, as MLX's ops raise for such inputs, and a ValueError, as
    :func:`split` and :meth:`DoubleWord.from_float64` raised before (numpy's
    ``AxisError`` is likewise two classes)."""


READS = ("array", "words", "float64")
_PYTHON = (list, tuple, int, float, complex)
_NUMPY = (np.ndarray, np.generic)
_ARRAY_LIKE = (_ARRAY,) + _NUMPY + _PYTHON
# numpy dtypes wider than float32 / complex64 that MLX's mx.array would round
_WIDE = (np.float64, np.complex128, np.longdouble, np.clongdouble)


@functools.lru_cache(maxsize=None)
def _mx_dtypes(dtypes: tuple[str, ...]) -> frozenset:
    """The MLX dtypes named in ``dtypes`` (a set, so that the check per call is a
    lookup; names MLX lacks, such as complex128, are left out)."""
    return frozenset(getattr(mx, d) for d in dtypes if hasattr(mx, d))


def _dtype_name(x) -> str:
    """``x``'s dtype as messages name it: ``mlx.core.float32``, ``numpy float64``."""
    return str(x.dtype) if isinstance(x, _ARRAY) else f"numpy {x.dtype}"


def _expected(reads: str, dtypes) -> str:
    """What an op with these ``reads`` / ``dtypes`` takes, for its messages."""
    names = ", ".join(dtypes[:-1]) + (" or " if len(dtypes) > 1 else "") + dtypes[-1]
    if reads != "words":
        return names
    wide = {"float32": "float64", "complex64": "complex128"}
    return f"{names}, {' / '.join(wide[d] for d in dtypes)} data or a DoubleWord of {names} words"


def read_input(x, name: str, reads: str = "array", dtypes: tuple[str, ...] | None = None):
    """An array input of a public op as its engine takes it: every public op reads
    its array arguments through this function, once (docs/api.md, "Inputs").

    ``mx.array``\\ s are taken as they are; numpy data, lists, tuples and Python
    numbers through ``mx.array`` (MLX's dtype rules: a list of floats is float32),
    except wide data (numpy float64 / complex128 / longdouble, ``mx.float64``),
    which MLX would round to float32 without a word. By ``reads``:

    * ``"array"`` (ops on float32 words, the conversions): an ``mx.array``; wide
      data is refused, naming the two ways out.
    * ``"words"`` (the double-word ops): an ``mx.array`` or a :class:`DoubleWord`
      (returned as it is); float64 / complex128 data is split into a DoubleWord
      (``hi = RN32(x)``, ``lo = RN32(x - hi)``, :func:`split`), so it enters at full
      precision; an ``mx.array`` that carries a low word (made inside
      ``extended_precision()``) is its words, a DoubleWord. ``dtypes`` names the
      words' dtypes.
    * ``"float64"`` (ops on float64 data): float64 / complex128 data as it is (a
      numpy array, or an ``mx.float64`` array); lists and Python numbers are read
      as the float64 / complex128 values Python holds (numpy); narrower data as in
      ``"array"``.

    Args:
        x: the input.
        name: the argument's name, for the messages.
        reads: ``"array"``, ``"words"`` or ``"float64"``.
        dtypes: the dtypes the op takes, by name (``"float32"``, ``"complex64"``,
            ``"float64"``, ``"complex128"``, ...); None: any.

    Raises:
        InputError (a TypeError and a ValueError): not an array-like, a dtype not in
            ``dtypes``, wide data where ``reads="array"``, longdouble data (wider
            than float64: convert it yourself), values a split refuses (not finite
            in float32).
        ValueError: an unknown ``reads``.
    """
    if reads not in READS:
        raise ValueError(f"reads must be one of {READS}, got {reads!r}")
    if isinstance(x, DoubleWord) and reads == "words":
        if dtypes is not None and x.dtype not in _mx_dtypes(dtypes):
            raise InputError(f"{name} has dtype {x.dtype} (a DoubleWord), expected "
                             f"{_expected(reads, dtypes)}")
        return x
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, _ARRAY_LIKE):
        want = "" if dtypes is None else f" of {_expected(reads, dtypes)}"
        raise InputError(f"{name} must be an mx.array or array-like (numpy array, list, "
                         f"number){want}, got {type(x).__name__}")
    if reads == "float64" and isinstance(x, _PYTHON):
        try:
            x = np.asarray(x)
        except (TypeError, ValueError) as e:
            raise InputError(f"{name} is not a valid array: {e}") from None
        if x.dtype.kind not in "iufc":
            raise InputError(f"{name} must hold numbers, got numpy dtype {x.dtype}")
        x = x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)
    if isinstance(x, _ARRAY) and x.dtype == mx.float64 or (
            isinstance(x, _NUMPY) and x.dtype in _WIDE):
        x = _wide(x, name, reads, dtypes)
    elif not isinstance(x, _ARRAY):
        try:
            x = mx.array(x)
        except (TypeError, ValueError) as e:
            raise InputError(f"{name} is not a valid array: {e}") from None
    if dtypes is not None and not isinstance(x, DoubleWord):
        ok = (x.dtype in _mx_dtypes(dtypes) if isinstance(x, _ARRAY)
              else x.dtype.name in dtypes)  # numpy: complex128
        if not ok:
            raise InputError(f"{name} has dtype {_dtype_name(x)}, expected "
                             f"{_expected(reads, dtypes)}")
    if reads == "words" and type(x) is _ARRAY:
        words = _carried(x)
        if words is not None:
            return words
    return x


def _carried(x: mx.array):
    """The DoubleWord an array made inside ``extended_precision()`` carries, or
    None (:data:`~mlx_precise.core.context.carried_words`)."""
    return carried_words[0](x) if carried_words else None


_WORD_DTYPES = (mx.float32, mx.complex64)


def is_word_array(x) -> bool:
    """An ``mx.array`` of float32 or complex64 (the words' dtypes)."""
    return type(x) is _ARRAY and x.dtype in _WORD_DTYPES


def plain_input(x, name: str, dtypes: tuple[str, ...] | None = None) -> mx.array:
    """A plain twin's operand (the float32 path of a precision-aware function): an
    ``mx.array`` of ``dtypes`` as it is (its own value, whatever low word it carries:
    inside a block the flow's ops read that), anything else read as the extended
    twin reads it (:func:`read_input`), a DoubleWord then rounded once."""
    if is_word_array(x):
        return read_input(x, name, "array", dtypes)
    x = read_input(x, name, "words", dtypes)
    return x.round() if isinstance(x, DoubleWord) else x


def _wide(x, name: str, reads: str, dtypes):
    """Wide data (float64, complex128, longdouble) by ``reads``: refused, split into
    a DoubleWord, or kept as it is (numpy or ``mx.float64``)."""
    if reads == "array":
        raise InputError(
            f"{name} has dtype {_dtype_name(x).replace('mlx.core.', 'mlx ')}, which this op "
            "would have to round to float32: convert it yourself (e.g. "
            "x.astype(np.float32)) to accept that rounding, or use an op that takes "
            "double-word input (DoubleWord.from_float64)")
    if isinstance(x, _NUMPY) and x.dtype in (np.longdouble, np.clongdouble) and \
            x.dtype not in (np.float64, np.complex128):
        raise InputError(f"{name} has dtype {_dtype_name(x)}, wider than float64: convert "
                         "it yourself (x.astype(np.float64)) to accept that rounding")
    complex_ = isinstance(x, _NUMPY) and x.dtype.kind == "c"
    if reads == "words":
        if dtypes is not None and ("complex64" if complex_ else "float32") not in dtypes:
            raise InputError(f"{name} has dtype {_dtype_name(x)}, expected "
                             f"{_expected(reads, dtypes)}")
        return _split(x)
    # as it is: numpy data stays numpy (no copy; MLX has no complex128), an
    # mx.float64 array stays one
    return x if isinstance(x, _ARRAY) else np.asarray(x)


def split(x) -> tuple[mx.array, mx.array]:
    """Split float64 values into double-word pairs.

    Args:
        x: float64 values, any shape: a numpy array (or ``np.float64``), an
            ``mx.array`` of dtype float64 (CPU), or real Python numbers, lists and
            tuples (read as the float64 values Python holds).

    Returns:
        ``(hi, lo)``: two float32 ``mx.array``\\ s of ``x``'s shape with
        ``hi = RN32(x)`` and ``lo = RN32(x - hi)`` (``x - hi`` is exact in float64).
        ``hi + lo`` equals ``x`` exactly when ``x - hi`` fits in 24 bits (e.g. ``x``
        has at most 48 significant bits) and ``lo`` is a normal float32; otherwise it
        is within ``2^-48 |x|`` (relative) for ``|x| >= 2^-78``. Words below 2^-126
        are kept as float32 subnormals here, but kernels read them as zero (Apple
        GPUs flush subnormals), so full precision on the device needs
        ``|x| >= ~2^-78``.

    Raises:
        InputError (a ValueError and a TypeError): another dtype or type.
        ValueError: a value that is not finite or rounds to +-inf in float32
            (``|x| >= 2^128 - 2^103``).
    """
    return split_float64(np.asarray(read_input(x, "x", "float64", ("float64",))))


def _split(x) -> DoubleWord:
    """float64 (numpy or MLX) or complex128 (numpy) data split into a DoubleWord."""
    x = np.asarray(x)
    if x.dtype == np.complex128:
        rh, rl = split_float64(np.array(x.real))  # a contiguous copy that keeps 0-d
        ih, il = split_float64(np.array(x.imag))
        return DoubleWord(complex_from_parts(rh, ih), complex_from_parts(rl, il))
    return DoubleWord(*split_float64(x))


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


def map_words(f, *ws: DoubleWord) -> DoubleWord:
    """``f`` (an op that moves or selects values: slice, reshape, concatenate,
    repeat, ...) of the high words and of the low words of ``ws``; where none
    stores a low word (float32 operands, not a carried float64 value) the result
    stores none either (no zero word is made)."""
    if all(w._lo is None and w.wide is None for w in ws):
        return DoubleWord.exact(f(*(w.hi for w in ws)))
    return DoubleWord.of_words(f(*(w.hi for w in ws)), f(*(w.lo for w in ws)))


def as_complex(x: DoubleWord) -> DoubleWord:
    """x as a complex DoubleWord (exact)."""
    if x.is_complex:
        return x
    zero = mx.zeros_like(x.hi)
    if x.wide is not None:  # a zero imaginary part of its float64 value
        with mx.stream(mx.cpu):
            return combine(x, DoubleWord.from_wide(zero, (mx.zeros_like(x.wide[0]), None)))
    return combine(x, DoubleWord.exact(zero))
