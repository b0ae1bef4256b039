"""``x @ W.T`` and its kin inside ``extended_precision()`` on the kernel backends:
the GEMM reads ``W`` itself with swapped strides (no transpose node in the graph),
with the same bits as the product of a contiguous transposed copy, results
against float64 oracles, in-place updates honoured, gradients unchanged."""

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlx_precise as mp
from flow_helpers import f64, rng_f32, value64
from mlx_precise.extended import low_word
from mlx_precise.linalg import gemm
from mlx_precise.doubleword import DoubleWord
from mlx_precise.testing import graph_counts, lazy_metal_executor

U = 2.0 ** -24


def _words(a):
    return np.array(a), np.array(low_word(a))


def _within_gemm_bound(got, ref, absprod, k):
    """|got - ref| <= (K + 12) u^2 |A| |B| (docs/dwgemm.md), plus the oracle's own
    float64 rounding."""
    assert np.all(np.abs(value64(got) - ref) <= (k + 12) * U * U * absprod + 1e-15 * np.abs(ref))


@pytest.mark.parametrize("form", ["T", "mT", "transpose", "transpose_axes", "method",
                                  "swapaxes", "matrix_transpose", "permute_dims"])
def test_transposed_weight_same_bits_as_contiguous(form):
    x, w = mx.array(rng_f32((2, 5, 24), 1)), mx.array(rng_f32((16, 24), 2))
    wt_copy = mx.array(np.ascontiguousarray(np.array(w).T))  # not a transpose node
    flip = {"T": lambda v: v.T, "mT": lambda v: v.mT, "transpose": mx.transpose,
            "transpose_axes": lambda v: mx.transpose(v, (1, 0)),
            "method": lambda v: v.transpose(1, 0), "swapaxes": lambda v: mx.swapaxes(v, -1, -2),
            "matrix_transpose": mx.matrix_transpose,
            "permute_dims": lambda v: mx.permute_dims(v, [1, 0])}[form]
    with mp.use_backend("emulate"), mp.extended_precision():
        h = x * 1.1  # carried low words on both operands
        wd = w * 0.7
        got = h @ flip(wd)
        want = h @ (wt_copy * 0.7)
        exact = h @ flip(w)  # an exact (float32) weight
        exact_want = h @ wt_copy
    for g, r in ((got, want), (exact, exact_want)):
        gh, gl = _words(g)
        rh, rl = _words(r)
        assert np.array_equal(gh, rh) and np.array_equal(gl, rl)
    ref = value64(h) @ (value64(wd).T)
    _within_gemm_bound(got, ref, np.abs(value64(h)) @ np.abs(value64(wd).T), 24)


def test_batched_and_left_operand_transposes():
    a, b = mx.array(rng_f32((3, 7, 5), 3)), mx.array(rng_f32((3, 9, 7), 4))
    with mp.use_backend("emulate"), mp.extended_precision():
        ad, bd = a * 1.1, b * 1.3
        got = mx.swapaxes(ad, -1, -2) @ bd.transpose(0, 2, 1)  # (3, 5, 9)
    A, B = value64(ad).transpose(0, 2, 1), value64(bd).transpose(0, 2, 1)
    _within_gemm_bound(got, A @ B, np.abs(A) @ np.abs(B), 7)


def test_linear_graph_has_no_weight_transpose():
    lin = nn.Linear(24, 16)
    mx.eval(lin.parameters())
    x = mx.array(rng_f32((4, 24), 5))
    with lazy_metal_executor():
        with mp.use_backend("metal"), mp.extended_precision():
            y = lin(x * 1.1)
            z = x @ lin.weight.T
        counts = [graph_counts(v)["by_primitive"] for v in (y, z)]
    assert all(c.get("Transpose", 0) == 0 for c in counts), counts
    assert counts[1].get("Depends") == 1  # the one GEMM launch


def test_in_place_updates_after_the_transpose():
    x, w = mx.array(rng_f32((3, 6), 6)), mx.array(rng_f32((4, 6), 7))
    w_old = np.array(w).astype(np.float64)
    with mp.use_backend("emulate"), mp.extended_precision():
        wt = w.T
        wt[0, 0] = 5.0  # the transpose itself changed: the GEMM must read it
        y1 = x @ wt
        v = mx.array(np.array(w))
        vt = v.T
        v[0, 0] = 7.0  # the source changed after the transpose: vt keeps the old value
        y2 = x @ vt
    wt_ref = w_old.T.copy()
    wt_ref[0, 0] = 5.0
    for got, b in ((y1, wt_ref), (y2, w_old.T)):
        ref = f64(x) @ b
        _within_gemm_bound(got, ref, np.abs(f64(x)) @ np.abs(b), 6)


def test_gradient_through_transposed_weight():
    lin = nn.Linear(8, 5)
    mx.eval(lin.parameters())
    x = mx.array(rng_f32((6, 8), 8))
    W, bias, X = f64(lin.weight), f64(lin.bias), f64(x)
    with mp.use_backend("emulate"), mp.extended_precision():
        grads = nn.value_and_grad(lin, lambda m, v: (m(v) ** 2).sum())(lin, x)[1]
    y = X @ W.T + bias  # d/dW sum(y^2) = 2 y^T X, d/db = 2 sum_rows y
    gw, gb = f64(grads["weight"]), f64(grads["bias"])
    # the VJP is float32 (MLX's matmul VJP of the high words): float32-sized error
    assert np.allclose(gw, 2 * y.T @ X, rtol=0, atol=1e-5 * np.abs(2 * y.T @ X).max())
    assert np.allclose(gb, 2 * y.sum(0), rtol=0, atol=1e-5 * np.abs(2 * y.sum(0)).max())
    assert math.isfinite(float(gw.sum()))


def test_gemm_transposed_flag_equals_transposed_operand():
    rng = np.random.default_rng(9)
    hi = rng.standard_normal((2, 9, 7)).astype(np.float32)
    lo = (hi * rng.standard_normal(hi.shape) * 2e-8).astype(np.float32)
    a = DoubleWord(mx.array(rng_f32((2, 5, 7), 10)), mx.array(rng_f32((2, 5, 7), 11) * 1e-8))
    b = DoubleWord(mx.array(hi), mx.array(lo))
    bt = DoubleWord(mx.swapaxes(b.hi, -1, -2), mx.swapaxes(b.lo, -1, -2))
    for backend in ("emulate", "cpu"):
        got = gemm.transposed_matmul(a, b, (False, True), backend=backend)
        want = gemm.matmul(a, bt, backend=backend)
        assert np.array_equal(np.array(got.hi), np.array(want.hi))
        assert np.array_equal(np.array(got.lo), np.array(want.lo))
    with pytest.raises(gemm.MatmulShapeError):
        gemm.transposed_matmul(a, DoubleWord.exact(mx.ones((7,))), (False, True))
