"""The cpu engine of double-word arithmetic: DoubleWords to MLX float64 values and
back (:func:`to64`, :func:`from64`, lazily, keeping the float64 value for the next
cpu step), cpu results computed in float64 (:func:`from_float64_result`), fused
float64 steps (:func:`step`), and ``+ * /`` in float64 (:func:`arith64`).

A cpu step is a float64 formula of its operands' float64 values. :func:`step`
runs it as one MLX function compiled with ``mx.compile`` (MLX's cpu backend fuses
an elementwise graph into one loop): each operand is read once, in whatever form
it has (its float64 value; its float32 word alone, converted inside the loop; or
its two words, joined inside), and the float64 result written once; the high
word, its float32 rounding, is a lazy array of its own, so a chain of steps
writes no high word that nothing reads."""

from __future__ import annotations

import contextlib
import functools
import weakref

import mlx.core as mx
import numpy as np

from ..core import jit
from ..core.plain import plain
from .hostsplit import complex_from_parts
from .types import DoubleWord

F32, F64 = mx.float32, mx.float64


def from_float64_result(y: np.ndarray, round_output: bool):
    """A cpu-backend result computed in float64: rounded once to float32 / complex64
    (overflow to Inf, as on the GPU, without numpy's warning), or split into a
    :class:`DoubleWord` when ``round_output`` is False (lazily by :func:`from64`,
    which keeps the float64 value for the next cpu step)."""
    if round_output:
        with np.errstate(over="ignore"):
            return mx.array(y.astype(np.complex64 if np.iscomplexobj(y) else np.float32))
    with mx.stream(mx.cpu):  # (mx.array reads strided parts: one copy each)
        if np.iscomplexobj(y):
            return from64(mx.array(y.real, dtype=F64), mx.array(y.imag, dtype=F64))
        return from64(mx.array(y, dtype=F64))


def _zero_as_minus_zero(v: mx.array) -> mx.array:
    """v with every zero made -0 (other values unchanged): x + (-0) = x for every
    x, -0 and +0 included, so adding this keeps the sign of a zero high word."""
    return -((-v) + 0.0)


def to64(x: DoubleWord) -> tuple[mx.array, mx.array | None]:
    """``hi + lo`` as MLX float64 arrays (re, im; im None for real words), lazy:
    exact for normalised pairs, and -0 stays -0; ``x.wide`` itself when ``x`` was
    made by :func:`from64` (the same value, without a pass over the words); one
    conversion of the high word for an exact ``x``. Call on the CPU stream (MLX has
    float64 there only)."""
    return _read(*_reading(x))


def from64(re: mx.array, im: mx.array | None = None) -> DoubleWord:
    """MLX float64 values split into two words, lazily: ``hi = RN32(v)``,
    ``lo = RN32(v - hi)``, ``lo = 0`` where ``hi`` is not finite (the special-value
    rule of the kernels); complex when ``im`` is given. The result keeps ``(re,
    im)`` as its ``wide`` value, and builds its low word only when it is read.
    The low word takes no gradient (:func:`_low64`)."""
    hi = re.astype(F32)
    if im is not None:
        hi = complex_from_parts(hi, im.astype(F32))
    return DoubleWord.from_wide(hi, (re, im))


# ---- fused float64 steps ---------------------------------------------------------------
# How a step reads an operand: "w" / "W" its float64 value (real / complex: the real
# and imaginary parts), "h" / "H" its high word alone (an exact value: converted in
# the loop), "j" / "J" its two words (joined in the loop), "a" an array as it is (a
# condition, an index).
_ARRAYS = {"w": 1, "W": 2, "h": 1, "H": 1, "j": 2, "J": 2, "a": 1}

FUSE_MIN = jit.FUSE_MIN
"""Elements from which a step runs compiled (one loop; MLX compiles a kernel for
each new shape pattern the first time, about a second); smaller ones run as
separate MLX ops (host-bound either way), with the same operations in the same
order, so the same bits where the compiler does not contract a * b + c into an
FMA (it does not on x86-64 and Apple silicon: one operation per statement)."""


def _loops(*fns) -> dict:
    """Functions of MLX arrays made of many elementwise ops (the pieces of exp, of a
    norm, of sin / cos), by name, compiled (:class:`.jit.compile`) when big or
    repeated: their dozens of ops cost more host time and more graph nodes than one
    compiled call even on 16 elements (exp64: 40 us against 220 us eagerly,
    evaluation included; a new shape retraces in about 0.5 ms, the kernel is built
    once per pattern and machine, about 0.8 s)."""
    return {f.__name__: jit.compile(f) for f in fns}


def _reading(x) -> tuple[str, tuple]:
    """(kind, arrays): how a step reads ``x`` (a DoubleWord or an ``mx.array``)."""
    if not isinstance(x, DoubleWord):
        return "a", (x,)
    if x.wide is not None:
        re, im = x.wide
        return ("w", (re,)) if im is None else ("W", (re, im))
    kind = "H" if x.is_complex else "h"
    if x._lo is None:
        return kind, (x.hi,)
    return kind.replace("h", "j").replace("H", "J"), (x.hi, x._lo)


def _join64(hi: mx.array, lo: mx.array) -> mx.array:
    return hi.astype(F64) + _zero_as_minus_zero(lo).astype(F64)


def _read(kind: str, arrays: tuple):
    """The float64 value (re, im or None) of an operand read as ``kind`` (an "a"
    operand: the array)."""
    if kind == "a":
        return arrays[0]
    if kind == "w":
        return arrays[0], None
    if kind == "W":
        return arrays
    if kind == "h":
        return arrays[0].astype(F64), None
    if kind == "H":
        return plain.real(arrays[0]).astype(F64), plain.imag(arrays[0]).astype(F64)
    if kind == "j":
        return _join64(*arrays), None
    hi, lo = arrays
    return (_join64(plain.real(hi), plain.real(lo)), _join64(plain.imag(hi), plain.imag(lo)))


