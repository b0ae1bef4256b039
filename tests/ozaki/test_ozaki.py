"""Split-integer (Ozaki-style) DGEMM emulation: mlx_precise.ozaki.dgemm_emulated.

Every Metal kernel of the product (ozaki_scan, ozaki_esc_estimate, ozaki_slice,
ozaki_products on the shared int8 GEMM engine, ozaki_accumulate) runs through the
emulator against an independent oracle: exact integer products of the float64
inputs (tests/oracle.py: Python integers, correctly rounded by CPython's int / int)
at small sizes, and a double-double reference (Ogita-Rump-Oishi Dot2, itself
checked against exact rationals here) for the phi sweep, which runs through the
numpy implementation of the same algorithm (the ``cpu`` backend) because the
emulator is slow at K = 1024 x 64 x 64 x 18 cases. The two implementations agree
bit for bit where both run.

Asserted:
* auto mode (ESC estimate) never has a larger max relative error than native
  float64 matmul (MLX CPU, the fallback itself) on a = (U(0,1) - 0.5) exp(phi N(0,1)),
  phi in {-1 (plain N(0,1)), 0, 0.5, 1, 2, 4}, K in {64, 256, 1024};
* results are the correctly rounded exact product whenever the slices hold every
  input bit (integer-valued data, ties, subnormal results);
* zero rows / columns give exact zeros; the worked example gives 18, and 16 with
  two 8-bit slices; Inf/NaN and too-wide products fall back visibly;
* bad input raises TypeError / ValueError naming the argument.
"""

import math
import os
import threading
from fractions import Fraction

import mlx.core as mx
import numpy as np
import pytest
from helpers import PHIS, native, phi_matrix
from oracle import dd_matmul, exact_f64, exact_matmul, rel_err_dd, round_f64

from mlx_precise.core import backends, cputhreads
from mlx_precise.esc import engine as escm
from mlx_precise.ozaki import engine as ozaki
from mlx_precise.ozaki import checks as ozaki_checks
from mlx_precise.ozaki import dgemm_emulated

EMU = "emulate"
def exact_rn(A, B):
    """Correctly rounded exact product (Python integers)."""
    return round_f64(exact_matmul(exact_f64(A), exact_f64(B)))


def run(A, B, backend, **kw):
    C, info = dgemm_emulated(A, B, return_info=True, backend=backend, **kw)
    assert C.dtype == mx.float64 and tuple(C.shape) == (A.shape[0], B.shape[1])
    return np.array(C), info


def same_bits(x, y):
    return np.array_equal(np.asarray(x, np.float64).view(np.uint64),
                          np.asarray(y, np.float64).view(np.uint64))


def few_bit_matrix(rng, shape, bits=20, spread=12):
    """Integers of <= ``bits`` bits times per-row powers of two: every product of
    two such matrices is exactly representable by a few slices."""
    ints = rng.integers(-(2**bits), 2**bits, shape).astype(np.float64)
    return ints * 2.0 ** rng.integers(-spread, spread + 1, (shape[0], 1))


# ---- the oracle itself -----------------------------------------------------------


def test_dd_oracle_against_fractions():
    rng = np.random.default_rng(0)
    A, B = phi_matrix(4, (3, 200), rng), phi_matrix(4, (200, 4), rng)
    hi, lo = dd_matmul(A, B)
    for i in range(3):
        for j in range(4):
            exact = sum(Fraction(float(A[i, k])) * Fraction(float(B[k, j])) for k in range(200))
            got = Fraction(float(hi[i, j])) + Fraction(float(lo[i, j]))
            assert abs(got - exact) <= abs(exact) * Fraction(1, 2**90)
    assert same_bits(round_f64(exact_matmul(exact_f64(A), exact_f64(B))), hi)


# ---- worked example (REFERENCES section 4) ------------------------------------------


