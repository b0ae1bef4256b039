"""``layout=``: the convolutions take MLX's channels-last signals (batch, L, channels)
as well as (batch, channels, L), with the same numbers bit for bit (values,
double-word results and gradients), on cpu and emulate; an unknown layout raises a
ValueError naming the argument."""

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise import DoubleWord
from mlx_precise.nn import FFTConv

BACKENDS = ("cpu", "emulate")


def _data(seed=7, B=2, C=3, L=16, K=3):
    rng = np.random.default_rng(seed)
    f = lambda *s: mx.array(rng.standard_normal(s).astype(np.float32))  # noqa: E731
    return f(B, C, L), f(C, L), f(C), f(C, K)


def _nlc(x):
    return x.transpose(0, 2, 1)


def _equal(a, b):
    if isinstance(a, DoubleWord):
        return _equal(a.hi, b.hi) and _equal(a.lo, b.lo)
    return np.array_equal(np.array(a), np.array(b))


def _ops(backend):
    """(name, f(signal, layout=..., **kw)) of every op with a layout."""
    _, k, D, w = _data()
    ext = dict(backend=backend)
    return [
        ("hyena_conv_extended", lambda u, **kw: mp.hyena_conv_extended(u, k, D, **ext, **kw)),
        ("hyena_conv_extended fft_size", lambda u, **kw: mp.hyena_conv_extended(
            u, k[:, :8], fft_size=16, **ext, **kw)),
        ("depthwise_conv_extended", lambda u, **kw: mp.depthwise_conv_extended(
            u, w, D, **ext, **kw)),
        ("depthwise3_extended", lambda u, **kw: mp.depthwise3_extended(u, w, **ext, **kw)),
    ]


def _plain_ops():
    _, k, D, w = _data()
    return [
        ("fftconv", lambda u, **kw: mp.fftconv(u, k, D, **kw)),
        ("depthwise_conv", lambda u, **kw: mp.depthwise_conv(u, w, D, **kw)),
        ("depthwise3", lambda u, **kw: mp.depthwise3(u, w, **kw)),
    ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_nlc_is_ncl_transposed_bit_for_bit(backend):
    u = _data()[0]
    for name, f in _ops(backend):
        want = f(u)
        assert _equal(f(u, layout="NCL"), want), name  # the default is NCL
        got = f(_nlc(u), layout="NLC")
        assert got.shape == _nlc(u).shape, name
        assert _equal(_nlc(got), want), name
        d_ncl, d_nlc = f(u, round_output=False), f(_nlc(u), layout="NLC", round_output=False)
        assert isinstance(d_nlc, DoubleWord) and _equal(
            DoubleWord(_nlc(d_nlc.hi), _nlc(d_nlc.lo)), d_ncl), name
    for name, f in _plain_ops():  # outside the block: plain MLX; inside: the extended twin
        assert _equal(_nlc(f(_nlc(u), layout="NLC")), f(u)), name
        with mp.use_backend(backend), mp.extended_precision():
            assert _equal(_nlc(f(_nlc(u), layout="NLC")), f(u)), name


@pytest.mark.parametrize("backend", BACKENDS)
def test_nlc_gradients_are_the_ncl_gradients(backend):
    u, k, D, w = _data()
    g = mx.array(np.random.default_rng(8).standard_normal(u.shape).astype(np.float32))

    def loss(layout):
        def f(u, k, D):
            x = u if layout == "NCL" else _nlc(u)
            y = mp.hyena_conv_extended(x, k, D, layout=layout, backend=backend)
            return ((y if layout == "NCL" else _nlc(y)) * g).sum()
        return mx.grad(f, argnums=(0, 1, 2))(u, k, D)

    for a, b in zip(loss("NCL"), loss("NLC")):
        assert _equal(a, b)


def test_unknown_layout_raises():
    u, k, D, w = _data()
    for f in (lambda: mp.hyena_conv_extended(u, k, layout="NHC", backend="cpu"),
              lambda: mp.fftconv(u, k, layout="nlc"),
              lambda: mp.depthwise_conv_extended(u, w, layout=None, backend="cpu"),
              lambda: mp.depthwise3(u, w, layout="BLC"),
              lambda: FFTConv(3, 16, layout="LNC")):
        with pytest.raises(ValueError, match=r"layout must be 'NCL' \(batch, channels, L\) or "
                                             r"'NLC' \(batch, L, channels\)"):
            f()
    with pytest.raises(ValueError, match=r"u must be \(batch, L, channels\) with layout='NLC'"):
        mp.hyena_conv_extended(u[0], k, layout="NLC", backend="cpu")
    with pytest.raises(ValueError, match="w has 3 channels but x has 16"):
        mp.depthwise3_extended(u, w, layout="NLC", backend="cpu")  # (B, L=3, C=16)


def test_fftconv_layer_channels_last():
    u = _data()[0]
    mx.random.seed(5)
    ncl = FFTConv(3, 16)
    nlc = FFTConv(3, 16, layout="NLC")
    nlc.update(ncl.parameters())
    assert _equal(_nlc(nlc(_nlc(u))), ncl(u))
    assert _equal(_nlc(nlc(_nlc(u[:, :, :8]))), ncl(u[:, :, :8]))  # L < max_len
    with pytest.raises(ValueError, match=r"must be 3-D \(batch, L, channels\)"):
        nlc(u[0])
    with pytest.raises(ValueError, match="must have 3 on axis 2"):
        nlc(u)
