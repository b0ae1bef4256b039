"""The im2col gather of the convolution rules (mlx_precise/extended/rules/
convolution.py, _columns): taps on a grid are one ``as_strided`` window of the
padded input, bit for bit the slices-and-stack gather (carried low words
included), and the convolution against a float64 oracle; a window is two graph
nodes per word where the slices were 2T + 1."""

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.extended import low_word
from mlx_precise.extended.rules import convolution
from mlx_precise.testing import graph_counts, lazy_metal_executor


@pytest.mark.parametrize("offsets, want", [
    ([(0,), (2,), (4,)], [(0, 2, 3)]),
    ([(3,), (1,)], [(3, -2, 2)]),
    ([(0, 0), (0, 1), (2, 0), (2, 1)], [(0, 2, 2), (0, 1, 2)]),
    ([(0, 0), (0, 1), (2, 1), (2, 0)], None),  # not in product order
    ([(0,), (1,), (3,)], None),                # not a progression
    ([(0,), None], None),                      # a zero tap
])
def test_progressions(offsets, want):
    assert convolution._progressions(offsets) == want


def _oracle(x, w, stride, padding, dilation):
    """conv2d of (N, H, W, C) by (O, KH, KW, C) in float64 (MLX's cross-correlation)."""
    xp = np.pad(x, [(0, 0), (padding, padding), (padding, padding), (0, 0)])
    k = w.shape[1:3]
    out = [(n - dilation * (kk - 1) - 1) // stride + 1 for n, kk in zip(xp.shape[1:3], k)]
    y = np.zeros((x.shape[0], *out, w.shape[0]))
    for i, j in np.ndindex(*k):
        win = xp[:, i * dilation::stride, j * dilation::stride][:, :out[0], :out[1]]
        y += win @ w[:, i, j].T
    return y


def _conv(x, w, kw, backend="emulate"):
    with mp.use_backend(backend), mp.extended_precision():
        y = mx.conv2d(x * 1.1, w, **kw)  # x * 1.1 carries a low word
        return np.array(y), np.array(low_word(y))


@pytest.mark.parametrize("kw", [dict(stride=1, padding=1, dilation=1),
                                dict(stride=2, padding=2, dilation=2),
                                dict(stride=3, padding=0, dilation=1)])
def test_window_matches_slices(monkeypatch, kw):
    rng = np.random.default_rng(kw["stride"] + 10 * kw["dilation"])
    x = mx.array(rng.standard_normal((2, 9, 8, 3)).astype(np.float32))
    w = mx.array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    hi, lo = _conv(x, w, kw)
    want = _oracle(np.array(x).astype(np.float64) * 1.1, np.array(w).astype(np.float64), **kw)
    got = hi.astype(np.float64) + lo.astype(np.float64)
    assert np.abs(got - want).max() <= 1e-12 * np.abs(want).max()
    monkeypatch.setattr(convolution, "_progressions", lambda *_: None)  # slices + stack
    ref_hi, ref_lo = _conv(x, w, kw)
    assert np.array_equal(hi.view(np.uint32), ref_hi.view(np.uint32))
    assert np.array_equal(lo.view(np.uint32), ref_lo.view(np.uint32))


def test_one_window_per_word_on_metal(monkeypatch):
    """The composition (a gradient's recording takes it; 1-D calls otherwise run as
    one launch reading the window in place, tests/extended/test_convolution.py)."""
    monkeypatch.setattr(convolution, "_direct", lambda *_: None)
    x = mx.array(np.random.default_rng(1).standard_normal((1, 12, 4)).astype(np.float32))
    w = mx.array(np.random.default_rng(2).standard_normal((5, 7, 4)).astype(np.float32))
    with lazy_metal_executor():
        with mp.use_backend("metal"), mp.extended_precision():
            y = mx.conv1d(x * 1.1, w, padding=3)
            g = graph_counts(y, low_word(y))["by_primitive"]
    # (the slices: the halves of each launch's packed words, none of the window)
    assert g.get("AsStrided") == 2 and g.get("Slice") == 2 * g["Depends"]
    assert "Concatenate" not in g
