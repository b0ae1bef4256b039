"""Every mlx.nn layer of ``nn_layer_cases.py`` run unmodified inside
``extended_precision()`` (cpu and emulate): forward outputs and the gradients of
sum(output * fixed weights) with respect to parameters and inputs are within one
float32 ulp of a float64 oracle, with an empty report; outside the block the
results are MLX's own bits.

Oracle: the same layer in MLX float64 on the CPU, outside every block, with the
ops whose float64 versions MLX 0.32 computes only to ~float32 accuracy (exp,
sigmoid, logaddexp, erf, softmax, logsumexp, the fast norms and attention) replaced by
float64 formulas of accurate ops (expm1, log1p, division, sums, matmul); a float64
result is ~2^-53 relative, the double-word result ~2^-48, far below the float32
ulp (2^-24) the assertion allows. Sinusoidal positional encoding (sin / cos, also
float32-accurate in MLX float64) has a numpy oracle.
"""

import contextlib
import itertools
import math
import os
import subprocess
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlx_precise as mp
from nn_layer_cases import (ACT_INPUT, CASES, flat, loss_weights, make_case, outputs_of,
                            rng_f32, value_and_grads)

# ---- the float64 oracle -------------------------------------------------------------


def _exp(x):
    # exp(x) from expm1 (accurate in float64): 1 + expm1(x) above 0, 1 / (1 + expm1(-x))
    # below (no cancellation either side); clipped so that neither branch overflows
    xc = mx.clip(x, -700.0, 700.0)
    return mx.where(x >= 0, mx.expm1(xc) + 1.0, 1.0 / (mx.expm1(-xc) + 1.0))


def _softmax(x, axis=-1, precise=False, stream=None):
    e = _exp(x - mx.stop_gradient(mx.max(x, axis=axis, keepdims=True)))
    return e / e.sum(axis=axis, keepdims=True)


def _logsumexp(x, axis=None, keepdims=False, stream=None):
    m = mx.stop_gradient(mx.max(x, axis=axis, keepdims=True))
    y = mx.log(_exp(x - m).sum(axis=axis, keepdims=True)) + m
    return y if keepdims else mx.squeeze(y, axis=axis)


def _logaddexp(a, b, stream=None):
    a, b = mx.array(a, mx.float64), mx.array(b, mx.float64)
    return mx.maximum(a, b) + mx.log1p(_exp(-mx.abs(a - b)))


def _layer_norm(x, weight, bias, eps, stream=None):
    x = x - x.mean(-1, keepdims=True)
    y = x * mx.rsqrt((x * x).mean(-1, keepdims=True) + eps)
    y = y if weight is None else y * weight
    return y if bias is None else y + bias


def _rms_norm(x, weight, eps, stream=None):
    y = x * mx.rsqrt((x * x).mean(-1, keepdims=True) + eps)
    return y if weight is None else y * weight


def _attention(q, k, v, *, scale, mask=None, sinks=None, stream=None):
    assert sinks is None
    rep = q.shape[1] // k.shape[1]
    k, v = mx.repeat(k, rep, axis=1), mx.repeat(v, rep, axis=1)
    s = (q * scale) @ k.swapaxes(-1, -2)
    if isinstance(mask, str):
        L, S = s.shape[-2:]
        mask = mx.arange(L)[:, None] + (S - L) >= mx.arange(S)[None]
    if mask is not None:
        s = mx.where(mask, s, -np.inf) if mask.dtype == mx.bool_ else s + mask
    return _softmax(s, axis=-1) @ v


def _erf(x, stream=None):
    # erf x = 2/sqrt(pi) e^(-x^2) sum_n 2^n x^(2n+1) / (1 3 5 ... (2n+1)) (Abramowitz
    # and Stegun 7.1.6): positive terms, no cancellation; |x| <= 6 needs ~150 of them
    # (erf(6) is 1 in float64)
    xc = mx.clip(x, -6.0, 6.0)
    x2, t = xc * xc, xc
    s = t
    for n in range(1, 160):
        t = t * (2.0 * x2) / (2 * n + 1)
        s = s + t
    return _exp(-x2) * s * (2.0 / math.sqrt(math.pi))


