"""``mx.fast.gated_delta_update`` by its recurrence in double-word, against the
recurrence written out in numpy float64 (and MLX's own kernel to float32 level)."""

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp

from flow_helpers import rng_f32, share, value64

B, T, HK, HV, DK, DV = 2, 6, 2, 4, 8, 5


def _recurrence(q, k, v, gamma, beta, state, mask):
    """float64: S = gamma S; S += k (beta (v - S k))^T; y = S q (0 and S kept where
    the mask is False); key heads repeated to the value heads."""
    q, k = (np.repeat(a, HV // HK, axis=-2) for a in (q, k))
    ys = []
    for t in range(T):
        s = state * gamma[:, t, :, None, None]
        kt = k[:, t][:, :, None, :]
        delta = (v[:, t] - (s * kt).sum(-1)) * beta[:, t][..., None]
        s = s + kt * delta[..., None]
        y = (s * q[:, t][:, :, None, :]).sum(-1)
        if mask is not None:
            s = np.where(mask[:, t][:, None, None, None], s, state)
            y = np.where(mask[:, t][:, None, None], y, 0.0)
        state = s
        ys.append(y)
    return np.stack(ys, 1), state


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_gated_delta_update(backend, with_state, with_mask):
    rng = np.random.default_rng(3)
    q, k, v = rng_f32((B, T, HK, DK), 1), rng_f32((B, T, HK, DK), 2) * 0.3, rng_f32(
        (B, T, HV, DV), 3)
    gamma = (0.5 + 0.5 * rng.random((B, T, HV))).astype(np.float32)
    beta = rng.random((B, T, HV)).astype(np.float32)
    s0 = rng_f32((B, HV, DV, DK), 4)
    mask = rng.random((B, T)) > 0.3
    args = [mx.array(a) for a in (q, k, v, gamma, beta)]
    extra = [mx.array(s0) if with_state else None, mx.array(mask) if with_mask else None]
    with mp.extended_precision(strict=True) as rep:
        y, state = mx.fast.gated_delta_update(args[0] / 3, *args[1:], *extra)
    assert rep.extended["fast.gated_delta_update"] == 1 and not rep.float32, rep
    wide = [a.astype(np.float64) for a in (q, k, v, gamma, beta)]
    wide[0] = wide[0] / 3
    want_y, want_s = _recurrence(*wide, s0.astype(np.float64) if with_state
                                 else np.zeros((B, HV, DV, DK)), mask if with_mask else None)
    for got, want in ((y, want_y), (state, want_s)):
        np.testing.assert_allclose(value64(got), want, rtol=2**-40, atol=2**-40)
        assert share(got, want) >= 0.999
    plain_y, _ = mx.fast.gated_delta_update(mx.array(q) / 3, *args[1:], *extra)
    np.testing.assert_allclose(np.array(y), np.array(plain_y), rtol=1e-4, atol=1e-5)
    assert share(plain_y, want_y) < 0.9
