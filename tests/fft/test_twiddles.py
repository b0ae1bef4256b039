"""Twiddles and chirps of the double-word FFT against mpmath at 200 bits."""

import mpmath
import numpy as np
import pytest

from mlx_precise.fft.twiddles import (
    chirp_words,
    roots_dd,
    roots_words,
    twiddle_table,
)


def exact_root(m, e):
    """exp(-2 pi i e / m) at 200 bits."""
    with mpmath.workprec(200):
        return mpmath.expj(-2 * mpmath.pi * int(e) / m)


def max_errors(m, e, words=False):
    """Largest |computed - exact| over the components (absolute), and the largest
    relative error of the float32 words where they are used."""
    e = np.asarray(e)
    if words:
        w = roots_words(m, e).astype(np.float64)
        parts = (w[:, 0], w[:, 1], w[:, 2], w[:, 3])
    else:
        parts = roots_dd(m, e)
    worst_abs, worst_rel = 0.0, 0.0
    with mpmath.workprec(200):
        for i, ei in enumerate(e):
            z = exact_root(m, ei)
            quarter = (4 * int(ei)) % m == 0  # components exactly 0 or +-1
            for v, hi, lo in ((z.real, parts[0][i], parts[1][i]),
                              (z.imag, parts[2][i], parts[3][i])):
                if quarter:
                    v = mpmath.nint(v)  # mpmath's cos(pi/2) is ~1e-61, not 0
                err = abs(mpmath.mpf(float(hi)) + mpmath.mpf(float(lo)) - v)
                worst_abs = max(worst_abs, float(err))
                if v != 0:
                    worst_rel = max(worst_rel, float(err / abs(v)))
                elif err != 0:
                    worst_rel = np.inf
    return worst_abs, worst_rel


@pytest.mark.parametrize("m", [1, 2, 3, 8, 12, 1000, 2**16, 2**20, 2 * 99991])
def test_roots_double_double_accuracy(m):
    rng = np.random.default_rng(m)
    e = np.arange(m) if m <= 1000 else rng.integers(0, m, 400)
    e = np.concatenate([e, [0, m // 8, m // 4, m // 2, 3 * m // 4, m - 1, -1, 5 * m + 1]])
    err, _ = max_errors(m, e)
    print(f"m={m}: double-double twiddles max abs error 2^{np.log2(err) if err else -np.inf:.1f}")
    assert err <= 2.0**-100  # the claim in twiddles.py: ~2^-100 (better than 2^-60)


@pytest.mark.parametrize("m", [8, 1024, 2**20])
def test_words_are_correctly_split(m):
    """float32 words: relative error <= 2^-48 per component (hi = RN32, lo =
    RN32 of the rest), normalised, and exact at quarter turns."""
    rng = np.random.default_rng(1)
    e = np.concatenate([rng.integers(0, m, 300), [0, m // 4, m // 2, 3 * m // 4]])
    _, rel = max_errors(m, e, words=True)
    print(f"m={m}: float32 double-word twiddles max rel error 2^{np.log2(rel):.1f}")
    assert rel <= 2.0**-48
    w = roots_words(m, e)
    for h, lo in ((w[:, 0], w[:, 1]), (w[:, 2], w[:, 3])):
        assert ((h.astype(np.float64) + lo).astype(np.float32) == h).all()  # normalised
    q = roots_words(m, np.array([0, m // 4, m // 2, 3 * m // 4]))
    assert q.tolist() == [[1, 0, 0, 0], [0, 0, -1, 0], [-1, 0, 0, 0], [0, 0, 1, 0]]


def test_table_layout_and_half_turn_symmetry():
    m = 64
    t = np.array(twiddle_table(m)).reshape(-1, 4)
    assert t.shape == (32, 4)
    np.testing.assert_array_equal(t, roots_words(m, np.arange(32)))
    # The kernels use w^(e + m/2) = -w^e: check that against the independent roots.
    np.testing.assert_array_equal(-t, roots_words(m, np.arange(32, 64)) + 0.0)
    assert np.array(twiddle_table(2)).size == 8  # padded: a device buffer
    with pytest.raises(ValueError, match="even order"):
        twiddle_table(3)
    with pytest.raises(ValueError, match="m must be an integer >= 1"):
        roots_dd(0, [0])


def test_chirp_uses_exact_exponents():
    """c_k = exp(-pi i k^2 / n) for k up to n - 1 with n ~ 10^5: k^2 ~ 10^10
    would lose ~20 bits as a float64 angle; the integer reduction loses none."""
    n = 99991
    ks = np.array([0, 1, 2, 317, 50000, 99989, 99990])
    c = chirp_words(n).astype(np.float64)[ks]
    with mpmath.workprec(200):
        for row, k in zip(c, ks):
            z = mpmath.expj(-mpmath.pi * k * k / n)
            assert abs(complex(row[0] + row[1], row[2] + row[3]) - complex(z)) < 2.0**-47
            assert abs(mpmath.mpf(row[0]) + row[1] - z.real) <= 2.0**-48 * abs(z.real) + 2.0**-100


def test_chirp_conjugate_and_scaled():
    """conj(c_k) / 7 (Bluestein's last factor for an inverse of size 7): split once
    from the double-double product, so still within 2^-48 per component."""
    n = 7
    c = chirp_words(n, conj=True, scale_den=n).astype(np.float64)
    with mpmath.workprec(200):
        for k in range(n):
            z = mpmath.expj(mpmath.pi * k * k / n) / n
            for v, hi, lo in ((z.real, c[k, 0], c[k, 1]), (z.imag, c[k, 2], c[k, 3])):
                assert abs(mpmath.mpf(hi) + lo - v) <= 2.0**-48 * abs(v) + 2.0**-100
