"""Split-integer (Ozaki-style) DGEMM emulation: float64 products from int8 slices.

Apple GPUs have no float64. :func:`dgemm_emulated` computes ``A @ B`` for float64
matrices from exact int8 x int8 -> int32 matrix products (Ozaki scheme I on
integers, as in ozIMMU and cuBLAS's FP64 emulation; docs/ozaki.md cites the papers):

1. exponent scan (``ozaki_scan``): per row of A / column of B the largest exponent,
   and per k-block the exponent range and nonzero count for the ESC estimate;
2. slice count: fixed, or chosen from the ESC (:mod:`mlx_precise.esc`);
3. slicing (``ozaki_slice``): row i of A is scaled by 2^-t_i (a power of two, so
   exactly), its magnitude truncated to ``b s`` fraction bits and cut into ``s``
   digits of ``b`` bits, stored as int8 with the sign (likewise B's columns).
   b <= 7: sign-magnitude digits, t_i = e(max|a_i.|) + 1, so ``b s`` magnitude
   bits; b = 8: balanced digits in [-128, 127] (carries from the low digits),
   which need 2 bits of headroom (t_i = e + 3): ``8 s - 2`` magnitude bits;
4. slice products (``ozaki_products``, on the shared int8 GEMM engine of
   ``metal/include/int8_gemm.h``): for each anti-diagonal ``d = p + q < s``
   (0-based; the s(s+1)/2 pairs of Ozaki's scheme) ``D_d = sum_p A_p B_(d-p)``
   exactly in int32, all in one launch, k-blocked so that no int32 sum can
   overflow (``k_block``);
5. accumulation (``ozaki_accumulate``): ``sum_d D_d 2^(b(s-1-d))`` exactly in
   128-bit integers, ONE rounding to float64 bits, scales undone by the exponent
   (``2^(t_i + t_j - b(s+1))``).

So each output is the correctly rounded value of the kept terms: the exact product
of the truncated inputs, less the slice pairs ``p + q >= s``. Inputs with Inf/NaN,
and (in rule-based modes) products whose required width exceeds ``max_bits``, are
computed by native float64 matmul on the CPU instead; ``return_info=True`` says so.

The ``cpu`` backend computes the same sums in numpy with float64 BLAS products of
digit *pieces* (several slices at once, exact below 2^53; :func:`product_cpu`),
blocked over N and K, and rounds them the same way: bit for bit the same result.
"""

from __future__ import annotations

import functools

import mlx.core as mx
import numpy as np

from ..core import backends
from ..core.streams import streamed
from ..esc import engine as _esc
from ..core.autodiff import guarded, host_guard
from ..core.cputhreads import map_runs, workers_for
from ..esc.engine import DEFAULT_BLOCK, METHODS, NEG, Scan, check_operands, pad8
from ..int8.engine import device_buffer, gemm_grid
from ..core.kernels import Kernel, ParamLayout, generated_block
from ..core.backends import Backend

_I32 = (mx.int32,)
_INT32_MAX = 2**31 - 1
_FLOAT64_EXACT = 2**53  # integers below this are exact in float64 sums

OZAKI_SLICE_PARAMS = ParamLayout("OZAKI_SLICE", (
    "rows",        # R, rows of X
    "cols",        # C, columns of X
    "slices",      # S
    "slice_bits",  # B, bits per slice
    "balanced",    # balanced digits (B = 8), else sign-magnitude
), size=8)
"""The ``params`` buffer of ``ozaki_slice`` (``OZAKI_SLICE_ROWS`` ... in
``metal/include/ozaki.h``)."""

OZAKI_SLICE = Kernel(
    name="ozaki_slice",
    body="ozaki_slice.metal",
    headers=("ozaki.h",),
    inputs=("x", "t", "params"),
    outputs=("out",),
    input_dtypes={"x": (mx.uint32,), "t": _I32, "params": _I32},
    extended=False,
    variants={"out": (mx.int8,)},
)
"""Rows of a float64 matrix (raw bits) -> int8 slices ``[S, R, C]`` (params:
:data:`OZAKI_SLICE_PARAMS`)."""

OZAKI_ACCUMULATE_PARAMS = ParamLayout("OZAKI_ACCUMULATE", (
    "m", "n",      # the output C (M, N)
    "slices",      # S
    "slice_bits",  # B
    "k_blocks",    # NKB, the k-blocks of the slice products
), size=8)
"""The ``params`` buffer of ``ozaki_accumulate`` (``OZAKI_ACCUMULATE_M`` ...)."""

OZAKI_ACCUMULATE = Kernel(
    name="ozaki_accumulate",
    body="ozaki_accumulate.metal",
    headers=("ozaki.h",),
    inputs=("prod", "tA", "tB", "params"),
    outputs=("out",),
    input_dtypes={"prod": _I32, "tA": _I32, "tB": _I32, "params": _I32},
    extended=False,
    variants={"out": (mx.uint32,)},
)
"""int32 slice products ``[S, NKB, M, N]`` -> float64 bits (uint32 ``[M, N, 2]``)
(params: :data:`OZAKI_ACCUMULATE_PARAMS`)."""

