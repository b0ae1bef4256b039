"""Double-word row sums by row number (``rules.shape.rows_add``: scatter-adds, the
gradients of gathers and embeddings) on every backend. On emulate (and metal) the
``dw_rows_add`` kernel sums each row's values after a stable sort of the row
numbers: any number of rows and values (the one-hot GEMM it replaces stopped at 2^22
index-row pairs, past which these gradients were float32, reported). Oracle: numpy's
add.at in long double on the values' exact words."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.extended import low_word
from mlx_precise.extended.rules.shape import rows_add
from flow_helpers import rng_f32, value64

LD = np.longdouble


def _exact(shape, seed):
    """Values with a low word, the same on every backend: a float32 array plus a
    float64 one of float32 values 2^-30 of it (exact in both representations). Call
    inside a block; also returns the values in float64 (exact)."""
    hi = rng_f32(shape, seed)
    lo = (hi * np.float32(2.0**-30) * np.sign(rng_f32(shape, seed + 1))).astype(np.float32)
    return mx.array(hi) + mx.array(lo.astype(np.float64)), hi.astype(np.float64) + lo


@pytest.mark.parametrize("n,rows,m", [(1, 1, 1), (7, 3, 1), (3000, 50, 7), (40, 1000, 3)],
                         ids=["one", "few", "many per row", "sparse"])
def test_rows_add_matches_long_double(backend, n, rows, m):
    rng = np.random.default_rng(n + rows)
    idx = rng.integers(-rows, rows, n).astype(np.int32)  # negatives count from the end
    with mp.extended_precision(strict=True) as rep:
        v, v64 = _exact((n, m), 3)
        out = rows_add(rows, mx.array(idx), v)
        got = value64(out)
    assert not rep.float32, rep
    want = np.zeros((rows, m), LD)
    np.add.at(want, idx, v64.astype(LD))
    assert np.max(np.abs(got - want)) <= 2.0**-46 * max(np.abs(v64).max() * 4, 1e-30)
    np.testing.assert_array_equal(np.array(out), want.astype(np.float32))


def test_rows_outside_are_ignored_on_emulate():
    """A row number past the rows (after counting negatives from the end) adds
    nothing (MLX's own scatter would write outside the array)."""
    with mp.use_backend("emulate"), mp.extended_precision():
        out = rows_add(4, mx.array([0, 4, -5, 9, 3]), mx.ones((5, 2)))
    np.testing.assert_array_equal(np.array(out), [[1, 1], [0, 0], [0, 0], [1, 1]])


def test_special_values(backend):
    """Infinities, NaN, overflow past 2^127 and signed zeros as float32's sums of the
    same values give them."""
    big = np.float32(2.0**127)
    vals = np.array([[np.inf], [1.0], [-np.inf], [np.inf], [np.nan], [2.0], [big], [big],
                     [-0.0], [3.0]], np.float32)
    idx = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4, 5], np.int32)
    with mp.extended_precision():
        out = np.array(rows_add(6, mx.array(idx), mx.array(vals)))
    want = np.zeros((6, 1), np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        np.add.at(want, idx, vals)
    np.testing.assert_array_equal(out, want)  # inf, nan, nan, inf, 0, 3


def test_complex_values(backend):
    rng = np.random.default_rng(5)
    idx = rng.integers(0, 6, 40).astype(np.int32)
    with mp.extended_precision() as rep:
        (re, re64), (im, im64) = _exact((40, 3), 6), _exact((40, 3), 8)
        v, v64 = re + 1j * im, re64 + 1j * im64
        out = rows_add(6, mx.array(idx), v)
        mx.eval(out)
    # (value64 reads real values: the words of a complex array joined here)
    got = np.array(out).astype(np.complex128) + np.array(low_word(out)).astype(np.complex128)
    assert not rep.float32, rep
    want = np.zeros((6, 3), np.clongdouble)
    np.add.at(want, idx, v64.astype(np.clongdouble))
    assert np.max(np.abs(got - want)) <= 2.0**-46 * np.abs(v64).max() * 8


def test_embedding_gradient_of_many_tokens(backend):
    """nn.Embedding's gradient (the VJP of take: a scatter-add into the table) with
    1000 rows and 4096 tokens (4.1M index-row pairs: float32 on emulate before, past
    the one-hot limit), double-word, rounded once."""
    emb = nn.Embedding(1000, 16)
    ids = mx.array(np.random.default_rng(8).integers(0, 1000, (8, 512)).astype(np.int32))
    w = rng_f32((8, 512, 16), 9)

    def loss(e):
        return (e(ids) * (mx.array(w) / 3)).sum()

    with mp.extended_precision(strict=True) as rep:
        g = value64(nn.value_and_grad(emb, loss)(emb)[1]["weight"])
        w3 = value64(mx.array(w) / 3)
    assert not rep.float32, rep
    want = np.zeros((1000, 16), LD)
    np.add.at(want, np.array(ids).reshape(-1), w3.reshape(-1, 16).astype(LD))
    assert np.max(np.abs(g - want)) <= 2.0**-46 * np.abs(want).max()


def test_complex_scatter_add_keeps_the_low_words(backend):
    """``y.at[i].add(v)`` of complex carried arrays: double-word (before: MLX's
    complex64 scatter of the high words, and not even reported)."""
    idx = np.array([0, 2, 0, 1, 2, 2], np.int32)
    with mp.extended_precision(strict=True) as rep:
        (re, re64), (im, im64) = _exact((6, 2), 21), _exact((6, 2), 23)
        (yr, yr64), (yi, yi64) = _exact((3, 2), 25), _exact((3, 2), 27)
        out = (yr + 1j * yi).at[mx.array(idx)].add(re + 1j * im)
        mx.eval(out)
    assert not rep.float32, rep
    got = np.array(out).astype(np.complex128) + np.array(low_word(out)).astype(np.complex128)
    want = (yr64 + 1j * yi64).astype(np.clongdouble)
    np.add.at(want, idx, (re64 + 1j * im64).astype(np.clongdouble))
    assert np.max(np.abs(got - want)) <= 2.0**-46 * np.abs(want).max()


@pytest.mark.parametrize("index", ["x[:, i]", "x[:, i, j]", "x[:, :, i]"])
def test_gradient_of_gathers_after_full_slices(backend, index):
    """The gradient of ``x[:, i, j]`` (integer arrays after full slices: nn.Upsample's
    linear and cubic modes read their inputs so) is a scatter-add at (slice, rows):
    double-word row sums with the named axes moved first (was float32 on emulate,
    reported). Oracle: numpy's add.at of the cotangent, in long double."""
    rng = np.random.default_rng(31)
    i = mx.array(rng.integers(-4, 4, (3, 5)).astype(np.int32))
    j = mx.array(rng.integers(0, 5, (3, 5)).astype(np.int32))
    pick = {"x[:, i]": lambda t: t[:, i], "x[:, i, j]": lambda t: t[:, i, j],
            "x[:, :, i]": lambda t: t[:, :, i]}[index]
    x0 = rng_f32((2, 4, 5, 3), 32)
    w = rng_f32(pick(mx.zeros((2, 4, 5, 3))).shape, 33)
    with mp.extended_precision(strict=True) as rep:
        g = value64(mx.grad(lambda t: (pick(t) * (mx.array(w) / 3)).sum())(mx.array(x0)))
        w3 = value64(mx.array(w) / 3)
    assert not rep.float32, rep
    want = np.zeros((2, 4, 5, 3), LD)
    ii, jj = np.array(i), np.array(j)
    key = {"x[:, i]": (slice(None), ii), "x[:, i, j]": (slice(None), ii, jj),
           "x[:, :, i]": (slice(None), slice(None), ii)}[index]
    np.add.at(want, key, w3.astype(LD))
    assert np.max(np.abs(g - want)) <= 2.0**-46 * np.abs(want).max()


def test_complex_update_of_a_float32_array_keeps_float32(backend):
    """MLX updates a float32 x by the update cast to float32 (its real part): so does
    the block, in double-word (before the complex row sums it gave a complex64 x)."""
    idx = mx.array([0, 2, 0])
    plain = x_plain = mx.zeros((3,)).at[idx].add(mx.array([1 + 2j, 3j, 0.5 - 1j]))
    with mp.extended_precision(strict=True) as rep:
        (re, re64), (im, im64) = _exact((3,), 41), _exact((3,), 43)
        x = mx.zeros((3,)) / 3
        y = x.at[idx].add(re + 1j * im)
        got = value64(y)
    assert not rep.float32, rep
    assert y.dtype == plain.dtype == mx.float32 and x_plain.shape == y.shape
    want = np.zeros(3, LD)
    np.add.at(want, [0, 2, 0], re64.astype(LD))
    assert np.max(np.abs(got - want)) <= 2.0**-46 * np.abs(want).max()
    np.testing.assert_array_equal(np.array(y), want.astype(np.float32))
