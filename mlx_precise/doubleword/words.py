"""Double-word ("float-float") numbers on the host, and the double-word core kernels.

A double-word number is an unevaluated pair ``(hi, lo)`` of float32 with
``hi = RN(hi + lo)``: about 48 significand bits, i.e. ~14 decimal digits, over
float32's exponent range. The device arithmetic lives in
``metal/include/doubleword.h`` (JMP / MR algorithms, bounds in its comments); this
module splits float64 data into pairs, joins pairs back into float64, declares the
kernels that exercise the header, and runs the device self-test that guards every
extended-precision kernel (:func:`eft_selftest`).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..core import backends, context
from ..core.arrays import as_array, float64_data, is_wide
from ..core.plain import plain
from .dw_kernels import CDW_OP, CDW_OPS, DW_OP, DW_OPS  # noqa: F401  (DW_OPS, CDW_OPS: re-exported)

def _as_numpy(x, name: str, dtype: str) -> np.ndarray:
    """``x`` (an ``mx.array`` or numpy data of exactly ``dtype``, "float32" or
    "float64") as a numpy array; ValueError for another dtype or type."""
    if isinstance(x, mx.array):
        if x.dtype != getattr(mx, dtype):
            raise ValueError(f"{name} must have dtype {dtype}, got {x.dtype}")
        return np.array(x, dtype=dtype)
    if isinstance(x, (np.ndarray, np.floating)):
        x = np.asarray(x)
        if x.dtype != dtype:
            raise ValueError(f"{name} must have dtype {dtype}, got numpy {x.dtype}")
        return x
    raise ValueError(f"{name} must be a {dtype} mx.array or numpy array, got "
                     f"{type(x).__name__}")


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
        ValueError: wrong dtype or type, or a value that is not finite or rounds to
            +-inf in float32 (``|x| >= 2^128 - 2^103``).
    """
    a = _as_numpy(float64_data(x, "x"), "x", "float64")  # lists, numbers: their float64
    with np.errstate(over="ignore"):
        hi = a.astype(np.float32)
    bad = ~np.isfinite(hi)
    if np.any(bad):
        first = a[bad].flat[0]
        raise ValueError(
            f"x has {int(np.count_nonzero(bad))} value(s) outside the float32 range "
            f"(non-finite, or |x| rounds to inf in float32), e.g. {first!r}"
        )
    return _split_result(a)


def join(hi, lo) -> np.ndarray:
    """Exact value ``hi + lo`` of double-word pairs, rounded once to float64.

    Args:
        hi, lo: float32 ``mx.array``\\ s (or numpy arrays) of the same shape.

    Returns:
        float64 numpy array of that shape: ``RN64(hi + lo)`` (float32 -> float64 is
        exact, and one float64 addition rounds the exact sum once). It is exactly
        ``hi + lo`` whenever that sum fits in 53 bits, which holds for the pairs
        :func:`split` makes; a pair such as ``(1, 2^-60)`` is rounded to ``1``.

    Raises:
        ValueError: wrong dtype or type, or shapes that differ.
    """
    h = _as_numpy(hi, "hi", "float32")
    l_ = _as_numpy(lo, "lo", "float32")
    if h.shape != l_.shape:
        raise ValueError(f"hi and lo must have the same shape, got {h.shape} and {l_.shape}")
    return h.astype(np.float64) + l_.astype(np.float64)


def _binary(op: str, reflected: bool = False):
    """The operator ``self <op> other`` (``other <op> self`` when reflected)."""

    def method(self, other):
        return arith(op, other, self) if reflected else arith(op, self, other)

    method.__name__ = f"__{'r' if reflected else ''}{op}__"
    return method


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
        if not isinstance(hi, mx.array) or not isinstance(lo, mx.array):
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

    # Arithmetic on the active backend (:func:`arith` below): double-word kernels
    # (metal / emulate) or float64 (cpu), with DoubleWords, float32 / complex64
    # arrays, float64 data and Python numbers (their float64 values).
    __add__, __radd__ = _binary("add"), _binary("add", reflected=True)
    __sub__, __rsub__ = _binary("sub"), _binary("sub", reflected=True)
    __mul__, __rmul__ = _binary("mul"), _binary("mul", reflected=True)
    __truediv__, __rtruediv__ = _binary("div"), _binary("div", reflected=True)

    def __neg__(self) -> "DoubleWord":
        return DoubleWord(-self.hi, -self.lo)  # exact: both words change sign

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
        """``hi + lo`` in float64 (complex128 for complex words), on the CPU."""
        if not self.is_complex:
            return join(self.hi, self.lo)
        # complex64 -> complex128 is exact per part, and one complex128 addition
        # rounds each part's exact sum once (as join does for real words)
        return np.array(self.hi).astype(np.complex128) + np.array(self.lo)

    def parts(self) -> tuple["DoubleWord", "DoubleWord"]:
        """Real and imaginary parts of a complex DoubleWord (exact)."""
        if not self.is_complex:
            raise TypeError("parts() needs a complex DoubleWord")
        return (DoubleWord(mx.real(self.hi), mx.real(self.lo)),
                DoubleWord(mx.imag(self.hi), mx.imag(self.lo)))


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


