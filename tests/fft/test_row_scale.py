"""The per-row range scaling done by the FFT kernels themselves (fft/engine.py
_RowScale, fft.h fft_row_exponent / fft_unscale): bit for bit the MLX glue it
replaces (mlx_precise/doubleword/pow2scale.py around the kernels, still the path of
Bluestein's sizes), on rows that need scaling, rows whose small entries flush after
it, rows of Inf / NaN / zeros and results that overflow; and against a DFT in numpy
longdouble (an independent oracle)."""

import mlx.core as mx
import numpy as np
import pytest

from mlx_precise import DoubleWord
from mlx_precise.fft import engine
from mlx_precise.fft.engine import transform_words

B = "emulate"


def _glue_only(monkeypatch):
    """The engine with the scaling as MLX ops around the kernels (the former path)."""
    run = engine._in_range
    monkeypatch.setattr(engine, "_in_range",
                        lambda f, hi, lo, g, *_: run(f, hi, lo, g, False, False))


def _rows(n: int, complex_: bool, seed: int) -> np.ndarray:
    """float32 / complex64 (8, n): rows at the top of the range (scaled), rows with
    entries 2^-117 .. 2^-100 next to a 2^125 maximum (their scaled values sit at
    float32's normal / subnormal boundary), a row of zeros, rows with Inf or NaN, and
    rows whose transform overflows."""
    rng = np.random.default_rng(seed)
    shape = (8, n)
    x = rng.standard_normal(shape)
    if complex_:
        x = x + 1j * rng.standard_normal(shape)
    x[0] *= 1e37 / n  # results in range, intermediates not without scaling
    x[1] *= 2.0**126 / n
    x[2] = x[2] * 2.0**-100
    x[2, 0] = 2.0**125
    x[2, 1::3] = 2.0**-117
    x[3] = 0
    x[4, n // 2] = np.inf
    x[5, 1 % n] = np.nan
    x[6] = 2.0**127 * (0.99 if n > 1 else 1)  # sums of n of them overflow
    x[7] = x[7] * 1e-3
    dtype = np.complex64 if complex_ else np.float32
    return x.astype(dtype)


def _low(hi: np.ndarray, seed: int) -> np.ndarray:
    """Low words u/4-ish relative to ``hi`` (0 where hi is not finite)."""
    rng = np.random.default_rng(seed)
    finite = np.where(np.isfinite(hi), hi, 0)
    return (finite * rng.uniform(-2.0**-26, 2.0**-26, hi.shape)).astype(hi.dtype)


def _words(y) -> tuple[np.ndarray, np.ndarray | None]:
    if isinstance(y, DoubleWord):
        return np.array(y.hi), np.array(y.lo)
    return np.array(y), None


def _run(kind, x, n, round_output):
    y = transform_words(kind, x, n, -1, round_output, B, None)
    return _words(y)


CASES = [("fft", 2), ("fft", 64), ("fft", 2048), ("ifft", 64), ("ifft", 2048),
         ("rfft", 2), ("rfft", 4), ("rfft", 64), ("rfft", 4096),
         ("irfft", 2), ("irfft", 4), ("irfft", 64), ("irfft", 4096),
         # Bluestein halves: the fft_real kernel scales one end, MLX ops the other
         ("rfft", 200), ("irfft", 200), ("fft", 100), ("rfft", 7)]


@pytest.mark.parametrize("kind, n", CASES)
def test_kernels_scale_as_the_glue_did(monkeypatch, kind, n):
    # fft of real rows (n = 64) runs the rfft kernels and extends the result
    complex_ = kind in ("ifft", "irfft") or (kind == "fft" and n != 64)
    m = n // 2 + 1 if kind == "irfft" else n
    hi = _rows(m, complex_, n)
    inputs = [mx.array(hi), DoubleWord(mx.array(hi), mx.array(_low(hi, n + 1)))]
    folded = [_run(kind, x, n, r) for x in inputs for r in (True, False)]
    _glue_only(monkeypatch)
    glue = [_run(kind, x, n, r) for x in inputs for r in (True, False)]
    for (a_hi, a_lo), (b_hi, b_lo) in zip(folded, glue):
        np.testing.assert_array_equal(a_hi.view(np.uint32), b_hi.view(np.uint32))
        if a_lo is not None:
            np.testing.assert_array_equal(a_lo.view(np.uint32), b_lo.view(np.uint32))
    # the special-value rule of the store: a high word that is not finite has zero
    # low words (complex results: both parts' when either part is not finite)
    y_hi, y_lo = folded[-1]
    bad = ~np.isfinite(y_hi)  # complex: either part
    assert bad.any() and (y_lo[bad] == 0).all()
    assert np.isfinite(y_hi[:4]).all()  # rows that needed scaling did not overflow


def _dft_longdouble(x: np.ndarray, inverse: bool) -> np.ndarray:
    """The DFT of each row in numpy longdouble (exp of longdouble angles)."""
    n = x.shape[-1]
    k = np.arange(n, dtype=np.longdouble)
    ang = (-1 if not inverse else 1) * 2 * np.pi * np.longdouble(1) * np.outer(k, k) / n
    w = np.cos(ang) + 1j * np.sin(ang)
    y = x.astype(np.clongdouble) @ w
    return y / n if inverse else y


@pytest.mark.parametrize("kind", ["fft", "ifft", "rfft", "irfft"])
def test_scaled_rows_against_a_longdouble_dft(kind):
    n = 64
    rng = np.random.default_rng(3)
    scale = np.array([1e37, 2.0**120, 2.0**-60, 1.0])[:, None]
    x = (rng.standard_normal((4, n)) + 1j * rng.standard_normal((4, n))) * scale
    if kind == "rfft":
        x = x.real
    if kind == "irfft":  # a Hermitian spectrum: the rfft of real rows
        x = np.fft.rfft(rng.standard_normal((4, n)) * scale)
    hi = x.astype(np.complex64 if np.iscomplexobj(x) else np.float32)
    lo = (x - hi.astype(x.dtype)).astype(hi.dtype)
    y_hi, y_lo = _run(kind, DoubleWord(mx.array(hi), mx.array(lo)), n, False)
    exact = hi.astype(np.clongdouble) + lo.astype(np.clongdouble)
    if kind == "rfft":
        want = _dft_longdouble(exact, False)[:, : n // 2 + 1]
    elif kind == "irfft":
        full = np.concatenate([exact, np.conj(exact[:, n // 2 - 1:0:-1])], axis=1)
        full[:, 0] = full[:, 0].real
        full[:, n // 2] = full[:, n // 2].real
        want = _dft_longdouble(full, True).real
    else:
        want = _dft_longdouble(exact, kind == "ifft")
    got = y_hi.astype(np.clongdouble) + y_lo.astype(np.clongdouble)
    err = np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)
    assert np.isfinite(y_hi).all()
    assert (err < 2.0**-44).all(), err