def _evaluate(formula, kinds: tuple, rounded: bool, arrays: tuple) -> tuple:
    values, k = [], 0
    for kind in kinds:
        n = _ARRAYS[kind]
        values.append(_read(kind, arrays[k:k + n]))
        k += n
    re, im = formula(*values)
    if rounded:
        return re.astype(F32)
    return (re,) if im is None else (re, im)


@functools.lru_cache(maxsize=None)
def _compiled(formula, kinds: tuple, rounded: bool):
    """``formula`` on operands read as ``kinds``, compiled once per formula and
    kinds (MLX compiles a kernel per shape pattern on first use and caches it on
    disk). ``rounded``: the float32 rounding of its (real) result."""
    return jit.compile(lambda *arrays: _evaluate(formula, kinds, rounded, arrays))


def _fused(formula, operands):
    """(outputs, the compiled function's kinds and arguments, or None when the
    formula ran as separate MLX ops)."""
    kinds, arrays = [], []
    for x in operands:
        kind, group = _reading(x)
        kinds.append(kind)
        arrays.extend(group)
    kinds, arrays = tuple(kinds), tuple(arrays)
    out, compiled = _run(formula, kinds, arrays)
    _remember(out, formula, kinds, arrays)
    return out, ((kinds, arrays) if compiled else None)


def _run(formula, kinds: tuple, arrays: tuple) -> tuple:
    """(``formula``'s outputs on operands read as ``kinds``, whether it ran
    compiled): below :data:`FUSE_MIN` elements in every operand, separate MLX ops
    (each operand read once)."""
    with mx.stream(mx.cpu):
        if all(a.size < FUSE_MIN for a in arrays):
            return _evaluate(formula, kinds, False, arrays), False
        return tuple(_compiled(formula, kinds, False)(*arrays)), True


# ---- broadcast results rebuilt by rows --------------------------------------------------
# A step whose result is much larger than its operands (an outer product, a broadcast
# sum: S4D's Vandermonde exponents dt A[..., None] * arange(L)) records how it was made,
# for as long as its float64 result lives: a consumer that works in pieces of leading
# rows (:func:`rows`) then computes each piece's rows from the operands' rows, and the
# whole result is never written unless something else reads it. The same formula on
# the same values, elementwise: the same bits.
_RECIPES: dict[int, tuple] = {}

BROADCAST_GROWTH = 4
"""A result at least this many times its operands' total size (and of at least 2
:data:`PIECE` elements) is recorded for :func:`rows`."""


def _remember(out: tuple, formula, kinds: tuple, arrays: tuple) -> None:
    re = out[0]
    if re.ndim == 0 or re.shape[0] < 2 or re.size < 2 * PIECE or (
            re.size < BROADCAST_GROWTH * sum(a.size for a in arrays)):
        return
    key = id(re)

    def drop(_ref, key=key):
        _RECIPES.pop(key, None)

    # (the imaginary part by identity too: a value whose real part alone comes
    # from this step, joined to another imaginary part, is not rebuilt from it)
    im = weakref.ref(out[1]) if len(out) == 2 else None
    _RECIPES[key] = (weakref.ref(re, drop), im, formula, kinds, arrays)


def rows(value: tuple, start: int, stop: int) -> tuple:
    """Rows ``start:stop`` (of axis 0) of a float64 value ``(re, im or None)``
    made by a step (lazy, CPU stream): from the operands' rows where the step's
    result was a broadcast much larger than its operands (so that working through
    such a value by rows never writes it whole), else slices of the value."""
    re, im = value
    entry = _RECIPES.get(id(re))
    if entry is None or entry[0]() is not re or (
            (entry[1] is None) != (im is None) or (im is not None and entry[1]() is not im)):
        return tuple(None if v is None else v[start:stop] for v in value)
    _, _, formula, kinds, arrays = entry
    # an operand spanning axis 0 gives its rows; one broadcast along it, itself
    part = tuple(a[start:stop] if a.ndim == re.ndim and a.shape[0] == re.shape[0] else a
                 for a in arrays)
    out = _run(formula, kinds, part)[0]
    return out if len(out) == 2 else (out[0], None)


def apply(formula, *operands) -> tuple:
    """``formula`` of the operands' float64 values, fused into one loop (see the
    module's docstring; below :data:`FUSE_MIN` elements, separate MLX ops):
    ``(re,)`` or ``(re, im)``, MLX arrays (lazy).

    Args:
        formula: ``formula(*values) -> (re, im or None)``, elementwise (a
            broadcast result may be rebuilt by rows from its operands' rows,
            :func:`rows`); a DoubleWord operand comes in as its value ``(re, im
            or None)`` (MLX float64 arrays; they broadcast), an ``mx.array``
            operand as it is. Made of MLX ops only, and
            a module-level function (kernels are cached per formula); the Python
            numbers in it are constants of the kernel, so numbers that vary from
            call to call must come in as operands.
        operands: DoubleWords and ``mx.array`` values.
    """
    return _fused(formula, operands)[0]


_WORDS_ONLY = frozenset("hHjJa")  # readings that hold no float64 value