def _arange(*args, dtype=None, **kw):
    # Upsample's sampling positions: in float64 (the block computes them in
    # double-word; MLX in float32)
    return _ARANGE(*args, dtype=mx.float64 if dtype is not None and dtype == mx.float32 else dtype, **kw)


_ARANGE = mx.arange
STANDINS = [(mx, "exp", _exp), (mx, "sigmoid", lambda x, stream=None: 1.0 / (1.0 + _exp(-x))),
            (mx, "softmax", _softmax), (mx, "logsumexp", _logsumexp),
            (mx, "logaddexp", _logaddexp), (mx, "erf", _erf), (mx, "arange", _arange),
            (mx.fast, "layer_norm", _layer_norm), (mx.fast, "rms_norm", _rms_norm),
            (mx.fast, "scaled_dot_product_attention", _attention)]


@contextlib.contextmanager
def float64_oracle():
    """MLX in float64 with the stand-ins above (compilation off: nn's compiled
    activations trace the stand-ins)."""
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in STANDINS]
    for mod, name, f in STANDINS:
        setattr(mod, name, f)
    mx.disable_compile()
    try:
        yield
    finally:
        mx.enable_compile()
        for mod, name, f in saved:
            setattr(mod, name, f)


def conv_oracle(m, x, weights):
    """nn.Conv*d / nn.ConvTranspose*d (stride, padding; no dilation or groups) in
    numpy float64 (MLX's float64 convolutions are float32-accurate or unsupported):
    outputs and the gradients of sum(y * weights). Each kernel tap maps an x
    position to a y position: y[o] += x[i] w[k]^T for conv, i = o s + k - p; the
    transposed convolution scatters, y[i s + k - p] += x[i] w[k]^T."""
    transposed = type(m).__name__.startswith("ConvTranspose")
    x, w = np.asarray(x, np.float64), np.array(m.weight).astype(np.float64)
    s, p = (np.broadcast_to(v, x.ndim - 2) for v in (m.stride, m.padding))
    S, K = x.shape[1:-1], w.shape[1:-1]
    O = (tuple((n - 1) * a - 2 * b + k for n, k, a, b in zip(S, K, s, p)) if transposed
         else tuple((n + 2 * b - k) // a + 1 for n, k, a, b in zip(S, K, s, p)))
    y = np.zeros((x.shape[0], *O, w.shape[0]))
    G = np.asarray(weights, np.float64)
    gx, gw = np.zeros_like(x), np.zeros_like(w)
    for pos in itertools.product(*map(range, S if transposed else O)):
        for k in itertools.product(*map(range, K)):
            q = tuple(a * c + kk - b for a, c, kk, b in zip(pos, s, k, p))
            if all(0 <= v < n for v, n in zip(q, O if transposed else S)):
                xi, yi = (pos, q) if transposed else (q, pos)
                xs, ys, wk = (slice(None), *xi), (slice(None), *yi), (slice(None), *k)
                y[ys] += x[xs] @ w[wk].T
                gx[xs] += G[ys] @ w[wk]
                gw[wk] += G[ys].T @ x[xs]
    y += np.array(m.bias)
    return y, {"p.weight": gw, "p.bias": G.reshape(-1, G.shape[-1]).sum(0), "x.0": gx}


def to64(tree):
    return nn.utils.tree_map(
        lambda a: a.astype(mx.float64) if isinstance(a, mx.array) and a.dtype == mx.float32 else a,
        tree)


def oracle(name):
    """(outputs, gradients, running statistics) of case ``name`` in float64, as
    numpy float64."""
    m, xs, call = make_case(name)
    if name.startswith("Conv"):
        y = outputs_of(m, xs, call)
        y, g = conv_oracle(m, xs[0], loss_weights(y)[0])
        return [y], g, {}
    with float64_oracle():
        m, xs, call = make_case(name)
        m.update(to64(m.parameters()))
        for k in ("running_mean", "running_var"):
            if k in m:
                setattr(m, k, m[k].astype(mx.float64))
        ys = outputs_of(m, to64(xs), call)
        state = {k: np.array(m[k]) for k in ("running_mean", "running_var") if k in m}
        m, xs, call = make_case(name)
        m.update(to64(m.parameters()))
        w = to64(loss_weights(ys))
        _, g = value_and_grads(m, to64(xs), call, w)
        return [np.array(y) for y in ys], flat({"p": g[0], "x": g[1]}), state


# ---- the measure ---------------------------------------------------------------------


def ulps(got, ref) -> float:
    """max |got - ref| in float32 ulps of ref (the spacing of float32 at |ref|
    rounded to float32); 0 for empty arrays."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    if got.size == 0:
        return 0.0
    ulp = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
    return float(np.max(np.abs(got - ref) / ulp))


def extended(name):
    """(outputs, gradients, running stats, report) of case ``name`` inside a block."""
    # (both modules built outside the block, as the oracle's)
    m, xs, call = make_case(name)
    m2, xs2, call2 = make_case(name)
    with mp.extended_precision() as rep:
        ys = outputs_of(m, xs, call)
        mx.eval(ys)
        state = {k: np.array(m[k]) for k in ("running_mean", "running_var") if k in m}
        _, g = value_and_grads(m2, xs2, call2, loss_weights(ys))
        g = flat({"p": g[0], "x": g[1]})
    return [np.array(y) for y in ys], g, state, rep


# Gradients that are 0 in exact arithmetic, where any rounding is all the relative
# error: the key projection's bias adds q.b to every score of a query, which the
# softmax cancels. Checked against the size of the terms that cancel instead.
EXACT_ZERO = {"MultiHeadAttention": ("p.key_proj.bias", "p.key_proj.weight")}


def errors(name):
    """Max float32-ulp errors of case ``name`` in the block against the oracle:
    forward, gradient, running statistics; and the block's report."""
    ys, g, state, rep = extended(name)
    rys, rg, rstate = oracle(name)
    assert sorted(g) == sorted(rg)
    fwd = max(ulps(a, b) for a, b in zip(ys, rys))
    zero, scale = EXACT_ZERO.get(name, (None, None))
    if zero:  # double-word: the cancellation leaves ~2^-48 of the terms' size
        assert np.abs(g.pop(zero)).max() <= 2.0**-40 * np.abs(g[scale]).max()
    grad = max((ulps(g[k], rg[k]) for k in g), default=0.0)
    st = max((ulps(state[k], rstate[k]) for k in state), default=0.0)
    return fwd, grad, st, rep


# ---- the tests ------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(CASES))
def test_layer_forward_and_gradients(backend, name):
    """Every layer, forward and gradients, within 1 float32 ulp of the float64 oracle,
    nothing reported (Upsample's linear and cubic modes read their input at
    x[:, i, j]: the gradient's scatter-add there is double-word on emulate too)."""
    fwd, grad, state, rep = errors(name)
    assert not rep.float32, rep
    assert fwd <= 1.0 and state <= 1.0 and grad <= 1.0, (fwd, grad, state)


def test_list_arguments_changed_after_the_call(backend):
    """A shape list the caller edits after an op (nn.Upsample's nearest mode does)
    is the op's as called, also in the gradient (the tape kept the list itself:
    the backward pass reshaped to the edited shape and raised)."""
    x = mx.array(rng_f32((2, 3), 40))
    w = mx.array(rng_f32((3, 2), 41))

    def f(x):
        shape = [3, 2]
        y = (x * 1.5).reshape(shape)
        shape[0], shape[1] = 2, 3
        return (y * w).sum()

    with mp.extended_precision() as rep:
        g = mx.grad(f)(x)
    assert np.array_equal(np.array(g), (1.5 * np.array(w).astype(np.float64)).reshape(2, 3)
                          .astype(np.float32))
    assert not rep.float32


def test_saturated_tanh_and_sigmoid_gradients(backend):
    """nn.Tanh / nn.Sigmoid / nn.SiLU far into saturation (LSTM and GRU gates):
    the derivatives 1 / cosh^2 and e^-|x| / (1 + e^-|x|)^2 stay faithful (they
    were computed as 1 - o^2 and o (1 - o), which cancel: 1e7 ulps off at 20)."""
    x = np.array([-40, -20, -12, -7, 7, 9, 12, 15, 20, 30, 40], np.float32)
    G = rng_f32(x.shape, 45)
    x64, G64 = x.astype(np.float64), G.astype(np.float64)
    t = np.exp(-np.abs(x64))
    s = np.where(x64 >= 0, 1 / (1 + t), t / (1 + t))
    want = {"Tanh": 1 / np.cosh(x64) ** 2, "Sigmoid": t / (1 + t) ** 2,
            "SiLU": s + x64 * t / (1 + t) ** 2}
    for name, d in want.items():
        m = getattr(nn, name)()
        with mp.extended_precision() as rep:
            g = mx.grad(lambda v: (m(v) * mx.array(G)).sum())(mx.array(x))
        assert ulps(g, G64 * d) <= 1.0, name
        assert not rep.float32, rep


@pytest.mark.parametrize("approx", ["none", "tanh"])
def test_gelu_where_its_formula_cancels(backend, approx):
    """nn.GELU's x (1 + erf(x / sqrt 2)) / 2 and its tanh form cancel for x << 0
    (1 + erf -> 0): each op is double-word (docs/dwmath.md: erf, tanh within 2^-45
    on emulate, 2^-48 on cpu), so the error is that of 1 + f, times |x|, not 1 ulp
    of the tiny result (float32 itself gives 0 or no correct digit there).
    Elsewhere within 1 ulp; the gradient likewise."""
    x = np.concatenate([ACT_INPUT.ravel(), np.linspace(-9, 4, 27, dtype=np.float32)])
    G = rng_f32(x.shape, 46)
    m = nn.GELU(approx)
    with mp.extended_precision() as rep:
        y = m(mx.array(x))
        g = mx.grad(lambda v: (m(v) * mx.array(G)).sum())(mx.array(x))
    with float64_oracle():
        X = mx.array(x, dtype=mx.float64)
        want = np.array(m(X))
        dwant = np.array(mx.grad(lambda v: (m(v) * mx.array(G, dtype=mx.float64)).sum())(X))
    x64 = np.abs(x.astype(np.float64))
    for got, ref, scale in ((y, want, x64), (g, dwant, (1 + x64 * x64) * np.abs(G))):
        got = np.array(got).astype(np.float64)
        ulp = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
        assert np.all(np.abs(got - ref) <= ulp + 2.0**-44 * scale)
        clear = np.abs(ref) > 2.0**-12 * scale  # (1 + f) above 2^-12: 1 ulp
        assert clear.mean() > 0.7 and np.all(np.abs(got - ref)[clear] <= ulp[clear])
    assert not rep.float32, rep


def test_quotients_by_huge_divisors(backend):
    """nn.Softsign at |x| near float32's top (x / (1 + |x|)) and divisions by
    |y| > 2^126, whose float32 reciprocal is subnormal: the quotients, not 0 (the
    kernels flushed 1 / y.hi and returned 0 where float32 gives ~1)."""
    x = np.array([3e38, -3e38, 2.0**127, 1e38, 5.0], np.float32)
    y = np.array([3e38, 2.0**127, 2.0**127, -2.0**126 * 1.5, 2.0**127], np.float32)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    with mp.extended_precision() as rep:
        soft = nn.Softsign()(mx.array(x))
        q = mx.array(x) / mx.array(y)
        q3 = (mx.array(x) / 3) / mx.array(y)  # a carried dividend
    assert ulps(soft, x64 / (1 + np.abs(x64))) <= 1.0
    assert ulps(q[:4], x64[:4] / y64[:4]) <= 1.0 and ulps(q3[:4], x64[:4] / 3 / y64[:4]) <= 1.0
    assert np.array(q)[4] in (0.0, np.float32(5.0 / 2.0**127))  # subnormal: flushed on GPUs
    assert not rep.float32, rep


def test_sinusoidal_positional_encoding(backend):
    """cos / sin of x * sigma (numpy oracle: MLX's float64 sin / cos are float32-
    accurate): the output and d/dx sum(y * G)."""
    m = nn.SinusoidalPositionalEncoding(8, scale=0.7)
    x = mx.array(rng_f32((3, 5), 42) * 4)
    G = rng_f32((3, 5, 8), 43)
    with mp.extended_precision() as rep:
        y = m(x)
        g = mx.grad(lambda v: (m(v) * mx.array(G)).sum())(x)
    a = np.array(x).astype(np.float64)[..., None] * np.array(m._sigmas).astype(np.float64)
    want = 0.7 * np.concatenate([np.cos(a), np.sin(a)], -1)  # cos_first=False: sin first
    want = np.concatenate([want[..., 4:], want[..., :4]], -1)
    sig = np.array(m._sigmas).astype(np.float64)
    G64 = G.astype(np.float64)
    dg = 0.7 * ((G64[..., :4] * np.cos(a) - G64[..., 4:] * np.sin(a)) * sig).sum(-1)
    assert ulps(y, want) <= 1.0 and ulps(g, dg) <= 1.0
    assert not rep.float32, rep


@pytest.mark.parametrize("name", ["Dropout", "Dropout2d", "Dropout3d"])
def test_dropout_training(backend, name):
    """Random masks: only the shape, the scaling of what is kept (1 / (1 - p),
    exact here) and the report are checked."""
    m = getattr(nn, name)(0.5)
    mx.random.seed(47)  # (Dropout3d draws 16 channel masks here: none all kept or dropped)
    x = mx.array(rng_f32((2, 3, 4, 4, 8), 44)[(0,) * (name == "Dropout2d") + (...,)] / 3)
    with mp.extended_precision() as rep:
        y = m(x)
        g = mx.grad(lambda v: (m(v) * v).sum())(x)
    y, x64 = np.array(y), np.array(x).astype(np.float64)
    kept = y != 0
    assert y.shape == x.shape and 0 < kept.mean() < 1
    assert np.array_equal(y[kept], (x64 * 2)[kept].astype(np.float32))
    assert np.array(g).shape == x.shape
    assert not rep.float32, rep


def test_outside_the_block_mlx_bits():
    """Outside every block the layers' outputs and gradients are MLX's own bits:
    the same cases (a third of them: nn_layer_cases.OUTSIDE) run in a process that
    never imports mlx_precise."""
    import tempfile

    here = os.path.dirname(__file__)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "plain.npz")
        subprocess.run([sys.executable, os.path.join(here, "nn_layer_cases.py"), out],
                       check=True, cwd=here)
        plain = dict(np.load(out))
    from nn_layer_cases import OUTSIDE, plain_results

    ours = plain_results(OUTSIDE)
    assert sorted(ours) == sorted(plain)
    for k, v in plain.items():
        assert np.array_equal(ours[k].view(np.uint32), v.view(np.uint32)), k


if __name__ == "__main__":
    names = sys.argv[1:] or list(CASES)
    for be in ("cpu", "emulate"):
        with mp.use_backend(be):
            for n in names:
                try:
                    f, g, s, rep = errors(n)
                    print(f"{be:8s} {n:32s} fwd {f:8.3f} grad {g:8.3f} state {s:6.3f} "
                          f"float32={dict(rep.float32)}", flush=True)
                except Exception as e:  # noqa
                    print(f"{be:8s} {n:32s} ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
