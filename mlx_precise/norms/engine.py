"""Matrix norms with LAPACK semantics, accurate to the last bit (SLATE-style tiles).

:func:`norm` computes the max, one, infinity or Frobenius norm of a general,
trapezoidal, symmetric or Hermitian matrix exactly as LAPACK's xLANGE, xLANTR,
xLANSY and xLANHE define it (LAPACK's reference documentation): which entries are
read, the unit diagonal, the ignored imaginary part of a Hermitian diagonal, 0 for
an empty matrix, NaN and Inf propagation with LAPACK's NaN-aware maximum.

* float32 / complex64 input runs two Metal kernels (backend ``metal`` or
  ``emulate``): ``norm_tile`` gives one threadgroup to each ``tile x tile`` tile, as
  SLATE gives one thread block to each tile, and writes tile partials; sums of
  ``|a|`` and of squares are double-word (``metal/include/norms.h``), the Frobenius
  norm uses Blue's three scaled accumulators, so nothing overflows or underflows;
  ``norm_reduce`` adds the partials in double-word and rounds once. The float32
  result is correctly rounded except when the exact norm lies within ~2^-36 (relative)
  of a float32 rounding boundary, and within 1 ulp (docs/norms.md: the bound).
* float64 / complex128 data, and any input on the ``cpu`` backend, use native
  float64 numpy code with the same semantics (double-double sums, Blue's scaling
  with float64's constants).

A matrix sharded over an ``mx.distributed`` group is handled by
:mod:`mlx_precise.norms.distributed` (``norm(..., group=, layout=)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ..doubleword.types import read_input
from ..core.cputhreads import map_runs, workers_for
from ..core.kernels import Codes, Kernel, ParamLayout, generated_block
from ..core.backends import Backend

__all__ = ["NORM_TILE", "NORM_REDUCE", "DEFAULT_TILE", "KIND", "STRUCTURE", "NORM_TILE_PARAMS",
           "NORM_REDUCE_PARAMS", "RECORDS"]

DEFAULT_TILE = 64
_MAX_THREADS = 256  # threadgroup size cap of both kernels (their threadgroup arrays)
_REDUCE_THREADS = 256
_IDENTITY_BLOCK = 1 << 30  # a "block" larger than any axis: global index = local

KIND = Codes("NORM_KIND", ("max", "one", "inf", "fro"))
"""The norm kinds, as the kernels see them (``NORM_KIND_MAX`` ... in
``metal/include/norms.h``)."""
MAX, ONE, INF, FRO = (KIND[n] for n in ("max", "one", "inf", "fro"))

STRUCTURE = Codes("NORM_STRUCTURE", ("general", "trapezoid", "symmetric", "hermitian"))
"""The matrix structures (``NORM_STRUCTURE_GENERAL`` ...)."""
GENERAL, TRAPEZOID, SYMMETRIC, HERMITIAN = (
    STRUCTURE[n] for n in ("general", "trapezoid", "symmetric", "hermitian"))

NORM_TILE_PARAMS = ParamLayout("NORM_TILE", (
    "m", "n",        # the local block's size
    "nb",            # the tile size
    "kind",          # a KIND code ("inf" of a symmetric matrix as "one")
    "structure",     # a STRUCTURE code
    "upper",         # 1: upper triangle / trapezoid
    "unit",          # 1: unit diagonal (trapezoid only)
    "complex",       # 1: (re, im) float pairs
    "l",             # length of a partial line vector (global n or m)
    "rowpart",       # first partial row of the symmetric row mode
    # The affine block-cyclic maps from local to global row and column indices,
    # g = off + (l / blk) * stride + l % blk (identity: off 0, blk >= size).
    "roff", "rblk", "rstride", "coff", "cblk", "cstride",
), size=16)
"""The int32 ``p`` buffer of :data:`NORM_TILE` (``NORM_TILE_M`` ... in
``metal/include/norms.h``)."""

RECORDS = Codes("NORM_RECORDS", ("lines", "blue"))
"""What :data:`NORM_REDUCE` reduces: ``lines``, records of two double-word classes
of a line sum (4 floats; a max-norm partial is (value, 0, 0, 0)); ``blue``, Blue's
three accumulators of a Frobenius norm, one double-word pair per line (2 floats)."""

NORM_REDUCE_PARAMS = ParamLayout("NORM_REDUCE", (
    "nr",       # records per line
    "l",        # lines
    "records",  # a RECORDS code
), size=8)
"""The int32 ``p`` buffer of :data:`NORM_REDUCE` (``NORM_REDUCE_NR`` ...)."""


def codes_source() -> str:
    """The generated block of ``metal/include/norms.h`` (a test checks that the header
    holds exactly this text)."""
    return generated_block("mlx_precise.norms.engine.codes_source()", KIND, STRUCTURE,
                           NORM_TILE_PARAMS, RECORDS, NORM_REDUCE_PARAMS)


NORM_TILE = Kernel(
    name="norm_tile",
    body="norm_tile.metal",
    headers=("norms.h",),
    inputs=("a", "p"),
    outputs=("part",),
    input_dtypes={"a": (mx.float32,), "p": (mx.int32,)},
    extended=True,
    variants={"part": (mx.float32,)},
)
"""Tile partials: ``a`` float32 (flat local block, complex as (re, im) pairs, at
least 8 values), ``p`` int32 (:data:`NORM_TILE_PARAMS`); output ``part`` float32 (flat, zero
initialised). See ``metal/kernels/norm_tile.metal``."""

NORM_REDUCE = Kernel(
    name="norm_reduce",
    body="norm_reduce.metal",
    headers=("norms.h",),
    inputs=("part", "p"),
    outputs=("sums", "result"),
    input_dtypes={"part": (mx.float32,), "p": (mx.int32,)},
    extended=True,
    variants={"sums": (mx.float32,), "result": (mx.float32,)},
    input_forms={"part": ("device",)},  # _pad8
)
"""Reduction of ``part`` float32 (NR x L records: 4 floats, the two double-word
classes of a line sum, or 2 floats, one pair, for Frobenius) with ``p`` int32
(:data:`NORM_REDUCE_PARAMS`) to ``sums`` (the L records summed over NR) and ``result``
(the float32 norm). See ``metal/kernels/norm_reduce.metal``."""

# ---- argument checking --------------------------------------------------------

_KINDS = {"max": MAX, "m": MAX, "one": ONE, "1": ONE, "o": ONE, "inf": INF, "i": INF,
          "fro": FRO, "f": FRO, "e": FRO}
_KIND_NAMES = KIND.names
_STRUCTURES = STRUCTURE.names
_UPLO = {"lower": False, "l": False, "upper": True, "u": True}
_DIAG = {"nonunit": False, "n": False, "unit": True, "u": True}
_KERNEL_DTYPES = (mx.float32, mx.complex64)


def _choice(value, table, name, expected):
    if isinstance(value, str) and value.lower() in table:
        return table[value.lower()]
    raise ValueError(f"{name} must be {expected}, got {value!r}")


@dataclass(frozen=True)
class Spec:
    """A validated norm request (codes as the kernels use them)."""

    kind: int  # a KIND code
    structure: int  # a STRUCTURE code
    upper: bool
    unit: bool
    complex: bool

    @property
    def symmetric(self) -> bool:
        return self.structure in (SYMMETRIC, HERMITIAN)


def make_spec(kind, structure, uplo, diag, complex_: bool) -> Spec:
    """Check the norm options; raise ValueError naming the bad one."""
    k = _choice(kind, _KINDS, "kind",
                "one of 'max', 'one', 'inf', 'fro' (or LAPACK's 'M', '1', 'O', 'I', 'F', 'E')")
    if not (isinstance(structure, str) and structure.lower() in _STRUCTURES):
        raise ValueError(f"structure must be one of {', '.join(map(repr, _STRUCTURES))}, "
                         f"got {structure!r}")
    s = STRUCTURE[structure.lower()]
    upper = _choice(uplo, _UPLO, "uplo", "'lower' or 'upper' (or 'L', 'U')")
    unit = _choice(diag, _DIAG, "diag", "'nonunit' or 'unit' (or 'N', 'U')")
    if unit and s != TRAPEZOID:
        raise ValueError(f"diag='unit' applies only to structure='trapezoid', got "
                         f"structure={_STRUCTURES[s]!r}")
    return Spec(k, s, upper, unit, complex_)


def as_matrix(A, name: str = "A"):
    """``(array, kernel_ok)``: ``A`` as an ``mx.array`` (float32, complex64, float64)
    or a numpy array (float64, complex128, which MLX lacks); ``kernel_ok`` when the
    dtype runs on the Metal kernels.

    Raises:
        TypeError: not an array, or an unsupported dtype.
        ValueError: not 2-D.
    """
    # lists / Python numbers: their float64 values; complex128 stays numpy
    A = read_input(A, name, "float64", ("float32", "complex64", "float64", "complex128"))
    if A.ndim != 2:
        raise ValueError(f"{name} must be a 2-D matrix (m, n), got shape {tuple(A.shape)}")
    return A, isinstance(A, mx.array) and A.dtype in _KERNEL_DTYPES


def check_tile(tile) -> int:
    if tile is None:
        return DEFAULT_TILE
    if isinstance(tile, bool) or not isinstance(tile, (int, np.integer)) or not 1 <= tile <= 4096:
        raise ValueError(f"tile must be an int in [1, 4096] (the tile is tile x tile), got {tile!r}")
    return int(tile)


def is_complex(A) -> bool:
    return A.dtype in (mx.complex64, np.complex64, np.complex128)


def out_dtype(A):
    """float32 for float32/complex64 input, float64 otherwise."""
    return mx.float32 if A.dtype in (mx.float32, mx.complex64) else mx.float64


def check_global_shape(spec: Spec, m: int, n: int, what: str):
    """Raise for a non-square symmetric/Hermitian matrix (``what`` describes the
    shape in the message); return the norm of an empty matrix (0) or None."""
    if spec.symmetric and m != n:
        raise ValueError(f"structure={_STRUCTURES[spec.structure]!r} needs a square matrix, "
                         f"got {what}")
    return mx.array(0.0) if m == 0 or n == 0 else None


# ---- index maps ---------------------------------------------------------------


@dataclass(frozen=True)
class AxisMap:
    """Local index l -> global index ``off + (l // block) * stride + l % block``
    (a block-cyclic distribution; the identity is ``AxisMap(0, 2^30, 0)``)."""

    off: int = 0
    block: int = _IDENTITY_BLOCK
    stride: int = 0

    def indices(self, count: int) -> np.ndarray:
        l_ = np.arange(count, dtype=np.int64)
        return self.off + (l_ // self.block) * self.stride + l_ % self.block


IDENTITY = AxisMap()


@dataclass(frozen=True)
class Partial:
    """What one process contributes, by ``kind`` (a :data:`KIND` code): max (kernel
    path: ``values`` (1, 4) = (max, 0, 0, 0); cpu: (1,)), one / inf line sums (kernel:
    (L, 4), the two double-word classes of norms.h's norm_line; cpu: (L, 2)
    double-doubles), fro: Blue's accumulators big, med, sml ((3, 2) pairs)."""

    kind: int
    values: mx.array
    result: mx.array | None = None  # the finished norm of this partial (kernel path)


def _line_length(spec: Spec, gshape) -> int:
    if spec.kind == INF and not spec.symmetric:
        return gshape[0]
    return gshape[1]


# ---- Metal kernel path ----------------------------------------------------------


def _pad8(x: mx.array) -> mx.array:
    """Kernels take inputs of >= 8 values (fewer would switch MLX to the
    ``constant`` address space: another compiled instantiation)."""
    return x if x.size >= 8 else mx.concatenate([x, mx.zeros((8 - x.size,), x.dtype)])


def reduce_partials(part: mx.array, nr: int, length: int, fro: bool, backend: str):
    """``norm_reduce`` on ``nr x length`` records (flat float32; 4 floats per record,
    2 for ``fro``): ``(sums (length, 4 or 2), result ())``."""
    width = 2 if fro else 4
    p = NORM_REDUCE_PARAMS.pack(nr=nr, l=length, records=RECORDS["blue" if fro else "lines"])
    sums, result = NORM_REDUCE(
        inputs=[_pad8(part.reshape(-1)), p],
        output_shapes=[(width * length,), (1,)], output_dtypes=[mx.float32, mx.float32],
        grid=(_REDUCE_THREADS, 1, 1), threadgroup=(_REDUCE_THREADS, 1, 1), backend=backend)
    return sums.reshape(length, width), result[0]


def kernel_partial(A: mx.array, spec: Spec, tile: int, backend: str,
                   gshape=None, rows: AxisMap = IDENTITY, cols: AxisMap = IDENTITY) -> Partial:
    """Tile partials of the local block ``A`` (float32 / complex64, 2-D) reduced on
    the device to one :class:`Partial` (float32 records), with its finished norm."""
    m, n = A.shape
    gshape = gshape or (m, n)
    kind = ONE if spec.symmetric and spec.kind == INF else spec.kind  # symmetric: inf == one
    length = 3 if kind == FRO else _line_length(spec, gshape)
    width = 2 if kind == FRO else 4
    if m == 0 or n == 0:  # nothing stored here: the neutral partial
        empty = mx.zeros((1 if kind == MAX else length, width), mx.float32)
        return Partial(kind, empty, mx.array(0.0, mx.float32))
    ntr, ntc = -(-m // tile), -(-n // tile)
    nz, rowpart = 1, 0
    if kind == MAX:
        nr, length = 1, ntr * ntc
    elif kind == FRO:
        nr = ntr * ntc
    elif spec.symmetric:  # column sums (z = 0) and mirrored row sums (z = 1)
        nz, nr, rowpart = 2, ntr + ntc, ntr
    else:
        nr = ntr if kind == ONE else ntc
    flat = A.reshape(-1)
    if spec.complex:
        flat = flat.view(mx.float32)
    if flat.size >= 2**31 or width * nr * length >= 2**32:  # the kernels index with uint
        raise ValueError(f"A of shape {tuple(A.shape)} is too large for the tile kernels "
                         "(at most 2^31 - 1 float32 values per block; use a larger tile "
                         "or shard it with group=)")
    p = NORM_TILE_PARAMS.pack(
        m=m, n=n, nb=tile, kind=kind, structure=spec.structure, upper=spec.upper,
        unit=spec.unit, complex=spec.complex, l=length, rowpart=rowpart, roff=rows.off,
        rblk=rows.block, rstride=rows.stride, coff=cols.off, cblk=cols.block,
        cstride=cols.stride)
    threads = min(tile, _MAX_THREADS)
    (part,) = NORM_TILE(
        inputs=[_pad8(flat), p], output_shapes=[(max(width * nr * length, 8),)],
        output_dtypes=[mx.float32], grid=(threads * ntc, ntr, nz),
        threadgroup=(threads, 1, 1), init_value=0.0, backend=backend)
    sums, result = reduce_partials(part, nr, length, kind == FRO, backend)
    if kind == MAX:
        return Partial(0, mx.concatenate([result[None], mx.zeros((3,), mx.float32)])[None],
                       result)
    return Partial(kind, sums, result)


# ---- cpu (float64) path -----------------------------------------------------------
#
# Sums are double-double: a pairwise tree of TwoSums whose exact error terms are
# summed on the side (Ogita, Rump, Oishi, "Accurate sum and dot product", SISC 2005,
# cascaded summation): relative error ~u^2 log^2(n), u = 2^-53, so the float64
# result is the correctly rounded norm except within ~2^-100 (relative) of a
# rounding boundary. Squares are exact pairs by Dekker's TwoProduct (Veltkamp
# splitting: numpy has no fma). Complex moduli come from np.hypot (< 1 ulp).

# Blue's constants for float64 (Anderson, ACM TOMS 44(1) 2017; minexp -1021, maxexp 1024,
# digits 53): tsml 2^-511, tbig 2^486, ssml 2^537, sbig 2^-538. Every scaled value
# is below 2^486, far from the 2^996 where Veltkamp's split overflows.
_TSML, _TBIG = 2.0**-511, 2.0**486
_SSML, _SBIG = 2.0**537, 2.0**-538


def _two_sum(a, b):
    """Knuth's TwoSum: s + e = a + b exactly (float64, elementwise)."""
    s = a + b
    bp = s - a
    return s, (a - (s - bp)) + (b - bp)


def _two_square(a):
    """Dekker's TwoProduct of a with itself: p + e = a^2 exactly (|a| < 2^996)."""
    c = 134217729.0 * a  # 2^27 + 1: Veltkamp's split into 26 + 27 bits
    hi = c - (c - a)
    lo = a - hi
    p = a * a
    return p, ((hi * hi - p) + 2.0 * hi * lo) + lo * lo


def dd_sum(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Double-double sums of non-negative float64 terms (or Inf/NaN) along
    ``axis``: array ``(..., 2)`` of (hi, lo) with hi + lo the sum to ~u^2 log^2 n.
    A non-finite hi (an Inf or NaN term, or overflow) comes with lo = 0."""
    x = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
    lo = np.zeros(x.shape[:-1])
    if x.shape[-1] == 0:
        return np.stack([lo, lo], axis=-1)
    with np.errstate(invalid="ignore", over="ignore"):
        while x.shape[-1] > 1:
            if x.shape[-1] % 2:
                x = np.concatenate([x, np.zeros(x.shape[:-1] + (1,))], axis=-1)
            x, e = _two_sum(x[..., 0::2], x[..., 1::2])
            lo = lo + e.sum(axis=-1)
    hi = x[..., 0]
    return np.stack([hi, np.where(np.isfinite(hi), lo, 0.0)], axis=-1)


def _dd_value(pairs: np.ndarray) -> np.ndarray:
    """hi + lo rounded once (non-finite hi kept)."""
    hi, lo = pairs[..., 0], pairs[..., 1]
    return np.where(np.isfinite(hi), hi + lo, hi)


def _ssq_dd(x: np.ndarray, w=None, exact: bool = False) -> np.ndarray:
    """Blue's three accumulators (big, med, sml) of sum(w x^2) as double-doubles,
    shape (3, 2); NaN lands in med and Inf in big, as in LAPACK's xLASSQ. ``exact``:
    the squares are exact in float64 (float32 data), skip their error terms."""
    a = np.abs(np.asarray(x, dtype=np.float64)).reshape(-1)
    w = None if w is None else np.broadcast_to(w, x.shape).reshape(-1)
    big, sml = a > _TBIG, (a < _TSML) & (a > 0)
    classes = ((big, _SBIG), (None, 1.0), (sml, _SSML))
    if big.any() or sml.any():
        classes = ((big, _SBIG), (~(big | sml), 1.0), (sml, _SSML))
    out = []
    for mask, scale in classes:
        if mask is not None and not mask.any():
            out.append(np.zeros(2))
            continue
        v = a if mask is None else a[mask] * scale
        ww = None if w is None else (w if mask is None else w[mask])
        with np.errstate(invalid="ignore", over="ignore"):
            p, e = (v * v, None) if exact else _two_square(v)
        terms = [p] if e is None else [p, np.where(np.isfinite(p), e, 0.0)]
        if ww is not None:
            terms = [ww * t for t in terms]
        out.append(dd_sum(np.concatenate(terms) if len(terms) > 1 else terms[0]))
    return np.stack(out)


def _dd_sqrt(pair) -> float:
    """sqrt of a double-double (hi > 0): one Newton step from sqrt(hi) with the
    exact residual (Dekker 1971), rounded once to float64."""
    hi, lo = float(pair[0]), float(pair[1])
    s = math.sqrt(hi)
    p, e = _two_square(s)
    return s + (((hi - p) - e) + lo) / (2.0 * s)


def finish_ssq64(acc: np.ndarray) -> float:
    """sqrt of Blue's accumulators (3, 2) (big, med, sml): NaN if one is NaN, else
    Inf if one is Inf; the smaller class is scaled onto the larger one's scale
    (small values are dropped when big ones exist: they are < 2^-1000 of one)."""
    acc = np.asarray(acc, dtype=np.float64)
    his = acc[:, 0]
    if np.isnan(his).any():
        return math.nan
    if np.isinf(his).any():
        return math.inf
    big, med, sml = acc
    if big[0] > 0:
        return _dd_sqrt(dd_sum(np.concatenate([big, med * _SBIG * _SBIG]))) / _SBIG
    if med[0] > 0:
        return _dd_sqrt(dd_sum(np.concatenate([med, sml / _SSML / _SSML])))
    if sml[0] > 0:
        return _dd_sqrt(sml) / _SSML
    return 0.0


def cpu_partial(A, spec: Spec, gshape=None, rows: AxisMap = IDENTITY,
                cols: AxisMap = IDENTITY) -> Partial:
    """The local block's :class:`Partial` in float64 numpy: max (1,), line sums
    (L, 2) or Blue's accumulators (3, 2) as double-double pairs."""
    a = np.array(A) if isinstance(A, mx.array) else np.asarray(A)
    m, n = a.shape
    gshape = gshape or (m, n)
    kind = ONE if spec.symmetric and spec.kind == INF else spec.kind
    exact = a.dtype in (np.float32, np.complex64)  # squares exact in float64
    re = a.real if spec.complex else a
    im = a.imag if spec.complex else None
    diag = None
    if spec.structure != GENERAL or spec.unit:
        gi = rows.indices(m)[:, None]
        gj = cols.indices(n)[None, :]
        diag = gi == gj
    if spec.structure != GENERAL:  # entries outside the triangle / trapezoid: never read
        stored = gi <= gj if spec.upper else gi >= gj
        re = np.where(stored, re, 0)
        im = None if im is None else np.where(stored, im, 0)
    if spec.unit:  # the diagonal is not read and counts as 1
        re = np.where(diag, 1, re)
        im = None if im is None else np.where(diag, 0, im)
    if spec.structure == HERMITIAN and im is not None:  # Hermitian: Im(diagonal) ignored
        im = np.where(diag, 0, im)
    if kind == FRO:
        w = np.where(diag, 1.0, 2.0) if spec.symmetric else None
        acc = _ssq_dd(re, w, exact)
        if im is not None:  # zLASSQ: the parts are separate reals
            acc = dd_sum(np.stack([acc, _ssq_dd(im, w, exact)], axis=-1).reshape(3, 4), 1)
        return Partial(3, mx.array(acc, dtype=mx.float64))
    if im is None:
        mag = np.abs(re.astype(np.float64))
    else:
        mag = np.hypot(re.astype(np.float64), im.astype(np.float64))  # Inf beats NaN
    if kind == MAX:
        v = float(np.max(mag)) if mag.size else 0.0  # np.max propagates NaN
        return Partial(0, mx.array([v], dtype=mx.float64))
    line = np.zeros((_line_length(spec, gshape), 2))
    if kind == ONE:
        line[cols.indices(n)] = dd_sum(mag, axis=0)
        if spec.symmetric:  # the mirrored triangle: stored off-diagonal row sums
            r = rows.indices(m)
            line[r] = dd_sum(np.concatenate([line[r], dd_sum(np.where(diag, 0.0, mag), 1)], 1), 1)
    else:
        line[rows.indices(m)] = dd_sum(mag, axis=1)
    return Partial(kind, mx.array(line, dtype=mx.float64))


# ---- cpu streaming path for float32 / complex64 (general matrices) --------------
#
# One pass over blocks of whole rows (about 2^16 values, cast to float64 in cache):
# float64 sums by BLAS (ddot for the squares, gemv for column sums), no full-size
# temporaries. float32 data needs no scaling in float64 (squares of float32 lie in
# [2^-298, 2^256]). Any order of summing n non-negative terms errs by at most
# gamma_n = n u / (1 - n u) relative (Higham, Accuracy and Stability, 2nd ed.,
# sec. 4.2), so the exact norm lies in a known interval around the float64 value;
# when both ends round to the same float32 that is the correctly rounded norm, else
# (near a rounding boundary: rare) the exact double-double path decides (Ziv's
# strategy).

_U64 = 2.0**-53
_BLOCK_VALUES = 1 << 16
_DOT = 1 << 13  # OpenBLAS runs ddot on the calling thread below about 10^4 values


def _spans(m: int, n: int):
    """Row spans of about 2^16 values (float64 blocks that stay in cache)."""
    step = max(1, _BLOCK_VALUES // max(n, 1))
    return [(r0, min(m, r0 + step)) for r0 in range(0, m, step)]


def _moduli(blk: np.ndarray) -> np.ndarray:
    """|a| of a float64 block: exact for real data, np.hypot (< 1 ulp) for complex
    (re, im) pairs on the last axis."""
    return np.hypot(blk[..., 0], blk[..., 1]) if blk.ndim == 3 else np.abs(blk, out=blk)


def _block_reduce(a: np.ndarray, kind: int, r0: int, r1: int, buf: np.ndarray):
    """One block of rows of float32 / complex64 ``a``, cast to float64 in ``buf``
    (a reused buffer: no fresh pages per block): its sum of squares (fro), max
    modulus (max), column sums (one) or max row sum (inf)."""
    blk = a[r0:r1]
    if kind == MAX and a.dtype == np.float32:  # exact in float32: two read-only passes
        return np.maximum(np.max(blk), -np.min(blk))  # NaN propagates
    if a.dtype == np.complex64:
        blk = blk.view(np.float32).reshape(r1 - r0, a.shape[1], 2)
    b64 = buf[:blk.size].reshape(blk.shape)
    np.copyto(b64, blk)
    if kind == FRO:
        v = b64.reshape(-1)  # ddot on pieces small enough for BLAS to stay on this thread
        return math.fsum(np.dot(v[i:i + _DOT], v[i:i + _DOT]) for i in range(0, v.size, _DOT))
    mod = _moduli(b64)
    if kind == MAX:
        return np.max(mod)
    return mod.sum(axis=0) if kind == ONE else np.max(mod.sum(axis=1))


def _parallel_blocks(a: np.ndarray, kind: int) -> list:
    """:func:`_block_reduce` over all row blocks, the blocks split into one
    contiguous run per core."""
    spans = _spans(*a.shape)
    width = a.shape[1] * (2 if a.dtype == np.complex64 else 1)

    def run(part):
        buf = np.empty(max(r1 - r0 for r0, r1 in part) * width)
        return [_block_reduce(a, kind, r0, r1, buf) for r0, r1 in part]

    return map_runs(run, spans, workers_for(a.size, len(spans)))


def _stream_cpu(a: np.ndarray, kind: int):
    """(float64 value, relative error bound) of a general norm (squared for
    "fro") of float32 / complex64 ``a`` in one streaming pass."""
    m, n = a.shape
    cplx = a.dtype == np.complex64
    with np.errstate(invalid="ignore", over="ignore"):
        parts = _parallel_blocks(a, kind)
        if kind == FRO:
            terms = (2 if cplx else 1) * max(_BLOCK_VALUES, n)
            return math.fsum(parts), (terms + 2) * _U64
        slack = 2 * _U64 if cplx else 0.0  # hypot's error
        if kind == MAX:
            return float(np.max(parts)), slack + _U64  # np.max: NaN wins
        if kind == ONE:
            return float(np.max(np.sum(parts, axis=0))), (m + 2) * _U64 + slack
        return float(np.max(parts)), (n + 2) * _U64 + slack


def stream_norm_f32(a: np.ndarray, kind: int):
    """The correctly rounded float32 norm of a general float32 / complex64 matrix
    (m, n >= 1) from :func:`_stream_cpu`, or None when the error interval straddles
    a float32 rounding boundary (the caller then takes the exact path)."""
    v, rel = _stream_cpu(a, kind)
    if not math.isfinite(v):  # NaN, or an Inf entry (or column of Infs)
        return np.float32(v)
    rel *= 1.01  # gamma_n's 1 / (1 - n u), and the bound applied to the computed value
    lo, hi = v * (1 - rel), v * (1 + rel)
    if kind == FRO:  # sqrt is correctly rounded: one more ulp each way
        lo, hi = np.nextafter(math.sqrt(lo), 0), np.nextafter(math.sqrt(hi), math.inf)
    with np.errstate(over="ignore"):
        r_lo, r_hi = np.float32(lo), np.float32(hi)
    return r_lo if r_lo == r_hi else None


def _totals(values: np.ndarray) -> np.ndarray:
    """Double-double sums over the ``P`` processes (axis 0) of line sums (L, 2) or
    Blue's accumulators (3, 2)."""
    pairs = values.reshape(values.shape[0], -1, 2)  # (P, L, 2)
    return dd_sum(np.concatenate([pairs[..., 0], pairs[..., 1]], axis=0), axis=0)


def finish_cpu(kind: int, values: np.ndarray) -> float:
    """The norm from the float64 partials of ``P`` processes stacked on axis 0."""
    values = np.asarray(values, dtype=np.float64)
    if kind == MAX:
        return float(np.max(values)) if values.size else 0.0
    total = _totals(values)
    if kind == FRO:
        return finish_ssq64(total)
    lines = _dd_value(total)
    return float(np.max(lines)) if lines.size else 0.0


def finish_cpu_result(kind: int, values: np.ndarray, dtype) -> mx.array:
    """:func:`finish_cpu` as a 0-d array of ``dtype``, rounded once: for float32 the
    float64 value is only a guide (rounding it again could double-round at a
    float32 midpoint); the side of each neighbouring midpoint m is read from the
    double-double sums exactly: sign((hi - m) + lo), hi - m exact when they are
    close (Sterbenz), and for Frobenius against m^2 (exact: m has 25 bits)."""
    v = finish_cpu(kind, values)
    if dtype != mx.float32 or kind == MAX or not (math.isfinite(v) and v > 0):
        return to_result(v, dtype)
    total = _totals(np.asarray(values, dtype=np.float64))
    if kind == FRO and (total[0, 0] > 0 or total[2, 0] > 0):
        return to_result(v, dtype)  # scaled classes: never for float32 data
    with np.errstate(over="ignore"):
        r = np.float32(v)
    if not np.isfinite(r):
        return mx.array(r)
    for toward in (np.float32(np.inf), np.float32(0)):
        nb = np.nextafter(r, toward)
        m = (float(r) + float(nb)) / 2
        if kind == FRO:
            side = np.sign((total[1, 0] - m * m) + total[1, 1])
        else:
            side = np.max(np.sign((total[:, 0] - m) + total[:, 1]))
        if toward == 0:
            side = -side
        if side > 0 or (side == 0 and int(nb.view(np.int32)) % 2 == 0):
            return mx.array(nb)  # beyond the midpoint, or a tie to the even neighbour
    return mx.array(r)


def _local_norm(A, spec: Spec, nb: int, name: Backend, kernel_ok: bool) -> mx.array:
    """The norm of one process's matrix on a resolved backend."""
    m, n = A.shape
    dtype = out_dtype(A)
    empty = check_global_shape(spec, m, n, f"A of shape ({m}, {n})")
    if empty is not None:
        return empty.astype(dtype)
    if kernel_ok and name.has_kernels:
        return kernel_partial(A, spec, nb, name).result
    if kernel_ok and spec.structure == GENERAL:  # cpu, float32 / complex64: one streaming pass
        fast = stream_norm_f32(np.asarray(A), spec.kind)
        if fast is not None:
            return mx.array(fast)
    part = cpu_partial(A, spec)
    return finish_cpu_result(part.kind, np.array(part.values)[None], dtype)


def to_result(value: float, dtype) -> mx.array:
    """A float64 norm as a 0-d array of ``dtype`` (float32: one correct rounding)."""
    if dtype == mx.float32:
        with np.errstate(over="ignore"):  # beyond float32's range: Inf, correctly
            return mx.array(np.float32(value))
    return mx.array(value, dtype=mx.float64)


# ---- self-test (python -m mlx_precise selftest) ---------------------------------