OZAKI_PRODUCTS_PARAMS = ParamLayout("OZAKI_PRODUCTS", (
    "m", "n", "k",  # one slice product: A_i (M, K) B_j (K, N)
    "k_block",      # KB, the k-block length
    "k_blocks",     # NKB, the number of k-blocks
), size=8)
"""The ``p`` buffer of ``ozaki_products`` (``OZAKI_PRODUCTS_M`` ...)."""

OZAKI_PRODUCTS = Kernel(
    name="ozaki_products",
    body="ozaki_products.metal",
    headers=("ozaki.h", "int8_gemm.h"),
    inputs=("a", "b", "p"),
    outputs=("c",),
    input_dtypes={"a": (mx.int8,), "b": (mx.int8,), "p": _I32},
    extended=False,
    variants={"c": (mx.int32,)},
    # device_buffer, OZAKI_PRODUCTS_PARAMS (8 elements)
    input_forms=dict.fromkeys(("a", "b", "p"), ("device",)),
)
"""All kept slice products in one launch of the shared int8 GEMM engine: int8
slices ``[S, M, K]`` and ``[S, K, N]`` -> int32 anti-diagonal sums ``[S, NKB, M, N]``
(p: :data:`OZAKI_PRODUCTS_PARAMS`)."""


def codes_source() -> str:
    """The second generated block of ``metal/include/ozaki.h`` (a test checks that
    the header holds exactly this text)."""
    return generated_block("mlx_precise.ozaki.engine.codes_source()", OZAKI_SLICE_PARAMS,
                           OZAKI_ACCUMULATE_PARAMS, OZAKI_PRODUCTS_PARAMS)


# ---- parameters ------------------------------------------------------------------


def max_digit_product(slice_bits: int) -> int:
    """Largest |digit x digit|: (2^b - 1)^2 for sign-magnitude digits, 2^14 for
    balanced 8-bit digits (only (-128)^2 reaches it)."""
    return (2**slice_bits - 1) ** 2 if slice_bits <= 7 else 2 ** (2 * slice_bits - 2)


