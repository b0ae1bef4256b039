"""Whole layers inside extended_precision(): elementary functions, matrix products,
normalisation and mlx.nn layers carry double-word values (mlx_precise.extended).

Oracles: the same math in float64 (numpy / scipy) from the same float32 inputs and
parameters, rounded once to float32; float64 carries ~2^5 more bits than the
double-word results, so an exactly rounded share below 100% by a few outputs in
10^4 is the double rounding of near-midpoint cases, not an error of the code.
"""

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from scipy.special import erf

import mlx_precise as mp
from flow_helpers import f64, rng_f32, share
from mlx_precise.extended import low_word


# (MLX's functions are looked up when called, as model code does: a name bound
# before the block opens, such as ``f = mx.exp``, keeps MLX's own function.)
FUNCTIONS = {
    "exp": (lambda v: mx.exp(v), np.exp), "log": (lambda v: mx.log(mx.abs(v)), lambda v: np.log(np.abs(v))),
    "sin": (lambda v: mx.sin(v), np.sin), "cos": (lambda v: mx.cos(v), np.cos), "tanh": (lambda v: mx.tanh(v), np.tanh),
    "sigmoid": (lambda v: mx.sigmoid(v), lambda v: 1 / (1 + np.exp(-v))), "erf": (lambda v: mx.erf(v), erf),
    "sqrt": (lambda v: mx.sqrt(mx.abs(v)), lambda v: np.sqrt(np.abs(v))),
    "rsqrt": (lambda v: mx.rsqrt(mx.abs(v)), lambda v: 1 / np.sqrt(np.abs(v))),
    "power": (lambda v: mx.abs(v) ** 1.7, lambda v: np.abs(v) ** 1.7),
    "arctan2": (lambda v: mx.arctan2(v, v * v + 0.5), lambda v: np.arctan2(v, v * v + 0.5)),
}


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_functions_of_carried_values(backend, name):
    """f(x / 3): the argument carries a low word, the function reads it."""
    fn, ref = FUNCTIONS[name]
    x = mx.array(rng_f32(2000, 1))
    with mp.extended_precision() as rep:
        y = fn(x / 3)
    assert share(y, ref(f64(x) / 3)) >= 0.998
    assert low_word(y) is not None and not rep.float32


def test_complex_exp(backend):
    z = rng_f32(500, 2) * 3 + 1j * rng_f32(500, 3) * 100
    Z = mx.array(z.astype(np.complex64))
    with mp.extended_precision():
        y = mx.exp(Z * 0.5)
    assert share(y, np.exp(z.astype(np.complex128) * 0.5)) >= 0.99


def test_matrix_products(backend):
    a, b = rng_f32((3, 17, 24), 4), rng_f32((24, 9), 5)
    c = rng_f32((9,), 6)
    A, B, C = mx.array(a), mx.array(b), mx.array(c)
    with mp.extended_precision() as rep:
        outs = {"matmul": A @ B, "addmm": mx.addmm(C, A[0], B),
                "einsum": mx.einsum("bij,jk->bik", A, B),
                "tensordot": mx.tensordot(A, B, axes=1), "inner": mx.inner(A[0], B.T),
                "outer": mx.outer(C, C), "scaled": (A / 3) @ B}
    a64, b64, c64 = f64(a), f64(b), f64(c)
    refs = {"matmul": a64 @ b64, "addmm": a64[0] @ b64 + c64,
            "einsum": np.einsum("bij,jk->bik", a64, b64), "tensordot": a64 @ b64,
            "inner": a64[0] @ b64, "outer": np.outer(c64, c64), "scaled": (a64 / 3) @ b64}
    for k, v in outs.items():
        assert share(v, refs[k]) >= 0.995, k
    assert share(mx.matmul(A, B), refs["matmul"]) < 0.9  # float32, for contrast
    assert not rep.float32


def test_normalisation_and_softmax(backend):
    x = rng_f32((6, 32), 7) * 3 + 10
    X = mx.array(x)
    w, b = mx.array(rng_f32(32, 8)), mx.array(rng_f32(32, 9))
    with mp.extended_precision() as rep:
        ln = mx.fast.layer_norm(X, w, b, 1e-5)
        rms = mx.fast.rms_norm(X, w, 1e-5)
        sm = mx.softmax(X / 7, axis=-1)
        lse = mx.logsumexp(X / 7, axis=-1)
        sd = mx.std(X, axis=0)
    x64, w64, b64 = f64(x), f64(w), f64(b)
    mu = x64.mean(-1, keepdims=True)
    var = ((x64 - mu) ** 2).mean(-1, keepdims=True)
    e = np.exp(x64 / 7 - (x64 / 7).max(-1, keepdims=True))
    refs = {"ln": (x64 - mu) / np.sqrt(var + 1e-5) * w64 + b64,
            "rms": x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-5) * w64,
            "sm": e / e.sum(-1, keepdims=True),
            "lse": np.log(np.exp(x64 / 7).sum(-1)), "sd": x64.std(axis=0)}
    for k, v in {"ln": ln, "rms": rms, "sm": sm, "lse": lse, "sd": sd}.items():
        assert share(v, refs[k]) >= 0.99, k
    assert not rep.float32


