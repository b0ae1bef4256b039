"""The package's own double-word functions inside a block: their operands' low
words go in and their results keep theirs.

A precision-aware function (``fftconv``, ``depthwise3``, ``mlx_precise.fft.*``, ...)
or its ``*_extended`` twin called inside ``extended_precision()`` on values the
block carries reads their low words (before: their float32 values, reported as a
custom function under ``float32``, and ``strict=True`` raised in the package's own
``nn.HyenaOperator``), and its result carries its low word on into the block
(before: rounded at the function's exit, unreported). Oracles: numpy float64 on the
operands' exact values (the double-word chain is within 1e-13 of them; the float32
rounding is 6e-8 away)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise import nn as pnn
from mlx_precise.extended import PrecisionDropError
from flow_helpers import rng_f32

X = rng_f32((2, 4, 24), 0)
K = (rng_f32((4, 24), 1) / 8).astype(np.float32)
W3, W5 = rng_f32((4, 3), 2), rng_f32((4, 5), 3)
C = (rng_f32((24,), 4) + 1j * rng_f32((24,), 5)).astype(np.complex64)


def _causal(x, w):
    """sum_s w[c, s] x[b, c, t - s] in float64 (x: (B, C, L), w: (C, K); the depthwise
    convolutions are MLX's cross-correlations: their taps reversed)."""
    L = x.shape[2]
    out = np.zeros(x.shape)
    for s in range(w.shape[1]):
        out[:, :, s:] += w[None, :, s, None] * x[:, :, :L - s]
    return out


_K, _W3, _W5, _C = (mx.array(v) for v in (K, W3, W5, C))
# name -> (the call on an array, the extended twin's call (its engine), the oracle on
# the array's float64 value)
CASES = {
    "fftconv": (lambda a: mp.fftconv(a, _K), lambda a: mp.hyena_conv_extended(a, _K),
                lambda v: _causal(v, K.astype(float))),
    "hyena_conv_extended": (lambda a: mp.hyena_conv_extended(a, _K, layout="NCL"),
                            lambda a: mp.hyena_conv_extended(a, _K),
                            lambda v: _causal(v, K.astype(float))),
    "depthwise3": (lambda a: mp.depthwise3(a, _W3), lambda a: mp.depthwise3_extended(a, _W3),
                   lambda v: _causal(v, W3[:, ::-1].astype(float))),
    "depthwise_conv_extended": (lambda a: mp.depthwise_conv_extended(a, _W5),
                                lambda a: mp.depthwise_conv_extended(a, _W5),
                                lambda v: _causal(v, W5[:, ::-1].astype(float))),
    "rfft": (lambda a: mp.fft.rfft(a), lambda a: mp.rfft_extended(a), np.fft.rfft),
    "fft2_extended": (lambda a: mp.fft.fft2_extended(a), lambda a: mp.fft.fft2_extended(a),
                      np.fft.fft2),
    "irfft": (lambda a: mp.fft.irfft(a.astype(mx.complex64)),
              lambda a: mp.irfft_extended(a.astype(mx.complex64)), np.fft.irfft),
    "fft_scale": (lambda a: mp.fft_scale(a, 7), lambda a: mp.fft_scale_extended(a, 7),
                  lambda v: v / 7),
    "complex_multiply": (lambda a: mp.complex_multiply(a.astype(mx.complex64), _C),
                         lambda a: mp.complex_multiply_extended(a.astype(mx.complex64), _C),
                         lambda v: v * C.astype(np.complex128)),
}


def _value(y) -> np.ndarray:
    """The value ``y`` carries (float64 / complex128: its words joined)."""
    words = mp.extended.carry.words_of(y)
    if words is not None:
        return words.to_float64()
    return np.array(y).astype(np.complex128 if y.dtype == mx.complex64 else np.float64)


def _err(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("name", list(CASES))
def test_carried_operands_go_in_and_results_keep_their_words(backend, name):
    call, engine, oracle = CASES[name]
    x = mx.array(X)
    with mp.use_backend(backend), mp.extended_precision(strict=True) as report:
        a = x / 3  # carries a low word
        got = _value(call(a))
        z = call(x)  # float32 operands: the engine, its result's words kept
        got_z = _value(z)
    assert not report.float32
    assert _err(got, oracle(X.astype(np.float64) / 3)) < 1e-13
    assert _err(got_z, oracle(X.astype(np.float64))) < 1e-13
    with mp.use_backend(backend):  # the high word: the engine's rounded result, bit for bit
        assert (np.array(z) == np.array(engine(x))).all()


def test_round_output_false_returns_the_words(backend):
    x = mx.array(X)
    with mp.use_backend(backend), mp.extended_precision(strict=True):
        w = mp.hyena_conv_extended(x / 3, mx.array(K), round_output=False)
        v = mp.fft.rfft_extended(x, round_output=False)
    assert isinstance(w, mp.DoubleWord) and isinstance(v, mp.DoubleWord)
    assert _err(w.to_float64(), _causal(X.astype(float) / 3, K.astype(float))) < 1e-13
    assert _err(v.to_float64(), np.fft.rfft(X.astype(float))) < 1e-13
    # inside the block the DoubleWord's words add up to its value once (its high word
    # is not a carried array, whose value would already include the low word)
    with mp.use_backend(backend), mp.extended_precision(strict=True):
        w = mp.hyena_conv_extended(x / 3, mx.array(K), round_output=False)
        got = _value(w.round())
    assert _err(got, w.to_float64()) < 1e-13


def test_gradients_through_them_are_double_word(backend):
    """mx.grad inside the block through fftconv of a carried value: every entry
    exactly rounded against the float64 sums (the flow's VJP rules of the FFTs)."""
    rng = np.random.default_rng(6)
    u, k = mx.array(rng_f32((1, 4, 32), 7)), mx.array((rng_f32((4, 32), 8) / 8))
    G = rng_f32((1, 4, 32), 9)

    def f(u, k):
        return (mp.fftconv(u / 3, k) * mx.array(G)).sum()

    with mp.use_backend(backend), mp.extended_precision(strict=True):
        gu, gk = mx.grad(f, argnums=(0, 1))(u, k)
    u64, k64, G64 = (np.array(v).astype(np.float64) for v in (u, k, mx.array(G)))
    gu_ref, gk_ref = np.zeros(u64.shape), np.zeros(k64.shape)
    for t in range(32):
        for s in range(t + 1):
            gu_ref[0, :, t - s] += G64[0, :, t] * k64[:, s] / 3
            gk_ref[:, s] += G64[0, :, t] * u64[0, :, t - s] / 3
    assert (np.array(gu) == gu_ref.astype(np.float32)).all()
    assert (np.array(gk) == gk_ref.astype(np.float32)).all()


def test_the_packages_hyena_layer_trains_under_strict(backend):
    """nn.HyenaOperator (projections, the short depthwise filter, fftconv) forward
    and gradient under strict=True: before, its depthwise3 and fftconv read their
    carried inputs' float32 values and strict raised."""
    mx.random.seed(0)
    m = pnn.HyenaOperator(8, 32)
    x = mx.random.normal((2, 32, 8))

    def loss(m, x):
        return (m(x) ** 2).mean()

    with mp.use_backend(backend), mp.extended_precision(strict=True) as report:
        _, g = nn.value_and_grad(m, loss)(m, x)
        mx.eval(g)
    assert not report.float32
    assert report.extended["hyena_conv_extended"] >= 1
    assert report.extended["depthwise3_extended"] >= 1


def test_beside_doublewords_the_engine_reads_the_words(backend):
    """A twin given a DoubleWord beside a carried array runs its engine, which
    reads the carried array's words (the FFTs, complex_multiply, fft_scale); the
    convolutions' engines take float32 operands: there the carried array's float32
    value is read, reported under the function's name, and strict raises."""
    c = mx.array(C)
    with mp.use_backend(backend), mp.extended_precision(strict=True) as report:
        y = mp.complex_multiply_extended(c / 3, mp.DoubleWord.from_complex64(c))
        got = _value(y)
    assert not report.float32
    c128 = C.astype(np.complex128)
    assert _err(got, c128 / 3 * c128) < 1e-13
    with mp.use_backend(backend), mp.extended_precision() as report:
        mp.hyena_conv_extended(mx.array(X) / 3, K)  # k a numpy array
    assert report.float32["hyena_conv_extended"] == 1
    with pytest.raises(PrecisionDropError, match="hyena_conv_extended"):
        with mp.use_backend(backend), mp.extended_precision(strict=True):
            mp.hyena_conv_extended(mx.array(X) / 3, K)


def test_doublewords_made_of_carried_values_hold_their_words(backend):
    """DoubleWord.from_array / from_float32 of a value the block carries (inside the
    block and after it) are its words (before: its float32 value, lo = 0, with an
    empty report), and their high word is not the carried array itself, so the
    flow's ``d.hi + d.lo`` counts the low word once."""
    x = mx.array(X[0, 0])
    want = X[0, 0].astype(np.float64) / 3
    with mp.use_backend(backend), mp.extended_precision(strict=True) as report:
        a = x / 3
        d, d32 = mp.DoubleWord.from_array(a), mp.DoubleWord.from_float32(a)
        r = _value(d.round())
    after = mp.DoubleWord.from_array(a)
    assert not report.float32
    for w in (d, d32, after):
        assert _err(w.to_float64(), want) < 1e-13
    assert _err(r, want) < 1e-13


@pytest.mark.parametrize("name", ["norm", "simulate_q115", "scaled_mm"])
def test_ops_of_float32_values_report_carried_operands(backend, name):
    """The ops without a double-word form read a carried operand's float32 value:
    reported under their own name on every backend (before: norm as
    'mx.custom_function' on both, scaled_mm's scales on emulate only, the others
    not at all), strict raises; their results are their float32 results as
    outside a block, bit for bit."""
    x = mx.array(X[0] / 4)
    qa = mx.array(np.arange(-6, 6, dtype=np.int8).reshape(3, 4))
    calls = {"norm": lambda v: mp.norm(v),
             "simulate_q115": lambda v: mp.simulate_q115(v),
             "scaled_mm": lambda v: mp.scaled_mm(qa, qa.T, v[:3, :1], v[:1, :3])}
    call = calls[name]
    with mp.use_backend(backend):
        want = np.array(call(x))
        with mp.extended_precision() as report:
            y = (x * 3) / 3  # x's value, carrying a (zero) low word
            got = np.array(call(y))
    assert report.float32 == {name: 1}
    assert (got == want).all()
    with pytest.raises(PrecisionDropError, match=name):
        with mp.use_backend(backend), mp.extended_precision(strict=True):
            call(x / 3)


def test_shifts_of_carried_values_stay_arrays(backend):
    """mlx_precise.fft.fftshift of a carried value: an mx.array carrying its moved
    low word (mx.roll through the flow), not a DoubleWord."""
    x = mx.array(X[0])
    with mp.use_backend(backend), mp.extended_precision(strict=True):
        y = mp.fft.fftshift(x / 3, axes=-1)
        got = _value(y)
    assert type(y) is mx.array
    assert _err(got, np.fft.fftshift(X[0].astype(np.float64) / 3, axes=-1)) < 1e-13