# MLX's own real / imag: inside extended_precision() the names in mx are the flow's
# dispatchers, which a VJP must not go through.
_real, _imag = plain.real, plain.imag


@mx.custom_function
def _complex_bits(re: mx.array, im: mx.array) -> mx.array:
    return mx.stack([re, im], axis=-1).view(mx.complex64).reshape(re.shape)


@_complex_bits.vjp
def _complex_bits_vjp(primals, cotangent, output):
    g = cotangent[0] if isinstance(cotangent, (list, tuple)) else cotangent
    return _real(g), _imag(g)


def complex_from_parts(re: mx.array, im: mx.array) -> mx.array:
    """complex64 ``re + i im`` from float32 parts (broadcast), bit for bit
    (``re + 1j * im`` would turn an infinite ``im`` into a NaN real part:
    ``0 * inf``, and can change the sign of a zero); differentiable."""
    return _complex_bits(*mx.broadcast_arrays(re, im))


def _split_result(y: np.ndarray) -> tuple[mx.array, mx.array]:
    """:func:`split` for a computed result: a value that is not finite in float32
    (Inf, NaN, overflow) becomes that float32 value with a zero low word, the rule
    the kernels follow (docs/api.md, "Special values"), instead of an error."""
    y = np.asarray(y)
    if np.iscomplexobj(y):  # part by part, in one pass over complex128 data
        with np.errstate(over="ignore", invalid="ignore"):
            hi = y.astype(np.complex64)
            rest = y - hi.astype(np.complex128)
        lo = np.empty(y.shape, np.complex64)
        lo.real = np.where(np.isfinite(hi.real), rest.real, 0.0)
        lo.imag = np.where(np.isfinite(hi.imag), rest.imag, 0.0)
        return mx.array(hi), mx.array(lo)
    with np.errstate(over="ignore", invalid="ignore"):
        hi = y.astype(np.float32)
        lo = np.where(np.isfinite(hi), y - hi.astype(np.float64), 0.0).astype(np.float32)
    return mx.array(hi), mx.array(lo)


def as_words(x, name: str):
    """``x`` as the double-word ops read their inputs: :func:`~mlx_precise.core.arrays.as_array`,
    except that float64 / complex128 data is split into a :class:`DoubleWord`
    (``hi = RN32(x)``, ``lo = RN32(x - hi)``), so it enters at full precision
    (docs/api.md, "Inputs")."""
    if is_wide(x):
        return DoubleWord.from_float64(x)
    return as_array(x, name)


# ---- DoubleWord arithmetic (the operators of DoubleWord) -------------------------


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
    return DoubleWord.from_array(operand(v, name, ("float32", "complex64")))


# ---- the double-word engine: + - * / of DoubleWords on every backend --------------



def real_imag(x: DoubleWord) -> tuple[DoubleWord, DoubleWord]:
    """Real and imaginary parts (exact; a real x has a zero imaginary part)."""
    if not x.is_complex:
        return x, DoubleWord(mx.zeros_like(x.hi), mx.zeros_like(x.lo))
    if x.wide is not None:  # the parts of the float64 value (cpu)
        return (DoubleWord.from_wide(mx.real(x.hi), (x.wide[0], None)),
                DoubleWord.from_wide(mx.imag(x.hi), (x.wide[1], None)))
    return (DoubleWord(mx.real(x.hi), mx.real(x.lo)),
            DoubleWord(mx.imag(x.hi), mx.imag(x.lo)))