@pytest.mark.parametrize("backend", [EMU, "cpu"])
def test_worked_example(backend):
    # Row x holds 2^8 and 2^-8, column y holds 2^-4 and 2^8: the largest product is
    # 2^4, ESC = 8 + 8 - 4 = 12, x . y = 16 + 1 + 1 = 18.
    x = np.array([[2.0**8, 2.0**-8, 2.0**-8]])
    y = np.array([[2.0**-4], [2.0**8], [2.0**8]])
    C, info = run(x, y, backend)
    assert C[0, 0] == 18.0
    assert info["esc"] == 12 and info["width"] == 66 and not info["fallback"]
    assert info["slices"] == 10  # ceil(66 / 7)
    assert escm.slices_needed(x, y, "esc", slice_bits=8, backend=backend) == 9
    # Two 8-bit slices keep 14 bits below each leading power of two (balanced
    # digits give up 2): the 2^-8 entries of x (16 binades down) vanish.
    C2, _ = run(x, y, backend, slices=2, slice_bits=8)
    assert C2[0, 0] == 16.0
    C3, _ = run(x, y, backend, slices=3, slice_bits=8)
    assert C3[0, 0] == 18.0
    Ct, it = run(x, y, backend, slices="tight")
    assert Ct[0, 0] == 18.0 and it["slices"] == 4  # 3 digits for x, 2 for y


# ---- exactness: one correct rounding --------------------------------------------------


def test_exact_products_bit_for_bit():
    """Integer-valued data: the tight rule's exact route makes the emulated product
    exact, so every output must be the correctly rounded exact value; the cpu
    implementation agrees bit for bit. K = 77 and 33 x 29 outputs are no multiples
    of the 32 x 32 x 32 GEMM tile nor of the 64-long scan block."""
    rng = np.random.default_rng(1)
    A = few_bit_matrix(rng, (33, 77), bits=26)
    B = few_bit_matrix(rng, (29, 77), bits=26).T.copy()
    want = exact_rn(A, B)
    for b in (7, 8):
        C, info = run(A, B, EMU, slices="tight", slice_bits=b)
        assert not info["fallback"]
        assert same_bits(C, want), f"b={b}: {np.count_nonzero(C != want)} outputs differ"
        Cc, ic = run(A, B, "cpu", slices="tight", slice_bits=b)
        assert ic["slices"] == info["slices"] and same_bits(Cc, C)
    # native float64 rounds every partial sum: it is not correctly rounded here
    assert np.count_nonzero(native(A, B) != want) > 0


def test_ties_and_sticky_bits():
    # 2^53 + 1 is a tie (rounds to even 2^53); a 2^-40 below it breaks the tie
    # downwards, above it upwards; negated rows mirror; the last row cancels to 1.
    A = np.array([
        [2.0**53, 1.0, 0.0],
        [2.0**53, 1.0, 2.0**-40],
        [2.0**53, 1.0, -(2.0**-40)],
        [-(2.0**53), -1.0, -(2.0**-40)],
        [2.0**53 + 2, 3.0, -(2.0**53)],
    ])
    B = np.ones((3, 1))
    want = exact_rn(A, B)
    assert list(want[:, 0]) == [2.0**53, 2.0**53 + 2, 2.0**53, -(2.0**53 + 2), 5.0]
    for backend in (EMU, "cpu"):
        C, _ = run(A, B, backend, slices=14)  # 14 x 7 = 98 bits hold 2^53 ... 2^-40
        assert same_bits(C, want)


def test_subnormal_inputs_and_results():
    rng = np.random.default_rng(2)
    # Products near 2^-1080 are subnormal: the sum is rounded once, on the
    # subnormal grid (native float64 rounds each product first).
    A = rng.integers(-(2**12), 2**12, (6, 40)) * 2.0**-540
    B = rng.integers(-(2**12), 2**12, (40, 5)) * 2.0**-540
    want = exact_rn(A, B)
    assert np.all(np.abs(want) < 2.0**-1022) and np.any(want != 0)
    # Subnormal inputs: entries 2^-1074 ... 2^-1060 times moderate values.
    S = rng.integers(1, 2**14, (6, 40)) * 2.0**-1074 * rng.choice([-1, 1], (6, 40))
    T = rng.integers(-(2**20), 2**20, (40, 5)) * 2.0**-10
    want2 = exact_rn(S, T)
    for backend in (EMU, "cpu"):
        C, info = run(A, B, backend)
        assert not info["fallback"] and same_bits(C, want)
        C2, info2 = run(S, T, backend)
        assert not info2["fallback"] and same_bits(C2, want2)
    assert np.count_nonzero(native(A, B) != want) > 0


