"""Double-word FFTs: ``fft``, ``ifft``, ``rfft``, ``irfft`` rounded once at the end.

The whole transform stays in double-word ("float-float", ~48 bits): the input
words, the twiddles (computed on the host to ~2^-100 and split into float32 pairs,
:mod:`mlx_precise.fft.twiddles`), every butterfly (accurate DW+DW additions and
DWTimesDW3 products, ``metal/include/doubleword.h``) and the 1/n scaling (exact for
powers of two); the result is rounded once to complex64 / float32
(``round_output=True``) or returned as a :class:`~mlx_precise.DoubleWord`.

Sizes: powers of two run the Stockham kernel (``metal/kernels/fft_pass.metal``) in
passes of radix <= 1024 (one pass up to 1024 points, two up to 2^20, three up to
2^30); other sizes use Bluestein's chirp-z algorithm on a power-of-two FFT, with
the chirp exp(-pi i k^2 / n) taken from the exact integers k^2 mod 2n. Real
transforms of even length run a half-length complex FFT and a double-word
post/pre-processing kernel (``metal/kernels/fft_real.metal``).

Conventions are numpy's (``numpy.fft``): ``n`` zero-pads or truncates the input
along ``axis`` (for ``irfft``: the first ``n//2 + 1`` input points are used, and
the imaginary parts of the zero-frequency and, for even n, Nyquist terms are
ignored), normalisation "backward" (ifft and irfft scale by 1/n), batched over all
other axes.

Backends: ``metal`` / ``emulate`` run the kernels; ``cpu`` computes numpy's
complex128 FFT of the float64 value of the input and rounds once (or splits into
a DoubleWord). The plain-named twins :func:`fft`, :func:`ifft`, :func:`rfft`,
:func:`irfft` follow :func:`~mlx_precise.extended_precision`: outside it they are
``mx.fft.*`` in float32 / complex64.
"""

from __future__ import annotations

import functools
import math
import weakref
from typing import NamedTuple

import mlx.core as mx
import numpy as np

from ..core import backends
from ..doubleword import fusion, pow2scale
from ..doubleword.engine64 import from64, from_float64_result
from ..doubleword.types import DoubleWord, read_input
from ..doubleword.elementwise import CMUL, reciprocal_words
from ..doubleword.fusion import note_parts, rows_of
from ..core.kernels import Constants, Kernel, ParamLayout, elementwise_grid, generated_block
from . import cpu
from .twiddles import chirp_words, twiddle_table

_F32 = (mx.float32,)
_I32 = (mx.int32,)

TG_POINTS = 1024  # FFT_TG_POINTS in metal/include/fft.h: points per threadgroup
_LOG_TG = TG_POINTS.bit_length() - 1  # log2 of the largest radix of a pass
_MAX_POINTS = 2**30  # rows * n (and Bluestein's padded length): 32-bit word indices
_THREADS = 256

# The fields of the per-row range scaling (_RowScale) in both kernels' params.
_ROW_SCALE = (
    "rs_in",        # load each row times 2^-e (e from rmax[row], fft.h)
    "rs_out",       # store each row times 2^e, non-finite high words' low words 0
    "rs_per_part",  # that rule part by part (the parts are real results)
    "rs_growth",    # log2 of the transform's growth bound (pow2scale.row_exponents)
)

FFT_PASS_PARAMS = ParamLayout("FFT_PASS", (
    "logn",      # log2 n, the transform length
    "log_r",     # log2 R, the radix of this pass
    "log_ns",    # log2 Ns = R_1 ... R_(p-1), the product of the earlier radices
    "log_c",     # log2 C, groups per threadgroup
    "groups",    # G = rows * n / R
    "log_nt",    # log2 of the twiddle table's order
    "inverse",   # conjugate twiddles (inverse transform)
    "lo_in",     # x_lo holds low words (else they are 0 and x_lo is not read)
    "lo_out",    # write the low words
    "lo_at",     # x_lo's words start this many floats in (packed words: x_lo is x_hi)
    "out_lo_at",  # the low words start this many floats into y (packed words)
    "scaled",    # multiply by the double-word (scale_hi, scale_lo)
    "scale_hi",  # int32 bits of the float32 words of the scale
    "scale_lo",
    *_ROW_SCALE,
), size=20)
"""The ``params`` buffer of ``fft_pass`` (named ``FFT_PASS_LOGN`` ... in
``metal/include/fft.h``)."""

FFT_REAL_PARAMS = ParamLayout("FFT_REAL", (
    "n_half",    # N = n / 2, the length of the complex FFT
    "rows",
    "pre",       # irfft pre-processing (else rfft post-processing)
    "lo_in",
    "lo_out",
    "lo_at",
    "out_lo_at",
    "scaled",
    "scale_hi",
    "scale_lo",
    *_ROW_SCALE,
))
"""The ``params`` buffer of ``fft_real`` (``FFT_REAL_N_HALF`` ... in ``fft.h``)."""


def codes_source() -> str:
    """The generated block of ``metal/include/fft.h`` (a test checks that the header
    holds exactly this text)."""
    return generated_block("mlx_precise.fft.engine.codes_source()", FFT_PASS_PARAMS,
                           FFT_REAL_PARAMS, FFT_CONSTANTS)


FFT_CONSTANTS = Constants("FFT", {"headroom": pow2scale.HEADROOM})
"""Constants the kernels share with :mod:`mlx_precise.doubleword.pow2scale`
(``FFT_HEADROOM`` in ``fft.h``)."""


FFT_PASS = Kernel(
    name="fft_pass",
    body="fft_pass.metal",
    headers=("fft.h",),
    inputs=("x_hi", "x_lo", "tab", "rmax", "params"),
    outputs=("y",),
    input_dtypes={"x_hi": _F32, "x_lo": _F32, "tab": _F32, "rmax": _F32, "params": _I32},
    variants={"y": _F32},
    # _flat, _dummy, twiddle_table and FFT_PASS_PARAMS give every input >= 8 elements
    input_forms=dict.fromkeys(("x_hi", "x_lo", "tab", "rmax", "params"), ("device",)),
)
"""One Stockham pass (see the kernel's header comment): inputs ``x_hi``, ``x_lo``
float32 interleaved words, ``tab`` twiddle table, ``rmax`` float32 row maxima
(:class:`_RowScale`), ``params`` int32
(:data:`FFT_PASS_PARAMS`); output ``y`` float32: the high words, then
(``lo_out``) the low words (packed words). Grid: ``C`` groups of one radix-R
transform per threadgroup (planned by :func:`_plan`)."""

