"""Gradients of ops that may read an element several times (``mx.as_strided``,
``take_along_axis``) in a block. as_strided: a window that reads each element
once moves the cotangent's words (exact, reported nowhere); an overlapping window
(frames, im2col, pooling) adds the cotangents of an element read several times,
exact on the cpu backend's float64 pass, elsewhere a double-word sum of injective
windows (at most 64 of them), beyond that MLX's float32 VJP, reported as
``as_strided (gradient)`` and raising under ``strict=True`` (never a silently
float32 sum). Oracle: the cotangent scattered by hand in float64 numpy."""

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.extended import PrecisionDropError

from flow_helpers import f64, rng_f32, value64

N = 64
WINDOWS = {  # (shape, strides, emulate's VJP: a move, a double-word sum, or float32)
    "frames (hop 3, length 8)": ((19, 8), (3, 1), "sum"),
    "cube of overlaps (81 windows)": ((9, 9, 9), (1, 1, 1), "float32"),
    "disjoint rows": ((8, 8), (8, 1), "move"),
    "transposed": ((8, 8), (1, 8), "move"),
    "every other": ((32,), (2,), "move"),
}


def _oracle(shape, strides, w):
    """d/dx sum(window(x) * w): w's entries added at their offsets, in float64."""
    g = np.zeros(N)
    for idx in np.ndindex(*shape):
        g[sum(i * s for i, s in zip(idx, strides))] += w[idx]
    return g


def _loss(shape, strides, w):
    return lambda x: (mx.as_strided(x * 1.0, shape, strides) * w).sum()


def _window_grad(backend, shape, strides):
    """(the gradient, the block's report, the float64 oracle)."""
    x = mx.array(rng_f32(N))
    w = mx.array(rng_f32(shape, 1)) / 3
    with mp.use_backend(backend), mp.extended_precision() as rep:
        w = w * 1.0
        g = mx.grad(_loss(shape, strides, w))(x)
        want = _oracle(shape, strides, value64(w))
    return g, rep, want


@pytest.mark.parametrize("name", list(WINDOWS))
def test_cpu_gradient_is_exact(name):
    shape, strides, _ = WINDOWS[name]
    g, rep, want = _window_grad("cpu", shape, strides)
    np.testing.assert_allclose(value64(g), want, rtol=2**-46,
                               atol=2**-46 * np.abs(want).max())
    assert not rep.float32, rep


@pytest.mark.parametrize("name", list(WINDOWS))
def test_emulate_gradient_exact_or_reported(name):
    shape, strides, kind = WINDOWS[name]
    g, rep, want = _window_grad("emulate", shape, strides)
    if kind == "float32":
        assert rep.float32["as_strided (gradient)"] >= 1, rep
        np.testing.assert_allclose(f64(g), want, rtol=1e-5)
        x, w = mx.array(rng_f32(N)), mx.array(rng_f32(shape, 1))
        with pytest.raises(PrecisionDropError):
            with mp.use_backend("emulate"), mp.extended_precision(strict=True):
                mx.grad(_loss(shape, strides, w * 1.0))(x)
    elif kind == "sum":
        assert not rep.float32, rep
        np.testing.assert_allclose(value64(g), want, rtol=2**-46,
                                   atol=2**-46 * np.abs(want).max())
    else:
        assert not rep.float32, rep
        np.testing.assert_array_equal(value64(g), want)  # a move: one cotangent each


@pytest.mark.parametrize("backend", ["cpu", "emulate"])
@pytest.mark.parametrize("repeated", [False, True])
@pytest.mark.parametrize("axis", [1, -2, None])
def test_take_along_axis_gradient(backend, repeated, axis):
    """Distinct indices along the axis: the cotangent moves, exact everywhere;
    repeated ones (an element read several times): exact sums on cpu and, by the
    double-word row sums, on emulate (was float32 there, reported)."""
    x = mx.array(rng_f32((4, 16)))
    if axis is None:  # (the flattened x)
        order = np.argsort(rng_f32(64, 2))
        idx = np.concatenate([order[:20], order[:20]]) if repeated else order
    else:
        order = np.argsort(rng_f32((4, 16), 2), axis=axis % 2)
        half = order[:, :8] if axis == 1 else order[:2]
        idx = np.concatenate([half, half], axis % 2) if repeated else order
    idx = mx.array(idx.astype(np.int32))
    w = mx.array(rng_f32(idx.shape, 3))

    def loss(a):
        return (mx.take_along_axis(a * 1.0, idx, axis=axis) * w).sum()

    with mp.use_backend(backend), mp.extended_precision(strict=True) as rep:
        w = w / 3
        g = mx.grad(loss)(x)
        got, wv = value64(g), value64(w)
    want = np.zeros(64 if axis is None else (4, 16))
    np.add.at(want, np.array(idx) if axis is None else (
        (np.arange(4)[:, None], np.array(idx)) if axis == 1 else
        (np.array(idx), np.arange(16)[None, :])), wv)
    assert not rep.float32, rep
    np.testing.assert_allclose(got, want.reshape(4, 16), rtol=2**-46, atol=2**-46)


def test_take_along_axis_gradient_of_many_repeated_reads():
    """Repeated reads at a size a one-hot matrix would not fit (64 x 256 elements,
    each read 3 times by 768 indices per row): double-word row sums on emulate (was
    MLX's float32 VJP there, reported), each element's three cotangents summed
    exactly as numpy's add.at does in long double, then rounded once."""
    x = mx.array(rng_f32((64, 256)))
    idx = np.tile(np.arange(256), (64, 3))
    w = rng_f32((64, 768), 7)

    def loss(a):
        return (mx.take_along_axis(a * 1.0, mx.array(idx.astype(np.int32)), axis=1)
                * (mx.array(w) / 3)).sum()

    with mp.use_backend("emulate"), mp.extended_precision(strict=True) as rep:
        g = value64(mx.grad(loss)(x))
        w3 = value64(mx.array(w) / 3)
    assert not rep.float32, rep
    want = np.zeros((64, 256), np.longdouble)
    np.add.at(want, (np.arange(64)[:, None], idx), w3.astype(np.longdouble))
    assert np.max(np.abs(g - want)) <= 2.0**-46 * np.abs(want).max()
