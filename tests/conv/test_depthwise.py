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


# ---- MLX's channels-last depthwise conv1d read in place (conv1d_words) --------------

def _spread_path(x, w, stride, padding, dilation):
    """The same convolution composed around DEPTHWISE as the flow did it before
    conv1d_words: x (N, L, C) transposed, channels repeated (multiplier), padded;
    the taps spread by dilation (zeros between them); every stride-th output from
    K' - 1, transposed back."""
    C, (Cout, K, _) = x.shape[2], w.shape
    xe = mx.repeat(x.transpose(0, 2, 1), Cout // C, axis=1)
    xe = mx.pad(xe, [(0, 0), (0, 0), (padding, padding)])
    we = w[:, :, 0]
    if dilation > 1:
        gaps = mx.zeros((Cout, K, dilation - 1), mx.float32)
        we = mx.concatenate([we[:, :, None], gaps], axis=2).reshape(Cout, -1)
        we = we[:, : dilation * (K - 1) + 1]
    y = depthwise_conv_extended(xe, we, round_output=False, backend="emulate")
    return [v[:, :, we.shape[1] - 1::stride].transpose(0, 2, 1) for v in (y.hi, y.lo)]


@pytest.mark.parametrize("C, m, K, stride, padding, dilation", [
    (8, 1, 3, 1, 2, 1), (4, 2, 5, 2, 1, 1), (6, 1, 4, 1, 3, 2), (1, 1, 7, 3, 0, 1),
    (3, 3, 3, 2, 4, 3), (2, 1, 1, 1, 0, 1)])
def test_conv1d_words_in_place(C, m, K, stride, padding, dilation):
    """One launch on the channels-last signal gives the bits of the transposed,
    padded, spread and cut composition, special values included (Inf and NaN
    inputs meet the spread zeros and the padding as they did there), and the
    float64 sum of the exact products within 2u^2 on finite data."""
    from mlx_precise.conv.depthwise import conv1d_words
    from mlx_precise.core import backends

    rng = np.random.default_rng(C * 100 + K)
    x = rng.standard_normal((2, 40, C)).astype(np.float32)
    w = rng.standard_normal((C * m, K, 1)).astype(np.float32)
    xs, ws = x.copy(), w.copy()
    xs[0, 5, 0], xs[1, 11, -1], ws[-1, 0, 0] = np.inf, np.nan, -np.inf
    for xa, wa in ((x, w), (xs, ws)):
        X, W = mx.array(xa), mx.array(wa)
        y = conv1d_words(X, W, stride, padding, dilation, backends.get("emulate"))
        want = _spread_path(X, W, stride, padding, dilation)
        for got, ref in zip((y.hi, y.lo), want):
            assert got.shape == ref.shape
            assert np.array_equal(np.array(got).view(np.uint32), np.array(ref).view(np.uint32))
    Lout = (40 + 2 * padding - dilation * (K - 1) - 1) // stride + 1
    xp = np.repeat(np.pad(x.astype(np.float64), [(0, 0), (padding, padding), (0, 0)]), m, axis=2)
    ref = sum(w[None, None, :, j, 0].astype(np.float64) * xp[:, j * dilation::stride][:, :Lout]
              for j in range(K))
    y = conv1d_words(mx.array(x), mx.array(w), stride, padding, dilation,
                     backends.get("emulate"))
    got = np.array(y.hi).astype(np.float64) + np.array(y.lo).astype(np.float64)
    mag = sum(np.abs(w[None, None, :, j, 0].astype(np.float64) * xp[:, j * dilation::stride][:, :Lout])
              for j in range(K))
    assert np.all(np.abs(got - ref) <= 2.0**-46 * mag)


def test_conv1d_words_kernel_longer_than_the_signal():
    """A filter longer than the padded signal raises MLX's own ValueError (the
    composition it replaced returned an empty result)."""
    from mlx_precise.conv.depthwise import conv1d_words
    from mlx_precise.core import backends

    with pytest.raises(ValueError, match=r"\[conv\] Spatial dimensions"):
        conv1d_words(mx.ones((1, 2, 4)), mx.ones((4, 5, 1)), 1, 0, 1, backends.get("emulate"))