def test_overflow_rounds_to_infinity():
    A = np.array([[2.0**1000, 2.0**1000], [2.0**1000, -(2.0**1000)], [2.0**1023, 2.0**970]])
    B = np.array([[2.0**23], [2.0**23]])
    want = exact_rn(A, B)
    assert want[0, 0] == np.inf and want[1, 0] == 0.0 and want[2, 0] == np.inf
    for backend in (EMU, "cpu"):
        C, _ = run(A, B, backend, slices=10)
        assert same_bits(C, want)


def test_cancellation_exact_and_random():
    rng = np.random.default_rng(3)
    # Integer data whose sums cancel to far below the terms: still exact.
    X = few_bit_matrix(rng, (16, 50), bits=24, spread=0)
    Y = few_bit_matrix(rng, (50, 12), bits=24, spread=0)
    X[:, 25:] = -X[:, :25]
    Y[25:] = Y[:25] + rng.integers(-2, 3, (25, 12))
    want = exact_rn(X, Y)
    assert np.median(np.abs(want)) < 1e-6 * np.abs(X).max() * np.abs(Y).max() * 50
    C, _ = run(X, Y, EMU, slices="tight")
    assert same_bits(C, want)
    # Random 53-bit data with heavy cancellation: auto mode within native's error.
    A = phi_matrix(-1, (24, 96), rng)
    B = phi_matrix(-1, (96, 20), rng)
    A[:, 48:] = -A[:, :48] * (1 + 2.0**-30)
    B[48:] = B[:48]
    hi, lo = dd_matmul(A, B)
    C, info = run(A, B, EMU)
    assert rel_err_dd(C, hi, lo).max() <= rel_err_dd(native(A, B), hi, lo).max()


@pytest.mark.parametrize("backend", [EMU, "cpu"])
def test_zero_rows_and_columns_are_exact_zeros(backend):
    rng = np.random.default_rng(4)
    A = phi_matrix(1, (9, 70), rng)
    B = phi_matrix(1, (70, 11), rng)
    A[[0, 5]] = 0.0
    A[3] = -0.0
    B[:, [2, 10]] = 0.0
    C, info = run(A, B, backend)
    assert not info["fallback"]
    assert np.all(C[[0, 3, 5]] == 0) and np.all(C[:, [2, 10]] == 0)
    assert not np.signbit(C[[0, 3, 5]]).any() and not np.signbit(C[:, [2, 10]]).any()
    Z, _ = run(np.zeros((3, 5)), np.zeros((5, 4)), backend)
    assert np.all(Z == 0)


@pytest.mark.parametrize("shape", [(1, 130, 7), (6, 130, 1), (1, 1, 1), (40, 3, 35)])
def test_vector_and_odd_shapes(shape):
    M, K, N = shape
    rng = np.random.default_rng(5)
    A = phi_matrix(0.5, (M, K), rng)
    B = phi_matrix(0.5, (K, N), rng)
    hi, lo = dd_matmul(A, B)
    C, info = run(A, B, EMU)
    Cc, _ = run(A, B, "cpu")
    assert same_bits(C, Cc)
    assert rel_err_dd(C, hi, lo).max() <= max(rel_err_dd(native(A, B), hi, lo).max(), 2.0**-53)


