"""``mx.custom_function`` inside ``extended_precision()``: its Python function
runs on the caller's arrays through the flow and, while a gradient is taken in
the block, its own ``vjp`` runs on the carried primals, cotangents and outputs
(before: MLX ran it on new arrays, without their low words, forward and backward
in float32, reported, and ``strict=True`` raised: the common pattern of
``mlx_lm.tuner`` losses and fused layers with an analytic VJP). Oracles: the
functions' float64 formulas in numpy."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.extended import autodiff
from flow_helpers import rng_f32, value64

X, Y = rng_f32((4, 3), 0), rng_f32((4, 3), 1)
X64, Y64 = X.astype(np.float64), Y.astype(np.float64)
VJP_CALLS = []


@mx.custom_function
def product_sum(x, y):
    return mx.sum(x * y / 3)


@product_sum.vjp
def product_sum_vjp(primals, cotangents, outputs):
    VJP_CALLS.append(1)
    x, y = primals
    return cotangents * y / 3, cotangents * x / 3


@mx.custom_function
def soft(x):
    return mx.tanh(x / 3)  # no vjp: MLX's default, the forward's derivative


@mx.custom_function
def split_scale(x, y):
    return x / 3, y * x


@split_scale.vjp
def split_scale_vjp(primals, cotangents, outputs):
    x, y = primals
    gu, gv = cotangents
    return gu / 3 + gv * y, gv * x


def _err(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.fixture(params=["cpu", "emulate", "cpu, flow pass"])
def where(request, monkeypatch):
    if request.param == "cpu, flow pass":  # the VJP rules in ops of the flow on cpu too
        monkeypatch.setattr(autodiff, "FLOAT64_PASS", False)
        return "cpu"
    return request.param


def test_forward_reads_and_keeps_low_words(where):
    with mp.use_backend(where), mp.extended_precision(strict=True) as report:
        x = mx.array(X) / 7  # carries a low word
        s, t = product_sum(x, mx.array(Y)), soft(x)
        got_s, got_t = value64(s), value64(t)
    assert not report.float32 and report.extended["mx.custom_function"] == 2
    assert _err(got_s, (X64 / 7 * Y64 / 3).sum()) < 1e-13
    assert _err(got_t, np.tanh(X64 / 21)) < 1e-13


def test_own_vjp_runs_in_double_word(where):
    VJP_CALLS.clear()

    def f(x, y):
        return product_sum(x / 7, y) * 2

    with mp.use_backend(where), mp.extended_precision(strict=True) as report:
        gx, gy = mx.grad(f, argnums=(0, 1))(mx.array(X), mx.array(Y))
        got_x, got_y = value64(gx), value64(gy)
    assert not report.float32
    assert VJP_CALLS  # the function's own vjp gave the gradient
    assert _err(got_x, 2 * Y64 / 21) < 1e-13 and _err(got_y, 2 * X64 / 21) < 1e-13


def test_default_vjp_is_the_forwards_derivative(where):
    with mp.use_backend(where), mp.extended_precision(strict=True):
        g = mx.grad(lambda x: soft(x).sum())(mx.array(X))
        got = value64(g)
    t = np.tanh(X64 / 3)
    assert _err(got, (1 - t ** 2) / 3) < 1e-13
    assert (np.array(g) == ((1 - t ** 2) / 3).astype(np.float32)).all()


def test_several_outputs(where):
    def f(x, y):
        u, v = split_scale(x, y)
        return (u * 2).sum() + (v * 5).sum()

    with mp.use_backend(where), mp.extended_precision(strict=True):
        gx, gy = mx.grad(f, argnums=(0, 1))(mx.array(X), mx.array(Y))
        got_x, got_y = value64(gx), value64(gy)
    assert _err(got_x, 2 / 3 + 5 * Y64) < 1e-13 and _err(got_y, 5 * X64) < 1e-13


@mx.custom_function
def kernel_like(x):
    return x * 2


@kernel_like.vjp
def kernel_like_vjp(primals, cotangents, outputs):
    if primals.dtype != mx.float32:  # as a float32-only kernel would
        raise TypeError(f"kernel_like takes float32, got {primals.dtype}")
    return cotangents * 2


def test_a_vjp_without_float64_falls_back_reported():
    """cpu's float64 pass gives the vjp float64 values; one that cannot take them
    (a float32-only kernel) falls back to MLX's float32 VJP of the high words:
    reported, and strict raises; the kernel backends run it on the carried words."""
    x = mx.array(X)
    with mp.use_backend("cpu"), mp.extended_precision() as report:
        g = mx.grad(lambda a: kernel_like(a / 3).sum())(x)
    assert report.float32["mx.custom_function (gradient)"] == 1
    assert np.allclose(np.array(g), 2 / 3, rtol=1e-6)
    with pytest.raises(mp.extended.PrecisionDropError):
        with mp.use_backend("cpu"), mp.extended_precision(strict=True):
            mx.grad(lambda a: kernel_like(a / 3).sum())(x)
    with mp.use_backend("emulate"), mp.extended_precision(strict=True):
        g = mx.grad(lambda a: kernel_like(a / 3).sum())(x)
        got = value64(g)
    assert _err(got, np.full(X.shape, 2 / 3)) < 1e-13


@mx.custom_function
def joined(parts):
    return [mx.concatenate([p.reshape(-1) for p in parts]) / 3]


@joined.vjp
def joined_vjp(parts, cotangents, outputs):
    g = cotangents[0] / 3
    sizes = [p.size for p in parts]
    return [g[sum(sizes[:k]):sum(sizes[:k + 1])].reshape(p.shape)
            for k, p in enumerate(parts)]


def test_list_arguments_and_outputs(where):
    """A list of arrays in and out (the shape of mlx.nn's sharded gather): the
    cotangents come back per array."""
    def f(a, b):
        (y,) = joined([a * 2, b])
        return (y * mx.arange(y.size)).sum()

    with mp.use_backend(where), mp.extended_precision(strict=True):
        ga, gb = mx.grad(f, argnums=(0, 1))(mx.array(X[:2]), mx.array(Y[:1]))
        got_a, got_b = value64(ga), value64(gb)
    weights = np.arange(9, dtype=np.float64) / 3
    assert _err(got_a, 2 * weights[:6].reshape(2, 3)) < 1e-13
    assert _err(got_b, weights[6:].reshape(1, 3)) < 1e-13


@mx.custom_function
def scaled_gradient(x):
    return x  # the identity forward of mlx.nn's gradient-sum layers


@scaled_gradient.vjp
def scaled_gradient_vjp(x, dx, _):
    return dx * 3


def test_identity_forward(where):
    """A forward that returns its input: the result is a new array (as MLX's), so
    the vjp's cotangent reaches the input once: 3 c x / 7, not twice."""
    c = mx.array(Y[0])

    def f(w):
        return (scaled_gradient(w * mx.array(X[0]) / 7) * c).sum()

    with mp.use_backend(where), mp.extended_precision(strict=True):
        w = mx.array(np.float32([0.5, -1.0, 2.0]))
        got = value64(mx.grad(f)(w))
        y = scaled_gradient(w)
    assert y is not w
    assert _err(got, 3 * Y64[0] * X64[0] / 7) < 1e-13


@mx.custom_function
def twice(x):
    y = x / 3
    return y, y  # one array returned twice


@twice.vjp
def twice_vjp(x, cotangents, outputs):
    gu, gv = cotangents
    return gu / 3 + gv * 2 / 3


def test_one_array_returned_twice(where):
    def f(x):
        u, v = twice(x)
        return (u * 5).sum() + (v * 7).sum()

    with mp.use_backend(where), mp.extended_precision(strict=True):
        got = value64(mx.grad(f)(mx.array(X)))
    assert _err(got, np.full(X.shape, 5 / 3 + 14 / 3)) < 1e-13