def step(formula, *operands, cheap: bool = False) -> DoubleWord:
    """One cpu step: :func:`apply`, the result a DoubleWord that keeps its float64
    value (its low word built only when read, its high word a lazy array).

    ``cheap`` (one float64 operation; a complex result ignores it): compiled, the
    high word comes from a kernel of its own
    that reads the operands (one rounding of the same operation: equal to the
    rounding of the float64 result), so that reading the high word writes no
    float64 result, and a next step reading the float64 result writes no high
    word. But from 2 :data:`PIECE` elements, where an operand is read as its
    float64 value, the high word is the rounding of the result: a kernel of its own would keep the operands'
    float64 values alive for as long as the high word lives unevaluated (a rule
    evaluating its operand, as softmax does by pieces, then held them beside the
    result: 17 MB in a transformer's attention); operands read as their words
    (float32 arrays, held anyway) keep the kernel at every size (a product of two
    float32 arrays of 1e6 elements: one pass, 2.5x faster than writing the float64
    result and rounding it).

    Returns:
        The DoubleWord of the result (float32 words, or complex64 where the formula
        returns an imaginary part).
    """
    wide, kernel = _fused(formula, operands)
    if not cheap or kernel is None or len(wide) == 2 or (
            wide[0].size >= 2 * PIECE and not _WORDS_ONLY.issuperset(kernel[0])):
        return from64(*wide)
    kinds, arrays = kernel
    with mx.stream(mx.cpu):
        hi = _compiled(formula, kinds, True)(*arrays)
    return DoubleWord.from_wide(hi, (wide[0], None))


def _add(x, y):
    (xr, xi), (yr, yi) = x, y
    return xr + yr, (None if xi is None and yi is None else
                     yi if xi is None else xi if yi is None else xi + yi)


def _mul(x, y):
    (xr, xi), (yr, yi) = x, y
    if xi is None or yi is None:
        s, (a, b) = (xr, (yr, yi)) if xi is None else (yr, (xr, xi))
        return a * s, None if b is None else b * s
    return xr * yr - xi * yi, xr * yi + xi * yr


def _div(x, y):
    (xr, xi), (yr, yi) = x, y
    if yi is None:
        return xr / yr, None if xi is None else xi / yr
    d = yr * yr + yi * yi
    xi = mx.zeros_like(xr) if xi is None else xi  # (+0: the signs of zero parts)
    return (xr * yr + xi * yi) / d, (xi * yr - xr * yi) / d


def _select(c, x, y):
    (xr, xi), (yr, yi) = x, y
    if xi is None and yi is None:
        return mx.where(c, xr, yr), None
    xi = mx.zeros_like(xr) if xi is None else xi
    yi = mx.zeros_like(yr) if yi is None else yi
    return mx.where(c, xr, yr), mx.where(c, xi, yi)


def _maximum(x, y):
    return mx.maximum(x[0], y[0]), None


def _minimum(x, y):
    return mx.minimum(x[0], y[0]), None


def _abs(x):
    return mx.abs(x[0]), None


def _comparison(name: str):
    f = getattr(mx, name)

    def compare(x, y):
        (xr, xi), (yr, yi) = x, y
        if xi is None and yi is None:
            return f(xr, yr), None
        xi = mx.zeros_like(xr) if xi is None else xi
        yi = mx.zeros_like(yr) if yi is None else yi
        same = mx.equal(xr, yr) & mx.equal(xi, yi)  # (complex: == and != only)
        return (same if name == "equal" else mx.logical_not(same)), None

    compare.__name__ = f"_{name}"
    return compare


COMPARISONS = {name: _comparison(name) for name in ("less", "less_equal", "greater",
                                                     "greater_equal", "equal", "not_equal")}
"""Exact comparisons of the values (``apply(COMPARISONS[name], x, y)``)."""


def select(cond: mx.array, x: DoubleWord, y: DoubleWord) -> DoubleWord:
    """``where(cond, x, y)`` of the values (exact)."""
    return step(_select, cond, x, y, cheap=not (x.is_complex or y.is_complex))


def extremum(x: DoubleWord, y: DoubleWord, larger: bool) -> DoubleWord:
    """``maximum`` / ``minimum`` of real values (exact; NaN propagates, as MLX's
    does: the high word of the result is the extremum of the high words)."""
    return step(_maximum if larger else _minimum, x, y, cheap=True)


def absolute(x: DoubleWord) -> DoubleWord:
    """``|x|`` of a real value (exact)."""
    return step(_abs, x, cheap=True)


_ARITH = {"add": _add, "mul": _mul, "div": _div}


def arith64(op: str, x: DoubleWord, y: DoubleWord) -> DoubleWord:
    """``x + y``, ``x * y`` or ``x / y`` (op "add", "mul", "div") by MLX float64 on
    the CPU stream (complex as pairs of float64 arrays: MLX has no complex128), one
    fused step (:func:`step`)."""
    return step(_ARITH[op], x, y, cheap=True)  # (complex results: step's own check)


# ---- float64 elementary functions ----------------------------------------------------
# MLX 0.32's float64 exp, sin, cos, sigmoid and erf are only float32-accurate (relative
# errors near 2^-20, and 2^-1 for sin at |x| ~ 1000), and its accurate ones (expm1,
# tan, ...) call the C library one element at a time. These are float64 evaluations
# made of MLX arithmetic, fused by mx.compile: exp by Cody and Waite's reduction
# x = k ln2 + r (ln 2 in two parts, the first exact times any k in range), e^r by its
# Taylor polynomial to r^13 (|r| <= ln2 / 2: truncation below 2^-57) by Estrin's
# scheme, and 2^k as exponent bits; sin and cos by a reduction of the same kind
# (below).
# References: W. J. Cody, W. Waite, "Software Manual for the Elementary Functions",
# 1980; G. Estrin, "Organization of computer systems", 1960.

_MAGIC = 6755399441055744.0  # 1.5 * 2^52: (y + M) - M is y rounded to an integer (|y| < 2^51)


