"""Double-word depthwise (Hyena short filter) convolution against an exact oracle."""

import mlx.core as mx
import numpy as np
import pytest
from oracle import Exact, rounding_check

from mlx_precise import DoubleWord
from mlx_precise.conv.depthwise import (
    depthwise3_extended,
    depthwise_conv,
    depthwise_conv_extended,
)

BACKENDS = ("emulate", "cpu")


def exact_depthwise(x, w, bias):
    """Exact y and sum |terms| (as Exact arrays, flattened like x) from the
    definition y[b,c,t] = bias[c] + sum_j w[c,j] x[b,c,t+j-(K-1)]."""
    B, C, L = x.shape
    K = w.shape[1]
    xp = np.concatenate([np.zeros((B, C, K - 1), np.float32), x], axis=2)
    y = Exact.f32(np.broadcast_to(bias[None, :, None], x.shape).ravel() if bias is not None
                  else np.zeros(x.size, np.float32))
    mag = Exact(abs(y.n), y.k)
    for j in range(K):
        term = (Exact.f32(np.broadcast_to(w[None, :, j, None], x.shape).ravel())
                * Exact.f32(np.ascontiguousarray(xp[:, :, j:j + L]).ravel()))
        y = y + term
        mag = mag + Exact(abs(term.n), term.k)
    return y, mag


def data(seed, B, C, L, K, cancel=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, C, L)).astype(np.float32)
    w = rng.standard_normal((C, K)).astype(np.float32)
    bias = rng.standard_normal(C).astype(np.float32)
    if cancel:
        # Filters summing to ~0 over smooth inputs: heavy cancellation, |y| down to
        # ~2^-24 of sum |terms| and below.
        x = np.cumsum(x * 3e-6, axis=2).astype(np.float32) + 1
        w[:, -1] = -(w[:, :-1].astype(np.float64).sum(axis=1)).astype(np.float32)
        bias = (bias * 1e-6).astype(np.float32)
    return x, w, bias


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("K,cancel", [(3, False), (4, False), (7, True), (3, True)])
def test_depthwise_accuracy(backend, K, cancel):
    x, w, bias = data(K + 10 * cancel, 2, 8, 2048, K, cancel)
    fn = depthwise3_extended if K == 3 and not cancel else depthwise_conv_extended
    y = np.array(fn(mx.array(x), mx.array(w), mx.array(bias), backend=backend)).ravel()
    ye, mag = exact_depthwise(x, w, bias)
    exact, faithful = rounding_check(y, ye)
    # Faithful wherever |y| >= 2^-20 sum |terms| (decided exactly in integers).
    a, m, _ = ye._align(mag)
    well_conditioned = np.array([abs(int(v)) * 2**20 >= int(s) for v, s in zip(a, m)])
    assert well_conditioned.mean() > (0.2 if cancel else 0.99)
    assert faithful[well_conditioned].all()
    print(f"{backend} K={K} cancel={cancel}: {100 * exact.mean():.4f}% exactly rounded, "
          f"{100 * well_conditioned.mean():.1f}% with |y| >= 2^-20 sum|terms|")
    if not cancel:
        assert exact.mean() >= 0.9999


@pytest.mark.parametrize("B,C,L,K", [(1, 1, 4, 3), (1, 2, 3, 3), (2, 1, 3, 2), (1, 3, 2, 2)])
def test_small_inputs(B, C, L, K):
    """Inputs of fewer than 8 elements (B*C*L, C*K and C here) reach Metal as
    `constant` pointers: a distinct instantiation of the kernel, run here through
    the emulator against the exact oracle, with and without bias, TAPS = 0 and 3."""
    x, w, bias = data(B + C + L + K, B, C, L, K)
    for b in (bias, None):
        fns = [depthwise_conv_extended] + ([depthwise3_extended] if K == 3 else [])
        for fn in fns:
            y = fn(mx.array(x), mx.array(w), None if b is None else mx.array(b), backend="emulate")
            ye, _ = exact_depthwise(x, w, b)
            exact, _ = rounding_check(np.array(y).ravel(), ye)
            assert exact.all(), (fn.__name__, b is None)
        d = depthwise_conv_extended(mx.array(x), mx.array(w), None if b is None else mx.array(b),
                                    round_output=False, backend="emulate")
        ye, mag = exact_depthwise(x, w, b)
        a, m, _ = (Exact.dw(np.array(d.hi).ravel(), np.array(d.lo).ravel()) - ye)._align(mag)
        assert all(abs(int(e)) * 2**48 <= 3 * int(s) for e, s in zip(a, m))  # as below