FFT_REAL = Kernel(
    name="fft_real",
    body="fft_real.metal",
    headers=("fft.h",),
    inputs=("x_hi", "x_lo", "tab", "rmax", "params"),
    outputs=("y",),
    input_dtypes={"x_hi": _F32, "x_lo": _F32, "tab": _F32, "rmax": _F32, "params": _I32},
    variants={"y": _F32},
    input_forms=dict.fromkeys(("x_hi", "x_lo", "tab", "rmax", "params"), ("device",)),
)
"""Real-FFT post-processing (rfft) or pre-processing (irfft) of a half-length
complex FFT; one thread per output point."""


# ---- argument checking ------------------------------------------------------------


# The dtypes of the transforms' inputs (read_input: float64 data is split).
ANY, REAL = ("float32", "complex64"), ("float32",)


def _check_axis(ndim: int, axis, name: str) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis must be an int, got {type(axis).__name__}")
    if ndim == 0:
        raise ValueError(f"{name} must have at least one dimension, got a 0-d array")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for {name} with {ndim} dimension(s)")
    return int(axis) % ndim


def _check_n(n, default: int, what: str = "n") -> int:
    if n is None:
        n = default
        if n < 1:
            raise ValueError(f"{what} must be >= 1: the default {what} = {n} is invalid for "
                             "this input; pass n explicitly")
        return n
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{what} must be an integer >= 1 (the transform length), got {n!r}")
    return int(n)


# ---- host-side layout: words as (rows, n) arrays --------------------------------


def _hi_lo(x, complex_out: bool):
    """(hi, lo or None) words; lo is None for plain arrays and exact DoubleWords
    (their low words are 0: none is made)."""
    hi, lo = x, None
    if isinstance(x, DoubleWord):
        hi, lo = x.hi, None if x._lo is None and x.wide is None else x.lo
    if complex_out and hi.dtype != mx.complex64:
        hi = hi.astype(mx.complex64)
        lo = None if lo is None else lo.astype(mx.complex64)
    return hi, lo


def _fit(a: mx.array, n: int) -> mx.array:
    """Zero-pad or truncate the last axis to n (numpy's ``n``)."""
    m = a.shape[-1]
    if m > n:
        return a[..., :n]
    if m < n:  # one pad: no array of zeros of its own
        return mx.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, n - m)])
    return a


def _to_rows(a, axis: int, n: int):
    """Move ``axis`` last, fit it to n, flatten the rest: (rows, n) (MLX's reshape
    copies where the strides require; the kernels' inputs are made flat by
    :func:`_flat`)."""
    if a is None:
        return None
    # (an axis already last, a 2-D array: MLX's moves would return it as it is; the
    # calls are skipped, each a dispatched op inside a block)
    a = _fit(a if axis == a.ndim - 1 else mx.moveaxis(a, axis, -1), n)
    return a if a.ndim == 2 else a.reshape(-1, n)