def _split_bits(v, bits: int) -> float:
    """The float64 with the leading ``bits`` significant bits of the mpmath value v."""
    import mpmath as mp

    e = int(mp.floor(mp.log(abs(v), 2)))
    return float(mp.floor(v * mp.mpf(2) ** (bits - 1 - e)) * mp.mpf(2) ** (e + 1 - bits))


@functools.lru_cache(maxsize=None)
def _constants() -> dict:
    """ln 2 in two parts, 1/ln 2 and the Taylor coefficients of e^r (mpmath, 200
    bits, rounded once to float64)."""
    import mpmath as mp

    with mp.workprec(200):
        ln2 = mp.log(2)
        ln2_hi = _split_bits(ln2, 32)  # k ln2_hi is exact for |k| < 2^21
        return {
            "inv_ln2": float(1 / ln2), "ln2": (ln2_hi, float(ln2 - mp.mpf(ln2_hi))),
            # e^r = 1 + r + r^2 (1/2 + r/6 + ... + r^11/13!), highest degree first
            "exp": [float(1 / mp.factorial(n)) for n in range(13, 1, -1)],
        }


def _estrin(coefficients, z):
    """The polynomial with ``coefficients`` (highest degree first) at z, by
    Estrin's scheme: depth about 2 log2(degree) instead of Horner's 2 degree (MLX
    fuses at most 11 levels of operations into one loop)."""
    p = list(coefficients[::-1])
    while len(p) > 1:
        p = [p[i] + p[i + 1] * z if i + 1 < len(p) else p[i] for i in range(0, len(p), 2)]
        z = z * z
    return p[0]


def _round_to_integer(y):
    return (y + _MAGIC) - _MAGIC


# e^x = m 2^j is four loops of at most 11 levels, each with one output (MLX fuses a
# graph in pieces of at most 11 levels, and materialises every value that crosses
# from one piece to another): k, r, m, and m 2^j (the bits of 2^j made in the loop),
# where j is k brought into the normal exponents and m carries the rest, 2^(k - j),
# exactly. k, an integer in [-1077, 1025], crosses the loops as int16 (exact; a
# quarter of a float64 temporary): the loops' full-size temporaries are r and m.

def _exp_k(x):
    """k = round(x / ln 2) of x clipped to [-746, 710] (beyond: 0 and Inf; NaN
    propagates), as float64."""
    return _round_to_integer(mx.clip(x, -746.0, 710.0) * _constants()["inv_ln2"])


def _exp_k16(x):
    """k as int16 (NaN gives 0: its r, hence its result, is NaN anyway)."""
    return _exp_k(x).astype(mx.int16)


def _exp_r(x, k16):
    """r = x - k ln 2, |r| <= ln2 / 2 (ln 2 in two parts, the first exact times k)."""
    c = _constants()["ln2"]
    k = k16.astype(F64)
    x = mx.clip(x, -746.0, 710.0)
    return (x - k * c[0]) - k * c[1]


def _exp_j(k):
    return mx.clip(k, -1021.0, 1023.0)


def _exp_m(r, k16):
    """e^r 2^(k - j): the Taylor polynomial of e^r (to r^13) and the exact power of
    two that j leaves (k - j in [-55, 1])."""
    k = k16.astype(F64)
    m = 1.0 + (r + r * r * _estrin(_constants()["exp"], r))
    d = (k - _exp_j(k) + 55.0).astype(mx.int64)
    return m * ((mx.array(1, mx.int64) << d).astype(F64) * 2.0**-55)


def _exp_scaled(m, k16):
    """m 2^j, 2^j from its float64 bits."""
    return m * ((_exp_j(k16.astype(F64)) + 1023.0).astype(mx.int64) << 52).view(F64)


def _exp_k16_shifted(x, shift):
    return _exp_k16(x - shift)


def _exp_r_shifted(x, shift, k16):
    return _exp_r(x - shift, k16)


_EXP = _loops(_exp_k16, _exp_r, _exp_m, _exp_scaled, _exp_k16_shifted, _exp_r_shifted)


def exp64(x: mx.array, shift: mx.array | None = None) -> mx.array:
    """e^x (or e^(x - shift), the difference rounded once and never written out)
    of MLX float64 values (lazy, CPU stream): within one ulp; NaN stays NaN,
    overflow is Inf, underflow gradual (subnormal, then 0)."""
    if shift is None:
        k = _EXP["_exp_k16"](x)
        r = _EXP["_exp_r"](x, k)
    else:
        k = _EXP["_exp_k16_shifted"](x, shift)
        r = _EXP["_exp_r_shifted"](x, shift, k)
    return _EXP["_exp_scaled"](_EXP["_exp_m"](r, k), k)


# ---- normalisations: the flow's decompositions as float64 formulas ----------------------
# The same operations in the same order as the rules' decompositions (so the same
# bits), with the elementwise parts fused and the full-size intermediates never
# written: only what a reduction reads is.

def shift_kept(m, infinite: bool = False):
    """Where softmax's / logsumexp's shift is the row's maximum ``m`` (elsewhere 0):
    where it is finite, and (``infinite``: softmax's) where it is +Inf too, so that
    a row holding +Inf is NaN throughout, as MLX's ``exp(x - max)`` makes it (a
    shift of 0 made it NaN at the Inf and 0 elsewhere); logsumexp's is 0 there (its
    value is +Inf, MLX's). Shared with the flow's rules
    (``extended.rules.reductions``)."""
    return mx.isfinite(m) | (m == mx.inf) if infinite else mx.isfinite(m)


