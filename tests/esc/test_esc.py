"""Exponent analysis of the split-integer DGEMM: mlx_precise.esc.

The exponent scan, the exact ESC and the block estimate run through the emulator
and the numpy implementation, against a direct evaluation from ``math.frexp`` and
``fractions`` (independent of the bit manipulations under test). Asserted: the
exact ESC matches its definition; the estimate is never below it (random zero
patterns, blocks of 1 ... 64; equal to it with blocks of 1); the slice rules give
the documented counts; the tight rule keeps native float64 accuracy on the phi
suite with fewer slices than the estimate rule.
"""

import math
from fractions import Fraction

import mlx.core as mx
import numpy as np
import pytest
from oracle import dd_matmul, rel_err_dd
from helpers import PHIS, native, phi_matrix

from mlx_precise.core import backends, cputhreads
from mlx_precise.esc import engine as escm
from mlx_precise.ozaki import dgemm_emulated

EMU = "emulate"


def e(v: float) -> int:
    """floor(log2|v|) for v != 0 (subnormals included)."""
    return math.frexp(v)[1] - 1


def low(v: float) -> int:
    """Exponent of the lowest set bit of |v|."""
    fr = Fraction(v)
    n, d = abs(fr.numerator), fr.denominator
    return ((n & -n).bit_length() - 1) - (d.bit_length() - 1)


def direct_esc(A, B):
    M, K = A.shape
    N = B.shape[1]
    out = np.zeros((M, N), dtype=np.int64)
    for i in range(M):
        for j in range(N):
            terms = [e(A[i, k]) + e(B[k, j]) for k in range(K) if A[i, k] and B[k, j]]
            if terms:
                out[i, j] = (max(e(v) for v in A[i] if v) + max(e(v) for v in B[:, j] if v)
                             - max(terms))
    return out


def wide_matrix(rng, shape, zeros=0.0):
    """Entries over 2^-1074 ... 2^1000 (subnormals included), with zeros."""
    x = rng.standard_normal(shape) * 2.0 ** rng.integers(-40, 40, shape)
    x[rng.random(shape) < 0.05] = rng.integers(1, 2**20, 1)[0] * 2.0**-1074
    x[rng.random(shape) < 0.05] *= 2.0**900
    x[rng.random(shape) < zeros] = 0.0
    return x


@pytest.mark.parametrize("backend", [EMU, "cpu"])
def test_scan_matches_direct_evaluation(backend, monkeypatch):
    monkeypatch.setattr(escm, "_SCAN_VALUES", 150)  # cpu: a row per chunk, on 2 threads
    monkeypatch.setattr(cputhreads, "_MIN_VALUES", 150)
    rng = np.random.default_rng(10)
    X = wide_matrix(rng, (7, 150), zeros=0.2)
    X[2] = 0.0
    X[4, 70:] = 0.0
    X[5, 3], X[6, 100] = np.inf, np.nan
    block = 64
    A = mx.array(X, dtype=mx.float64)
    s = escm.scan(A, mx.zeros((150, 1), mx.float64), block, backends.get(backend))[0]
    for r in range(7):
        for q in range(3):
            vals = [v for v in X[r, q * block:(q + 1) * block]]
            fin = [v for v in vals if math.isfinite(v) and v != 0]
            assert s.maxe[r, q] == (max(map(e, fin)) if fin else escm.NEG)
            assert s.mine[r, q] == (min(map(e, fin)) if fin else escm.POS)
            assert s.nnz[r, q] == len(fin)
            assert s.bad[r, q] == sum(not math.isfinite(v) for v in vals)
            assert s.low[r, q] == (min(map(low, fin)) if fin else escm.POS)
    assert list(s.length) == [64, 64, 22]


@pytest.mark.parametrize("backend", [EMU, "cpu"])
def test_esc_exact_matches_definition(backend):
    rng = np.random.default_rng(11)
    A = wide_matrix(rng, (9, 70), zeros=0.3)
    B = wide_matrix(rng, (70, 6), zeros=0.3)
    A[1] = 0.0
    B[:, 2] = 0.0
    got = np.array(escm.esc(A, B, backend=backend))
    assert got.dtype == np.int32 and got.shape == (9, 6)
    np.testing.assert_array_equal(got, direct_esc(A, B))


@pytest.mark.parametrize("zeros", [0.0, 0.3, 0.9])
def test_estimate_never_below_exact(zeros):
    rng = np.random.default_rng(12 + int(10 * zeros))
    for K in (1, 63, 64, 65, 200):
        A = wide_matrix(rng, (8, K), zeros)
        B = wide_matrix(rng, (K, 7), zeros)
        exact = np.array(escm.esc(A, B, backend="cpu")).astype(np.int64)
        for block in (64, 16, 1):
            est = np.array(escm.esc_estimate(A, B, block, backend=EMU)).astype(np.int64)
            cpu = np.array(escm.esc_estimate(A, B, block, backend="cpu")).astype(np.int64)
            np.testing.assert_array_equal(est, cpu)
            assert np.all(est >= exact), (K, block)
            if block == 1:  # each block pins one k: the bounds are exact
                bounded = est != escm.ESC_UNBOUNDED
                np.testing.assert_array_equal(est[bounded], exact[bounded])