def combine(re: DoubleWord, im: DoubleWord) -> DoubleWord:
    """The complex DoubleWord ``re + i im`` (exact)."""
    return DoubleWord(complex_from_parts(re.hi, im.hi), complex_from_parts(re.lo, im.lo))


def as_complex(x: DoubleWord) -> DoubleWord:
    """x as a complex DoubleWord (exact)."""
    if x.is_complex:
        return x
    zero = mx.zeros_like(x.hi)
    return combine(x, DoubleWord(zero, zero))


def negate(x: DoubleWord) -> DoubleWord:
    """-x (exact)."""
    return DoubleWord(-x.hi, -x.lo)


def _zero_as_minus_zero(v: mx.array) -> mx.array:
    """v with every zero made -0 (other values unchanged): x + (-0) = x for every
    x, -0 and +0 included, so adding this keeps the sign of a zero high word."""
    return -((-v) + 0.0)


def _finite_or_zero(lo: mx.array, hi: mx.array) -> mx.array:
    """lo where hi is finite, +0 where it is not (Inf, NaN), by a bit mask: MLX's
    ``where`` and ``isfinite`` on the CPU are ~10x slower than an arithmetic pass."""
    keep = -(mx.abs(hi) < float("inf")).astype(mx.int32)  # all ones / all zeros
    bits = mx.uint32 if lo.dtype == mx.float32 else mx.uint64
    return (lo.view(bits) & keep.astype(bits)).view(lo.dtype)


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


def _low64(v: mx.array) -> mx.array:
    """RN32(v - RN32(v)) of float64 v, 0 where RN32(v) is not finite; no gradient
    (hi + lo = v, so the low word's derivative with respect to v is 0: the
    gradient flows through hi)."""
    with mx.stream(mx.cpu), context.flow_suspended():  # plain MLX even inside a block
        s = mx.stop_gradient(v)
        h = s.astype(mx.float32)
        return _finite_or_zero((s - h.astype(mx.float64)).astype(mx.float32), h)


def low_from_wide(wide: tuple) -> mx.array:
    """The low word of the float64 value ``wide = (re, im or None)`` (complex64
    when ``im`` is given), lazily."""
    re, im = wide
    if im is None:
        return _low64(re)
    with context.flow_suspended():
        return complex_from_parts(_low64(re), _low64(im))


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


