"""Transposed convolutions whose phases all read the same input columns (kernel 2s at
stride s, as in upsampling layers): one gather and one GEMM for all phases
(mlx_precise/extended/rules/convolution.py, _shared_columns). Bit for bit the
per-phase path on emulate (carried low words included), against a float64 oracle,
and on the metal path one gather per word instead of one per phase."""

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.extended import low_word
from mlx_precise.extended.rules import convolution
from mlx_precise.testing import graph_counts, lazy_metal_executor

CASES = [((2, 9, 6), (4, 8, 6), dict(stride=4, padding=2)),
         ((1, 7, 5), (3, 16, 5), dict(stride=8, padding=4)),
         ((2, 5, 5, 3), (4, 4, 4, 3), dict(stride=2, padding=1)),
         ((2, 8, 4), (3, 6, 4), dict(stride=3, padding=0))]


def _run(x, w, kw):
    f = mx.conv_transpose1d if x.ndim == 3 else mx.conv_transpose2d
    with mp.use_backend("emulate"), mp.extended_precision():
        y = f(x * 1.1, w, **kw)  # x * 1.1 carries a low word
        return np.array(y), np.array(low_word(y))


def _oracle(x: np.ndarray, w: np.ndarray, stride: int, padding: int) -> np.ndarray:
    """conv_transpose of (N, *L, C) by (O, *K, C) in float64, by scattering each
    input point's products (MLX's definition: out = (L - 1) s - 2p + K)."""
    full = [(n - 1) * stride + k for n, k in zip(x.shape[1:-1], w.shape[1:-1])]
    y = np.zeros((x.shape[0], *full, w.shape[0]))
    for idx in np.ndindex(*x.shape[1:-1]):
        for tap in np.ndindex(*w.shape[1:-1]):
            at = tuple(i * stride + k for i, k in zip(idx, tap))
            y[(slice(None),) + at] += x[(slice(None),) + idx] @ w[(slice(None),) + tap].T
    crop = tuple(slice(padding, f - padding) for f in full)
    return y[(slice(None),) + crop + (slice(None),)]


@pytest.mark.parametrize("xs, ws, kw", CASES)
def test_one_gemm_for_all_phases(monkeypatch, xs, ws, kw):
    rng = np.random.default_rng(len(xs) + ws[1])
    x = mx.array(rng.standard_normal(xs).astype(np.float32))
    w = mx.array(rng.standard_normal(ws).astype(np.float32))
    hi, lo = _run(x, w, kw)
    x64 = np.array(x).astype(np.float64) * 1.1
    want = _oracle(x64, np.array(w).astype(np.float64), kw["stride"], kw["padding"])
    got = hi.astype(np.float64) + lo.astype(np.float64)
    assert np.abs(got - want).max() <= 1e-12 * np.abs(want).max()
    monkeypatch.setattr(convolution, "_shared_columns", lambda *_: False)  # per phase
    ref_hi, ref_lo = _run(x, w, kw)
    assert np.array_equal(hi.view(np.uint32), ref_hi.view(np.uint32))
    assert np.array_equal(lo.view(np.uint32), ref_lo.view(np.uint32))


def test_one_gather_on_metal(monkeypatch):
    """The composition (a gradient's recording takes it; 1-D calls otherwise run as
    one launch reading the window in place, tests/extended/test_convolution.py)."""
    monkeypatch.setattr(convolution, "_direct", lambda *_: None)
    rng = np.random.default_rng(3)
    x = mx.array(rng.standard_normal((2, 16, 8)).astype(np.float32))
    w = mx.array(rng.standard_normal((4, 16, 8)).astype(np.float32))

    def gathers():  # (as_strided windows, concatenates) of both words
        with lazy_metal_executor():
            with mp.use_backend("metal"), mp.extended_precision():
                y = mx.conv_transpose1d(x * 1.1, w, stride=8, padding=4)
                g = graph_counts(y, low_word(y))
        return tuple(g["by_primitive"].get(p, 0) for p in ("AsStrided", "Concatenate"))

    shared = gathers()
    monkeypatch.setattr(convolution, "_shared_columns", lambda *_: False)
    # shared: one window per word; per phase: one per phase and word, the phases
    # concatenated (per word), and the weights' zero tap appended
    assert shared == (2, 0) and gathers() == (2 * 8, 2 + 1)
