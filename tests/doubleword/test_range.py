"""The documented range holds: FFT-based paths do not overflow in intermediates when
inputs and results are within float32's range (rows scaled by exact powers of two,
mlx_precise/doubleword/pow2scale.py). Oracle: numpy float64 (exact enough: its error ~1e-16
is far below the double-word 1e-13 asserted)."""

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp

BACKENDS = ("emulate", "cpu")
SCALES = (1e35, 1e36, 1e37, 2.0**120)


def normwise(got, want) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def dw64(y) -> np.ndarray:
    return y.to_float64() if isinstance(y, mp.DoubleWord) else np.array(y).astype(np.complex128)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [128, 127, 100])  # power of two, odd, Bluestein (100 even)
def test_transforms_at_the_top_of_the_range(backend, n):
    rng = np.random.default_rng(n)
    for s in SCALES:
        x = (rng.standard_normal((3, n)) * s).astype(np.float32)
        c = (x + 1j * (rng.standard_normal((3, n)) * s).astype(np.float32)).astype(np.complex64)
        half = c[:, : n // 2 + 1]
        cases = (
            ("fft", lambda **k: mp.fft_extended(mx.array(c), **k), np.fft.fft(c.astype(np.complex128))),
            ("ifft", lambda **k: mp.ifft_extended(mx.array(c), **k), np.fft.ifft(c.astype(np.complex128))),
            ("rfft", lambda **k: mp.rfft_extended(mx.array(x), **k), np.fft.rfft(x.astype(np.float64))),
            ("irfft", lambda **k: mp.irfft_extended(mx.array(half), n=n, **k),
             np.fft.irfft(half.astype(np.complex128), n)),
        )
        for name, f, want in cases:
            if np.abs(want).max() >= 2.0**127:  # the result itself is out of range
                continue
            got = dw64(f(round_output=False, backend=backend))
            assert np.isfinite(got).all(), (name, s)
            assert normwise(got, want) < 1e-13, (name, s, normwise(got, want))
            r = np.array(f(backend=backend))
            assert np.isfinite(r).all() and normwise(r.astype(np.complex128), want) < 1e-7


@pytest.mark.parametrize("backend", BACKENDS)
def test_near_two_to_127(backend):
    """Entries at 2^126 whose transform reaches 2^127 (the largest binade)."""
    x = np.array([2.0**126, 2.0**126, 2.0**125, -(2.0**124)], np.float32)
    want = np.fft.fft(x.astype(np.float64))
    assert np.abs(want).max() >= 2.0**127
    got = np.array(mp.fft_extended(mx.array(x), backend=backend)).astype(np.complex128)
    np.testing.assert_array_equal(got, want.astype(np.complex64))  # all exact here
    over = np.array([2.0**127, 2.0**127], np.float32)  # X_0 = 2^128: out of range
    y = np.array(mp.fft_extended(mx.array(over), backend=backend))
    assert y[0].real == np.inf and y[1] == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("s", [1e35, 1e37])
def test_hyena_at_the_top_of_the_range(backend, s):
    rng = np.random.default_rng(5)
    B, C, L = 2, 3, 128
    u = (rng.standard_normal((B, C, L)) * s).astype(np.float32)
    k = (rng.standard_normal((C, L)) * np.exp(-np.arange(L) / 30)).astype(np.float32)
    D = rng.standard_normal(C).astype(np.float32)
    u64, k64, D64 = u.astype(np.float64), k.astype(np.float64), D.astype(np.float64)
    N = 2 * L
    want = np.fft.irfft(np.fft.rfft(u64, N) * np.fft.rfft(k64, N), N)[..., :L] + D64[None, :, None] * u64
    assert np.abs(want).max() < 2.0**127
    got = mp.hyena_conv_extended(mx.array(u), mx.array(k), mx.array(D), round_output=False,
                                 backend=backend)
    assert normwise(dw64(got).real, want) < 1e-13
    # gradients of sum(y): du = corr(1, k) + D, dk = sum_b corr(1, u_b)
    du, dk = mx.grad(lambda a, b: mp.hyena_conv_extended(a, b, mx.array(D), backend=backend).sum(),
                     argnums=(0, 1))(mx.array(u), mx.array(k))
    g = np.ones((B, C, L))
    G = np.fft.rfft(g, N)
    du_want = np.fft.irfft(G * np.conj(np.fft.rfft(k64, N)), N)[..., :L] + D64[None, :, None]
    dk_want = np.fft.irfft(G * np.conj(np.fft.rfft(u64, N)), N)[..., :L].sum(axis=0)
    assert normwise(np.array(du), du_want) < 1e-7 and normwise(np.array(dk), dk_want) < 1e-7