def test_depthwise_doubleword_output_and_no_bias():
    x, w, _ = data(3, 1, 4, 300, 5)
    d = depthwise_conv_extended(mx.array(x), mx.array(w), round_output=False, backend="emulate")
    assert isinstance(d, DoubleWord) and d.shape == x.shape
    ye, mag = exact_depthwise(x, w, None)
    err = Exact.dw(np.array(d.hi).ravel(), np.array(d.lo).ravel()) - ye
    a, m, _ = err._align(mag)
    # Compensated sum: |err| <= 2u^2 |y| + O(K u^3 sum|terms|) <= 3u^2 sum|terms|.
    assert all(abs(int(e)) * 2**48 <= 3 * int(s) for e, s in zip(a, m))


def test_depthwise_matches_plain_semantics():
    """The plain float32 twin (mx.conv1d) has the same semantics, to float32 accuracy."""
    x, w, bias = data(4, 2, 3, 50, 4)
    ye = np.array(depthwise_conv_extended(mx.array(x), mx.array(w), mx.array(bias), backend="emulate"))
    yp = np.array(depthwise_conv(mx.array(x), mx.array(w), mx.array(bias)))
    np.testing.assert_allclose(yp, ye, rtol=1e-5, atol=1e-5)
    # K = 1 and L < K: still causal, zero history.
    x1 = mx.array(np.arange(3, dtype=np.float32).reshape(1, 1, 3))
    w1 = mx.array(np.array([[2.0, 3.0, 5.0, 7.0]], np.float32))
    y1 = depthwise_conv_extended(x1, w1, backend="emulate")
    assert np.array(y1).ravel().tolist() == [0.0, 7.0, 19.0]  # 7*1 ; 5*1 + 7*2
    k1 = depthwise_conv_extended(x1, mx.array([[2.0]]), backend="emulate")
    assert np.array(k1).ravel().tolist() == [0.0, 2.0, 4.0]


def test_bad_input():
    x = mx.zeros((2, 3, 8))
    with pytest.raises(ValueError, match="w has 4 channels but x has 3"):
        depthwise_conv_extended(x, mx.zeros((4, 3)), backend="emulate")
    with pytest.raises(ValueError, match="K >= 1"):
        depthwise_conv_extended(x, mx.zeros((3, 0)), backend="emulate")
    with pytest.raises(ValueError, match=r"x must be \(batch, channels, L\)"):
        depthwise_conv_extended(mx.zeros((3, 8)), mx.zeros((3, 3)), backend="emulate")
    with pytest.raises(ValueError, match=r"bias must have shape \(3,\)"):
        depthwise_conv_extended(x, mx.zeros((3, 3)), mx.zeros((4,)), backend="emulate")
    with pytest.raises(TypeError, match="x has dtype mlx float64, which this op would have to round"):
        depthwise_conv_extended(x.astype(mx.float64), mx.zeros((3, 3)), backend="emulate")
    with pytest.raises(TypeError, match="w has dtype mlx.core.int32, expected float32"):
        depthwise_conv_extended(x, mx.zeros((3, 3), mx.int32), backend="emulate")
    with pytest.raises(ValueError, match=r"shape \(channels, 3\)"):
        depthwise3_extended(x, mx.zeros((3, 4)), backend="emulate")
