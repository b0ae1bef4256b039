"""Exponent analysis for split-integer DGEMM: ESC, its cheap estimate, slice rules.

For an output ``c_ij = sum_k a_ik b_kj`` with ``x`` = row i of A and ``y`` = column j
of B, the *exponent span capacity* (NVIDIA, arXiv 2511.13778) is::

    ESC_ij = e(max|x|) + e(max|y|) - max_k [e(x_k) + e(y_k)],   e(v) = floor(log2|v|)

(zeros count as -infinity). It counts the bits, beyond float64's 53, that the
fixed-point slices of x and y must carry so that the largest product term keeps
full precision. :func:`esc` computes it exactly (a max-plus product, O(MNK));
:func:`esc_estimate` bounds it from per-k-block exponent summaries (O(MNK/block))
and is never below the exact value. :func:`slices_needed` turns either into a
slice count, or applies the ``"tight"`` rule of this package (see its docstring
and ``docs/ozaki.md`` for the measurements).

Each step has a Metal kernel (``metal/kernels/ozaki_scan.metal``,
``ozaki_esc_estimate.metal``, ``ozaki_esc.metal``; float64 enters as raw bits) and
a numpy implementation of the same algorithm for the ``cpu`` backend.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ..core import backends
from ..core.streams import streamed
from ..doubleword.types import read_input
from ..core.autodiff import host_guard
from ..core.cputhreads import map_runs, workers_for
from ..core.kernels import Codes, Constants, Kernel, ParamLayout, generated_block
from ..core.backends import Backend

SENTINELS = Constants("OZ", {
    # exponent of zero and max over an empty set, min over an empty set, exponent
    # of Inf/NaN: far outside any sum of two real exponents (those lie in
    # [-2148, 2046]), and their sums cannot overflow int32
    "neg": -(1 << 20),
    "pos": 1 << 20,
    "nonfinite": 1 << 21,
    "neg_limit": -(1 << 19),  # exponent sums below this involve a zero
})
"""Exponent sentinels of the kernels (``OZ_NEG`` ... in ``metal/include/ozaki.h``)."""
NEG, POS, NONFINITE, NEG_LIMIT = (SENTINELS.neg, SENTINELS.pos, SENTINELS.nonfinite,
                                  SENTINELS.neg_limit)
ESC_UNBOUNDED = POS
"""Value of :func:`esc_estimate` where no k-block proves a nonzero product term
(e.g. a sparse row meeting a sparse column): the estimate cannot bound the ESC."""

DEFAULT_BLOCK = 64
METHODS = ("esc", "esc_estimate", "tight")

_U32 = (mx.uint32,)
_I32 = (mx.int32,)

INFO = Codes("OZ_INFO", (
    "max_exponent",  # max exponent over nonzeros (NEG if none)
    "min_exponent",  # min exponent over nonzeros (POS if none)
    "nonzeros",      # number of nonzeros
    "nonfinite",     # number of Inf/NaN
    "low_exponent",  # min exponent of the lowest set bit over nonzeros (POS if none)
))
"""The fields of one (row, k-block) entry of ``ozaki_scan``'s ``info`` (last axis,
``OZ_INFO_COUNT`` of them; ``OZ_INFO_MAX_EXPONENT`` ... in ``ozaki.h``)."""

OZAKI_SCAN_PARAMS = ParamLayout("OZAKI_SCAN", (
    "rows",    # R, rows of X
    "cols",    # C, columns of X
    "block",   # KB, the k-block length
    "blocks",  # NB, the number of k-blocks
), size=8)
"""The ``params`` buffer of ``ozaki_scan`` (``OZAKI_SCAN_ROWS`` ... in ``ozaki.h``)."""

OZAKI_SCAN = Kernel(
    name="ozaki_scan",
    body="ozaki_scan.metal",
    headers=("ozaki.h",),
    inputs=("x", "params"),
    outputs=("info",),
    input_dtypes={"x": _U32, "params": _I32},
    extended=False,
    variants={"info": _I32},
)
"""Per row and k-block of a float64 matrix (raw bits): max/min exponent, nonzero
count, Inf/NaN count, lowest set bit (:data:`INFO`). Inputs ``x`` (uint32, the
bits of X (R, C), low word first) and ``params`` (:data:`OZAKI_SCAN_PARAMS`).
Output int32 ``[R, NB, INFO_COUNT]``."""

OZAKI_ESC_ESTIMATE_PARAMS = ParamLayout("OZAKI_ESC_ESTIMATE", (
    "m", "n", "k",  # C = A B: A (M, K), B (K, N)
    "block",        # KB, the k-block length of the scans
    "blocks",       # NB, the number of k-blocks
), size=8)
"""The ``params`` buffer of ``ozaki_esc_estimate`` (``OZAKI_ESC_ESTIMATE_M`` ...)."""

OZAKI_ESC_ESTIMATE = Kernel(
    name="ozaki_esc_estimate",
    body="ozaki_esc_estimate.metal",
    headers=("ozaki.h",),
    inputs=("infoA", "infoB", "params"),
    outputs=("esc",),
    input_dtypes={"infoA": _I32, "infoB": _I32, "params": _I32},
    extended=False,
    variants={"esc": _I32},
)
"""Conservative ESC per output from two scans (params:
:data:`OZAKI_ESC_ESTIMATE_PARAMS`). Output int32 ``[M, N]``."""

OZAKI_ESC_PARAMS = ParamLayout("OZAKI_ESC", ("m", "n", "k"), size=8)
"""The ``params`` buffer of ``ozaki_esc``: A (M, K), B (K, N)."""

OZAKI_ESC = Kernel(
    name="ozaki_esc",
    body="ozaki_esc.metal",
    headers=("ozaki.h",),
    inputs=("a", "bt", "params"),
    outputs=("esc",),
    input_dtypes={"a": _U32, "bt": _U32, "params": _I32},
    extended=False,
    variants={"esc": _I32},
)
"""Exact ESC per output from the raw bits of A and B^T (params:
:data:`OZAKI_ESC_PARAMS`). Output int32 ``[M, N]``."""


def codes_source() -> str:
    """The first generated block of ``metal/include/ozaki.h`` (a test checks that
    the header holds exactly this text)."""
    return generated_block("mlx_precise.esc.engine.codes_source()", SENTINELS, INFO,
                           OZAKI_SCAN_PARAMS, OZAKI_ESC_ESTIMATE_PARAMS, OZAKI_ESC_PARAMS)


# ---- input checking and raw bits ------------------------------------------------


def as_float64_matrix(x, name: str) -> mx.array:
    """``x`` as a 2-D float64 ``mx.array`` (numpy float64 arrays are converted).

    Raises:
        InputError (a TypeError): not an array-like, or dtype not float64.
        ValueError: not 2-D.
    """
    # lists / Python numbers: their float64 values, unrounded
    x = read_input(x, name, "float64", ("float64",))
    if isinstance(x, np.ndarray):
        x = mx.array(x, dtype=mx.float64)
    if x.ndim != 2:
        raise ValueError(f"{name} must be a 2-D matrix, got shape {tuple(x.shape)}")
    return x


def check_operands(A, B) -> tuple[mx.array, mx.array]:
    """Validate a product ``A @ B``: float64 matrices (M, K) and (K, N)."""
    A = as_float64_matrix(A, "A")
    B = as_float64_matrix(B, "B")
    if A.shape[1] != B.shape[0]:
        raise ValueError(
            f"A (M, K) and B (K, N) must share K: got A {tuple(A.shape)} and B {tuple(B.shape)}"
        )
    return A, B


def _check_block(block) -> int:
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
        raise ValueError(f"block must be a positive int, got {block!r}")
    return int(block)


def pad8(x: mx.array) -> mx.array:
    """Flattened ``x``, zero-padded to at least 8 elements: MLX passes inputs of
    fewer than 8 elements in the ``constant`` address space, which would compile a
    second variant of each kernel. Kernels read logical sizes from ``params``."""
    x = x.reshape(-1)
    if x.size < 8:
        x = mx.concatenate([x, mx.zeros((8 - x.size,), x.dtype)])
    return x


def raw_bits(X: mx.array) -> mx.array:
    """float64 (R, C) -> its raw bits, uint32 (R, C, 2) (low word first). The view
    runs on the CPU stream: GPUs have no float64, so no GPU op touches X itself."""
    R, C = X.shape
    return mx.view(X, mx.uint32, stream=mx.cpu).reshape(R, C, 2)


def row_bits(X: mx.array) -> mx.array:
    """Raw bits of the rows of a float64 (R, C) matrix: uint32, flat, padded."""
    return pad8(raw_bits(X))


def col_bits(X: mx.array) -> mx.array:
    """Raw bits of the columns of a float64 (R, C) matrix, i.e. of the rows of X^T."""
    return pad8(mx.transpose(raw_bits(X), (1, 0, 2)))


# ---- float64 fields in numpy (cpu implementations) ------------------------------


def _bit_length(v: np.ndarray) -> np.ndarray:
    """Bit length of uint64 values (0 for 0), exactly: 32-bit halves convert to
    float64 without rounding, and frexp's exponent is the bit length."""
    v = v.astype(np.uint64)
    hi = (v >> np.uint64(32)).astype(np.float64)
    lo = (v & np.uint64(0xFFFFFFFF)).astype(np.float64)
    return np.where(hi > 0, 32 + np.frexp(hi)[1], np.frexp(lo)[1]).astype(np.int64)