def _float32_shift(v, axes, infinite: bool = False):
    """softmax's and logsumexp's shift along ``axes``: the float32 maximum of the
    high words (= the rounding of the float64 maximum ``m``), 0 where it is not
    kept (:func:`shift_kept`), and ``m`` itself from 2^24 on, where the maximum's
    low word reaches 1 (its exp would overflow past ~2^31: see the flow's rule,
    ``extended.rules.reductions._shift_low``)."""
    m = mx.max(v, axis=axes, keepdims=True)
    m32 = m.astype(F32).astype(F64)
    return mx.where(shift_kept(m32, infinite), mx.where(mx.abs(m32) >= 2.0**24, m, m32), 0.0)


PIECE = 1 << 15
"""Elements of a piece of :func:`by_rows`: from twice this size, softmax64,
logsumexp64 and erf run piece by piece, so that their full-size float64
temporaries (exp's r and m, e; erf's gathered coefficients) are piece-size."""

TRIG_PIECE = 1 << 17
"""Elements of a piece of :func:`sincos64` and :func:`cexp64` (:func:`in_pieces`),
from twice this size: their dozen full-size float64 temporaries (k, r, rr, the two
polynomials, the selections, exp's) then fit MLX's buffer cache (32 MB by default
here), where whole they touched fresh pages: sin of 2^20 values measured 2.3x
faster, a complex exp 1.3-1.7x (2^16 to 2^18 elements within noise)."""


def in_pieces(fn, arrays: list, piece: int, beside: bool = True) -> tuple:
    """``fn(*arrays)`` (elementwise, a tuple of arrays of their shape) on runs of
    ``piece`` elements of the flattened ``arrays`` (of one shape), each written into
    the results as it is made (:func:`_pieces`; ``beside``: two at a time, one on a
    second CPU stream): the same values as whole (each element's operations are the
    same)."""
    flat = [a.reshape(-1) for a in arrays]
    outs = _pieces(fn, flat, piece, beside)
    return tuple(o.reshape(arrays[0].shape) for o in outs)


def _pieces(fn, arrays: list, step: int, beside: bool) -> list:
    """``fn(*rows)`` (a tuple of arrays of ``step`` leading rows) of each run of
    ``step`` leading rows of ``arrays``, each written into the results as it is
    made (:func:`_written`) and evaluated: no piece outlives its update, where
    joining them held every piece beside the joined result. ``beside``: the odd
    pieces are made on a second CPU stream (:func:`_side_stream`) and evaluated
    with the even one before, so that MLX runs each pair side by side on two threads
    (each op of MLX's CPU backend runs on its stream's one thread; measured: erf of
    2^19 float64 values 1.8x faster in wall time, the same CPU time). Inside a
    function transformation nothing can be evaluated: the pieces are then made one
    after another (each depends on the last, where MLX would run an elementwise
    function's pieces side by side, all their temporaries held), on one stream.
    The same operations on the same values, whichever stream: the same bits."""
    n = arrays[0].shape[0]
    outs, last, settled = None, None, True
    for k, i in enumerate(range(0, n, step)):
        # (an odd piece's slices too: made on the first stream, they would wait there
        # behind the write of the piece before, which waits for this one)
        with mx.stream(_side_stream()) if beside and settled and k % 2 else _SAME_STREAM:
            part = [a[i:i + step] for a in arrays]
            if not settled:
                part = mx.depends(part, list(last))
            last = fn(*part)
        outs = _written(outs, last, i, n)
        if settled and (not beside or k % 2 or i + step >= n):
            settled = _settle(*outs)
    return outs


_SAME_STREAM = contextlib.nullcontext()


def _written(outs, piece: tuple, i: int, n: int) -> list:
    """``outs`` with ``piece`` written at row ``i``: the results (``n`` rows each,
    made at the first piece) take each piece as it is made (their buffers donated
    from update to update), not concatenated, so that no piece outlives its update.
    The callers then evaluate them (:func:`_settle`, once the old ``outs`` are let
    go: a live one would keep MLX from donating its buffer) before the next piece
    is made, where they can: lazily, MLX's breadth-first order ran about 20 pieces
    side by side, every one's temporaries held (measured: a (2, 16, 256, 256)
    softmax held 9 MB of them, 2 whole)."""
    if outs is None:
        outs = [mx.zeros((n, *a.shape[1:]), a.dtype) for a in piece]
    return [mx.slice_update(o, a, mx.array([i]), [0]) for o, a in zip(outs, piece)]


