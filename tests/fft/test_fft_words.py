"""A transform's complex result inside a block is a view of the float32 words its
last kernel wrote; the kernels that read it next (a fused program over the parts
axis, the complex exponential, the complex division) read those words as they are
(mlx_precise.doubleword.fusion.note_parts / words_of), not float32 views of
reshapes of its complex view: the same floats, fewer graph nodes (a compiled
call on metal replays every one)."""

import importlib

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.extended import low_word, recipes
from mlx_precise.testing import graph_counts, lazy_metal_executor

fftengine = importlib.import_module("mlx_precise.fft.engine")


def _ops(X, c):
    """rfft result X (complex words) read by a fused product, the complex
    exponential and a complex division."""
    return [X * c + X, mx.exp(X / 64), c / X]


def _inputs():
    rng = np.random.default_rng(3)
    x = mx.array(rng.standard_normal((4, 32)).astype(np.float32))
    c = mx.array((rng.standard_normal((4, 17)) + 1j * rng.standard_normal((4, 17)))
                 .astype(np.complex64))
    return x, c


def _bits(a):
    return np.ascontiguousarray(np.array(a)).view(np.uint32)


def test_reading_the_words_keeps_the_bits(monkeypatch):
    """On emulate, each result and its low word have the same bits whether the
    readers take the transform's words or views of its complex words, and the
    carried values agree with a float64 oracle."""
    x, c = _inputs()
    out = []
    for noted in (True, False):
        if not noted:
            monkeypatch.setattr(fftengine, "note_parts", lambda *a: None)
        with mp.use_backend("emulate"), mp.extended_precision() as rep:
            ys = _ops(mx.fft.rfft(x), c)
            mx.eval(ys, [low_word(y) for y in ys])
        assert not rep.float32, rep.float32
        out.append([(_bits(y), _bits(low_word(y))) for y in ys])
    for (h1, l1), (h2, l2) in zip(*out):
        assert np.array_equal(h1, h2) and np.array_equal(l1, l2)
    X = np.fft.rfft(np.array(x).astype(np.float64))
    c64 = np.array(c).astype(np.complex128)
    for y, ref in zip(ys, [X * c64 + X, np.exp(X / 64), c64 / X]):
        got = np.array(y).astype(np.complex128) + np.array(low_word(y)).astype(np.complex128)
        assert np.max(np.abs(got - ref)) <= 1e-12 * np.max(np.abs(ref))


# View nodes in the graph of each reader (the product, the exponential, the
# division). With the transform's words read as they are, the Views left are the
# result's own complex views of the words its kernel wrote and those of c's float32
# parts (the product reads c's parts reversed as a slice of that view); through
# views of X's complex words, each word of X a reader takes costs two more (a
# complex view and a float32 view; the division, reading flat, one more), but for
# X's own complex view, one view of its packed words for both.
VIEWS = {"noted": (3, 2, 5), "viewed": (8, 5, 7)}


@pytest.mark.parametrize("which", range(3))
def test_readers_take_the_words(lazy_metal, monkeypatch, which):
    """On metal (lazy stand-in) each reader's graph holds the View nodes counted
    in :data:`VIEWS`, with the same launches as when the transform's complex words
    are read through views (the note turned off), and no more Reshapes (a program
    reads the transform's packed words through one reshape of them, where the
    words take one each)."""
    # (the rules' own graphs: a repeated structure is not replayed, extended.recipes)
    monkeypatch.setattr(recipes, "ENABLED", False)
    x, c = _inputs()
    mx.eval(x, c)
    counts = {}
    for form in ("noted", "viewed"):
        if form == "viewed":
            monkeypatch.setattr(fftengine, "note_parts", lambda *a: None)
        with mp.use_backend("metal"), mp.extended_precision():
            y = _ops(mx.fft.rfft(x), c)[which]
            counts[form] = graph_counts(y, low_word(y))
    for form, g in counts.items():
        assert g["by_primitive"].get("View", 0) == VIEWS[form][which], (form, g)
    noted, viewed = (counts[f]["by_primitive"] for f in ("noted", "viewed"))
    assert counts["noted"]["launches"] == counts["viewed"]["launches"]
    assert noted["Reshape"] <= viewed["Reshape"], (noted, viewed)


fftnd = importlib.import_module("mlx_precise.fft.nd")


