"""Double-double reference of a float64 matrix product, shared by the Ozaki benchmark
and the test suite (tests/oracle.py re-exports it). It lives here, not in tests/,
because the wheel ships benchmarks/ (as ``mlx_precise/benchmarks``) but not tests/."""

from __future__ import annotations

import numpy as np


def _veltkamp(a):
    c = 134217729.0 * a  # 2^27 + 1
    hi = c - (c - a)
    return hi, a - hi


def dd_matmul(A, B):
    """Double-double reference of a float64 matrix product: ``(hi, lo)`` float64
    arrays with ``hi + lo`` within about ``K 2^-104 sum_k |a_ik b_kj|`` of the exact
    product (Ogita-Rump-Oishi Dot2 with the error terms kept unrounded: TwoProduct
    by Veltkamp/Dekker splitting, exact in float64 for |entries| < 2^996 and
    products above the underflow range; TwoSum accumulation). O(K) numpy passes
    over (M, N) arrays."""
    A = np.asarray(A, dtype=np.float64)
    B = np.asarray(B, dtype=np.float64)
    M, K = A.shape
    N = B.shape[1]
    ah, al = _veltkamp(A)
    bh, bl = _veltkamp(B)
    s = np.zeros((M, N))
    t = np.zeros((M, N))
    for k in range(K):
        a, b = A[:, k, None], B[None, k, :]
        p = a * b
        e = ((ah[:, k, None] * bh[None, k, :] - p) + ah[:, k, None] * bl[None, k, :]
             + al[:, k, None] * bh[None, k, :]) + al[:, k, None] * bl[None, k, :]
        s2 = s + p
        z = s2 - s
        t += ((s - (s2 - z)) + (p - z)) + e
        s = s2
    hi = s + t
    return hi, t - (hi - s)


def rel_err_dd(C, hi, lo) -> np.ndarray:
    """Elementwise |C - (hi + lo)| / |hi + lo| for float64 C and a double-double
    reference (C - hi is exact when C is within a factor 2 of hi, the case that
    matters; elsewhere the error is large anyway)."""
    C = np.asarray(C, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.abs(((C - hi) - lo) / hi)