def _binary64(op: str, x: DoubleWord, y: DoubleWord) -> DoubleWord:
    """The cpu engine: MLX float64 on the CPU stream (complex as pairs of float64
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


def _flat8(a: mx.array, shape: tuple) -> mx.array:
    """``a`` broadcast to ``shape``, flat, padded to 8 elements at least (MLX passes
    smaller inputs in ``constant`` space: one kernel instantiation for all sizes).
    An operand of the full shape is only reshaped (the kernels are declared
    ``ensure_row_contiguous``: MLX copies a strided one)."""
    f = a.reshape(-1) if tuple(a.shape) == shape else mx.broadcast_to(a, shape).reshape(-1)
    return f if f.size >= 8 else mx.concatenate([f, mx.zeros((8 - f.size,), f.dtype)])


def _launch(kernel, op: int, words: list[mx.array], n_out: int, backend: str, stream):
    """An elementwise kernel over float32 words broadcast to one shape."""
    shape = tuple(mx.broadcast_shapes(*(tuple(w.shape) for w in words)))
    size = int(np.prod(shape))
    if size == 0:
        return [mx.zeros(shape, mx.float32) for _ in range(n_out)]
    out = kernel(inputs=[_flat8(w, shape) for w in words], template={"OP": op},
                 output_shapes=[(max(size, 8),)] * n_out, output_dtypes=[mx.float32] * n_out,
                 backend=backend, stream=stream)
    return [o[:size].reshape(shape) for o in out]


def _binary_kernels(op: str, x: DoubleWord, y: DoubleWord, backend: str, stream) -> DoubleWord:
    """The metal / emulate engine: the ``dw_ops`` / ``cdw_ops`` kernels; mixed real
    and complex operands part by part, complex quotients by :func:`_complex_div`."""
    real = (lambda code, a, b: DoubleWord(*_launch(DW_OPS, code, [a.hi, a.lo, b.hi, b.lo], 2,
                                                   backend, stream)))
    if not x.is_complex and not y.is_complex:
        return real(DW_OP[op], x, y)
    if op == "add" or (op == "mul" and x.is_complex and y.is_complex):
        (xr, xi), (yr, yi) = real_imag(as_complex(x)), real_imag(as_complex(y))
        words = [w for p in (xr, xi, yr, yi) for w in (p.hi, p.lo)]
        rh, rl, ih, il = _launch(CDW_OPS, CDW_OP[op], words, 4, backend, stream)
        return combine(DoubleWord(rh, rl), DoubleWord(ih, il))
    if op == "mul":  # complex times real: each part times the real factor
        c, r = (x, y) if x.is_complex else (y, x)
        re, im = real_imag(c)
        return combine(real(DW_OP["mul"], re, r), real(DW_OP["mul"], im, r))
    if not y.is_complex:  # complex / real
        re, im = real_imag(x)
        return combine(real(DW_OP["div"], re, y), real(DW_OP["div"], im, y))
    return _complex_div(x, y, real, backend, stream)


def _pow2(e: mx.array) -> mx.array:
    """2^e in float32 for int32 ``e`` in [-126, 127] (exponent bits; lazy)."""
    return ((e + 127) << 23).astype(mx.uint32).view(mx.float32)


def _exponent(w: DoubleWord) -> mx.array:
    """floor(log2 max(|Re|, |Im|)) of the high words, int32, clipped to [-126, 127]
    (zero and subnormal: -126; Inf and NaN: 127)."""
    re, im = real_imag(as_complex(w))
    big = mx.maximum(mx.abs(re.hi), mx.abs(im.hi))
    e = ((big.view(mx.uint32) >> 23) & 0xFF).astype(mx.int32) - 127
    return mx.clip(e, -126, 127)


def _scale(w: DoubleWord, e: mx.array, parts: int) -> DoubleWord:
    """w 2^e (exact barring over/underflow of the result) as ``parts`` factors of
    one sign, each a normal float32 (|e| <= 126 parts)."""
    for k in range(parts, 0, -1):
        ek = e // k if k > 1 else e
        f = _pow2(ek)
        w = DoubleWord(w.hi * f, w.lo * f)
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
    yr, yi = real_imag(ys)
    d = real(DW_OP["add"], real(DW_OP["mul"], yr, yr), real(DW_OP["mul"], yi, yi))
    conj_y = DoubleWord(mx.conj(ys.hi), mx.conj(ys.lo))
    nr, ni = real_imag(_binary_kernels("mul", xs, conj_y, backend, stream))
    q = combine(real(DW_OP["div"], nr, d), real(DW_OP["div"], ni, d))
    return _scale(q, ex - ey, 3)


def binary(op: str, x: DoubleWord, y: DoubleWord, backend: str, stream=None) -> DoubleWord:
    """``x + y`` (op "add"), ``x - y`` ("sub"), ``x * y`` ("mul") or ``x / y``
    ("div") in double-word on a resolved ``backend``: real or complex words,
    broadcasting; lazy (no autodiff of its own). Relative errors on metal /
    emulate: <= 3u^2 + 13u^3 (add, sub), 4u^2 (mul), 9.8u^2 (div), complex products
    8.66u^2 normwise (u = 2^-24, JMP / MR bounds); cpu: float64 then split."""
    if op == "sub":
        op, y = "add", negate(y)  # exact negation: x - y = x + (-y)
    z = _binary64(op, x, y) if backend == "cpu" else _binary_kernels(op, x, y, backend, stream)
    if op == "div" and y.is_complex:
        z = _complex_div_specials(x, y, z)
    return z


def _complex_div_specials(x: DoubleWord, y: DoubleWord, z: DoubleWord) -> DoubleWord:
    """The float32 rule for complex quotients: where an operand is Inf or NaN, or
    y is 0, the result is MLX's complex64 quotient of the high words (Inf, NaN or
    0, as float32 gives) with a zero low word; a quotient that overflows float32
    is Inf with a zero low word."""
    def finite(a):  # both parts of a (real or complex) array
        return mx.isfinite(_real(a)) & mx.isfinite(_imag(a))

    special = ~finite(x.hi) | ~finite(y.hi) | (y.hi == 0)
    hi = mx.where(special, x.hi / y.hi, z.hi)
    lo = mx.where(special | ~finite(hi), mx.zeros_like(z.lo), z.lo)
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
    return binary(op, a, b, backends.resolve(None))