def test_cpu_normalisations_equal_their_decompositions():
    """On cpu, softmax, logsumexp, layer_norm and rms_norm run as fused float64
    formulas; they give the bits of the same decompositions written as separate
    ops of the flow (and keep the float64 value the flow carries)."""
    from mlx_precise.extended.carry import wide_value

    x = mx.array(rng_f32((3, 5, 40), 21) * 4)
    w, b = mx.array(rng_f32(40, 22)), mx.array(rng_f32(40, 23))

    def shift(v, axis):
        with mp.extended_precision(False):
            m = mx.stop_gradient(mx.max(v, axis=axis, keepdims=True))
            return mx.where(mx.isfinite(m), m, 0.0)

    with mp.use_backend("cpu"), mp.extended_precision() as rep:
        v = x * 1.1 + 0.3  # a carried value
        e = mx.exp(v - shift(v, -1))
        layer = v - mx.mean(v, axis=-1, keepdims=True)
        layer = layer * mx.rsqrt(mx.mean(layer * layer, axis=-1, keepdims=True) + 1e-5)
        pairs = [(mx.softmax(v, axis=-1), e / mx.sum(e, axis=-1, keepdims=True)),
                 (mx.logsumexp(v, axis=1), mx.log(mx.sum(mx.exp(v - shift(v, 1)), axis=1,
                                                           keepdims=True))[:, 0]
                  + shift(v, 1)[:, 0]),
                 (mx.fast.layer_norm(v, w, b, 1e-5), layer * w + b),
                 (mx.fast.rms_norm(v, w, eps=1e-6),
                  v * mx.rsqrt(mx.mean(v * v, axis=-1, keepdims=True) + 1e-6) * w)]
    assert not rep.float32 and rep.extended["softmax"] == 1
    for fused, ops in pairs:
        assert np.array_equal(np.array(wide_value(fused)[0]), np.array(wide_value(ops)[0]))


class MLP(nn.Module):
    """A transformer-style feed-forward block in plain mlx.nn."""

    def __init__(self, d, h):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 2 * h)
        self.down = nn.Linear(h, d)
        self.rms = nn.RMSNorm(d)

    def __call__(self, x):
        a, g = mx.split(self.up(self.norm(x)), 2, axis=-1)
        h = nn.gelu(a) * nn.sigmoid(g) + nn.silu(a) * 0.1 + nn.softplus(g) * 0.01
        return self.rms(x + self.down(nn.relu(h) + mx.tanh(h)))


def mlp_reference(p: dict, x):
    """The block's math in float64: p (parameter name -> float64 array)."""
    x = f64(x)
    mu = x.mean(-1, keepdims=True)
    z = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    z = z * p["norm.weight"] + p["norm.bias"]
    u = z @ p["up.weight"].T + p["up.bias"]
    a, g = np.split(u, 2, axis=-1)
    sig = (lambda v: 1 / (1 + np.exp(-v)))
    h = (a * (1 + erf(a / math.sqrt(2))) / 2 * sig(g) + a * sig(a) * 0.1
         + np.logaddexp(g, 0) * 0.01)
    y = x + (np.maximum(h, 0) + np.tanh(h)) @ p["down.weight"].T + p["down.bias"]
    return y / np.sqrt((y ** 2).mean(-1, keepdims=True) + 1e-5) * p["rms.weight"]


def test_feed_forward_block_and_gradients(backend):
    mx.random.seed(3)
    m = MLP(16, 32)
    x = mx.array(rng_f32((8, 16), 10))
    params = {k: f64(v) for k, v in nn.utils.tree_flatten(m.parameters())}
    ref = mlp_reference(params, x)
    plain = m(x)
    with mp.extended_precision() as rep:
        y = m(x)
    err = (lambda v: np.linalg.norm(np.array(v) - ref) / np.linalg.norm(ref))
    # exactly rounded: the normwise error is the final rounding's alone (~2.7e-8);
    # this small block's float32 error is only ~3x that
    assert share(y, ref) >= 0.99 and err(y) < 3e-8 and err(y) * 2 < err(plain)
    assert not rep.float32, rep
    # gradients against float64 directional derivatives of the reference (central
    # differences, h = 1e-6: ~1e-11 relative), along random directions
    with mp.extended_precision():
        grads = nn.value_and_grad(m, lambda model, v: (model(v) ** 2).sum())(m, x)[1]
    g = {k: f64(v) for k, v in nn.utils.tree_flatten(grads)}
    rng = np.random.default_rng(11)
    for _ in range(3):
        d = {k: rng.standard_normal(v.shape) for k, v in params.items()}
        loss = (lambda t: (mlp_reference({k: params[k] + t * d[k] for k in params}, x) ** 2).sum())
        h = 1e-6
        want = (loss(h) - loss(-h)) / (2 * h)
        got = sum(float(np.sum(g[k] * d[k])) for k in params)
        scale = math.sqrt(sum(float(np.sum(g[k] ** 2)) for k in params)) * math.sqrt(
            sum(float(np.sum(v ** 2)) for v in d.values()))
        assert abs(got - want) <= 1e-5 * scale, (got, want, scale)