def fields(X: np.ndarray):
    """(sign, significand m, ulp exponent u, exponent e) of float64 values with
    ``x = (-1)^sign m 2^u`` exactly; ``e = floor(log2|x|)``, NEG for zeros,
    NONFINITE for Inf/NaN (as ``oz_exponent`` in ozaki.h)."""
    bits = np.ascontiguousarray(X, dtype=np.float64).view(np.uint64)
    biased = ((bits >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64)
    frac = bits & np.uint64(0xFFFFFFFFFFFFF)
    m = np.where(biased == 0, frac, frac | np.uint64(1 << 52))
    u = np.where(biased == 0, -1074, biased - 1075)
    e = u + _bit_length(m) - 1
    e = np.where(m == 0, NEG, e)
    e = np.where(biased == 2047, NONFINITE, e)
    sign = (bits >> np.uint64(63)).astype(np.int64)
    return sign, m, u, e


# ---- the exponent scan -----------------------------------------------------------


@dataclass
class Scan:
    """Exponent summaries of the rows of a matrix, per k-block (numpy int arrays).

    ``maxe, mine, nnz, bad, low``: ``[R, NB]`` (see ozaki_scan.metal); ``length``:
    ``[NB]`` block lengths."""

    maxe: np.ndarray
    mine: np.ndarray
    nnz: np.ndarray
    bad: np.ndarray
    low: np.ndarray
    length: np.ndarray

    @classmethod
    def from_info(cls, info: np.ndarray, C: int, block: int) -> "Scan":
        info = np.asarray(info, dtype=np.int64)
        nb = info.shape[1]
        length = np.minimum(block, C - block * np.arange(nb))
        f = {n: info[..., i] for n, i in INFO.items()}
        return cls(f["max_exponent"], f["min_exponent"], f["nonzeros"], f["nonfinite"],
                   f["low_exponent"], length)

    @property
    def emax(self) -> np.ndarray:
        """Row maximum exponents ``[R]`` (NEG for a zero row)."""
        return self.maxe.max(axis=1, initial=NEG)

    @property
    def nonfinite(self) -> bool:
        return bool(self.bad.sum() > 0)

    @property
    def lowest(self) -> np.ndarray:
        """Per row, exponent of the lowest set bit of any entry (POS for zero rows)."""
        return self.low.min(axis=1, initial=POS)


def _exponent(v: np.ndarray) -> np.ndarray:
    """floor(log2 v) of positive finite float64 values (subnormals included):
    frexp's exponent less one."""
    return np.frexp(v)[1].astype(np.int64) - 1


_SCAN_VALUES = 1 << 16  # values per row chunk of the scan
_ESTIMATE_VALUES = 1 << 16  # outputs per row chunk of the estimate (int16 temporaries)


def _scan_chunk(a: np.ndarray, out: np.ndarray, starts: np.ndarray, lowest: bool) -> None:
    """One chunk of :func:`scan_rows_cpu`: |x| rows ``a`` into their ``info`` rows."""
    fin = np.isfinite(a)
    if not fin.all():  # Inf/NaN: counted, then left out of the exponents
        out[..., INFO["nonfinite"]] = np.add.reduceat(~fin, starts, axis=1)
        a = np.where(fin, a, 0.0)
    nz = a != 0
    out[..., INFO["nonzeros"]] = np.add.reduceat(nz, starts, axis=1)
    big = np.maximum.reduceat(a, starts, axis=1)
    small = np.minimum.reduceat(np.where(nz, a, np.inf), starts, axis=1)
    live = big > 0
    out[..., INFO["max_exponent"]] = np.where(live, _exponent(np.where(live, big, 1.0)), NEG)
    out[..., INFO["min_exponent"]] = np.where(live, _exponent(np.where(live, small, 1.0)), POS)
    if lowest:  # a = f 2^E, m = f 2^53 an integer: lowest bit 2^(E - 53 + ctz m)
        f, E = np.frexp(a)
        m = (f * 2.0**53).astype(np.int64)
        low = E - 53 + _exponent((m & -m).astype(np.float64) + ~nz)
        out[..., INFO["low_exponent"]] = np.minimum.reduceat(np.where(nz, low, POS), starts, axis=1)


def scan_rows_cpu(X: np.ndarray, block: int, lowest: bool = True) -> Scan:
    """numpy implementation of ozaki_scan on float64 rows, streamed over chunks of
    rows (temporaries of about 0.5 MiB, one run of chunks per core): block maxima
    and minima of |x| first, then exponents of those (e(max|x|) = max e(x): the
    exponent is monotone in |x|).
    ``lowest=False`` skips the lowest-set-bit summary (``low`` is then None):
    only the tight slice rule reads it."""
    R, C = X.shape
    nb = max(1, -(-C // block))
    info = np.empty((R, nb, len(INFO.names)), np.int64)
    empty = {"max_exponent": NEG, "min_exponent": POS, "nonzeros": 0, "nonfinite": 0,
             "low_exponent": POS}
    info[...] = [empty[n] for n in INFO.names]
    starts = np.arange(nb) * block
    step = max(1, _SCAN_VALUES // max(C, 1))

    def run(part):  # rows [r0, r0 + step) of info, for r0 in part
        for r0 in part:
            _scan_chunk(np.abs(X[r0:r0 + step]), info[r0:r0 + step], starts, lowest)

    chunks = list(range(0, R if C else 0, step))
    map_runs(run, chunks, workers_for(R * C, len(chunks)))
    scan = Scan.from_info(info, C, block)
    if not lowest:
        scan.low = None
    return scan


def _scan_metal(bits: mx.array, R: int, C: int, block: int, backend: str) -> mx.array:
    nb = max(1, -(-C // block))
    (info,) = OZAKI_SCAN(
        inputs=[bits, OZAKI_SCAN_PARAMS.pack(rows=R, cols=C, block=block, blocks=nb)],
        grid=(nb, R, 1), threadgroup=(min(nb, 32), min(R, 8), 1),
        output_shapes=[(R, nb, len(INFO.names))], output_dtypes=[mx.int32], backend=backend,
    )
    return info


def scan(A: mx.array, B: mx.array, block: int, backend: Backend, lowest: bool = True):
    """Scans of A's rows and B's columns on ``backend``. Returns ``(scanA, scanB,
    infoA, infoB)``; the raw ``info`` arrays (mx, int32) are None on cpu, where
    ``lowest=False`` skips the lowest-set-bit summary."""
    (M, K), N = A.shape, B.shape[1]
    if not backend.has_kernels:
        a, b = np.asarray(A), np.asarray(B)
        return scan_rows_cpu(a, block, lowest), scan_rows_cpu(b.T, block, lowest), None, None
    ia = _scan_metal(row_bits(A), M, K, block, backend)
    ib = _scan_metal(col_bits(B), N, K, block, backend)
    return Scan.from_info(np.array(ia), K, block), Scan.from_info(np.array(ib), K, block), ia, ib


# ---- ESC: exact and estimated ---------------------------------------------------


def _estimate_rows(sa: Scan, sb: Scan, r0: int, r1: int) -> np.ndarray:
    """Rows r0:r1 of :func:`esc_estimate_cpu`. A block proves the bound max_A + min_B
    when A's part has a nonzero and B's part none (both separable per row / column,
    so each is a max-plus outer sum), min_A + max_B symmetrically, and min_A + min_B
    when both parts have zeros but more nonzeros than positions (rare: done on the
    few rows and columns concerned). In int16 (twice the SIMD width of int32):
    exponents lie in [-1074, 1023], so proven bounds lie in [-2148, 2046], a
    candidate with an invalid side (-2^14) at most -15361 and two invalid sides
    -2^15; "no bound yet" is -10000 between them."""
    off, none = np.int16(-(1 << 14)), np.int16(-10000)
    n = sa.length[None, :]
    na, nb = sa.nnz[r0:r1], sb.nnz
    a1 = np.where(na > 0, sa.maxe[r0:r1], off).astype(np.int16)
    a2 = np.where(na == n, sa.mine[r0:r1], off).astype(np.int16)
    b1 = np.where(nb == n, sb.mine, off).astype(np.int16)
    b2 = np.where(nb > 0, sb.maxe, off).astype(np.int16)
    lb = np.full((r1 - r0, nb.shape[0]), none, np.int16)
    t = np.empty_like(lb)
    for q in range(n.shape[1]):
        np.maximum(lb, np.add(a1[:, q, None], b1[None, :, q], out=t), out=lb)
        np.maximum(lb, np.add(a2[:, q, None], b2[None, :, q], out=t), out=lb)
        rows = np.flatnonzero((na[:, q] > 0) & (na[:, q] < n[0, q]))
        cols = np.flatnonzero((nb[:, q] > 0) & (nb[:, q] < n[0, q]))
        if rows.size and cols.size:
            both = na[rows, q, None] + nb[None, cols, q] > n[0, q]
            c3 = np.where(both, sa.mine[r0 + rows, q, None] + sb.mine[None, cols, q], none)
            sub = np.ix_(rows, cols)
            lb[sub] = np.maximum(lb[sub], c3)
    lb = lb.astype(np.int64)
    ea, eb = sa.emax[r0:r1, None], sb.emax[None, :]
    out = np.where(lb == none, ESC_UNBOUNDED, ea + eb - lb)
    return np.where((ea == NEG) | (eb == NEG), 0, out).astype(np.int64)


def _row_chunks(sa: Scan, sb: Scan):
    """Row ranges of about 2^16 outputs (cache-sized int32 temporaries)."""
    M, N = sa.maxe.shape[0], sb.maxe.shape[0]
    step = max(1, _ESTIMATE_VALUES // max(N, 1))
    return ((r0, min(M, r0 + step)) for r0 in range(0, M, step))


def esc_estimate_cpu(sa: Scan, sb: Scan) -> np.ndarray:
    """numpy implementation of ozaki_esc_estimate (same bounds, same sentinels):
    int64 ``(M, N)``."""
    M, N = sa.maxe.shape[0], sb.maxe.shape[0]
    out = np.empty((M, N), np.int64)
    for r0, r1 in _row_chunks(sa, sb):
        out[r0:r1] = _estimate_rows(sa, sb, r0, r1)
    return out


def esc_estimate_max_cpu(sa: Scan, sb: Scan) -> int:
    """``esc_estimate_cpu(sa, sb).max()`` without the (M, N) array."""
    chunks = list(_row_chunks(sa, sb))

    def run(part):
        return [int(_estimate_rows(sa, sb, r0, r1).max(initial=0)) for r0, r1 in part]

    work = sa.maxe.shape[0] * sb.maxe.shape[0] * sa.maxe.shape[1]
    return max(map_runs(run, chunks, workers_for(work, len(chunks))), default=0)


def esc_exact_cpu(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """numpy implementation of ozaki_esc: the max-plus product of exponents,
    in k-chunks of at most 2^22 (M, chunk, N) elements."""
    ea, eb = fields(A)[3], fields(B)[3]
    M, K = ea.shape
    N = eb.shape[1]
    pmax = np.full((M, N), NEG, dtype=np.int64)
    kc = max(1, (1 << 22) // max(1, M * N))
    for k0 in range(0, K, kc):
        part = ea[:, k0:k0 + kc, None] + eb[None, k0:k0 + kc, :]
        np.maximum(pmax, part.max(axis=1), out=pmax)
    amax = ea.max(axis=1, initial=NEG)[:, None]
    bmax = eb.max(axis=0, initial=NEG)[None, :]
    return np.where(pmax < NEG_LIMIT, 0, amax + bmax - pmax)


def _estimate(sa: Scan, sb: Scan, infoA, infoB, K: int, block: int,
              backend: Backend) -> np.ndarray:
    if not backend.has_kernels:
        return esc_estimate_cpu(sa, sb)
    M, N = sa.maxe.shape[0], sb.maxe.shape[0]
    nb = sa.maxe.shape[1]
    (out,) = OZAKI_ESC_ESTIMATE(
        inputs=[pad8(infoA), pad8(infoB), 
                OZAKI_ESC_ESTIMATE_PARAMS.pack(m=M, n=N, k=K, block=block, blocks=nb)],
        grid=(N, M, 1), threadgroup=(min(N, 32), min(M, 8), 1),
        output_shapes=[(M, N)], output_dtypes=[mx.int32], backend=backend,
    )
    return np.array(out).astype(np.int64)


def _no_nonfinite(s: Scan, name: str) -> None:
    if s.nonfinite:
        raise ValueError(f"{name} contains Inf or NaN: the ESC is defined for finite inputs")


@host_guard
@streamed
def esc(A, B, *, backend: str | None = None, stream=None) -> mx.array:
    """Exact ESC of every output of ``A @ B``.

    Args:
        A: float64 ``(M, K)``; B: float64 ``(K, N)`` (``mx.array`` or numpy).
        backend: ``"metal"``, ``"emulate"``, ``"cpu"`` or None (active backend).
        stream: MLX stream or device (``mx.Stream``, ``mx.Device``) the op's MLX
            ops and kernel launches run on; None: the default stream.

    Returns:
        int32 ``mx.array`` ``(M, N)``: ``e(max|a_i.|) + e(max|b_.j|) - max_k [e(a_ik) +
        e(b_kj)]``; 0 where no k has both entries nonzero (the output is exactly 0).

    Raises:
        TypeError / ValueError: non-float64 or non-2-D inputs, mismatched K, or
        Inf/NaN entries.
    """
    A, B = check_operands(A, B)
    name = backends.resolve(backend)
    (M, K), N = A.shape, B.shape[1]
    a, b = np.array(A), np.array(B)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("A or B contains Inf or NaN: the ESC is defined for finite inputs")
    if not name.has_kernels or M * N == 0:
        return mx.array(esc_exact_cpu(a, b).astype(np.int32).reshape(M, N))
    if K == 0:
        return mx.zeros((M, N), mx.int32)
    (out,) = OZAKI_ESC(
        inputs=[row_bits(A), col_bits(B), OZAKI_ESC_PARAMS.pack(m=M, n=N, k=K)],
        grid=(N, M, 1), threadgroup=(min(N, 32), min(M, 8), 1),
        output_shapes=[(M, N)], output_dtypes=[mx.int32], backend=name,
    )
    return out


@host_guard
@streamed
def esc_estimate(A, B, block: int = DEFAULT_BLOCK, *, backend: str | None = None,
                 stream=None) -> mx.array:
    """Conservative ESC of every output of ``A @ B`` from k-block exponent summaries.

    Per k-block the scan keeps max/min exponent and nonzero count of each row of A
    and column of B; a block proves that some k has ``e(a_ik) + e(b_kj)`` at least
    ``max_A + min_B`` (B's part has no zero), ``min_A + max_B`` (A's part has no zero)
    or ``min_A + min_B`` (more nonzeros than the block has positions). The largest
    such bound replaces the exact max over k, so the estimate is never below
    :func:`esc` (cost O(MN K/block) instead of O(MNK)).

    Args:
        A: float64 ``(M, K)``; B: float64 ``(K, N)``.
        block: k-block length (positive int; 64 as in cuBLAS).
        backend: as :func:`esc`.
        stream: MLX stream or device (``mx.Stream``, ``mx.Device``) the op's MLX
            ops and kernel launches run on; None: the default stream.

    Returns:
        int32 ``mx.array`` ``(M, N)``; 0 for outputs of a zero row or column;
        :data:`ESC_UNBOUNDED` where no block proves a nonzero term.

    Raises:
        TypeError / ValueError: bad inputs (as :func:`esc`), bad ``block``.
    """
    A, B = check_operands(A, B)
    block = _check_block(block)
    name = backends.resolve(backend)
    (M, K), N = A.shape, B.shape[1]
    if M * N == 0 or K == 0:
        return mx.zeros((M, N), mx.int32)
    sa, sb, ia, ib = scan(A, B, block, name)
    _no_nonfinite(sa, "A")
    _no_nonfinite(sb, "B")
    return mx.array(_estimate(sa, sb, ia, ib, K, block, name).astype(np.int32))


# ---- slice counts ----------------------------------------------------------------


def headroom(slice_bits: int) -> int:
    """Magnitude bits a row scale gives up for the digit set: 0 for sign-magnitude
    digits (b <= 7), 2 for balanced 8-bit digits (|x| < 2^(t-2) keeps the top digit,
    after carries, inside int8)."""
    return 0 if slice_bits <= 7 else 2


def esc_width(esc_value: int) -> int:
    """Width the ESC rule asks for: 1 (sign) + 52 + ESC + 1 bits."""
    return 1 + 52 + int(esc_value) + 1


def slices_for_width(width: int, slice_bits: int) -> int:
    """Smallest slice count whose ``b s - headroom`` magnitude bits reach ``width``."""
    return max(1, -(-(int(width) + headroom(slice_bits)) // slice_bits))


TIGHT_GUARD = 4
"""Guard bits the tight rule adds to the ESC rule's width 1 + 52 + ESC + 1.

Measured on the phi suite (docs/ozaki.md; ``benchmarks/bench_ozaki.py --rules``):
with the exact ESC and no guard bits the rule's max relative error exceeded
native float64 matmul's in about 1 product in 15 (mostly plain normal data); with
3 guard bits in 1 of about 400; with 4 in none. The block estimate sits 5 to 16
bits above the exact ESC on the same inputs, so the tight rule still needs fewer
slices than the estimate rule there."""


def exact_slices(sa: Scan, sb: Scan, slice_bits: int):
    """Fewest slices that make the emulated product exact: every row of A and column
    of B fits its slices (b s - headroom >= e(max) + 1 - lowest set bit) and every
    nonzero digit pair is kept (n_A + n_B - 1 <= s). None for a zero product."""
    h = headroom(slice_bits)

    def digits(s: Scan):
        live = s.emax != NEG
        if not live.any():
            return 0
        width = (s.emax + 1 - s.lowest)[live]
        return int(-(-(width.max() + h) // slice_bits))

    na, nb = digits(sa), digits(sb)
    return None if na == 0 or nb == 0 else na + nb - 1


def rule_slices(method: str, A, B, sa: Scan, sb: Scan, est, slice_bits: int, backend: str):
    """``(slices, width)`` that rule ``method`` asks for; ``(None, None)`` when it
    cannot bound the product. ``width``: magnitude bits per value (the ESC rules:
    1 + 52 + ESC + 1)."""
    b = slice_bits
    if method == "esc_estimate":
        worst = int(np.max(est))
        if worst >= ESC_UNBOUNDED:
            return None, None
        w = esc_width(worst)
        return slices_for_width(w, b), w
    if method == "esc":
        w = esc_width(int(np.array(esc(A, B, backend=backend)).max()))
        return slices_for_width(w, b), w
    if method == "tight":
        s_exact = exact_slices(sa, sb, b)
        w = esc_width(int(np.array(esc(A, B, backend=backend)).max())) + TIGHT_GUARD
        s_stat = slices_for_width(w, b)
        if s_exact is not None and s_exact <= s_stat:
            return s_exact, b * s_exact - headroom(b)
        return s_stat, w
    raise ValueError(f"unknown slice rule {method!r}: expected one of {METHODS}")


@host_guard
@streamed
def slices_needed(A, B, method: str = "esc_estimate", slice_bits: int = 7,
                  block: int = DEFAULT_BLOCK, *, backend: str | None = None, stream=None):
    """Slice count a rule asks for to emulate ``A @ B`` with ``slice_bits``-bit slices.

    Methods:
        ``"esc"``: the ESC rule with the exact ESC: ``ceil((1 + 52 + ESC + 1 + h) / b)``
        (``h``: headroom of the digit set, 0 for b <= 7, 2 for b = 8), ESC the
        largest over the outputs.
        ``"esc_estimate"``: the same with :func:`esc_estimate` (cuBLAS's choice;
        what ``dgemm_emulated(slices="auto")`` uses).
        ``"tight"``: this package's rule, the fewer slices of two routes: (1) the
        count that makes the emulated product exact when the rows and columns have
        few significant bits (:func:`exact_slices`: integers, short fixed-point data,
        the worked example: 4 slices where the ESC rule asks for 10); (2) the ESC
        rule with the exact ESC and :data:`TIGHT_GUARD` guard bits, which kept
        native accuracy on the phi suite where the exact ESC rule alone did not,
        with at most as many slices as the estimate there, often one fewer
        (docs/ozaki.md).

    Args:
        A: float64 ``(M, K)``; B: float64 ``(K, N)``.
        method: one of ``"esc"``, ``"esc_estimate"``, ``"tight"``.
        slice_bits: 2..8.
        block: k-block length of the estimate.
        backend: as :func:`esc`.
        stream: MLX stream or device (``mx.Stream``, ``mx.Device``) the op's MLX
            ops and kernel launches run on; None: the default stream.

    Returns:
        int, or None when the estimate cannot bound the product (no k-block
        proves a nonzero term). 0 for an empty or all-zero product.

    Raises:
        TypeError / ValueError: bad inputs, Inf/NaN entries, unknown method,
        slice_bits outside [2, 8], bad block.
    """
    A, B = check_operands(A, B)
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: expected one of {METHODS}")
    if isinstance(slice_bits, bool) or not isinstance(slice_bits, (int, np.integer)) \
            or not 2 <= slice_bits <= 8:
        raise ValueError(f"slice_bits must be an int in [2, 8], got {slice_bits!r}")
    block = _check_block(block)
    name = backends.resolve(backend)
    (M, K), N = A.shape, B.shape[1]
    if M * N == 0 or K == 0:
        return 0
    sa, sb, ia, ib = scan(A, B, block, name)
    _no_nonfinite(sa, "A")
    _no_nonfinite(sb, "B")
    if not ((sa.emax != NEG).any() and (sb.emax != NEG).any()):
        return 0
    est = _estimate(sa, sb, ia, ib, K, block, name) if method == "esc_estimate" else None
    return rule_slices(method, A, B, sa, sb, est, int(slice_bits), name)[0]