def test_long_k_is_blocked_not_overflowed():
    """K = 30000 with every digit at its maximum: a diagonal of the kept slice pairs
    sums 5 x 30000 x 127^2 > 2^31, so int32 would wrap; k-blocks of
    (2^31 - 1) // (9 x 127^2) keep it exact (3 blocks here)."""
    K = 30000
    S = 9  # values of 35 bits: 5 digits each, exact with 5 + 5 - 1 slices
    assert ozaki.k_block(S, 7) < K and 5 * K * 127**2 > 2**31
    rng = np.random.default_rng(6)
    v = 1 - 2.0**-35  # digits 127, 127, 127, 127, 127
    A = v * rng.choice([-1.0, 1.0], (3, K)) * 2.0 ** rng.integers(-3, 4, (3, 1))
    B = v * rng.choice([-1.0, 1.0], (K, 4))
    A[:, :K // 2] = np.abs(A[:, :K // 2])
    B[:K // 2] = np.abs(B[:K // 2])
    want = exact_rn(A, B)
    C, info = run(A, B, EMU, slices="tight")
    assert info["slices"] == S
    assert same_bits(C, want)


# ---- single kernels -----------------------------------------------------------------


@pytest.mark.parametrize("b", [7, 8, 3])
def test_slice_kernel_digits(b):
    """ozaki_slice: the digits of each entry reconstruct trunc(x 2^(bS - t)) exactly
    (rational oracle), within int8 and the digit set's range."""
    rng = np.random.default_rng(20 + b)
    X = rng.standard_normal((5, 40)) * 2.0 ** rng.integers(-30, 30, (5, 40))
    X[0, :5] = [0.0, -0.0, 2.0**-1074, -(2.0**-1060) * 3, 2.0**1023 * 1.5]
    X[1] = 0.0
    X[2] = -(2.0 - 2.0**-52)  # all-ones significands
    S = 7
    Xm = mx.array(X, dtype=mx.float64)
    sc = escm.scan(Xm, mx.zeros((40, 1), mx.float64), 64, backends.get("cpu"))[0]
    t = ozaki.scale_exponents(sc.emax, b)
    d = np.array(ozaki._slice_metal(escm.row_bits(Xm), t, 5, 40, S, b, EMU)).astype(np.int64)
    np.testing.assert_array_equal(d, ozaki.slice_cpu(X, t, S, b))
    lo, hi = (-128, 127) if b == 8 else (-(2**b - 1), 2**b - 1)
    assert d.min() >= lo and d.max() <= hi
    for r in range(5):
        for c in range(40):
            x = Fraction(float(X[r, c]))
            scaled = x * Fraction(2) ** (b * S - int(t[r]))
            want = int(scaled)  # truncation toward zero
            got = sum(int(d[p, r, c]) << (b * (S - 1 - p)) for p in range(S))
            assert got == want, (r, c)


def test_accumulate_kernel_rounds_once():
    """ozaki_accumulate: Horner in 128 bits and one rounding, for random diagonal
    sums and scale exponents from overflow down to total underflow (r >= 128
    bits dropped), against float(Fraction) (correctly rounded)."""
    rng = np.random.default_rng(30)
    S, M, N, b = 6, 16, 24, 7
    P = rng.integers(-(2**31), 2**31, (S, 2, M, N), dtype=np.int64).astype(np.int32)
    P[:, :, 0, :] = 0  # an exact zero row
    P[0, 0, 1, :] = 1 << 30  # values that round at ties: one bit far above the rest
    P[1:, :, 1, :] = 0
    P[S - 1, 0, 1, ::2] = 1
    tA = rng.integers(-1100, 1000, M).astype(np.int32)
    tB = rng.integers(-1100, 1100, N).astype(np.int32)
    tA[2], tB[3] = 1024, 1024  # overflow
    tA[3], tB[4] = -1074, -1074  # far below the subnormal range
    got = np.array(ozaki._accumulate_metal(mx.array(P.reshape(S * 2, M, N)), 2, tA, tB,
                                           M, N, S, b, EMU))
    D = P.astype(np.int64).sum(axis=1)
    np.testing.assert_array_equal(got.view(np.uint64),
                                  ozaki.accumulate_cpu(D, tA, tB, b).view(np.uint64))
    for i in range(M):
        for j in range(N):
            acc = sum(int(D[d, i, j]) << (b * (S - 1 - d)) for d in range(S))
            exact = Fraction(acc) * Fraction(2) ** (int(tA[i]) + int(tB[j]) - b * (S + 1))
            try:
                want = float(exact)
            except OverflowError:
                want = np.inf if exact > 0 else -np.inf
            # bits, so that signed zeros count: a negative value that underflows
            # rounds to -0 (IEEE 754), an exact zero sum is +0
            assert same_bits(got[i, j], want), (i, j, got[i, j], want)


# ---- the phi suite ------------------------------------------------------------------


@pytest.mark.parametrize("phi", PHIS)
def test_phi_suite_auto_matches_native(phi):
    """Auto mode's max relative error <= native float64 matmul's, K = 64 ... 1024
    (cpu implementation; the emulator runs the same algorithm bit for bit, checked
    in test_phi_suite_emulated). Printed with -s: slices, errors."""
    rng = np.random.default_rng(100 + PHIS.index(phi))
    for K in (64, 256, 1024):
        A = phi_matrix(phi, (48, K), rng)
        B = phi_matrix(phi, (K, 48), rng)
        hi, lo = dd_matmul(A, B)
        nat = rel_err_dd(native(A, B), hi, lo)
        C, info = run(A, B, "cpu")
        err = rel_err_dd(C, hi, lo)
        print(f"phi={phi:4} K={K:5} slices={info['slices']} fallback={info['fallback']} "
              f"max {err.max():.2e} (native {nat.max():.2e}) "
              f"median {np.median(err):.2e} (native {np.median(nat):.2e})")
        assert err.max() <= nat.max()
        if not info["fallback"]:
            assert np.median(err) <= np.median(nat)


def test_phi_suite_emulated():
    rng = np.random.default_rng(7)
    for phi in (-1, 2):
        A = phi_matrix(phi, (32, 256), rng)
        B = phi_matrix(phi, (256, 24), rng)
        hi, lo = dd_matmul(A, B)
        C, info = run(A, B, EMU)
        Cc, ic = run(A, B, "cpu")
        assert not info["fallback"] and info == {**ic, "backend": EMU}
        assert same_bits(C, Cc)
        assert rel_err_dd(C, hi, lo).max() <= rel_err_dd(native(A, B), hi, lo).max()


# ---- fallbacks ---------------------------------------------------------------------


@pytest.mark.parametrize("backend", [EMU, "cpu"])
def test_nonfinite_falls_back(backend):
    rng = np.random.default_rng(8)
    A, B = rng.standard_normal((5, 9)), rng.standard_normal((9, 4))
    A[1, 2] = np.nan
    B[3, 1] = np.inf
    C, info = run(A, B, backend)
    assert info["fallback"] and info["reason"] == "Inf/NaN input" and info["slices"] is None
    np.testing.assert_array_equal(C, native(A, B))


@pytest.mark.parametrize("backend", [EMU, "cpu"])
def test_wide_products_fall_back(backend):
    rng = np.random.default_rng(9)
    # The largest entries of A's rows (column 0) and of B's columns (row 1) meet
    # only small partners: ESC ~ 40 > 79 - 54.
    A = rng.standard_normal((6, 40))
    B = rng.standard_normal((40, 5))
    A[:, 0] *= 2.0**40
    B[1] *= 2.0**40
    C, info = run(A, B, backend)
    assert info["fallback"] and info["width"] > 79 and "max_bits=79" in info["reason"]
    np.testing.assert_array_equal(C, native(A, B))
    # A fixed slice count is honoured (truncated, no fallback).
    C8, info8 = run(A, B, backend, slices=8)
    assert not info8["fallback"] and info8["slices"] == 8


# ---- bad input -----------------------------------------------------------------------


def test_bad_input():
    A = np.ones((3, 4))
    B = np.ones((4, 2))
    with pytest.raises(TypeError, match="A has dtype .*, expected float64"):
        dgemm_emulated(A.astype(np.float32), B)
    with pytest.raises(TypeError, match="B has dtype .*, expected float64"):
        dgemm_emulated(A, mx.array(B, dtype=mx.float32))
    with pytest.raises(TypeError, match="A must be an mx.array or array-like .* of float64"):
        dgemm_emulated("A", B)
    with pytest.raises(ValueError, match="A must be a 2-D matrix"):
        dgemm_emulated(np.ones(4), B)
    with pytest.raises(ValueError, match="must share K"):
        dgemm_emulated(A, np.ones((5, 2)))
    with pytest.raises(ValueError, match="slice_bits must be in \\[2, 8\\].*int32"):
        dgemm_emulated(A, B, slice_bits=9)
    with pytest.raises(ValueError, match="slice_bits must be in"):
        dgemm_emulated(A, B, slice_bits=1)
    with pytest.raises(TypeError, match="slice_bits must be an int"):
        dgemm_emulated(A, B, slice_bits=7.0)
    with pytest.raises(ValueError, match="slices must be >= 1"):
        dgemm_emulated(A, B, slices=0)
    with pytest.raises(ValueError, match="slices must be a positive int, 'auto'"):
        dgemm_emulated(A, B, slices="many")
    with pytest.raises(ValueError, match="overflows the 128-bit accumulator.*at most"):
        dgemm_emulated(A, B, slices=40)
    with pytest.raises(ValueError, match="max_bits must be a positive int"):
        dgemm_emulated(A, B, max_bits=0)
    with pytest.raises(ValueError, match="unknown backend"):
        dgemm_emulated(A, B, backend="gpu")


def test_empty_shapes():
    for M, K, N in ((0, 3, 2), (2, 0, 3), (2, 3, 0)):
        C, info = run(np.ones((M, K)), np.ones((K, N)), "cpu")
        assert C.shape == (M, N) and np.all(C == 0)


def test_selftest_checks_pass():
    for backend in (EMU, "cpu"):
        checks = ozaki_checks.selftest_checks(backend)
        assert checks and all(c.passed for c in checks), [c.line() for c in checks]


@pytest.mark.parametrize("b", [7, 8, 5])
def test_cpu_pieces_blocked_match_the_int8_products(monkeypatch, b):
    """The cpu product (float64 GEMMs of digit pieces, several N-blocks and K-chunks
    here) gives bit for bit the int8 slice-pair products accumulated once, and,
    with enough slices for integer data, the correctly rounded exact product."""
    monkeypatch.setattr(ozaki, "_PIECE_VALUES", 40 * 64)  # K-chunks of 64
    monkeypatch.setattr(ozaki, "_OUT_VALUES", 40 * 8)  # N-blocks of 256
    monkeypatch.setattr(cputhreads, "_MIN_VALUES", 64)  # pieces and Horner on 2 threads,
    monkeypatch.setattr(ozaki, "_FILL_VALUES", 64 * 8)  # in row chunks of 8
    monkeypatch.setattr(ozaki, "_HORNER_VALUES", 256 * 8)
    threads, prefixes = set(), ozaki._prefixes
    monkeypatch.setattr(ozaki, "_prefixes",
                        lambda *a: threads.add(threading.get_ident()) or prefixes(*a))
    rng = np.random.default_rng(40 + b)
    M, K, N = 40, 150, 600
    A = rng.standard_normal((M, K)) * 2.0 ** rng.integers(-30, 30, (M, K))
    B = rng.standard_normal((K, N)) * 2.0 ** rng.integers(-30, 30, (K, N))
    A[3], B[:, 7] = 0.0, 0.0
    sa = escm.scan_rows_cpu(A, 64)
    sb = escm.scan_rows_cpu(np.ascontiguousarray(B.T), 64)
    tA, tB = ozaki.scale_exponents(sa.emax, b), ozaki.scale_exponents(sb.emax, b)
    S = 9
    slA = ozaki.slice_cpu(A, tA, S, b)
    slB = ozaki.slice_cpu(np.ascontiguousarray(B.T), tB, S, b)
    ref = ozaki.accumulate_cpu(ozaki.products_cpu(slA, np.ascontiguousarray(
        slB.transpose(0, 2, 1)), b), tA, tB, b)
    assert same_bits(ozaki.product_cpu(A, B, tA, tB, S, b), ref)
    assert len(threads) >= min(2, os.cpu_count() or 1)
    monkeypatch.setattr(ozaki, "_INT64", 1)  # as if int64 class sums could overflow
    assert same_bits(ozaki.product_cpu(A, B, tA, tB, S, b), ref)
    monkeypatch.undo()
    # Integers of 20 bits: the tight rule's slices make the product exact.
    X = few_bit_matrix(rng, (6, 150))
    Y = few_bit_matrix(rng, (150, 300))
    C, info = run(X, Y, "cpu", slices="tight", slice_bits=b)
    assert same_bits(C, exact_rn(X, Y))


@pytest.mark.parametrize("b", range(2, 9))
def test_cpu_plan_covers_the_kept_pairs_once(b):
    """plan_pieces partitions the kept pairs p + q <= S - 1 into rectangles whose
    products, 256 at a time, are exact in float64, each in the weight class of
    its last cell; for S = 9 seven-bit slices with 11 GEMMs (the least possible,
    see plan_pieces), eight-bit with 13, against 45 pairs."""
    for S in list(range(1, 21)) + [ozaki.max_slices(1, b)]:
        plan = ozaki.plan_pieces(S, b)
        cells = []
        for e, rects in plan.items():
            for p0, p1, q0, q1 in rects:
                assert (p1 - 1) + (q1 - 1) == e and p0 < p1 and q0 < q1
                bound = ozaki._piece_bound(p1 - p0, b) * ozaki._piece_bound(q1 - q0, b)
                assert 256 * bound < 2**53
                cells += [(p, q) for p in range(p0, p1) for q in range(q0, q1)]
        assert sorted(cells) == [(p, q) for p in range(S) for q in range(S - p)], (b, S)
    count = {b_: sum(map(len, ozaki.plan_pieces(9, b_).values())) for b_ in (7, 8)}
    assert count == {7: 11, 8: 13}


def test_cpu_product_memory_is_bounded():
    """Extra numpy allocations of a 512^3 cpu product (tracemalloc): below the
    4 MiB inputs' 16x (pieces of 2^18 values, class sums of 2^20: bounded
    constants), where per-pair int8 slices took ~300 bytes per output."""
    import tracemalloc

    rng = np.random.default_rng(50)
    A, B = phi_matrix(0, (512, 512), rng), phi_matrix(0, (512, 512), rng)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    C = dgemm_emulated(A, B, backend="cpu")
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    hi, lo = dd_matmul(A[:8], B)
    assert rel_err_dd(np.array(C)[:8], hi, lo).max() <= rel_err_dd(A[:8] @ B, hi, lo).max()
    print(f"extra peak {peak / 2**20:.1f} MiB")
    assert peak <= 64 * 2**20


def test_round_to_odd_conversion_matches_exact_rounding():
    """accumulate_cpu's round-to-odd conversion of 128-bit integers against
    float(Fraction) (correct rounding): random widths, ties and sticky bits,
    results from overflow down through 2^-1022 and the subnormals to zero."""
    rng = np.random.default_rng(60)
    vals = [int(v) for v in rng.integers(-(2**62), 2**62, 300)]
    vals += [(1 << 100) + (1 << 47), (1 << 100) + (1 << 47) + 1, -((1 << 90) + (3 << 37)),
             (1 << 53) + 1, (1 << 127) - 1, -(1 << 127), 1, -1]
    vals += [int(rng.integers(1, 2**62)) << int(rng.integers(0, 64)) for _ in range(100)]
    n = len(vals)
    u = [v % (1 << 128) for v in vals]
    hi = np.array([x >> 64 for x in u], dtype=np.uint64)
    lo = np.array([x & ((1 << 64) - 1) for x in u], dtype=np.uint64)
    for E in (-1200, -1150, -1100, -1074 - 60, -1022 - 64, -1022 - 40, 0, 900, 960):
        Ev = np.full(n, E)
        got = ozaki._round_i128_fast(hi, lo, Ev)
        want = [float(Fraction(v) * Fraction(2) ** E) if abs(Fraction(v) * Fraction(2) ** E)
                < 2**1024 - 2**970 else math.copysign(math.inf, v) for v in vals]
        assert same_bits(got, np.array(want)), E