def test_cumsum_and_complex_abs(backend):
    x = rng_f32((4, 300), 12)
    big = (rng_f32(400, 13) * 1e20 + 1j * rng_f32(400, 14) * 3e19).astype(np.complex64)
    small = (rng_f32(400, 15) * 1e-20 + 1j * rng_f32(400, 16) * 1e-21).astype(np.complex64)
    X = mx.array(x)
    with mp.extended_precision() as rep:
        c = mx.cumsum(X / 3, axis=1)
        cr = X.cumsum(axis=0, reverse=True)
        ce = mx.cumsum(X, axis=1, inclusive=False)
        a_big, a_small = mx.abs(mx.array(big) * 1.0), mx.abs(mx.array(small) / 3)
    x64 = f64(x)
    # (sum x)/3 is a float32 midpoint exactly for ~1% of the prefixes here (when
    # 3 divides the sum's numerator and the quotient ends at bit 25): an exact tie
    # that no finite precision decides; away from ties, all are exactly rounded
    want = np.cumsum(x64 / 3, axis=1)
    off_tie = np.abs(want - want.astype(np.float32)) < 0.49 * np.spacing(
        np.abs(want).astype(np.float32))
    assert np.all(np.array(c)[off_tie] == want[off_tie].astype(np.float32))
    assert off_tie.mean() > 0.95
    assert share(cr, np.flip(np.cumsum(np.flip(x64, 0), 0), 0)) == 1.0
    assert share(ce, np.concatenate([np.zeros((4, 1)), np.cumsum(x64, 1)[:, :-1]], 1)) == 1.0
    # no overflow / underflow of the squares (as MLX's float32 abs avoids them)
    assert share(a_big, np.abs(big.astype(np.complex128))) == 1.0
    assert share(a_small, np.abs(small.astype(np.complex128) / 3)) == 1.0
    assert not rep.float32


def test_attention_extremes_integers_and_group_norm(backend):
    """mx.fast.scaled_dot_product_attention (grouped-query heads, causal), max / min
    reductions of carried values, integer arrays with float scalars (exact
    operands), nn.GroupNorm (through mx.fast.layer_norm)."""
    q, k, v = rng_f32((2, 4, 8, 16), 20), rng_f32((2, 2, 8, 16), 21), rng_f32((2, 2, 8, 16), 22)
    x = rng_f32((4, 50), 23)
    with mp.extended_precision() as rep:
        o = mx.fast.scaled_dot_product_attention(mx.array(q), mx.array(k), mx.array(v),
                                                 scale=0.25, mask="causal")
        m, mn = mx.max(mx.array(x) / 3, axis=1), (mx.array(x) / 3).min()
        grid = mx.arange(10) * 0.1 + mx.array(np.array([2**30 + 1], np.int32)) * 0.5
        gn = nn.GroupNorm(2, 50)(mx.array(x).reshape(4, 1, 50) * 1.5)
        gp = nn.GroupNorm(2, 50, pytorch_compatible=True)(mx.array(x).reshape(4, 1, 50) * 1.5)
    Q, K, V = f64(q), np.repeat(f64(k), 2, axis=1), np.repeat(f64(v), 2, axis=1)
    s = np.where(np.tril(np.ones((8, 8))) > 0, Q @ K.swapaxes(-1, -2) * 0.25, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    assert share(o, (p / p.sum(-1, keepdims=True)) @ V) >= 0.99
    X = f64(x)
    assert share(m, (X / 3).max(1)) == 1.0 and share(mn, (X / 3).min()) == 1.0
    assert share(grid, np.arange(10) * 0.1 + (2**30 + 1) * 0.5) == 1.0
    norm = (lambda g, ax: (g - g.mean(ax, keepdims=True)) / np.sqrt(g.var(ax, keepdims=True)
                                                                       + 1e-5))
    # MLX's default groups interleave the channels (c belongs to group c % 2)
    assert share(gn, norm((X * 1.5).reshape(4, 25, 2), 1).reshape(4, 1, 50)) >= 0.99
    assert share(gp, norm((X * 1.5).reshape(4, 2, 25), 2).reshape(4, 1, 50)) >= 0.99
    assert not rep.float32