def by_rows(fn, v: mx.array, axes: tuple = (), piece: int | None = None):
    """``fn(v, axes)`` of a float64 ``v``, in pieces of whole rows when ``axes``
    (where ``fn`` reduces, keeping them; elementwise elsewhere) are the trailing
    axes (none: ``fn`` is elementwise, the pieces runs of elements,
    :func:`in_pieces`) and ``v`` has at least 2 ``piece`` elements (:data:`PIECE`
    when None; less where ``fn``'s temporaries are several times its operand's
    size). Each row is computed whole, as in one piece: the same bits. ``fn`` may
    return a tuple of arrays (each of ``v``'s leading shape): so does ``by_rows``."""
    piece = PIECE if piece is None else piece
    n = v.ndim
    lead = n - len(axes)
    if v.size < 2 * piece or lead == 0 or sorted(a % n for a in axes) != list(range(lead, n)):
        return fn(v, axes)
    if not axes:
        return in_pieces(lambda p: (fn(p, ()),), [v], piece)[0]
    rows = v.reshape(-1, *v.shape[lead:])
    step = max(1, piece * rows.shape[0] // v.size)
    if step >= rows.shape[0]:
        return fn(v, axes)
    axes = tuple(range(1, rows.ndim))
    single = []

    def each(r):
        out = fn(r, axes)
        single[:] = [not isinstance(out, tuple)]
        return (out,) if single[0] else out

    outs = tuple(o.reshape(*v.shape[:lead], *o.shape[1:]) for o in _pieces(each, [rows], step, True))
    return outs[0] if single[0] else outs


def _exp_and_sum(v, axes):
    """(e, sum(e)) along ``axes``, ``e = exp(v - shift)``: softmax's numerator and
    denominator."""
    e = exp64(v, _float32_shift(v, axes, True))
    return e, mx.sum(e, axis=axes, keepdims=True)


def _logsumexp(v, axes):
    shift = _float32_shift(v, axes)
    return mx.log(mx.sum(exp64(v, shift), axis=axes, keepdims=True)) + shift


def softmax64(x: DoubleWord, axes) -> DoubleWord:
    """``e / sum(e)``, ``e = exp(x - shift)`` along ``axes``. In pieces of rows
    (:func:`by_rows`), e and its sums are written out and divided once after the
    last piece: the division then writes over e (its only reader: MLX donates the
    buffer), where dividing in each piece made a second piece-size array per piece.
    The same division of the same values: the same bits."""
    with mx.stream(mx.cpu):
        e, s = by_rows(_exp_and_sum, to64(x)[0], axes)
        return from64(e / s)


def logsumexp64(x: DoubleWord, axes, keepdims: bool) -> DoubleWord:
    """``log(sum(exp(x - shift))) + shift`` along ``axes``."""
    with mx.stream(mx.cpu):
        s = by_rows(_logsumexp, to64(x)[0], axes)
        return from64(s if keepdims else mx.squeeze(s, axis=axes))


def _square_of_difference(v, mean):
    d = v - mean
    return d * d


def _scaled(v, mean, r):
    return (v - mean) * r


def _scaled_affine(v, mean, r, w, b):
    return ((v - mean) * r) * w + b


def _scaled_weighted(v, mean, r, w):
    return ((v - mean) * r) * w


def _scaled_shifted(v, mean, r, b):
    return (v - mean) * r + b


_NORM = _loops(_square_of_difference, _scaled, _scaled_affine, _scaled_weighted,
               _scaled_shifted)


def norm64(x: DoubleWord, weight: DoubleWord | None, bias: DoubleWord | None, eps: float,
           centred: bool) -> DoubleWord:
    """``mx.fast.layer_norm`` (``centred``: ``(x - mean) rsqrt(mean((x - mean)^2) +
    eps)``, two passes) or ``mx.fast.rms_norm`` (``x rsqrt(mean(x^2) + eps)``) over
    the last axis, times ``weight``, plus ``bias`` (either may be None)."""
    with mx.stream(mx.cpu):
        v = to64(x)[0]
        n = float(v.shape[-1])
        mean = mx.sum(v, axis=-1, keepdims=True) / n if centred else mx.zeros((1,), F64)
        sq = _NORM["_square_of_difference"](v, mean)
        r = mx.rsqrt(mx.sum(sq, axis=-1, keepdims=True) / n + eps)
        args = [to64(a)[0] for a in (weight, bias) if a is not None]
        name = {(False, False): "_scaled", (True, True): "_scaled_affine",
                (True, False): "_scaled_weighted", (False, True): "_scaled_shifted"}[
            (weight is not None, bias is not None)]
        return from64(_NORM[name](v, mean, r, *args))


# sin and cos by Cody and Waite's reduction x = k pi/2 + r: pi/2 in four parts, the
# first three of 33 significant bits (k times each is exact for |k| < 2^20); the
# first subtraction is exact (Sterbenz), the next two recover their rounding errors
# by TwoSum (Knuth), so that r + rr, a double-word, keeps x - k pi/2 to about 2^-100
# relative even for the doubles closest to multiples of pi/2. sin r and cos r by
# their Taylor polynomials to r^17 and r^18 (|r| <= pi/4: truncation below 2^-62),
# rr entering to first order; k mod 4 selects and signs. (Within about 0.75 ulp of
# mpmath.) Past |x| = SINCOS_BOUND (k beyond 2^20) the products k p_i would not be
# exact: those elements take half-angle formulas of MLX's correctly reduced tan.
# Each loop has one output: MLX's compiled cpu loops with two outputs ran 10x slower
# (measured), so r and rr are two loops, as are the two polynomials.
# References: W. J. Cody, W. Waite, 1980 (above); D. E. Knuth, "The Art of Computer
# Programming" vol. 2, 1969 (TwoSum); P. H. Sterbenz, "Floating-Point Computation",
# 1974.

SINCOS_BOUND = 2.0**20
"""|x| up to which :func:`sincos64` reduces by its own Cody-Waite scheme."""


@functools.lru_cache(maxsize=None)
def _trig_constants() -> dict:
    """2/pi, pi/2 in four parts (three of 33 bits), and the Taylor coefficients of
    sin and cos (mpmath, 300 bits, each rounded once to float64)."""
    import mpmath as mp

    with mp.workprec(300):
        rest, parts = mp.pi / 2, []
        for _ in range(3):
            parts.append(_split_bits(rest, 33))
            rest -= mp.mpf(parts[-1])
        return {
            "2/pi": float(2 / mp.pi), "pi/2": parts + [float(rest)],
            # sin r = r + r z (-1/3! + z/5! - ... + z^7/17!), z = r^2, highest first
            "sin": [float((-1) ** n / mp.factorial(2 * n + 1)) for n in range(8, 0, -1)],
            # cos r = 1 - z/2 + z^2 (1/4! - z/6! + ... + z^7/18!)
            "cos": [float((-1) ** n / mp.factorial(2 * n)) for n in range(9, 1, -1)],
        }


def _two_diff(a, b):
    """(d, e): d = RN(a - b) and e = a - b - d exactly (Knuth's TwoSum of a and -b,
    the negation folded in: one level less in the loop)."""
    d = a - b
    t = d - a
    return d, (a - (d - t)) - (b + t)


def _trig_k(x):
    """k = round(x 2/pi) as int32 (meaningless where |x| > SINCOS_BOUND or x is not
    finite: those elements are replaced, or NaN through rr)."""
    return _round_to_integer(x * _trig_constants()["2/pi"]).astype(mx.int32)


def _trig_reduced(x, k32):
    """(s, lo): x - k pi/2 = s + lo up to the rounding of lo."""
    p = _trig_constants()["pi/2"]
    k = k32.astype(F64)
    s = x - k * p[0]  # exact: k p0 is, and lies within a factor 2 of x (Sterbenz)
    s, e1 = _two_diff(s, k * p[1])
    s, e2 = _two_diff(s, k * p[2])
    return s, (e1 + e2) - k * p[3]


def _trig_r(x, k32):
    """r = RN(x - k pi/2), |r| <= pi/4 (a little more where x 2/pi rounds at a half)."""
    s, lo = _trig_reduced(x, k32)
    return s + lo


def _trig_rr(x, k32, r):
    """rr = x - k pi/2 - r = (s - r) + lo (NaN for non-finite x: Inf - Inf), r read
    rather than formed again (the same value; measured 2.3x faster: MLX cut the
    deeper loop in two)."""
    s, lo = _trig_reduced(x, k32)
    return (s - r) + lo


def _sin_poly(r, rr):
    z = r * r
    return r + (r * (z * _estrin(_trig_constants()["sin"], z)) + rr * (1.0 - 0.5 * z))


def _cos_poly(r, rr):
    z = r * r
    h = 0.5 * z
    w = 1.0 - h
    # (1 - w) - h: the rounding error of w, exactly (Sterbenz), added back
    return w + (((1.0 - w) - h) + (z * z * _estrin(_trig_constants()["cos"], z) - r * rr))


def _sin_select(x, k32, s, c):
    """sin x from s = sin r, c = cos r: by k mod 4, s, c, -s, -c; x = +-0 stays."""
    v = mx.where((k32 & 1) == 1, c, s)
    v = mx.where((k32 & 2) == 2, -v, v)
    return mx.where(x == 0.0, x, v)


def _cos_select(k32, s, c):
    """cos x: by k mod 4, c, -s, -c, s."""
    v = mx.where((k32 & 1) == 1, s, c)
    return mx.where(((k32 + 1) & 2) == 2, -v, v)


# beyond SINCOS_BOUND, from t = tan(x/2): one loop writes t, one each sin and cos
def _tan_half(x):
    return mx.tan(0.5 * x)


def _sin_from_tan_half(t):
    return 2.0 * t / (1.0 + t * t)


def _cos_from_tan_half(x, t):
    t2 = t * t
    d = 1.0 + t2
    a = mx.abs(t)
    return mx.where((a >= 0.5) & (a <= 2.0), (2.0 * t / d) / mx.tan(x), (1.0 - t2) / d)


def _beyond(x):
    return (mx.abs(x) > SINCOS_BOUND) & (mx.abs(x) < float("inf"))


def _settle(*arrays) -> bool:
    """Evaluate ``arrays`` now (measured: MLX ran sincos64's loops 2-3x faster on
    evaluated inputs than as one lazy graph); False where nothing can be evaluated,
    inside a function transformation."""
    try:
        mx.eval(*arrays)
        return True
    except ValueError as e:  # (MLX's "[eval] ... during function transformations")
        if "transformations" not in str(e):
            raise
        return False


_TRIG = _loops(_trig_k, _trig_r, _trig_rr, _sin_poly, _cos_poly, _sin_select, _cos_select,
               _beyond, _tan_half, _sin_from_tan_half, _cos_from_tan_half)


def sincos64(x: mx.array, which: tuple = ("sin", "cos")) -> tuple:
    """sin x and / or cos x (``which``) of MLX float64 values (lazy, CPU stream;
    MLX's own are float32-accurate): within about 0.75 ulp for |x| <= 2^20 (-0 gives
    -0; Inf and NaN give NaN); beyond, from t = tan(x/2) by MLX's accurate float64
    tan: sin = 2t / (1 + t^2), cos = (1 - t^2) / (1 + t^2) where |t| is away from 1
    and sin x / tan x near the zeros of cos (|t| in [1/2, 2], where |sin x| >= 0.8;
    within about 2.5 ulp; no finite double lies close enough to an odd multiple of
    pi for t^2 to overflow). In pieces of :data:`TRIG_PIECE` elements."""
    if x.size >= 2 * TRIG_PIECE:
        # (not beside: each piece evaluates its own steps as it goes)
        return in_pieces(lambda p: _sincos64(p, which), [x], TRIG_PIECE, beside=False)
    return _sincos64(x, which)


def _sincos64(x: mx.array, which: tuple) -> tuple:
    k = _TRIG["_trig_k"](x)
    r = _TRIG["_trig_r"](x, k)
    rr = _TRIG["_trig_rr"](x, k, r)
    # below FUSE_MIN elements (host-bound) no waits: the selection below instead
    far = mx.any(_TRIG["_beyond"](x)) if x.size >= FUSE_MIN else None
    settled = far is not None and _settle(far, r, rr)
    s, c = _TRIG["_sin_poly"](r, rr), _TRIG["_cos_poly"](r, rr)
    del r, rr  # (once s and c are evaluated, r and rr go: not beside the selection)
    if settled:
        _settle(s, c)
    out = tuple(_TRIG["_sin_select"](x, k, s, c) if name == "sin" else
                _TRIG["_cos_select"](k, s, c) for name in which)
    if settled and not far.item():
        _settle(*out)  # (k, s and c go now: not beside what the caller does next)
        return out
    # (small, or inside a transformation: the selection too, the same values)
    t = _TRIG["_tan_half"](x)
    far = _beyond(x)
    return tuple(mx.where(far, _TRIG["_sin_from_tan_half"](t) if name == "sin" else
                          _TRIG["_cos_from_tan_half"](x, t), v) for name, v in zip(which, out))


def _sigmoid(x, e):
    """1 / (1 + e^-x) from e = e^-|x|, without overflow."""
    v = x[0]
    s = 1.0 / (1.0 + e)
    return mx.where(v >= 0.0, s, e * s), None


def sigmoid64(v: mx.array) -> mx.array:
    """The logistic function of MLX float64 values (CPU stream), from :func:`exp64`."""
    return _sigmoid((v,), exp64(-mx.abs(v)))[0]


def _cexp(b, e, s, c):
    """e^(a + ib) = e^a (cos b + i sin b) from b, e = e^a, s = sin b and c = cos b;
    b = 0 gives e^a and b exactly (the signs of zeros, and Inf * 0 avoided)."""
    b = b[0]
    return mx.where(b == 0.0, e, e * c), mx.where(b == 0.0, b, e * s)


# MLX's elementwise functions, captured at import (inside a block mx's names are the
# flow's stand-ins)
_MLX_FUNCTIONS = {name: getattr(mx, name) for name in (
    "expm1", "log", "log1p", "log2", "log10", "tanh", "sqrt", "rsqrt", "reciprocal", "power",
    "arctan2")}


@functools.lru_cache(maxsize=None)
def _function(name: str):
    """The formula of the elementwise function ``name`` (one of MLX's accurate
    float64 ones) on one operand's value."""
    f = _MLX_FUNCTIONS[name]
    return lambda x: (f(x[0]), None)


@functools.lru_cache(maxsize=None)
def _binary_function(name: str):
    f = _MLX_FUNCTIONS[name]
    return lambda x, y: (f(x[0], y[0]), None)


_OWN = ("exp", "sigmoid", "sin", "cos", "erf")  # evaluated here (MLX's: float32-accurate)


def one_op64(fn: str):
    """MLX's float64 function that :func:`unary64` evaluates ``fn`` with, alone
    (accurate in MLX 0.32: sqrt, log, tanh, ...), or None where it evaluates its
    own formula."""
    return None if fn in _OWN else _MLX_FUNCTIONS[fn]


def unary64(fn: str, x: DoubleWord) -> DoubleWord:
    """The elementwise function ``fn`` (one of
    :data:`mlx_precise.doubleword.functions.UNARY`) of a real DoubleWord in float64
    but erf (:func:`mlx_precise.doubleword.functions.unary` evaluates it with the
    kernels' tables) in float64, lazily."""
    if fn == "exp":
        with mx.stream(mx.cpu):
            return from64(exp64(to64(x)[0]))
    if fn == "sigmoid":
        with mx.stream(mx.cpu):
            return step(_sigmoid, x, exp64(-mx.abs(to64(x)[0])))
    if fn in ("sin", "cos"):
        with mx.stream(mx.cpu):
            return from64(sincos64(to64(x)[0], (fn,))[0])
    return step(_function(fn), x)


def binary64(fn: str, x: DoubleWord, y: DoubleWord) -> DoubleWord:
    """``mx.power`` or ``mx.arctan2`` (``fn``) of real DoubleWords in float64 (both
    accurate in MLX 0.32)."""
    return step(_binary_function(fn), x, y)


def cexp64(re: DoubleWord, im: DoubleWord) -> DoubleWord:
    """e^(re + i im) of real DoubleWords: a complex DoubleWord (in pieces of
    :data:`TRIG_PIECE` elements, as :func:`sincos64`)."""
    with mx.stream(mx.cpu):
        a, b = to64(re)[0], to64(im)[0]
        if a.shape == b.shape and a.size >= 2 * TRIG_PIECE:
            # (not beside: each piece's exp runs on the second stream already)
            return from64(*in_pieces(_cexp64, [a, b], TRIG_PIECE, beside=False))
        return step(_cexp, im, _exp64_beside(a), *sincos64(b))


def _cexp64(a: mx.array, b: mx.array) -> tuple:
    """e^(a + ib) of float64 values: (re, im)."""
    return apply(_cexp, from64(b), _exp64_beside(a), *_sincos64(b, ("sin", "cos")))


@functools.lru_cache(maxsize=1)
def _side_stream() -> mx.Stream:
    """A second CPU stream: MLX runs each stream's work on its own thread."""
    return mx.new_stream(mx.cpu)


def _exp64_beside(a: mx.array) -> mx.array:
    """:func:`exp64` of ``a``, from :data:`FUSE_MIN` elements begun at once on a
    second CPU stream, so that it runs beside what the caller evaluates next
    (complex exp: the sine and cosine, whose waits would otherwise hold it back).
    The same loops on the same values: the same bits. Measured on 2^16 elements,
    interleaved medians: complex exp 1.6x faster (wall) on 2 cores, the same CPU
    time. Lazy on the current stream inside a function transformation (nothing can
    be evaluated there)."""
    if a.size < FUSE_MIN:
        return exp64(a)
    with mx.stream(_side_stream()):
        e = exp64(a)
    try:
        mx.async_eval(e)
    except ValueError as err:  # (MLX: "[async_eval] Not allowed inside a graph transformation")
        if "transformation" not in str(err):
            raise
        return exp64(a)
    return e