def _rows_pair(hi, lo, axis: int, n: int):
    """:func:`_to_rows` of both words: where they are the halves of a kernel's packed
    words (:func:`~mlx_precise.doubleword.fusion.packed`) whose first axis stays
    first, one move, fit (zeros: both words' own) and reshape of the packed array
    (MLX's copy, where the strides require one, for both words at once), its halves
    recorded as packed: the first kernel reads it as one input."""
    z = None if lo is None or axis == 0 else fusion.packed(hi, lo)
    if z is None:
        return _to_rows(hi, axis, n), _to_rows(lo, axis, n)
    rows = _to_rows(z, axis, n)  # (2 rows, n): the high words' rows, then the low words'
    return fusion.unpacked(rows, (rows.shape[0] // 2, n))


def _from_rows(a: mx.array, lead: tuple, axis: int) -> mx.array:
    """(rows, m) back to ``lead`` with m at ``axis`` (:func:`_to_rows`'s inverse)."""
    if len(lead) != 1:
        a = a.reshape(lead + (a.shape[-1],))
    return a if axis == len(lead) else mx.moveaxis(a, -1, axis)


def _flat(a: mx.array) -> mx.array:
    """float32 words of a complex64 (or float32) array, at least 8 of them so that
    MLX passes every input as a device buffer (one kernel instantiation). The
    kernels index their inputs flat and MLX hands them row-contiguous (copied only
    where ``a``'s strides require, as a reshape would), so an array of 8 or more
    words keeps its shape: no reshape node (complex64: one view, (..., 2n))."""
    if a.size * (2 if a.dtype == mx.complex64 else 1) < 8:
        f = a.reshape(-1)
        f = f.view(mx.float32) if f.dtype == mx.complex64 else f
        return mx.pad(f, (0, 8 - f.size))
    return a.view(mx.float32) if a.dtype == mx.complex64 else a


def _words(rows: int, n: int) -> tuple:
    """The shape of a kernel's output of complex64 (rows, n) as float32 words:
    (rows, 2n), whose complex64 view is (rows, n) with no reshape; flat and padded
    to 8 words when smaller (an input of the next kernel must be a device buffer)."""
    return (rows, 2 * n) if 2 * rows * n >= 8 else (8,)


def _word_rows(f: mx.array, rows: int, width: int) -> mx.array:
    """float32 (rows, width) from a kernel's words (:func:`_words`: drops the padding)."""
    return f if f.shape == (rows, width) else f[: rows * width].reshape(rows, width)


def _unflat(f: mx.array, rows: int, n: int, note: bool = False) -> mx.array:
    """complex64 (rows, n) from a kernel's float32 words (:func:`_words`); ``note``:
    a transform's result, whose words :func:`_finish` may hand on (:data:`_VIEWED`)."""
    words = _word_rows(f, rows, 2 * n)
    c = words.view(mx.complex64)
    if note:
        key = id(c)
        _VIEWED[key] = (weakref.ref(c, lambda _ref, key=key: _VIEWED.pop(key, None)), words)
    return c


# id of a transform's complex64 result (rows, n) -> (a weak reference to it, the float32
# words (rows, 2n) it views): where the rows are the caller's last axis, the
# DoubleWord result views them too, and a fused program reads them as they are
# (fusion.note_parts) instead of views of its complex words.
_VIEWED: dict[int, tuple] = {}


def _viewed(c: mx.array | None) -> mx.array | None:
    """The float32 words the complex64 ``c`` views (:func:`_unflat`), or None."""
    entry = None if c is None else _VIEWED.get(id(c))
    return entry[1] if entry is not None and entry[0]() is c else None


def _complex(a: mx.array | None) -> mx.array | None:
    """complex64 words of complex64 or float32 (..., 2n) (re, im) words (a view)."""
    return a if a is None or a.dtype == mx.complex64 else a.view(mx.complex64)


@functools.lru_cache(maxsize=1)
def _dummy() -> mx.array:
    """Stand-in for absent low words (never read by the kernels). Built from numpy,
    so it holds data from the start: every thread shares this cached array, and MLX
    evaluates an unevaluated array only on the thread whose stream built it."""
    return mx.array(np.zeros(8, np.float32))


@functools.lru_cache(maxsize=256)
def _scale_bits(k: int):
    """int32 bit patterns of the double-word words of 1/k (exact for powers of 2)."""
    hi, lo = reciprocal_words(k)
    return tuple(int(np.float32(v).view(np.int32)) for v in (hi, lo))


def _check_size(points: int, what: str) -> None:
    """The per-call limit of the kernels (applied to every backend alike by
    :func:`mlx_precise.fft.nd.check_limits`, before dispatch)."""
    if points > _MAX_POINTS:
        raise ValueError(f"{what} has {points} points in all; every backend takes at most "
                         "2^30 points per transform (use a smaller n, or split the batch)")


def _batch(a: mx.array, ax: int):
    """(lead shape, rows) of the axes other than ``ax`` (sizes were checked
    before dispatch: :func:`mlx_precise.fft.nd.check_limits`)."""
    lead = a.shape[:ax] + a.shape[ax + 1:]  # (MLX's shapes: tuples of ints)
    return lead, math.prod(lead)


def _finish(y_hi, y_lo, lead: tuple, ax: int, round_output: bool):
    """Rows back to the caller's layout: an array, or a DoubleWord whose complex
    words are noted as views of the kernels' float32 words, in the rows' layout
    (:func:`~mlx_precise.doubleword.fusion.note_parts`: a fused program reads them
    where the rows are the last axis, the next transform everywhere,
    :func:`_rows_of_words`)."""
    if round_output:
        return _from_rows(y_hi, lead, ax)
    if y_hi.dtype != mx.complex64:  # real rows: their packed words moved when read
        out, lo = _from_rows(y_hi, lead, ax), _from_rows(y_lo, lead, ax)
        if lead and ax != 0 and fusion.has_packed(y_hi, y_lo):
            fusion.note_moved(out, lo, y_hi, y_lo,
                              lambda z: _from_rows(z, (2 * lead[0],) + lead[1:], ax))
        return DoubleWord.of_words(out, lo)
    words = _viewed(y_hi), _viewed(y_lo)
    known = words[0] is not None and words[1] is not None
    z = fusion.packed(*words) if known and lead and ax != 0 else None
    if z is not None:  # both words moved at once: the packed words' complex view
        shape = lead[:ax] + (y_hi.shape[-1],) + lead[ax:]
        out, lo = fusion.unpacked(_from_rows(z.view(mx.complex64),
                                             (2 * lead[0],) + lead[1:], ax), shape)
    else:
        out, lo = _from_rows(y_hi, lead, ax), _from_rows(y_lo, lead, ax)
    if known:
        layout = None if ax == len(lead) else (  # the axes but ax, then ax
            lead + (y_hi.shape[-1],), tuple(d for d in range(len(lead) + 1) if d != ax) + (ax,))
        note_parts(out, lo, words, layout)
    return DoubleWord.of_words(out, lo)  # (the kernels' words: one shape and dtype)


def _rows_of_words(x, ax: int, n: int, rows: int) -> tuple | None:
    """float32 (rows, 2n) words of the rows of the complex DoubleWord ``x`` along
    ``ax``, fitted to n, made from the float32 words a kernel wrote that x's words
    view (:func:`~mlx_precise.doubleword.fusion.rows_of`: a fused program's, a
    transform's): one transpose of them as (..., m, 2) and a reshape, the same
    floats as :func:`_to_rows` of x's complex words and their float32 view (which
    move x's axes back and forth, in views of views); None where none are known."""
    src = rows_of(x) if isinstance(x, DoubleWord) else None
    if src is None:
        return None
    words, (shape, axes) = src[:2], src[2:]
    target = tuple(d for d in range(x.ndim) if d != ax) + (ax,)
    perm = [axes.index(d) for d in target] + [len(axes)]
    z = fusion.packed(*words) if perm[0] == 0 else None
    if z is not None:  # both words at once: their packed array, its first axis first
        shape = (2 * shape[0],) + tuple(shape[1:])
        return fusion.unpacked(_rows_of_pairs(z, shape, perm, n, 2 * rows), (rows, 2 * n))
    return tuple(_rows_of_pairs(w, shape, perm, n, rows) for w in words)


def _rows_of_pairs(w: mx.array, shape: tuple, perm: list, n: int, rows: int) -> mx.array:
    """float32 (rows, 2n) rows of complex words of ``shape`` held as float32 (re, im)
    pairs ``w`` (any shape of that size): one transpose by ``perm`` of them as
    (..., m, 2), m fitted to n, and a reshape (:func:`_rows_of_words`); where
    neither is needed, the reshape alone."""
    if shape[-1] == n and perm == sorted(perm):
        return w.reshape(rows, 2 * n)
    a = w.reshape(tuple(shape) + (2,))
    if perm != sorted(perm):
        a = a.transpose(perm)
    m = a.shape[-2]
    if m > n:
        a = a[..., :n, :]
    elif m < n:  # zeros, as _fit pads the complex words
        a = mx.pad(a, [(0, 0)] * (a.ndim - 2) + [(0, n - m), (0, 0)])
    return a.reshape(rows, 2 * n)


def _empty(lead: tuple, m: int, dtype, ax: int, round_output: bool):
    """The (empty) result of a transform with no rows."""
    z = mx.zeros(lead + (m,), dtype)
    return _finish(z, z, lead, ax, round_output)


def _growth_log2(n: int) -> int:
    """log2 of a bound on |intermediate| / max|input| in the complex transform of
    length n: n for the Stockham passes (partial sums of up to n terms, the 1/n of
    an inverse applied last), M^3 for Bluestein's (chirp product, FFT of length M,
    times a spectrum of at most 2n - 1 < M, inverse FFT of length M)."""
    if n <= 1:
        return 0
    if _is_pow2(n):
        return n.bit_length()
    return 3 * (_next_pow2(2 * n - 1).bit_length() - 1) + 1


class _RowScale(NamedTuple):
    """The range scaling of :mod:`mlx_precise.doubleword.pow2scale` done by the
    kernels themselves: the first kernel of a transform loads each row times 2^-e
    (``load``), the last stores it times 2^e (``store``), e computed per row from
    ``rmax`` (float32 (max(rows, 8),): max |x| of each row) and ``growth`` as
    :func:`~mlx_precise.doubleword.pow2scale.row_exponents` computes it
    (``fft_row_exponent`` in ``fft.h``); ``per_part``: the special-value rule of
    the store part by part (the kernel's complex points are pairs of real results).
    One reduction on the host instead of the exponents' and the scalings' glue."""

    rmax: mx.array
    growth: int
    load: bool = True
    store: bool = True
    per_part: bool = False

    @property
    def key(self) -> tuple:
        """(growth, load, store, per_part): what a launch plan depends on."""
        return self[1:]


def _row_scale_fields(key: tuple | None, first: bool, last: bool) -> dict:
    """The ``rs_*`` params of a kernel that is the transform's ``first`` / ``last``,
    for a :attr:`_RowScale.key` (None: no row scaling)."""
    if key is None:
        return _NO_ROW_SCALE
    growth, load, store, per_part = key
    return dict(rs_in=first and load, rs_out=last and store, rs_per_part=per_part,
                rs_growth=growth)


_NO_ROW_SCALE = dict(rs_in=False, rs_out=False, rs_per_part=False, rs_growth=0)


def _stage(rs: _RowScale | None, load: bool | None = None, store: bool | None = None,
           per_part: bool | None = None) -> _RowScale | None:
    """``rs`` for one kernel stage of a transform (``load`` / ``store`` / ``per_part``
    changed where given), or None (also when the stage scales nothing)."""
    if rs is None:
        return None
    load = rs.load if load is None else load
    store = rs.store if store is None else store
    if not (load or store):
        return None
    per_part = rs.per_part if per_part is None else per_part
    return _RowScale(rs.rmax, rs.growth, load, store, per_part)


def _in_range(run, hi, lo, growth_log2: int, load: bool, store: bool, seen=None):
    """``run(hi, lo, rs)`` on rows scaled by exact powers of two so that no
    intermediate overflows (:mod:`mlx_precise.doubleword.pow2scale`), and its result
    scaled back: by the transform's first kernel (``load``) and last (``store``),
    told so by ``rs`` (a :class:`_RowScale`), else by MLX ops around ``run`` (the
    Bluestein ends of a transform: a complex product). ``seen``: the rows whose
    maxima count, where ``hi`` holds complex rows as float32 words (their complex
    view: |z|, not |re| and |im|)."""
    m = pow2scale.row_maxima(hi if seen is None else seen)
    rs = _RowScale(_flat(m), growth_log2, load, store) if load or store else None
    if not (load and store):
        e = pow2scale.exponents(m, growth_log2)
    if not load:
        hi, lo = pow2scale.scale_all(e, hi, lo)
    y_hi, y_lo = run(hi, lo, rs)
    return (y_hi, y_lo) if store else pow2scale.unscale(y_hi, y_lo, e)


def _is_pow2(n: int) -> bool:
    return n & (n - 1) == 0


# ---- power-of-two complex FFT -----------------------------------------------------


def _plan(logn: int) -> list[int]:
    """log2 radices of the passes: as few passes as threadgroup memory allows
    (radix <= 1024), as equal as possible (larger first)."""
    passes = -(-logn // _LOG_TG)
    base, extra = divmod(logn, passes)
    return [base + 1] * extra + [base] * (passes - extra)


def _fft_pow2(hi, lo, rows: int, n: int, *, inverse: bool, scale_den: int, lo_out: bool,
              backend: str, stream, nt: int | None = None, rs: _RowScale | None = None):
    """Complex FFT of length n = 2^k >= 2 of each row of words ``hi``, ``lo``
    (float32, rows * n * 2 words or more, read flat; lo None for plain complex64
    data). Returns (y_hi, y_lo or None) shaped by :func:`_words`; the result is scaled by 1/scale_den.
    ``nt``: order of the twiddle table (a multiple of n, default n); ``rs``: the
    row scaling of the first and last passes. What the passes derive from the
    sizes (parameter buffers, grids, output shapes) is planned once per key
    (:func:`_pass_plan`): a repeated layer pays a lookup and MLX's launches."""
    hi, lo, plane = _packed_input(hi, lo)
    key = ("pass", rows, n, nt or n, inverse, scale_den, lo is not None, lo_out,
           None if rs is None else rs.key, plane)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _cache(key, _pass_plan(*key[1:]))
    rmax = _dummy() if rs is None else rs.rmax
    tab = twiddle_table(key[3])
    backend = backends.resolve(backend)
    for params, grid, tg, shapes, keep_lo in plan:
        # (the declared inputs by construction: float32 words of >= 8 elements,
        # int32 params: no per-launch checks); the next pass reads the packed
        # words as both of its word inputs
        (hi,) = FFT_PASS.unchecked(
            inputs=[hi, lo if lo is not None else _dummy(), tab, rmax, params], template=None,
            grid=grid, threadgroup=tg, output_shapes=shapes,
            output_dtypes=[mx.float32], backend=backend, stream=stream)
        lo = hi if keep_lo else None
    return _unpacked(hi, lo, _words(rows, n))


def _packed_input(hi: mx.array, lo: mx.array | None):
    """``(hi, lo, plane)`` for a kernel's word inputs: where ``hi``, ``lo`` are the
    halves of a kernel's packed output (:func:`~mlx_precise.doubleword.fusion.packed`),
    that output as both and its plane (the low words' offset in floats), else
    ``(hi, lo, 0)``."""
    z = None if lo is None else fusion.packed(hi, lo)
    return (hi, lo, 0) if z is None else (z, z, z.size // 2)


def _unpacked(y: mx.array, lo: mx.array | None, shape: tuple):
    """A transform's result as its kernel wrote it: ``(y, None)`` (high words only)
    or the halves of the packed words ``y`` of float32 words of ``shape`` (recorded
    as such: the next kernel reads ``y`` itself)."""
    return (y, None) if lo is None else fusion.unpacked(y, shape)


_PLANS: dict = {}  # ("pass" | "real", a launch's key) -> its plan (the oldest first out)
_PLAN_CACHE = 1024


def _cache(key, plan):
    """``plan`` stored under ``key`` in :data:`_PLANS`; returns it."""
    _PLANS[key] = plan
    if len(_PLANS) > _PLAN_CACHE:
        _PLANS.pop(next(iter(_PLANS)), None)
    return plan


def _pass_plan(rows: int, n: int, nt: int, inverse: bool, scale_den: int, lo_in: bool,
               lo_out: bool, rs_key, plane: int) -> tuple:
    """The launches of :func:`_fft_pow2` for its key: per pass (params, grid,
    threadgroup, output shapes, whether its low words are kept). ``plane``: the
    offset of the first pass's low words in its x_lo (packed words; 0 otherwise);
    every later pass reads the packed output of the one before."""
    logn = n.bit_length() - 1
    logs = _plan(logn)
    s_hi, s_lo = _scale_bits(scale_den)
    size = _words(rows, n)
    plan, log_ns = [], 0
    for i, log_r in enumerate(logs):
        last = i == len(logs) - 1
        groups = rows << (logn - log_r)
        log_c = min(_LOG_TG - log_r, max(groups - 1, 0).bit_length())
        npts = 1 << (log_r + log_c)
        threads = min(_THREADS, max(npts // 4, 1))
        tgs = -(-groups // (1 << log_c))
        keep_lo = lo_out or not last
        params = FFT_PASS_PARAMS.pack(
            logn=logn, log_r=log_r, log_ns=log_ns, log_c=log_c, groups=groups,
            log_nt=nt.bit_length() - 1, inverse=inverse, lo_in=lo_in if i == 0 else True,
            lo_out=keep_lo, lo_at=plane if i == 0 else math.prod(size),
            out_lo_at=math.prod(size) if keep_lo else 0, scaled=last and scale_den != 1,
            scale_hi=s_hi if last else 0, scale_lo=s_lo if last else 0,
            **_row_scale_fields(rs_key, i == 0, last))
        plan.append((params, (tgs * threads, 1, 1), (threads, 1, 1),
                     [fusion.packed_shape(size) if keep_lo else size], keep_lo))
        log_ns += log_r
    return tuple(plan)


# ---- Bluestein (chirp-z) for other sizes ------------------------------------------


def _next_pow2(v: int) -> int:
    return 1 << max(v - 1, 0).bit_length()


def _complex_words(words: np.ndarray) -> DoubleWord:
    """A complex DoubleWord from float32 words (..., 4) = (re hi, re lo, im hi, im lo)."""
    hi = words[..., 0] + 1j * words[..., 2].astype(np.complex64)
    lo = words[..., 1] + 1j * words[..., 3].astype(np.complex64)
    return DoubleWord(mx.array(hi.astype(np.complex64)), mx.array(lo.astype(np.complex64)))


@functools.lru_cache(maxsize=32)
def _chirp(n: int, inverse: bool, scale_den: int) -> DoubleWord:
    """c_k / scale_den, c_k = exp(-+pi i k^2 / n): complex DoubleWord (n,)."""
    return _complex_words(chirp_words(n, conj=inverse, scale_den=scale_den))


@functools.lru_cache(maxsize=32)
def _bluestein_kernel(n: int, inverse: bool, backend: str) -> DoubleWord:
    """FFT_M of b, b_m = conj(c_|m|) for |m| < n wrapped mod M, zero elsewhere
    (c conjugated for the inverse): (M,) DoubleWord, computed once per size."""
    m_len = _next_pow2(2 * n - 1)
    words = chirp_words(n, conj=not inverse)
    b = np.zeros((m_len, 4), np.float32)
    b[:n] = words
    b[m_len - n + 1:] = words[1:][::-1]
    b = _complex_words(b)
    hi, lo = _fft_pow2(_flat(b.hi), _flat(b.lo), 1, m_len, inverse=False, scale_den=1,
                       lo_out=True, backend=backend, stream=None)
    out = DoubleWord(_unflat(hi, 1, m_len)[0], _unflat(lo, 1, m_len)[0])
    mx.eval(out.hi, out.lo)
    return out


def _bluestein(hi, lo, rows: int, n: int, *, inverse: bool, scale_den: int, lo_out: bool,
               backend: str, stream):
    """Bluestein's FFT of length n (any n >= 2) of complex64 (rows, n) words:
    X_k = c_k sum_j (x_j c_j) conj(c_(k-j)), c_k = exp(-pi i k^2 / n), the
    convolution by power-of-two FFTs of length M >= 2n - 1, all in double-word.
    Returns complex64 (rows, n) words (hi, lo or None), scaled by 1/scale_den."""
    m_len = _next_pow2(2 * n - 1)
    a_hi, a_lo = _times_row(hi, lo if lo is not None else mx.zeros_like(hi),
                            _chirp(n, inverse, 1), False, backend, stream)
    a_hi, a_lo = _to_rows(a_hi, 1, m_len), _to_rows(a_lo, 1, m_len)
    f_hi, f_lo = _fft_pow2(_flat(a_hi), _flat(a_lo), rows, m_len, inverse=False, scale_den=1,
                           lo_out=True, backend=backend, stream=stream)
    p_hi, p_lo = _times_row(_unflat(f_hi, rows, m_len), _unflat(f_lo, rows, m_len),
                            _bluestein_kernel(n, inverse, backend), False, backend, stream)
    g_hi, g_lo = _fft_pow2(_flat(p_hi), _flat(p_lo), rows, m_len, inverse=True,
                           scale_den=m_len, lo_out=True, backend=backend, stream=stream)
    return _times_row(_unflat(g_hi, rows, m_len)[:, :n], _unflat(g_lo, rows, m_len)[:, :n],
                      _chirp(n, inverse, scale_den), not lo_out, backend, stream)


def _times_row(hi, lo, c: DoubleWord, round_output: bool, backend, stream):
    """The complex double-word product of each row of complex64 (rows, m) words
    (hi, lo) and the (m,) DoubleWord c: (hi, lo) complex64 (rows, m), lo None when
    ``round_output`` (the high word then rounded once). The ``ext_cmul`` launch of
    :func:`~mlx_precise.doubleword.elementwise.complex_multiply_extended` (c's words
    broadcast to the rows, read through their strides: the same kernel, inputs and
    bits) without its argument checks, planned once per shape."""
    shape = tuple(hi.shape)
    key = ("cmul", shape, round_output)
    plan = _PLANS.get(key)
    if plan is None:
        size = math.prod(shape)
        grid, tg = elementwise_grid(size)
        plan = _cache(key, (mx.array(np.int32(size)), [("ROUND", round_output)], grid, tg,
                            [shape if round_output else fusion.packed_shape(shape)]))
    size, template, grid, tg, shapes = plan
    (y,) = CMUL.unchecked(
        inputs=[hi, lo, mx.broadcast_to(c.hi, shape), mx.broadcast_to(c.lo, shape), size],
        template=template, grid=grid, threadgroup=tg, output_shapes=shapes,
        output_dtypes=[mx.complex64], backend=backends.resolve(backend), stream=stream)
    return (y, None) if round_output else fusion.unpacked(y, shape)


def _cfft_rows(hi, lo, rows: int, n: int, *, inverse: bool, scale_den: int, lo_out: bool,
               backend: str, stream, nt: int | None = None, rs: _RowScale | None = None,
               words: bool = False):
    """Complex FFT (unnormalised, times 1/scale_den) of complex64 (rows, n) words
    (or their float32 (rows, 2n) views). Returns complex64 (rows, n) (hi, lo or
    None); with ``words``, float32 words as a kernel wrote them (:func:`_words`):
    a kernel reading them next needs no view of them. ``rs``: the kernels' row
    scaling (powers of two n >= 2 only)."""
    assert rs is None or (n > 1 and _is_pow2(n))
    if n == 1 or not _is_pow2(n):
        hi, lo = _complex(hi), _complex(lo)
        if n == 1:  # the identity; callers never ask for a scale here
            y = hi, (lo if lo is not None or not lo_out else mx.zeros_like(hi))
        else:
            y = _bluestein(hi, lo, rows, n, inverse=inverse, scale_den=scale_den,
                           lo_out=lo_out, backend=backend, stream=stream)
        return tuple(a.view(mx.float32) if words and a is not None else a for a in y)
    y_hi, y_lo = _fft_pow2(_flat(hi), None if lo is None else _flat(lo), rows, n,
                           inverse=inverse, scale_den=scale_den, lo_out=lo_out,
                           backend=backend, stream=stream, nt=nt, rs=rs)
    if words:
        return y_hi, y_lo
    return _unflat(y_hi, rows, n, True), None if y_lo is None else _unflat(y_lo, rows, n, True)


def _real_kernel(hi, lo, rows: int, big_n: int, *, pre: bool, scale_den: int, lo_out: bool,
                 backend: str, stream, rs: _RowScale | None = None, words: bool = False):
    """fft_real on complex64 words (rows, N) [post] or (rows, N + 1) [pre] (or
    their float32 views); returns complex64 (rows, N + 1) [post] or (rows, N) [pre]
    words (``words``: float32, as the kernel wrote them). ``rs``: its
    row scaling (the kernel is both the first and the last of its transform; ``rs``
    says which scalings it does)."""
    per_row = big_n if pre else big_n + 1
    hi, lo, plane = _packed_input(_flat(hi), None if lo is None else _flat(lo))
    key = ("real", rows, big_n, pre, scale_den, lo is not None, lo_out,
           None if rs is None else rs.key, plane)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _cache(key, _real_plan(*key[1:]))
    params, grid, tg, shapes = plan
    (y,) = FFT_REAL.unchecked(
        inputs=[hi, _dummy() if lo is None else lo, twiddle_table(2 * big_n),
                _dummy() if rs is None else rs.rmax, params],
        template=None, grid=grid, threadgroup=tg, output_shapes=shapes,
        output_dtypes=[mx.float32], backend=backends.resolve(backend), stream=stream)
    y_hi, y_lo = _unpacked(y, y if lo_out else None, _words(rows, per_row))
    if words:
        return y_hi, y_lo
    return (_unflat(y_hi, rows, per_row, True),
            _unflat(y_lo, rows, per_row, True) if lo_out else None)


def _real_plan(rows: int, big_n: int, pre: bool, scale_den: int, lo_in: bool, lo_out: bool,
               rs_key, plane: int) -> tuple:
    """The launch of :func:`_real_kernel` for its key: (params, grid, threadgroup,
    output shapes)."""
    per_row = big_n if pre else big_n + 1
    s_hi, s_lo = _scale_bits(scale_den)
    size = _words(rows, per_row)
    params = FFT_REAL_PARAMS.pack(n_half=big_n, rows=rows, pre=pre, lo_in=lo_in,
                                  lo_out=lo_out, lo_at=plane,
                                  out_lo_at=math.prod(size) if lo_out else 0,
                                  scaled=scale_den != 1, scale_hi=s_hi, scale_lo=s_lo,
                                  **_row_scale_fields(rs_key, True, True))
    total = rows * per_row
    return (params, (total, 1, 1), (min(_THREADS, total), 1, 1),
            [fusion.packed_shape(size) if lo_out else size])


def _rfft_rows(hi, lo, rows: int, n: int, *, lo_out: bool, backend: str, stream,
               rs: _RowScale | None = None):
    """rfft of float32 (rows, n) words (lo None: plain float32): complex64
    (rows, n//2 + 1) words (hi, lo or None). ``rs``: the kernels' row scaling
    (:func:`_real_folds` sizes)."""
    m = n // 2 + 1
    if n % 2:  # odd: the complex transform of x + 0i, cut to n//2 + 1 points
        y_hi, y_lo = _cfft_rows(hi.astype(mx.complex64),
                                None if lo is None else lo.astype(mx.complex64), rows, n,
                                inverse=False, scale_den=1, lo_out=lo_out,
                                backend=backend, stream=stream)

        def cut(a):  # X_0 of real data is real: drop its imaginary residue (~1e-16)
            return mx.concatenate([mx.real(a[:, :1]).astype(mx.complex64), a[:, 1:m]], axis=1)

        return cut(y_hi), None if y_lo is None else cut(y_lo)
    # z_j = x_2j + i x_2j+1 (x's words read as complex: no view needed), half-length
    # FFT, post-processing; the kernels pass words on as they wrote them.
    big_n = n // 2
    z_hi, z_lo = hi, lo  # (rows, n) (_to_rows)
    if big_n > 1:
        z_hi, z_lo = _cfft_rows(z_hi, z_lo, rows, big_n, inverse=False, scale_den=1,
                                lo_out=True, backend=backend, stream=stream, nt=n,
                                rs=_stage(rs, store=False), words=True)
        rs = _stage(rs, load=False)
    return _real_kernel(z_hi, z_lo, rows, big_n, pre=False, scale_den=1, lo_out=lo_out,
                        backend=backend, stream=stream, rs=rs)


def _real_folds(n: int) -> tuple[bool, bool]:
    """(first, last): whether the half-length complex FFT of a real transform of
    length n (rfft; irfft the other way round) scales the rows itself (N = n / 2 a
    power of two: Stockham's passes, or no FFT), and whether its fft_real kernel
    does (n even)."""
    return n % 2 == 0 and _is_pow2(n // 2), n % 2 == 0


def _hermitian_extend(a, n: int):
    """Full spectrum (rows, n) from the rfft half (rows, n//2 + 1): X_(n-k) =
    conj(X_k) (exact word operations)."""
    if a is None:
        return None
    return mx.concatenate([a, mx.conj(a[:, n - n // 2 - 1:0:-1])], axis=1)


# ---- the cpu backend: native float64 --------------------------------------------


def _float64(x) -> tuple[np.ndarray, mx.array | None]:
    """(x's float64 / complex128 value as a numpy array the transform may overwrite
    (scipy.fft and numpy overwrite complex inputs only), the MLX array that holds
    it or None): a DoubleWord's carried float64 value where it has one, read
    through views (``np.array``'s copies measured ~10x slower here: fresh pages;
    real: a read-only view, complex: its parts in a buffer of MLX's allocator,
    :func:`.cpu.buffer`), else its words joined."""
    if isinstance(x, DoubleWord):
        if x.wide is None:
            return x.to_float64(), None
        re, im = (None if v is None else np.asarray(v) for v in x.wide)
        if im is None:
            re.flags.writeable = False
            return re, None
        a, z = cpu.buffer(x.shape, True)
        z.real, z.imag = re, im
        return z, a
    a = np.asarray(x)  # a view of the MLX buffer: the float64 copy is the only one
    return a.astype(np.complex128 if np.iscomplexobj(a) else np.float64), None


def cpu_transform(steps, x, factor, round_output: bool):
    """The cpu backend's transform: the float64 steps ((kind, n, axis), in order,
    :func:`.cpu.chain`) of x's float64 value, times ``factor`` (a float, or None),
    rounded once (or kept whole: a DoubleWord of the float64 value, no copy where
    the result lies in a buffer of MLX's allocator)."""
    y, a = cpu.chain(steps, *_float64(x))
    if factor is not None:  # (the float64 product scale_extended makes on cpu)
        cpu.scale(y, factor)
    if round_output or a is None:
        return from_float64_result(y, round_output)
    with mx.stream(mx.cpu):
        return from64(a[..., 0], a[..., 1]) if np.iscomplexobj(y) else from64(a)


# ---- public API --------------------------------------------------------------------


def _complex_transform(x, n, axis, inverse, round_output, backend, stream, scaled=True):
    x = read_input(x, "x", "words", ANY)
    ax = _check_axis(x.ndim, axis, "x")
    n = _check_n(n, x.shape[ax])
    name = backends.resolve(backend)
    if name.float64_engine:
        return cpu_transform([("ifft" if inverse else "fft", n, ax)], x,
                             None if scaled or not inverse else float(n), round_output)
    real_in = x.dtype == mx.float32
    hi, lo = _hi_lo(x, complex_out=inverse)
    lead, rows = _batch(hi, ax)
    if rows == 0:
        return _empty(lead, n, mx.complex64, ax, round_output)
    stockham = n > 1 and _is_pow2(n)  # its first and last passes scale the rows
    # (Stockham's passes read float32 words as they are; Bluestein's reads complex)
    hi, lo, seen = _rows(x, hi, lo, ax, n, rows, stockham and not real_in)
    if real_in and not inverse:  # half the work, and exact Hermitian symmetry
        y_hi, y_lo = _in_range(
            lambda h, l, rs: _rfft_rows(h, l, rows, n, lo_out=not round_output, backend=name,
                                        stream=stream, rs=rs),
            hi, lo, _growth_log2(n) + 1, *_real_folds(n))
        y_hi, y_lo = _hermitian_extend(y_hi, n), _hermitian_extend(y_lo, n)
    else:
        y_hi, y_lo = _in_range(
            lambda h, l, rs: _cfft_rows(h, l, rows, n, inverse=inverse,
                                        scale_den=n if inverse and scaled else 1,
                                        lo_out=not round_output, backend=name, stream=stream,
                                        rs=rs),
            hi, lo, _growth_log2(n), stockham, stockham, seen)
    return _finish(y_hi, y_lo, lead, ax, round_output)


def _rows(x, hi, lo, ax: int, n: int, rows: int, words: bool):
    """(hi rows, lo rows, the complex rows whose maxima count or None): where
    ``words`` and x's float32 words are known, :func:`_rows_of_words` (the kernels
    read them as they are), else :func:`_to_rows` of the complex words ``hi``,
    ``lo``."""
    w = _rows_of_words(x, ax, n, rows) if words else None
    if w is None:
        return _to_rows(hi, ax, n), _to_rows(lo, ax, n), None
    return w[0], w[1], w[0].view(mx.complex64)


def _rfft_words(x, n, axis, round_output, backend, stream):
    x = read_input(x, "x", "words", REAL)
    ax = _check_axis(x.ndim, axis, "x")
    n = _check_n(n, x.shape[ax])
    name = backends.resolve(backend)
    if name.float64_engine:
        return cpu_transform([("rfft", n, ax)], x, None, round_output)
    hi, lo = _hi_lo(x, complex_out=False)
    lead, rows = _batch(hi, ax)
    if rows == 0:
        return _empty(lead, n // 2 + 1, mx.complex64, ax, round_output)
    y_hi, y_lo = _in_range(
        lambda h, l, rs: _rfft_rows(h, l, rows, n, lo_out=not round_output, backend=name,
                                    stream=stream, rs=rs),
        *_rows_pair(hi, lo, ax, n), _growth_log2(n) + 1, *_real_folds(n))
    return _finish(y_hi, y_lo, lead, ax, round_output)


def _irfft_words(X, n, axis, round_output, backend, stream, scaled=True):
    X = read_input(X, "X", "words", ANY)
    ax = _check_axis(X.ndim, axis, "X")
    n = _check_n(n, 2 * (X.shape[ax] - 1))
    name = backends.resolve(backend)
    if name.float64_engine:
        return cpu_transform([("irfft", n, ax)], X, None if scaled else float(n), round_output)
    hi, lo = _hi_lo(X, complex_out=True)
    lead, rows = _batch(hi, ax)
    if rows == 0:
        return _empty(lead, n, mx.float32, ax, round_output)
    m = n // 2 + 1
    growth = _growth_log2(n) if n % 2 else _growth_log2(n // 2) + 2  # + pre-processing
    # (an even length's kernels read float32 words as they are; an odd one's, complex)
    hi, lo, seen = _rows(X, hi, lo, ax, m, rows, n % 2 == 0)
    y_hi, y_lo = _in_range(
        lambda h, l, rs: _irfft_rows(h, l, rows, n, round_output, name, stream, rs,
                                     n if scaled else 1),
        hi, lo, growth, *_real_folds(n)[::-1], seen)
    return _finish(y_hi, y_lo, lead, ax, round_output)


def _irfft_rows(hi, lo, rows: int, n: int, round_output: bool, name: str, stream,
                rs: _RowScale | None = None, scale_den: int | None = None):
    """irfft of complex64 (rows, n//2 + 1) words: float32 (rows, n) (hi, lo or None),
    times 1/scale_den (default n: numpy's irfft). ``rs``: the kernels' row scaling
    (:func:`_real_folds` sizes)."""
    den = n if scale_den is None else scale_den
    m = n // 2 + 1
    if n % 2:  # odd: Hermitian extension to n points, complex inverse, real part
        def extend(a):
            first = mx.real(a[:, :1]).astype(mx.complex64)  # Im X_0 ignored
            return mx.concatenate([first, a[:, 1:], mx.conj(a[:, m - 1:0:-1])], axis=1)

        y_hi, y_lo = _cfft_rows(extend(hi), None if lo is None else extend(lo), rows, n,
                                inverse=True, scale_den=den, lo_out=not round_output,
                                backend=name, stream=stream)
        y_hi = mx.real(y_hi)
        y_lo = None if y_lo is None else mx.real(y_lo)
    else:
        big_n = n // 2
        single = big_n == 1  # no complex FFT runs: the kernel applies the 1/den
        rs = _stage(rs, per_part=True)  # the result's words are real
        z_hi, z_lo = _real_kernel(hi, lo, rows, big_n, pre=True, scale_den=den if single else 1,
                                  lo_out=not (single and round_output), backend=name,
                                  stream=stream, rs=_stage(rs, store=single),  # N = 1: folds
                                  words=True)
        if not single:
            z_hi, z_lo = _cfft_rows(z_hi, z_lo, rows, big_n, inverse=True, scale_den=den,
                                    lo_out=not round_output, backend=name, stream=stream,
                                    nt=n, rs=_stage(rs, load=False), words=True)
        # z: the kernels' float32 words, (rows, n) as they are
        y_hi = _word_rows(z_hi, rows, n)
        y_lo = None if z_lo is None else _word_rows(z_lo, rows, n)
    return y_hi, y_lo


def transform_words(kind: str, x, n, axis, round_output: bool, backend, stream,
                    scaled: bool = True):
    """One 1-D transform ``kind`` (fft, ifft, rfft, irfft) with no autodiff
    wrapper: the building block of :mod:`mlx_precise.fft.nd`. ``scaled=False``: an
    inverse (ifft, irfft) without its 1/n (the kernel backends; norm="forward")."""
    if kind in ("fft", "ifft"):
        return _complex_transform(x, n, axis, kind == "ifft", round_output, backend, stream,
                                  scaled)
    if kind == "irfft":
        return _irfft_words(x, n, axis, round_output, backend, stream, scaled)
    return _rfft_words(x, n, axis, round_output, backend, stream)