def k_block(slices: int, slice_bits: int, limit: int = _INT32_MAX) -> int:
    """Longest k-block whose diagonal sums (up to ``slices`` pairs per k) stay
    within ``limit`` in magnitude: int32 for the GEMM engine."""
    return max(1, limit // (slices * max_digit_product(slice_bits)))


def max_slices(K: int, slice_bits: int) -> int:
    """Most slices the 128-bit accumulator holds for this K.

    |acc| <= K 2^(b(s+1)) sum_d (d+1) 2^(-bd) < 1.8 K 2^(b(s+1)) for b >= 2, so
    b (s+1) + bit_length(K) + 2 <= 127 keeps it below 2^127 (two's complement)."""
    lk = max(1, int(K)).bit_length()
    return max(1, (126 - lk - 1) // slice_bits - 1)


def _check_options(slices, slice_bits, max_bits):
    if isinstance(slice_bits, bool) or not isinstance(slice_bits, (int, np.integer)):
        raise TypeError(f"slice_bits must be an int, got {type(slice_bits).__name__}")
    if not 2 <= slice_bits <= 8:
        raise ValueError(
            f"slice_bits must be in [2, 8], got {slice_bits}: a slice is an int8 "
            f"digit (sign-magnitude for b <= 7, balanced for b = 8), and the int32 "
            f"accumulator of a k-block of the int8 GEMM then stays exact (k-blocks of "
            f"up to {k_block(1, 8)} terms per slice pair at b = 8); wider digits "
            f"overflow int8 and, for long k, int32"
        )
    if isinstance(slices, str):
        if slices != "auto" and slices not in METHODS:
            raise ValueError(
                f"slices must be a positive int, 'auto' or one of {METHODS}, got {slices!r}"
            )
    elif isinstance(slices, bool) or not isinstance(slices, (int, np.integer)):
        raise TypeError(f"slices must be an int or a rule name, got {type(slices).__name__}")
    elif slices < 1:
        raise ValueError(f"slices must be >= 1, got {slices}")
    if isinstance(max_bits, bool) or not isinstance(max_bits, (int, np.integer)) or max_bits < 1:
        raise ValueError(f"max_bits must be a positive int, got {max_bits!r}")


def scale_exponents(emax: np.ndarray, slice_bits: int) -> np.ndarray:
    """Row scale exponents t with |x| < 2^(t - headroom): emax + 1 + headroom;
    0 for zero rows (their digits are all zero whatever t is)."""
    t = emax + 1 + _esc.headroom(slice_bits)
    return np.where(emax == NEG, 0, t).astype(np.int32)


# ---- cpu implementation (numpy) ---------------------------------------------------


def slice_cpu(X: np.ndarray, t: np.ndarray, S: int, b: int) -> np.ndarray:
    """numpy implementation of ozaki_slice: int8 ``[S, R, C]``."""
    sign, m, u, _ = _esc.fields(X)
    sgn = np.where(sign == 1, -1, 1)
    shift = u + b * S - t.astype(np.int64)[:, None]
    mask = np.uint64(2**b - 1)
    out = np.empty((S,) + X.shape, dtype=np.int8)
    carry = np.zeros(X.shape, dtype=np.int64)
    half = 1 << (b - 1)
    for p in range(S - 1, -1, -1):
        pos = b * (S - 1 - p) - shift
        right = (m >> np.clip(pos, 0, 63).astype(np.uint64)) & mask
        left = (m << np.clip(-pos, 0, 63).astype(np.uint64)) & mask
        dig = np.where(pos >= 64, 0, np.where(pos >= 0, right, np.where(pos > -b, left, 0)))
        d = sgn * dig.astype(np.int64) + carry
        carry = np.zeros_like(carry)
        if b == 8:  # balanced digits (see ozaki_slice.metal)
            up, down = d >= half, d < -half
            d = np.where(up, d - 2 * half, np.where(down, d + 2 * half, d))
            carry = up.astype(np.int64) - down.astype(np.int64)
        out[p] = d
    return out


def products_cpu(sa: np.ndarray, sb: np.ndarray, b: int) -> np.ndarray:
    """Diagonal sums ``D_d = sum_p A_p B_(d-p)``, d < S, int64 ``[S, M, N]``.

    float64 BLAS is exact here: every partial sum is an integer of magnitude below
    S K max_digit_product(b) < 2^53 (checked)."""
    S, M, K = sa.shape
    N = sb.shape[2]
    if S * K * max_digit_product(b) >= _FLOAT64_EXACT:
        raise ValueError(f"K={K} too long for exact float64 slice products")
    out = np.zeros((S, M, N), dtype=np.int64)
    for d in range(S):
        acc = np.zeros((M, N))
        for p in range(d + 1):  # converted per pair: memory stays O(MK + KN)
            acc += sa[p].astype(np.float64) @ sb[d - p].astype(np.float64)
        out[d] = acc.astype(np.int64)
    return out


_U64 = np.uint64
_MASK52 = _U64((1 << 52) - 1)


def _shr128(hi, lo, n):
    """Logical right shift of (hi, lo) uint64 arrays by n >= 0 (int array)."""
    n = np.asarray(n, dtype=np.int64)
    a = np.clip(n, 0, 63).astype(_U64)
    b = np.clip(n - 64, 0, 63).astype(_U64)
    c = np.clip(64 - n, 0, 63).astype(_U64)
    small_lo = np.where(n == 0, lo, (lo >> a) | (hi << c))
    small_hi = hi >> a
    lo2 = np.where(n >= 128, 0, np.where(n >= 64, hi >> b, small_lo)).astype(_U64)
    hi2 = np.where(n >= 64, 0, small_hi).astype(_U64)
    return hi2, lo2


def _ones(k):
    """uint64 masks of the low k bits, 0 <= k <= 64 (int array)."""
    k = np.asarray(k, dtype=np.int64)
    part = (_U64(1) << np.clip(k, 0, 63).astype(_U64)) - _U64(1)
    return np.where(k >= 64, _U64(2**64 - 1), np.where(k <= 0, _U64(0), part)).astype(_U64)


def _low_bits_nonzero(hi, lo, k):
    """True where the low k bits of (hi, lo) are not all zero (any k)."""
    k = np.asarray(k, dtype=np.int64)
    return ((lo & _ones(k)) != 0) | ((hi & _ones(k - 64)) != 0)


def round_i128_cpu(hi: np.ndarray, lo: np.ndarray, E: np.ndarray) -> np.ndarray:
    """numpy implementation of oz_round_to_f64: float64 RN((hi, lo) 2^E), where
    (hi, lo) is a two's-complement 128-bit integer (uint64 words)."""
    hi, lo = hi.astype(_U64), lo.astype(_U64)
    E = np.asarray(E, dtype=np.int64)
    neg = (hi >> _U64(63)) == 1
    nlo = ~lo + _U64(1)
    nhi = ~hi + (nlo == 0).astype(_U64)
    hi, lo = np.where(neg, nhi, hi), np.where(neg, nlo, lo)
    bl = _esc._bit_length
    n = np.where(hi != 0, 64 + bl(hi), bl(lo))
    q = np.maximum(n - 53 + E, -1074)
    r = q - E
    exact = lo << np.clip(-r, 0, 63).astype(_U64)
    _, shifted = _shr128(hi, lo, np.maximum(r, 0))
    _, halfbit = _shr128(hi, lo, np.maximum(r - 1, 0))
    sticky = _low_bits_nonzero(hi, lo, r - 1)
    up = (r > 0) & ((halfbit & _U64(1)) == 1) & (sticky | ((shifted & _U64(1)) == 1))
    mant = np.where(r <= 0, exact, shifted + up.astype(_U64)).astype(_U64)
    carry = mant == _U64(1 << 53)
    mant = np.where(carry, _U64(1 << 52), mant)
    q = q + carry
    biased = q + 1075
    normal = mant >= _U64(1 << 52)
    bits = np.where(
        normal,
        (np.clip(biased, 0, 2047).astype(_U64) << _U64(52)) | (mant & _MASK52),
        mant,
    ).astype(_U64)
    bits = np.where(normal & (biased >= 2047), _U64(0x7FF0000000000000), bits)
    bits |= neg.astype(_U64) << _U64(63)
    bits = np.where(n == 0, 0, bits).astype(_U64)
    return bits.view(np.float64)


def _round_i128_fast(hi: np.ndarray, lo: np.ndarray, E: np.ndarray) -> np.ndarray:
    """:func:`round_i128_cpu` by round-to-odd: the magnitude cut to its top 64 bits
    with the dropped bits ORed into the last one, converted to float64 (RN), then
    scaled by 2^(shift + E). Rounding to odd on 64 >= 53 + 2 bits and then to
    nearest rounds correctly once (Boldo and Melquiond, IEEE TC 2008); the scaling
    is exact unless the result is subnormal, where :func:`round_i128_cpu` decides."""
    neg = hi.view(np.int64) < 0
    nlo = ~lo + _U64(1)
    nhi = ~hi + (nlo == 0).astype(_U64)
    mh, ml = np.where(neg, nhi, hi), np.where(neg, nlo, lo)
    r = np.where(mh != 0, _esc._bit_length(mh), 0)  # bits to drop to fit 64
    rr = r.astype(_U64)
    kept = (mh << (_U64(64) - rr)) | (ml >> rr)  # r = 0 and r = 64: replaced below
    kept = np.where(r == 0, ml, np.where(r == 64, mh, kept))
    sticky = (ml & ((_U64(1) << rr) - _U64(1))) != 0
    sticky = np.where(r == 64, ml != 0, sticky)
    f = (kept | sticky.astype(_U64)).astype(np.float64)
    f = np.where(neg, -f, f)
    k = (r + E).astype(np.int64)
    with np.errstate(over="ignore"):
        out = np.ldexp(f, k)
    # below 2^-1022 ldexp rounds again; exactly 2^-1022 may be such a rounding up
    tiny = (np.abs(out) <= 2.0**-1022) & (f != 0)
    if tiny.any():
        out[tiny] = round_i128_cpu(hi[tiny], lo[tiny], np.broadcast_to(E, hi.shape)[tiny])
    return out


def accumulate_cpu(D, tA: np.ndarray, tB: np.ndarray, b: int) -> np.ndarray:
    """numpy implementation of ozaki_accumulate: Horner in 128 bits, one rounding.

    ``D``: the S weight classes, an int64 ``[S, M, N]`` array or a sequence of S
    int64 ``(M, N)`` arrays or None (an all-zero class: no work for it but the
    shift)."""
    S = len(D)
    hi = lo = None
    pending = 0  # bits of shift owed to the accumulator since the last class added
    for d in range(S):
        pending += b if hi is not None else 0
        if D[d] is None:
            continue
        v = np.ascontiguousarray(D[d], dtype=np.int64)
        if hi is None:
            hi, lo = (v >> 63).view(_U64), v.copy().view(_U64)
            continue
        while pending:
            sh = min(pending, 63)
            hi = (hi << _U64(sh)) | (lo >> _U64(64 - sh))
            lo = lo << _U64(sh)
            pending -= sh
        new = lo + v.view(_U64)
        hi = hi + (new < lo).astype(_U64) + (v >> 63).view(_U64)
        lo = new
    E = tA.astype(np.int64)[:, None] + tB.astype(np.int64)[None, :] - b * (S + 1) + pending
    if hi is None:
        return np.zeros(E.shape)
    return _round_i128_fast(hi, lo, E)


# ---- cpu product: float64 GEMMs of digit groups -------------------------------------
#
# The kept terms are the digit pairs (p, q) with p + q <= S - 1. A float64 GEMM of
# integers is exact while every partial sum stays below 2^53, so instead of one int8
# GEMM per pair it multiplies *pieces*: the integer value of g consecutive digits,
# sum_{p0 <= p < p1} d_p 2^(b (p1 - 1 - p)) (< 2^(b g)). A piece of A times a piece of
# B carries exactly the pairs of a rectangle [p0, p1) x [q0, q1) of the triangle,
# scaled to the weight class e = (p1 - 1) + (q1 - 1). Rectangles of a x c seven-bit
# digits with a + c <= 6 (42-bit products, 2^11 of them below 2^53) tile the triangle
# of S = 9 slices with 11 GEMMs instead of 45 (:func:`plan_pieces`): the splitting
# of Ozaki scheme I, with float64 GEMMs of slice sums as in Ozaki, Ogita, Oishi, Rump
# (2012) and Mukunoki et al. (2020, the exponent budget of a DGEMM-based split). The
# sums are the same integers as the int8 path's, so the result is bit for bit the
# same (one rounding of the kept terms).

_BUDGET = 2**53  # float64 integers are exact below this
_INT64 = 2**63
_PIECE_VALUES = 2**19  # M x (K-chunk) values per piece of A: bounds the temporaries
_OUT_VALUES = 2**20  # M x (N-block) outputs per class sum
_FILL_VALUES = 2**15  # values per row chunk of the pieces: S + 1 truncations in cache
_HORNER_VALUES = 2**15  # outputs per row chunk of Horner's ~10 uint64 temporaries


def _piece_bound(g: int, b: int) -> int:
    """Largest |value| of a piece of g digits."""
    top = 2**b - 1 if b <= 7 else 2 ** (b - 1)
    return top * ((1 << (b * g)) - 1) // ((1 << b) - 1)


@functools.lru_cache(maxsize=None)
def plan_pieces(S: int, b: int) -> dict:
    """Rectangles ``(p0, p1, q0, q1)`` of digit pairs, grouped by weight class e,
    that cover the kept pairs p + q <= S - 1 exactly once, as few as a guillotine
    search finds (each costs one GEMM of the full K): a rectangle fits when its
    products, 256 at a time, stay exact in float64.

    The search takes a rectangle at the top-left cell of the remaining staircase
    and recurses on what is right of it and what is below it (both staircases
    again, memoised). For S = 9 seven-bit slices (a + c <= 6 digits per a x c
    rectangle) it finds 11, the least possible: the 9 cells p + q = 8 need one
    rectangle each; (0, 0) lies in none of those, in some [0, a) x [0, c); and one
    of its neighbours (0, c), (a, 0) also lies in none of them (reaching row 0 at
    column c from the last diagonal takes c >= 4 digits, likewise a >= 4)."""
    fits = lambda a, c: 256 * _piece_bound(a, b) * _piece_bound(c, b) < _BUDGET  # noqa: E731

    @functools.lru_cache(maxsize=None)
    def cover(rows: tuple) -> tuple:
        # rows: the non-increasing lengths of a staircase anchored at (0, 0)
        if not rows:
            return ()
        found = None
        for a in range(1, len(rows) + 1):
            for c in range(rows[a - 1], 0, -1):
                if fits(a, c):
                    right = tuple(n - c for n in rows[:a] if n > c)
                    cand = ((0, a, 0, c),) + _shifted(cover(right), 0, c) \
                        + _shifted(cover(rows[a:]), a, 0)
                    if found is None or len(cand) < len(found):
                        found = cand
        return found

    plan: dict = {}
    for p0, p1, q0, q1 in cover(tuple(range(S, 0, -1))):
        plan.setdefault((p1 - 1) + (q1 - 1), []).append((p0, p1, q0, q1))
    return plan


def _shifted(rects: tuple, dp: int, dq: int) -> tuple:
    return tuple((p0 + dp, p1 + dp, q0 + dq, q1 + dq) for p0, p1, q0, q1 in rects)


def _class_bound(rects, b: int) -> int:
    """Largest |sum of one k term| over the rectangles of one weight class."""
    return sum(_piece_bound(p1 - p0, b) * _piece_bound(q1 - q0, b) for p0, p1, q0, q1 in rects)


def _prefixes(X: np.ndarray, t: np.ndarray, S: int, b: int, buf: np.ndarray) -> np.ndarray:
    """Digit source of the rows of X (float64 (R, C), row scales t): for b <= 7 the
    truncations ``P_k = trunc(X 2^(b k - t))``, k = 1..S, float64 (S + 1, R, C) in
    ``buf`` (a reused float64 buffer of at least that size: fresh pages per chunk
    would cost more than the arithmetic), each exact (at most 53 significant bits);
    for balanced 8-bit digits the int8 digits of :func:`slice_cpu` (S, R, C)."""
    if b == 8:
        return slice_cpu(X, t, S, b)
    P = buf[:(S + 1) * X.size].reshape((S + 1,) + X.shape)
    xs = P[0]  # P_0 = trunc(xs) = 0 is never read (see _piece): its slot holds xs
    # xs = X 2^-t, |xs| < 1, by two power-of-two factors (each in range; ldexp is ~8x
    # slower): exact while xs is normal; a subnormal xs (< 2^-1022) has only zero
    # digits whatever its rounding, as b S < 127
    h = -(t.astype(np.int64) // 2)
    np.multiply(X, np.exp2(h.astype(np.float64))[:, None], out=xs)
    xs *= np.exp2((-t - h).astype(np.float64))[:, None]
    for k in range(1, S + 1):
        np.trunc(np.multiply(xs, 2.0 ** (b * k), out=P[k]), out=P[k])
    return P


def _piece(src: np.ndarray, p0: int, p1: int, b: int, out: np.ndarray,
           tmp: np.ndarray) -> None:
    """Write the piece of digits [p0, p1) (see :func:`_prefixes`) into ``out``:
    P_p1 - P_p0 2^(b (p1 - p0)) (an integer below 2^(b g): exact), or the Horner
    sum of the int8 digits. ``tmp``: contiguous scratch of out's shape (an
    in-place subtract into a strided ``out`` makes numpy copy)."""
    if src.dtype == np.int8:
        out[...] = src[p0]
        for p in range(p0 + 1, p1):
            out *= 2.0**b
            out += src[p]
        return
    if p0 == 0:  # P_0 = 0
        np.copyto(out, src[p1])
        return
    np.multiply(src[p0], 2.0 ** (b * (p1 - p0)), out=tmp)
    np.subtract(src[p1], tmp, out=out)


def _fill_pieces(X: np.ndarray, t: np.ndarray, S: int, b: int, slots) -> None:
    """Write pieces of the rows of X (float64 (R, w)) into ``slots``: a list of
    ``((p0, p1), out)`` with out (R, w) views. Rows go in chunks of ~2^15 values so
    that the S + 1 truncations of a chunk stay in cache, one run of chunks per core."""
    R, w = X.shape
    step = max(1, _FILL_VALUES // max(w, 1))
    starts = list(range(0, R, step))

    def run(part):
        tmp, buf = np.empty((step, w)), np.empty((S + 1) * step * w)
        for r0 in part:
            src = _prefixes(X[r0:r0 + step], t[r0:r0 + step], S, b, buf)
            for (p0, p1), out in slots:
                o = out[r0:r0 + step]
                _piece(src, p0, p1, b, o, tmp[:o.shape[0]])

    map_runs(run, starts, workers_for(R * w * len(slots), len(starts)))


def _add_int64(i, f: np.ndarray) -> np.ndarray:
    """An int64 class sum ``i`` (None: none yet) plus the exact float64 sum ``f``."""
    if i is None:
        return f.astype(np.int64)
    i += f.astype(np.int64)
    return i


def product_cpu(a: np.ndarray, b_: np.ndarray, tA: np.ndarray, tB: np.ndarray, S: int,
                b: int) -> np.ndarray:
    """float64 ``(M, N)``: the kept slice-pair terms of ``a @ b_`` rounded once
    (bit for bit :func:`accumulate_cpu` of :func:`products_cpu`), by float64 GEMMs
    of digit pieces, blocked over N (column blocks) and K (chunks), so the
    temporaries are bounded: about 8 R (M + N-block) K-chunk bytes of pieces (R
    rectangles) and 8 (2 #classes + 1) M N-block bytes of class sums.

    a: float64 (M, K); b_: float64 (K, N); tA (M,), tB (N,) int scale exponents."""
    (M, K), N = a.shape, b_.shape[1]
    plan = plan_pieces(S, b)
    bounds = {e: _class_bound(r, b) for e, r in plan.items()}
    if K * max(bounds.values()) >= _INT64:  # int64 class sums would overflow
        slA = slice_cpu(a, tA, S, b)
        slB = slice_cpu(np.ascontiguousarray(b_.T), tB, S, b)
        return accumulate_cpu(products_cpu(slA, np.ascontiguousarray(slB.transpose(0, 2, 1)), b),
                              tA, tB, b)
    nb = min(N, max(256, _OUT_VALUES // M))
    kc = min(K, max(64, _PIECE_VALUES // max(M, nb)),
             min((_BUDGET - 1) // v for v in bounds.values()))
    out = np.empty((M, N))
    rows = max(1, _HORNER_VALUES // nb)
    for j0 in range(0, N, nb):
        j1 = min(N, j0 + nb)
        # reused by every chunk (fresh pages each time cost as much as the fill): the
        # pieces of each class side by side along k, and one GEMM product
        pa = {e: np.empty((M, kc * len(r))) for e, r in plan.items()}
        pb = {e: np.empty((j1 - j0, kc * len(r))) for e, r in plan.items()}
        prod = np.empty((M, j1 - j0))
        sums = {}
        for k0 in range(0, K, kc):
            k1 = min(K, k0 + kc)
            w = k1 - k0
            ga = {e: pa[e][:, :w * len(r)] for e, r in plan.items()}
            gb = {e: pb[e][:, :w * len(r)] for e, r in plan.items()}
            cut = lambda arr, i: arr[:, i * w:(i + 1) * w]  # noqa: E731
            _fill_pieces(a[:, k0:k1], tA, S, b, [((r[0], r[1]), cut(ga[e], i))
                                                 for e, rs in plan.items() for i, r in enumerate(rs)])
            _fill_pieces(np.ascontiguousarray(b_[k0:k1, j0:j1].T), tB[j0:j1], S, b,
                         [((r[2], r[3]), cut(gb[e], i))
                          for e, rs in plan.items() for i, r in enumerate(rs)])
            for e in plan:
                # float64 sums stay exact while the terms added bound them below 2^53;
                # then they move into int64
                f, n, i = sums.get(e, (None, 0, None))
                if f is None:
                    f, n = ga[e] @ gb[e].T, 0
                elif (n + w) * bounds[e] < _BUDGET:
                    f += np.matmul(ga[e], gb[e].T, out=prod)
                else:
                    i = _add_int64(i, f)
                    f, n = np.matmul(ga[e], gb[e].T, out=f), 0
                sums[e] = (f, n + w, i)
        del pa, pb, ga, gb, prod  # before Horner's temporaries
        total = {}
        for e in list(sums):  # one class at a time: one int64 temporary
            f, _, i = sums.pop(e)
            total[e] = _add_int64(i, f)
            del f

        def horner(part):
            for r0 in part:
                r1 = min(M, r0 + rows)
                D = [total[e][r0:r1] if e in total else None for e in range(S)]
                out[r0:r1, j0:j1] = accumulate_cpu(D, tA[r0:r1], tB[j0:j1], b)

        starts = list(range(0, M, rows))  # ~8 uint64 passes per output: weight 8
        map_runs(horner, starts, workers_for(8 * M * (j1 - j0), len(starts)))
    return out


# ---- Metal implementation ---------------------------------------------------------


def _slice_metal(bits: mx.array, t: np.ndarray, R: int, C: int, S: int, b: int,
                 backend: str) -> mx.array:
    (out,) = OZAKI_SLICE(
        inputs=[bits, pad8(mx.array(t.astype(np.int32))),
                OZAKI_SLICE_PARAMS.pack(rows=R, cols=C, slices=S, slice_bits=b,
                                        balanced=b == 8)],
        grid=(C, R, 1), threadgroup=(min(C, 64), min(R, 4), 1),
        output_shapes=[(S, R, C)], output_dtypes=[mx.int8], backend=backend,
    )
    return out


def _products_metal(sa: mx.array, sb: mx.array, b: int, backend: str):
    """int32 ``[S, NKB, M, N]`` from one launch of ``ozaki_products`` (sa: int8
    ``[S, M, K]``; sb: int8 ``[S, K, N]``), and NKB."""
    S, M, K = sa.shape
    N = sb.shape[2]
    kb = min(k_block(S, b), K)  # the longest diagonal has S pairs per k
    nkb = -(-K // kb)
    grid, tg = gemm_grid(M, N, S * nkb)
    (P,) = OZAKI_PRODUCTS(
        inputs=[device_buffer(sa), device_buffer(sb),
                OZAKI_PRODUCTS_PARAMS.pack(m=M, n=N, k=K, k_block=kb, k_blocks=nkb)],
        grid=grid, threadgroup=tg, output_shapes=[(S * nkb, M, N)],
        output_dtypes=[mx.int32], backend=backend,
    )
    return P, nkb


def _accumulate_metal(P: mx.array, nkb: int, tA, tB, M: int, N: int, S: int, b: int,
                      backend: str) -> mx.array:
    (out,) = OZAKI_ACCUMULATE(
        inputs=[pad8(P), pad8(mx.array(tA)), pad8(mx.array(tB)),
                OZAKI_ACCUMULATE_PARAMS.pack(m=M, n=N, slices=S, slice_bits=b, k_blocks=nkb)],
        grid=(N, M, 1), threadgroup=(min(N, 32), min(M, 8), 1),
        output_shapes=[(M, N, 2)], output_dtypes=[mx.uint32], backend=backend,
    )
    # uint32 bits -> float64 on the CPU stream (no float64 on the GPU)
    return mx.reshape(mx.view(out, mx.float64, stream=mx.cpu), (M, N), stream=mx.cpu)


# ---- the product -------------------------------------------------------------------


def _native(A: mx.array, B: mx.array) -> mx.array:
    """Native float64 matmul on the CPU (the fallback)."""
    out = mx.matmul(A, B, stream=mx.cpu)
    mx.eval(out)
    return out


def _emulate(A, B, sa: Scan, sb: Scan, S: int, b: int, name: Backend) -> mx.array:
    (M, K), N = A.shape, B.shape[1]
    tA = scale_exponents(sa.emax, b)
    tB = scale_exponents(sb.emax, b)
    if not name.has_kernels:
        return mx.array(product_cpu(np.asarray(A), np.asarray(B), tA, tB, S, b),
                        dtype=mx.float64)
    slA = _slice_metal(_esc.row_bits(A), tA, M, K, S, b, name)
    slB = _slice_metal(_esc.col_bits(B), tB, N, K, S, b, name)
    P, nkb = _products_metal(slA, mx.transpose(slB, (0, 2, 1)), b, name)
    return _accumulate_metal(P, nkb, tA, tB, M, N, S, b, name)


@host_guard
@streamed
def dgemm_emulated(A, B, *, slices="auto", slice_bits: int = 7, max_bits: int = 79,
                   return_info: bool = False, backend: str | None = None, stream=None):
    """float64 ``A @ B`` from exact int8 slice products (Ozaki scheme on integers).

    Args:
        A: float64 ``(M, K)``; B: float64 ``(K, N)`` (``mx.array`` on the CPU, or numpy).
        slices: number of slices per operand (int >= 1), or a rule choosing it from
            the inputs: ``"auto"`` (= ``"esc_estimate"``, the conservative block
            estimate used by cuBLAS), ``"esc"`` (exact ESC) or ``"tight"`` (this
            package's rule; see :func:`mlx_precise.esc.slices_needed`).
        slice_bits: bits per slice, 2..8. b <= 7 uses sign-magnitude digits (b s
            magnitude bits per value); b = 8 uses balanced digits in [-128, 127]
            (8 s - 2 magnitude bits).
        max_bits: rule-based modes fall back to native float64 when the width the
            rule asks for (ESC rule: 1 + 52 + ESC + 1 bits) exceeds it (79: cuBLAS).
        return_info: also return a dict with ``slices``, ``slice_bits``, ``esc``
            (largest estimated ESC over the outputs), ``width`` (bits the rule asked
            for), ``method``, ``fallback`` (bool), ``reason`` and ``backend``.
        backend: ``"metal"``, ``"emulate"``, ``"cpu"`` or None (the active backend).
        stream: MLX stream or device (``mx.Stream``, ``mx.Device``) the op's MLX
            ops and kernel launches run on; None: the default stream.

    Returns:
        float64 ``mx.array`` ``(M, N)``: each entry the correctly rounded (to
        nearest, ties to even) sum of the kept slice-pair terms, i.e. of the exact
        product of A and B truncated to ``b s`` bits below each row's / column's
        leading power of two, less the pairs ``p + q >= s`` (0-based). With enough
        slices for the inputs' bits this is the correctly rounded exact product.
        ``(C, info)`` when ``return_info``.

    Raises:
        TypeError: A or B not float64 numpy / mx arrays; non-int options.
        ValueError: not 2-D, mismatched K, ``slice_bits`` outside [2, 8], ``slices``
            < 1 or more than the 128-bit accumulator holds for this K, unknown rule.
    """
    A, B = check_operands(A, B)
    _check_options(slices, slice_bits, max_bits)
    b = int(slice_bits)
    name = backends.resolve(backend)
    (M, K), N = A.shape, B.shape[1]
    method = "esc_estimate" if slices == "auto" else (slices if isinstance(slices, str) else "fixed")
    info = dict(slices=None, slice_bits=b, esc=None, width=None, method=method,
                fallback=False, reason=None, backend=name)

    def done(C):
        if isinstance(A, mx.array) or isinstance(B, mx.array):
            # no VJP: mx.grad raises NotDifferentiableError instead of returning zeros
            C = guarded(lambda *_: C, [x for x in (A, B) if isinstance(x, mx.array)],
                        "dgemm_emulated", "its VJP is not implemented")
        return (C, info) if return_info else C

    if isinstance(slices, (int, np.integer)) and slices > max_slices(K, b):
        raise ValueError(
            f"slices={slices} with slice_bits={b} overflows the 128-bit accumulator "
            f"for K={K}: at most {max_slices(K, b)} slices"
        )
    if M * N == 0 or K == 0:
        info["slices"] = 0
        return done(mx.zeros((M, N), mx.float64, stream=mx.cpu))
    sa, sb, ia, ib = _esc.scan(A, B, DEFAULT_BLOCK, name, lowest=method == "tight")
    if sa.nonfinite or sb.nonfinite:
        info.update(fallback=True, reason="Inf/NaN input")
        return done(_native(A, B))
    if method != "fixed" or return_info:
        # the rules read only the largest estimate: on cpu, no (M, N) array for it
        est = (_esc.esc_estimate_max_cpu(sa, sb) if not name.has_kernels
               else _esc._estimate(sa, sb, ia, ib, K, DEFAULT_BLOCK, name))
        info["esc"] = int(np.max(est))
    if method == "fixed":
        S = int(slices)
    else:
        S, width = _esc.rule_slices(method, A, B, sa, sb, est, b, name)
        info["width"] = width
        if S is None or width > max_bits:
            info.update(fallback=True, reason=(
                f"rule {method!r} cannot bound the product" if S is None
                else f"required width {width} bits > max_bits={max_bits}"))
            return done(_native(A, B))
        if S > max_slices(K, b):
            info.update(fallback=True, reason=f"{S} slices exceed the 128-bit accumulator")
            return done(_native(A, B))
    info["slices"] = S
    return done(_emulate(A, B, sa, sb, S, b, name))


def report_section(backend: str, quick: bool):
    """Accuracy table for ``python -m mlx_precise report``: on the phi test matrices,
    the slices auto mode (ESC estimate) and the tight rule choose, and the max /
    median relative error of both and of native float64 matmul (MLX CPU), against
    the correctly rounded exact product: each term split exactly into products of
    Veltkamp halves (26 bits each, so every partial product is exact in float64)
    and summed by ``math.fsum`` (exact, then one rounding). Returns
    ``(markdown, None)``."""
    import math

    n, K = (24, 256) if quick else (48, 1024)
    rng = np.random.default_rng(42)
    rows = []

    def halves(x):
        c = x * 134217729.0  # 2^27 + 1
        hi = c - (c - x)
        return hi, x - hi

    for phi in (-1, 0, 0.5, 1, 2, 4):
        if phi == -1:
            a, b = rng.standard_normal((n, K)), rng.standard_normal((K, n))
        else:
            a = (rng.uniform(size=(n, K)) - 0.5) * np.exp(phi * rng.standard_normal((n, K)))
            b = (rng.uniform(size=(K, n)) - 0.5) * np.exp(phi * rng.standard_normal((K, n)))
        ah, al = halves(a)
        bh, bl = halves(b)
        ref = np.empty((n, n))
        for i in range(n):
            for j in range(n):
                terms = np.concatenate([ah[i] * bh[:, j], ah[i] * bl[:, j],
                                        al[i] * bh[:, j], al[i] * bl[:, j]])
                ref[i, j] = math.fsum(terms)
        A, B = mx.array(a, dtype=mx.float64), mx.array(b, dtype=mx.float64)
        cols = [phi]
        errs = {}
        for label, kw in (("auto", {}), ("tight", {"slices": "tight"})):
            C, info = dgemm_emulated(A, B, return_info=True, backend=backend, **kw)
            errs[label] = np.abs(np.array(C) - ref) / np.abs(ref)
            cols.append("fallback" if info["fallback"] else info["slices"])
        errs["native"] = np.abs(np.array(_native(A, B)) - ref) / np.abs(ref)
        cols += [f"{errs[k].max():.1e}" for k in ("auto", "tight", "native")]
        cols += [f"{np.median(errs[k]):.1e}" for k in ("auto", "native")]
        rows.append(cols)
    header = ["phi", "slices auto", "slices tight", "max err auto", "max err tight",
              "max err native", "median auto", "median native"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    md = (f"### DGEMM emulation ({n} x {K} x {n}, 7-bit slices, backend {backend}; "
          "reference: exact product rounded once)\n\n" + "\n".join(lines))
    return md, None
