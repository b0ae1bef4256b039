"""Hyena long convolution: accuracy against a longdouble oracle, the FFT-formula
semantics, gradients against float64, the nn layers, and bad input."""

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from helpers import float64_gradients

import mlx_precise as mp
from mlx_precise import DoubleWord
from mlx_precise.conv.hyena import default_fft_size, fftconv, hyena_conv_extended
from mlx_precise.nn import FFTConv, HyenaOperator

BACKENDS = ("emulate", "cpu")


def inputs(seed, B, C, L, Lk=None, decaying=False):
    rng = np.random.default_rng(seed)
    Lk = Lk or L
    u = rng.standard_normal((B, C, L)).astype(np.float32)
    k = rng.standard_normal((C, Lk))
    if decaying:  # Hyena-like filters: exponentially decaying with random rates
        k *= np.exp(-np.arange(Lk)[None] * rng.uniform(1, 20, (C, 1)) / Lk)
    D = rng.standard_normal(C).astype(np.float32)
    return u, k.astype(np.float32), D


def reference(u, k, D, N=None):
    """The FFT formula in longdouble (64-bit significand) from the float32 inputs."""
    L = u.shape[-1]
    N = N or default_fft_size(L, k.shape[-1])
    ul, kl = u.astype(np.longdouble), k.astype(np.longdouble)
    y = np.fft.irfft(np.fft.rfft(ul, N) * np.fft.rfft(kl, N), N)[..., :L]
    return y + (D.astype(np.longdouble)[None, :, None] * ul if D is not None else 0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("L,C,decaying", [(256, 4, False), (1024, 4, True), (4096, 2, False),
                                          (16384, 1, True)])
def test_exactly_rounded(backend, L, C, decaying):
    u, k, D = inputs(L, 1, C, L, decaying=decaying)
    ref = reference(u, k, D)
    y = np.array(hyena_conv_extended(mx.array(u), mx.array(k), mx.array(D), backend=backend))
    exact = (y == ref.astype(np.float32)).mean()
    plain = np.array(fftconv.plain(mx.array(u), mx.array(k), mx.array(D)))
    print(f"{backend} L={L}: {100 * exact:.4f}% exactly rounded "
          f"(plain float32 MLX: {100 * (plain == ref.astype(np.float32)).mean():.1f}%)")
    assert exact >= 0.9999
    if backend != "cpu":
        d = hyena_conv_extended(mx.array(u), mx.array(k), mx.array(D), round_output=False,
                                backend=backend)
        assert isinstance(d, DoubleWord)
        err = np.linalg.norm(d.to_float64() - ref) / np.linalg.norm(ref)
        print(f"  normwise error of the double-word result: {float(err):.2e}")
        assert err <= 1e-13


@pytest.mark.parametrize("backend", BACKENDS)
def test_explicit_fft_size_wraps_like_the_formula(backend):
    """fft_size = L < L + Lk - 1: circular convolution, exactly the FFT formula."""
    u, k, D = inputs(7, 2, 3, 64, Lk=40)
    ref = reference(u, k, None, N=64)
    y = np.array(hyena_conv_extended(mx.array(u), mx.array(k), fft_size=64, backend=backend))
    assert (y == ref.astype(np.float32)).mean() >= 0.999
    assert np.abs(y - ref).max() <= 2e-6 * np.abs(ref).max()
    # The default is the linear convolution, computed directly here.
    y = np.array(hyena_conv_extended(mx.array(u), mx.array(k), mx.array(D), backend=backend))
    direct = np.zeros(u.shape, np.longdouble)
    for s in range(k.shape[1]):
        direct[..., s:] += k[None, :, s, None].astype(np.longdouble) * u[..., :64 - s]
    direct += D[None, :, None] * u.astype(np.longdouble)
    assert (y == direct.astype(np.float32)).mean() >= 0.999


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_match_float64(backend):
    u, k, D = inputs(3, 2, 3, 48, Lk=32)
    g = np.random.default_rng(4).standard_normal(u.shape).astype(np.float32)

    def loss(u, k, D):
        return (hyena_conv_extended(u, k, D, backend=backend) * mx.array(g)).sum()

    grads = mx.grad(loss, argnums=(0, 1, 2))(mx.array(u), mx.array(k), mx.array(D))
    for got, ref, name in zip(grads, float64_gradients(u, k, D, g), ("du", "dk", "dD")):
        got = np.array(got, np.float64)
        assert got.shape == ref.shape, name
        # Rounded once from a double-word (or float64) value: within 1 ulp.
        assert np.all(np.abs(got - ref) <= np.spacing(np.abs(ref).astype(np.float32)) + 1e-30), name
    # Without D: two gradients.
    gu, gk = mx.grad(lambda u, k: (hyena_conv_extended(u, k, backend=backend) * mx.array(g)).sum(),
                     argnums=(0, 1))(mx.array(u), mx.array(k))
    du, dk, _ = float64_gradients(u, k, np.zeros_like(D), g)
    np.testing.assert_allclose(np.array(gu), du, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.array(gk), dk, rtol=1e-6, atol=1e-5)


def test_fftconv_follows_context():
    u, k, D = (mx.array(a) for a in inputs(5, 1, 2, 128, decaying=True))
    plain = np.array(mp.fftconv(u, k, D))
    np.testing.assert_allclose(plain, np.array(fftconv.plain(u, k, D)))
    with mp.use_backend("cpu"), mp.extended_precision():
        ext = np.array(mp.fftconv(u, k, D))
    assert (ext == np.array(hyena_conv_extended(u, k, D, backend="cpu"))).all()
    ref = reference(*(np.array(a) for a in (u, k, D))).astype(np.float32)
    assert (ext == ref).mean() > (plain == ref).mean()


def test_layers_train_under_extended_precision():
    mx.random.seed(0)
    model = HyenaOperator(8, 64, order=2, filter_order=16)
    conv = FFTConv(8, 64)
    x = mx.random.normal((2, 64, 8))
    target = mx.random.normal((2, 64, 8))

    def loss_fn(params_model, x, y):
        h = params_model[0](x)
        return ((params_model[1](h.transpose(0, 2, 1)).transpose(0, 2, 1) - y) ** 2).mean()

    stack = [model, conv]

    class Both(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = stack

    both = Both()
    opt = optim.Adam(learning_rate=1e-2)
    step = nn.value_and_grad(both, lambda m, x, y: loss_fn(m.layers, x, y))
    losses = []
    with mp.use_backend("cpu"), mp.extended_precision():
        for _ in range(8):
            loss, grads = step(both, x, target)
            opt.update(both, grads)
            mx.eval(both.parameters())
            losses.append(loss.item())
    assert losses[-1] < 0.95 * losses[0], losses
    # One step through the emulated Metal kernels gives the same loss as cpu.
    with mp.use_backend("emulate"), mp.extended_precision():
        loss_e, grads_e = step(both, x, target)
    with mp.use_backend("cpu"), mp.extended_precision():
        loss_c, grads_c = step(both, x, target)
    assert abs(loss_e.item() - loss_c.item()) <= 1e-6 * abs(loss_c.item())


def test_bad_input():
    u, k, D = (mx.array(a) for a in inputs(1, 1, 2, 16))
    with pytest.raises(ValueError, match=r"u must be \(batch, channels, L\)"):
        hyena_conv_extended(u[0], k, backend="cpu")
    with pytest.raises(ValueError, match="k has 3 channels but u has 2"):
        hyena_conv_extended(u, mx.zeros((3, 16)), backend="cpu")
    with pytest.raises(ValueError, match="Lk=32 steps, more than fft_size=16"):
        hyena_conv_extended(u, mx.zeros((2, 32)), fft_size=16, backend="cpu")
    with pytest.raises(ValueError, match="fft_size=8 must be >= L=16"):
        hyena_conv_extended(u, k, fft_size=8, backend="cpu")
    with pytest.raises(ValueError, match=r"D must have shape \(2,\)"):
        hyena_conv_extended(u, k, mx.zeros((3,)), backend="cpu")
    with pytest.raises(TypeError, match="u has dtype mlx.core.float16, expected float32"):
        hyena_conv_extended(u.astype(mx.float16), k, backend="cpu")
    with pytest.raises(ValueError, match="exceeds max_len"):
        FFTConv(2, 8)(u)
    with pytest.raises(ValueError, match="order must be an int >= 2"):
        HyenaOperator(4, 16, order=1)


def test_cpu_chunks_of_channels(monkeypatch):
    """The cpu path in chunks of 2 channels (3 chunks, batch 2, Lk < L): forward
    exactly rounded against the longdouble formula, gradients against direct
    float64 sums, the same bits as one chunk."""
    from mlx_precise.fft import cpu as fftcpu

    u, k, D = inputs(11, 2, 5, 300, Lk=200, decaying=True)
    g = np.random.default_rng(12).standard_normal(u.shape).astype(np.float32)
    args = (mx.array(u), mx.array(k), mx.array(D))

    def run():
        y = np.array(hyena_conv_extended(*args, backend="cpu"))
        grads = mx.grad(lambda *a: (hyena_conv_extended(*a, backend="cpu") * mx.array(g)).sum(),
                        argnums=(0, 1, 2))(*args)
        return y, [np.array(x) for x in grads]

    whole = run()
    monkeypatch.setattr(fftcpu, "_CHUNK_BYTES", 2 * 8 * 512)  # N = 512: 2 rows per chunk
    y, grads = run()
    assert (y == reference(u, k, D).astype(np.float32)).mean() >= 0.9999
    for got, ref in zip(grads, float64_gradients(u, k, D, g)):
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-5)
    assert (y == whole[0]).all() and all((a == b).all() for a, b in zip(grads, whole[1]))