@pytest.mark.parametrize("kind, shape, n", [("irfft", (3, 33), 64), ("ifft", (3, 32), 32),
                                            ("irfft", (2, 7), 12)])
def test_forward_norm_inverse_is_the_unscaled_sum(kind, shape, n):
    """An inverse transform with norm="forward" runs without its 1/n and without a
    scaling by n after it (one launch fewer): for a power-of-two n the bits of
    1/n applied by the kernels and n by a scaling after them (exact: powers of
    two), for another n (Bluestein's 1/n, not exact) within the double-word bound
    of numpy's sum in float64."""
    rng = np.random.default_rng(4)
    x = mx.array((rng.standard_normal(shape) + 1j * rng.standard_normal(shape))
                 .astype(np.complex64))
    with mp.use_backend("emulate"):
        y = fftnd.transform(kind, x, (n,), (1,), "forward", round_output=False)
        if n & (n - 1) == 0:
            scaled = fftnd.transform(kind, x, (n,), (1,), "backward", round_output=False)
            z = fftnd.scale_extended(scaled, n, round_output=False)
            for a, b in ((y.hi, z.hi), (y.lo, z.lo)):
                assert np.array_equal(_bits(a), _bits(b))
    ref = getattr(np.fft, kind)(np.array(x).astype(np.complex128), n, axis=1, norm="forward")
    got = np.array(y.hi).astype(np.complex128) + np.array(y.lo).astype(np.complex128)
    assert np.max(np.abs(got - ref)) <= 1e-13 * np.max(np.abs(ref))
    with lazy_metal_executor(record := []), mp.use_backend("metal"):
        y = fftnd.transform(kind, x, (n,), (1,), "forward", round_output=False)
        mx.eval(y.hi, y.lo)
    assert not [k for k in record if k.name == "ext_scale"]


def _nd_ops(x, c):
    """N-D transforms whose later steps read the rows of an earlier one (moved
    axes), and 1-D transforms of a fused product along a middle axis."""
    X = mx.fft.rfft2(x, axes=(0, 1))
    Y = mx.fft.fftn(c, s=(8, 16), axes=(1, 0))  # the second step pads its rows
    Z = mx.fft.ifft(c * c, axis=0)
    return [mx.fft.irfft2(X * 0.5, s=x.shape[:2], axes=(0, 1)), Y, mx.fft.irfft(Z, n=8, axis=0),
            mx.fft.ifft2(c * 2.0, axes=(0, 1))]


def test_transforms_of_transform_rows_keep_the_bits(monkeypatch):
    """On emulate, N-D transforms (each step after the first takes its rows from
    the words the previous step wrote: one transpose of them, no moves of views
    back and forth), 1-D ones of fused products along a middle axis, and fused
    programs reading a transform's words in its rows' layout (a transpose of them)
    give the bits of the paths through the complex words; on metal (lazy stand-in)
    with fewer graph nodes, and the same launches."""
    rng = np.random.default_rng(8)
    x = mx.array(rng.standard_normal((16, 8, 3)).astype(np.float32))
    c = mx.array((rng.standard_normal((8, 4, 2)) + 1j * rng.standard_normal((8, 4, 2)))
                 .astype(np.complex64))
    out, nodes = [], []
    for rows in (True, False):
        if not rows:  # no transform's words noted, none read
            monkeypatch.setattr(fftengine, "rows_of", lambda w: None)
            monkeypatch.setattr(fftengine, "note_parts", lambda *a: None)
        with mp.use_backend("emulate"), mp.extended_precision() as rep:
            ys = _nd_ops(x, c)
            mx.eval(ys, [low_word(y) for y in ys])
        assert not rep.float32, rep.float32
        out.append([(_bits(y), _bits(low_word(y))) for y in ys])
        with lazy_metal_executor(), mp.use_backend("metal"), mp.extended_precision():
            ys = _nd_ops(x, c)
            nodes.append([graph_counts(y, low_word(y)) for y in ys])
    for (h1, l1), (h2, l2) in zip(*out):
        assert np.array_equal(h1, h2) and np.array_equal(l1, l2)
    for g1, g2 in zip(*nodes):
        assert g1["launches"] == g2["launches"]
        assert sum(g1["by_primitive"].values()) < sum(g2["by_primitive"].values()), (g1, g2)