def test_estimate_max_on_threads(monkeypatch):
    """esc_estimate_max_cpu (row chunks on two threads) equals the largest entry of
    the full estimate, with and without zero blocks."""
    monkeypatch.setattr(escm, "_ESTIMATE_VALUES", 7)  # a row of outputs per chunk
    monkeypatch.setattr(cputhreads, "_MIN_VALUES", 1)
    rng = np.random.default_rng(13)
    for zeros in (0.0, 0.5):
        A, B = wide_matrix(rng, (9, 130), zeros), wide_matrix(rng, (130, 7), zeros)
        sa = escm.scan_rows_cpu(A, 16)
        sb = escm.scan_rows_cpu(np.ascontiguousarray(B.T), 16)
        full = escm.esc_estimate_cpu(sa, sb)
        assert escm.esc_estimate_max_cpu(sa, sb) == max(int(full.max()), 0) > 0


def test_unbounded_estimate():
    # Row (1, 0) and column (0, 1): one nonzero each in a block of 2; no block
    # proves a nonzero product (the product is exactly 0), so the estimate cannot
    # bound the ESC and auto mode falls back; the exact ESC says 0.
    A = np.array([[1.0, 0.0], [1.0, 1.0]])
    B = np.array([[0.0, 3.0], [1.0, 3.0]])
    est = np.array(escm.esc_estimate(A, B, block=2, backend=EMU))
    assert est[0, 0] == escm.ESC_UNBOUNDED and est[1, 1] == 0
    assert np.array(escm.esc(A, B, backend=EMU))[0, 0] == 0
    for backend in (EMU, "cpu"):
        C, info = dgemm_emulated(A, B, return_info=True, backend=backend)
        assert info["fallback"] and "cannot bound" in info["reason"]
        Ct, it = dgemm_emulated(A, B, slices="tight", return_info=True, backend=backend)
        assert not it["fallback"]
        np.testing.assert_array_equal(np.array(Ct), A @ B)


def test_zero_operands():
    A = np.zeros((3, 4))
    B = np.ones((4, 2))
    np.testing.assert_array_equal(np.array(escm.esc_estimate(A, B, backend=EMU)), 0)
    np.testing.assert_array_equal(np.array(escm.esc(A, B, backend=EMU)), 0)
    assert escm.slices_needed(A, B, "tight") == 0
    assert escm.slices_needed(np.ones((2, 0)), np.ones((0, 3))) == 0


@pytest.mark.parametrize("backend", [EMU, "cpu"])
def test_slice_rules_on_the_worked_example(backend):
    x = np.array([[2.0**8, 2.0**-8, 2.0**-8]])
    y = np.array([[2.0**-4], [2.0**8], [2.0**8]])
    assert np.array(escm.esc(x, y, backend=backend))[0, 0] == 12
    for method in ("esc", "esc_estimate"):
        # 1 + 52 + 12 + 1 = 66 bits: ceil(66 / 7) = 10; 8-bit slices keep 8s - 2 bits
        assert escm.slices_needed(x, y, method, backend=backend) == 10
        assert escm.slices_needed(x, y, method, slice_bits=8, backend=backend) == 9
    # tight: x needs 17 bits (3 digits), y 13 bits (2 digits): 3 + 2 - 1 slices
    assert escm.slices_needed(x, y, "tight", backend=backend) == 4
    assert escm.slices_needed(x, y, "tight", slice_bits=8, backend=backend) == 4


def test_tight_rule_on_the_phi_suite():
    """The tight rule: max relative error <= native float64 matmul's on every case;
    no more fallbacks than the estimate rule, and fewer slice pairs where both
    emulate. Printed with -s: slices per case."""
    rng = np.random.default_rng(13)
    methods = ("tight", "esc_estimate")
    pairs = dict.fromkeys(methods, 0)
    falls = dict.fromkeys(methods, 0)
    for phi in PHIS:
        for K in (64, 256, 1024):
            A = phi_matrix(phi, (40, K), rng)
            B = phi_matrix(phi, (K, 40), rng)
            hi, lo = dd_matmul(A, B)
            nat = rel_err_dd(native(A, B), hi, lo).max()
            used = {}
            for method in methods:
                C, info = dgemm_emulated(A, B, slices=method, return_info=True, backend="cpu")
                err = rel_err_dd(np.array(C), hi, lo).max()
                assert err <= nat, (phi, K, method, err, nat)
                falls[method] += info["fallback"]
                used[method] = info["slices"]
            print(f"phi={phi:4} K={K:5} slices {used}")
            if None not in used.values():
                for m, s in used.items():
                    pairs[m] += s * (s + 1) // 2
    print(pairs, falls)
    assert falls["tight"] <= falls["esc_estimate"]
    assert pairs["tight"] < pairs["esc_estimate"]


def test_bad_input():
    A = np.ones((3, 4))
    B = np.ones((4, 2))
    Ainf = A.copy()
    Ainf[0, 0] = np.inf
    with pytest.raises(ValueError, match="Inf or NaN"):
        escm.esc(Ainf, B)
    for backend in (EMU, "cpu"):
        with pytest.raises(ValueError, match="A contains Inf or NaN"):
            escm.esc_estimate(Ainf, B, backend=backend)
    with pytest.raises(ValueError, match="block must be a positive int"):
        escm.esc_estimate(A, B, block=0)
    with pytest.raises(ValueError, match="unknown method 'fast'"):
        escm.slices_needed(A, B, method="fast")
    with pytest.raises(ValueError, match="slice_bits must be an int in \\[2, 8\\]"):
        escm.slices_needed(A, B, slice_bits=9)
    with pytest.raises(TypeError, match="B has dtype .*, expected float64"):
        escm.esc(A, B.astype(np.int64))
    with pytest.raises(ValueError, match="must share K"):
        escm.esc(A, A)
