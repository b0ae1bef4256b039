"""float64 numpy oracles for training in double-word: gradients of the
cases of docs/training.md, and the float64 trajectory of a small MLP trained by SGD
with momentum, Adam and AdamW.

Independent of MLX and mlx_precise: plain numpy / scipy / math on float64 arrays,
forward passes and hand-written backward passes (each checked against central
finite differences and mpmath in tests/extended/test_training_oracle.py). The inputs
of every case are float32 arrays (what the MLX side computes on), made here from
fixed seeds; the oracle computes on their exact float64 values.

Gradient cases (:data:`GRAD_CASES`): ``make(**size)`` gives the float32 inputs
(a dict of numpy arrays), ``wrt`` names the differentiated ones, ``loss(inputs)``
the float64 loss and ``grad(inputs)`` the float64 gradient (a dict over ``wrt``).
Constants inside the cases are dyadic (0.5, 2^-7, 1 - 2^-10, ...), so float32
and float64 programs see the same constants and the measured error is the
arithmetic's.

Training (:func:`trajectory`): the MLP Linear(16, 32) - GELU (exact, erf form) -
LayerNorm(32) (eps 1e-5, affine) - Linear(32, 4), mean squared error over 64
samples, full batch, updated by numpy replicas of mlx.optimizers (MLX 0.32.4)
:class:`SGD`, :class:`Adam`, :class:`AdamW`. The replicas follow MLX's formulas
term by term (see each class); hyperparameters that MLX holds as float32 arrays
(the learning rate: ``mx.array(learning_rate)``) enter at their float32 value,
Python floats (betas, eps, momentum, dampening, weight decay) at their float64
value: exactly what MLX computes with ``model.set_dtype(mx.float64)``.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.special import erf

from models._common import gelu, layer_norm  # float64 numpy, shared with the model oracles

SQRT2 = math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
CHAIN = 2000  # the length of the two long chains (reuse, recurrence)
LN_EPS = 1e-5
RMS_EPS = 1e-5


def _f32(rng, shape, scale=1.0, low=None, high=None):
    if low is not None:
        return rng.uniform(low, high, shape).astype(np.float32)
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def _wide(inputs: dict) -> dict:
    return {k: np.asarray(v, dtype=np.float64) for k, v in inputs.items()}


# ---- single elementwise functions: f and f' in float64 --------------------------------

def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _dsigmoid(x):
    e = np.exp(-np.abs(x))
    return e / (1 + e) ** 2


UNARY = {
    # name: (f, f', input range)
    "exp": (np.exp, np.exp, (-4.0, 4.0)),
    "log": (np.log, lambda x: 1 / x, (0.05, 20.0)),
    "tanh": (np.tanh, lambda x: 1 / np.cosh(x) ** 2, (-3.0, 3.0)),
    "sigmoid": (_sigmoid, _dsigmoid, (-8.0, 8.0)),
    "erf": (erf, lambda x: 2 / math.sqrt(math.pi) * np.exp(-x * x), (-3.0, 3.0)),
}


def _unary_case(name, n=4096, seed=1):
    lo, hi = UNARY[name][2]
    rng = np.random.default_rng(seed)
    return {"x": _f32(rng, (n,), low=lo, high=hi), "G": _f32(rng, (n,))}


def _unary_loss(name):
    f = UNARY[name][0]
    return lambda i: float(np.sum(_wide(i)["G"] * f(_wide(i)["x"])))


def _unary_grad(name):
    df = UNARY[name][1]
    return lambda i: {"x": _wide(i)["G"] * df(_wide(i)["x"])}


# ---- arithmetic chain -----------------------------------------------------------------
# w = (0.5 x^2 + x - 0.25) / (x^2 + 1) * (x - 0.75);  loss = sum(G w)

def _chain_make(n=4096, seed=2):
    rng = np.random.default_rng(seed)
    return {"x": _f32(rng, (n,), 2.0), "G": _f32(rng, (n,))}


def _chain_parts(x):
    u = 0.5 * x * x + x - 0.25
    v = x * x + 1
    return u, v, u / v


def _chain_loss(i):
    w = _wide(i)
    x = w["x"]
    return float(np.sum(w["G"] * _chain_parts(x)[2] * (x - 0.75)))


def _chain_grad(i):
    w = _wide(i)
    x = w["x"]
    u, v, r = _chain_parts(x)
    dr = ((x + 1) * v - u * 2 * x) / (v * v)
    return {"x": w["G"] * (dr * (x - 0.75) + r)}


# ---- matmul: loss = sum(G * (A @ B)) --------------------------------------------------

def _matmul_make(M=256, K=16, N=256, seed=3):
    rng = np.random.default_rng(seed)
    return {"A": _f32(rng, (M, K)), "B": _f32(rng, (K, N)), "G": _f32(rng, (M, N))}


def _matmul_loss(i):
    w = _wide(i)
    return float(np.sum(w["G"] * (w["A"] @ w["B"])))


def _matmul_grad(i):
    w = _wide(i)
    return {"A": w["G"] @ w["B"].T, "B": w["A"].T @ w["G"]}


# ---- conv1d (MLX's: cross-correlation, channels last) ---------------------------------

CONV_PAD = 2


def conv1d(x, w, padding=0):
    """x (B, L, Cin), w (Cout, K, Cin) -> (B, L + 2 padding - K + 1, Cout)."""
    K = w.shape[1]
    xp = np.pad(x, [(0, 0), (padding, padding), (0, 0)])
    Lout = xp.shape[1] - K + 1
    return sum(xp[:, k:k + Lout] @ w[:, k].T for k in range(K))


def conv1d_grad(x, w, G, padding=0):
    """(d/dx, d/dw) of sum(G * conv1d(x, w, padding))."""
    K = w.shape[1]
    xp = np.pad(x, [(0, 0), (padding, padding), (0, 0)])
    Lout = G.shape[1]
    gw = np.stack([np.einsum("blo,blc->oc", G, xp[:, k:k + Lout]) for k in range(K)], axis=1)
    gxp = np.zeros_like(xp)
    for k in range(K):
        gxp[:, k:k + Lout] += G @ w[:, k]
    return gxp[:, padding:xp.shape[1] - padding], gw


def _conv_make(B=2, L=128, Cin=8, Cout=16, K=5, seed=4):
    rng = np.random.default_rng(seed)
    return {"x": _f32(rng, (B, L, Cin)), "w": _f32(rng, (Cout, K, Cin), 0.3),
            "G": _f32(rng, (B, L + 2 * CONV_PAD - K + 1, Cout))}


def _conv_loss(i):
    w = _wide(i)
    return float(np.sum(w["G"] * conv1d(w["x"], w["w"], CONV_PAD)))


def _conv_grad(i):
    w = _wide(i)
    gx, gw = conv1d_grad(w["x"], w["w"], w["G"], CONV_PAD)
    return {"x": gx, "w": gw}


# ---- layer_norm / rms_norm ------------------------------------------------------------

def layer_norm_grad(x, w, G, eps=LN_EPS):
    """(dx, dw, db) of sum(G * layer_norm(x, w, b)) over the last axis; w, b broadcast
    over the leading axes."""
    mu = x.mean(-1, keepdims=True)
    r = 1 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    xh = (x - mu) * r
    lead = tuple(range(x.ndim - 1))
    gxh = G * w
    gx = r * (gxh - gxh.mean(-1, keepdims=True) - xh * (gxh * xh).mean(-1, keepdims=True))
    return gx, (G * xh).sum(lead), G.sum(lead)


def rms_norm(x, w, eps=RMS_EPS):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rms_norm_grad(x, w, G, eps=RMS_EPS):
    r = 1 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    xh = x * r
    gxh = G * w
    gx = r * (gxh - xh * (gxh * xh).mean(-1, keepdims=True))
    return gx, (G * xh).sum(tuple(range(x.ndim - 1)))


def _norm_make(rows=64, d=128, seed=5):
    rng = np.random.default_rng(seed)
    return {"x": (3 + _f32(rng, (rows, d))).astype(np.float32), "w": _f32(rng, (d,)),
            "b": _f32(rng, (d,)), "G": _f32(rng, (rows, d))}


def _ln_loss(i):
    w = _wide(i)
    return float(np.sum(w["G"] * layer_norm(w["x"], w["w"], w["b"])))


def _ln_grad(i):
    w = _wide(i)
    gx, gw, gb = layer_norm_grad(w["x"], w["w"], w["G"])
    return {"x": gx, "w": gw, "b": gb}


def _rms_make(**kw):
    d = _norm_make(**kw)
    del d["b"]
    return d


def _rms_loss(i):
    w = _wide(i)
    return float(np.sum(w["G"] * rms_norm(w["x"], w["w"])))


def _rms_grad(i):
    w = _wide(i)
    gx, gw = rms_norm_grad(w["x"], w["w"], w["G"])
    return {"x": gx, "w": gw}


# ---- softmax and attention ------------------------------------------------------------

def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _softmax_make(rows=64, d=128, seed=6):
    rng = np.random.default_rng(seed)
    return {"x": _f32(rng, (rows, d), 3.0), "G": _f32(rng, (rows, d))}


def _softmax_loss(i):
    w = _wide(i)
    return float(np.sum(w["G"] * softmax(w["x"])))


def _softmax_grad(i):
    w = _wide(i)
    s = softmax(w["x"])
    return {"x": s * (w["G"] - (w["G"] * s).sum(-1, keepdims=True))}


ATTN_SCALE = 0.25  # 1 / sqrt(16): dyadic


def attention(q, k, v, scale=ATTN_SCALE):
    """Causal scaled dot-product attention, (B, H, T, D)."""
    T = q.shape[-2]
    s = scale * q @ np.swapaxes(k, -1, -2)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    p = softmax(s)
    return p @ v, p


def attention_grad(q, k, v, G, scale=ATTN_SCALE):
    o, p = attention(q, k, v, scale)
    gv = np.swapaxes(p, -1, -2) @ G
    gp = G @ np.swapaxes(v, -1, -2)
    gs = p * (gp - (gp * p).sum(-1, keepdims=True))
    return scale * gs @ k, scale * np.swapaxes(gs, -1, -2) @ q, gv


def _attn_make(B=1, H=4, T=32, D=16, seed=7):
    rng = np.random.default_rng(seed)
    return {n: _f32(rng, (B, H, T, D)) for n in ("q", "k", "v", "G")}


def _attn_loss(i):
    w = _wide(i)
    return float(np.sum(w["G"] * attention(w["q"], w["k"], w["v"])[0]))


def _attn_grad(i):
    w = _wide(i)
    gq, gk, gv = attention_grad(w["q"], w["k"], w["v"], w["G"])
    return {"q": gq, "k": gk, "v": gv}


# ---- cumsum: loss = 0.5 sum(G * cumsum(x)^2) ------------------------------------------

def _cumsum_make(n=4096, seed=8):
    rng = np.random.default_rng(seed)
    return {"x": _f32(rng, (n,)), "G": _f32(rng, (n,))}


def _cumsum_loss(i):
    w = _wide(i)
    c = np.cumsum(w["x"])
    return float(0.5 * np.sum(w["G"] * c * c))


def _cumsum_grad(i):
    w = _wide(i)
    c = np.cumsum(w["x"])
    return {"x": np.cumsum((w["G"] * c)[::-1])[::-1]}


# ---- a parameter used n times: loss = sum_i sum(W[i] * p) -----------------------------

def _reuse_make(uses=CHAIN, d=8, seed=9):
    rng = np.random.default_rng(seed)
    return {"p": _f32(rng, (d,)), "W": _f32(rng, (uses, d))}


def _reuse_loss(i):
    w = _wide(i)
    return float(np.sum(w["W"] * w["p"]))


def _reuse_grad(i):
    W = _wide(i)["W"]
    return {"p": np.array([math.fsum(W[:, j]) for j in range(W.shape[1])])}


# ---- back-propagation through a recurrence of n steps ---------------------------------
# h_{t+1} = DECAY h_t + GAIN tanh(a h_t + x_t);  loss = sum(G h_n);  d/da, d/dh0

DECAY = 1 - 2.0 ** -10
GAIN = 2.0 ** -7


def _rec_make(steps=CHAIN, d=16, seed=10):
    rng = np.random.default_rng(seed)
    return {"a": _f32(rng, (d,)), "h0": _f32(rng, (d,)), "X": _f32(rng, (steps, d)),
            "G": _f32(rng, (d,))}


def _rec_forward(w):
    h = w["h0"]
    hs, zs = [], []
    for t in range(w["X"].shape[0]):
        z = w["a"] * h + w["X"][t]
        hs.append(h)
        zs.append(z)
        h = DECAY * h + GAIN * np.tanh(z)
    return h, hs, zs


def _rec_loss(i):
    w = _wide(i)
    return float(np.sum(w["G"] * _rec_forward(w)[0]))


def _rec_grad(i):
    w = _wide(i)
    _, hs, zs = _rec_forward(w)
    lam = w["G"].copy()
    ga = np.zeros_like(w["a"])
    for h, z in zip(reversed(hs), reversed(zs)):
        gz = lam * GAIN / np.cosh(z) ** 2
        ga += gz * h
        lam = lam * DECAY + gz * w["a"]
    return {"a": ga, "h0": lam}


# ---- the MLP: Linear - GELU - LayerNorm - Linear, MSE ---------------------------------

MLP_SIZES = dict(d_in=16, hidden=32, d_out=4, samples=64)
MLP_PARAMS = ("l1.weight", "l1.bias", "ln.weight", "ln.bias", "l2.weight", "l2.bias")


def mlp_data(samples=64, d_in=16, d_out=4, seed=11):
    """(x, y): float32 inputs and regression targets."""
    rng = np.random.default_rng(seed)
    x = _f32(rng, (samples, d_in))
    y = _f32(rng, (samples, d_out))
    return x, y


def dgelu(x):
    return 0.5 * (1 + erf(x / SQRT2)) + x * np.exp(-0.5 * x * x) * INV_SQRT_2PI


def mlp_forward(p: dict, x):
    z1 = x @ p["l1.weight"].T + p["l1.bias"]
    a = gelu(z1)
    h = layer_norm(a, p["ln.weight"], p["ln.bias"])
    return h @ p["l2.weight"].T + p["l2.bias"], (z1, a, h)


def mlp_loss(p: dict, x, y) -> float:
    out, _ = mlp_forward(p, x)
    return float(np.mean((out - y) ** 2))


def mlp_grad(p: dict, x, y) -> tuple[float, dict]:
    """(loss, gradients) of the mean squared error, float64."""
    out, (z1, a, h) = mlp_forward(p, x)
    d = out - y
    gout = 2 * d / d.size
    ga, gw_ln, gb_ln = layer_norm_grad(a, p["ln.weight"], gout @ p["l2.weight"])
    gz1 = ga * dgelu(z1)
    return float(np.mean(d * d)), {
        "l1.weight": gz1.T @ x, "l1.bias": gz1.sum(0), "ln.weight": gw_ln, "ln.bias": gb_ln,
        "l2.weight": gout.T @ h, "l2.bias": gout.sum(0)}


def _mlp_case_make(seed=12):
    """Inputs of the whole-model gradient case: parameters drawn like mlx.nn's
    defaults (uniform +-1/sqrt(fan_in), LayerNorm weight 1 / bias 0 perturbed so the
    affine part is not trivial), plus the data."""
    s = MLP_SIZES
    rng = np.random.default_rng(seed)

    def u(shape, fan):
        return rng.uniform(-1, 1, shape).astype(np.float32) / np.float32(math.sqrt(fan))

    d_in, hidden, d_out = s["d_in"], s["hidden"], s["d_out"]
    p = {"l1.weight": u((hidden, d_in), d_in), "l1.bias": u((hidden,), d_in),
         "ln.weight": (1 + 0.1 * _f32(rng, (hidden,))).astype(np.float32),
         "ln.bias": _f32(rng, (hidden,), 0.1),
         "l2.weight": u((d_out, hidden), hidden), "l2.bias": u((d_out,), hidden)}
    x, y = mlp_data(s["samples"], s["d_in"], s["d_out"])
    return {**p, "x": x, "y": y}


def _mlp_case_loss(i):
    w = _wide(i)
    return mlp_loss({k: w[k] for k in MLP_PARAMS}, w["x"], w["y"])


def _mlp_case_grad(i):
    w = _wide(i)
    return mlp_grad({k: w[k] for k in MLP_PARAMS}, w["x"], w["y"])[1]


# ---- the case table -------------------------------------------------------------------

@dataclass(frozen=True)
class GradCase:
    name: str
    make: Callable[..., dict]          # (**size) -> float32 numpy inputs
    wrt: tuple                         # the inputs differentiated
    loss: Callable[[dict], float]      # float64 loss
    grad: Callable[[dict], dict]       # float64 gradient over wrt
    chain: str | None = None           # the keyword of make giving a chain's length n

    def label(self, n: int = CHAIN) -> str:
        return self.name.replace(" n ", f" {n} ")


GRAD_CASES: dict[str, GradCase] = {c.name: c for c in [
    GradCase("arith chain", _chain_make, ("x",), _chain_loss, _chain_grad),
    *[GradCase(n, lambda n=n, **kw: _unary_case(n, **kw), ("x",), _unary_loss(n), _unary_grad(n))
      for n in UNARY],
    GradCase("matmul", _matmul_make, ("A", "B"), _matmul_loss, _matmul_grad),
    GradCase("conv1d", _conv_make, ("x", "w"), _conv_loss, _conv_grad),
    GradCase("layer_norm", _norm_make, ("x", "w", "b"), _ln_loss, _ln_grad),
    GradCase("rms_norm", _rms_make, ("x", "w"), _rms_loss, _rms_grad),
    GradCase("softmax", _softmax_make, ("x",), _softmax_loss, _softmax_grad),
    GradCase("attention", _attn_make, ("q", "k", "v"), _attn_loss, _attn_grad),
    GradCase("cumsum", _cumsum_make, ("x",), _cumsum_loss, _cumsum_grad),
    GradCase("param used n times", _reuse_make, ("p",), _reuse_loss, _reuse_grad, "uses"),
    GradCase("recurrence of n steps", _rec_make, ("a", "h0"), _rec_loss, _rec_grad, "steps"),
    GradCase("MLP (GELU, LayerNorm)", _mlp_case_make, MLP_PARAMS, _mlp_case_loss, _mlp_case_grad),
]}


# ---- optimizers: numpy float64 replicas of mlx.optimizers (MLX 0.32.4) ----------------

def _lr32(lr: float) -> float:
    """The learning rate as MLX holds it: ``mx.array(lr)``, float32."""
    return float(np.float32(lr))


class _Optimizer:
    """MLX's Optimizer: the step counter is incremented before the update of every
    parameter (so the first update sees step 1); state initialised to zeros."""

    def __init__(self):
        self.step = 0
        self.state: dict = {}

    def update(self, params: dict, grads: dict) -> dict:
        self.step += 1
        return {k: self.apply_single(grads[k], params[k], self.state.setdefault(k, {}))
                for k in params}


class SGD(_Optimizer):
    """mlx.optimizers.SGD: g += wd p; without momentum p - lr g; otherwise
    v = mu v + (1 - dampening) g (just + g when dampening is 0),
    update = g + mu v (Nesterov) or v, p - lr update."""

    def __init__(self, learning_rate, momentum=0.0, weight_decay=0.0, dampening=0.0,
                 nesterov=False):
        super().__init__()
        self.lr, self.momentum, self.weight_decay = _lr32(learning_rate), momentum, weight_decay
        self.dampening, self.nesterov = dampening, nesterov

    def apply_single(self, g, p, s):
        if self.weight_decay != 0:
            g = g + self.weight_decay * p
        if self.momentum <= 0:
            return p - self.lr * g
        v = self.momentum * s.get("v", np.zeros_like(p))
        v = v + ((1 - self.dampening) * g if self.dampening > 0 else g)
        s["v"] = v
        return p - self.lr * (g + self.momentum * v if self.nesterov else v)


class Adam(_Optimizer):
    """mlx.optimizers.Adam: m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2;
    without bias correction (MLX's default) p - lr m / (sqrt(v) + eps); with it
    p - (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)."""

    def __init__(self, learning_rate, betas=(0.9, 0.999), eps=1e-8, bias_correction=False):
        super().__init__()
        self.lr, self.betas, self.eps = _lr32(learning_rate), tuple(betas), eps
        self.bias_correction = bias_correction

    def apply_single(self, g, p, s):
        b1, b2 = self.betas
        m = b1 * s.get("m", np.zeros_like(p)) + (1 - b1) * g
        v = b2 * s.get("v", np.zeros_like(p)) + (1 - b2) * g * g
        s["m"], s["v"] = m, v
        if self.bias_correction:
            c1 = self.lr / (1 - b1 ** self.step)
            c2 = 1 / math.sqrt(1 - b2 ** self.step)
            return p - c1 * m / (np.sqrt(v) * c2 + self.eps)
        return p - self.lr * m / (np.sqrt(v) + self.eps)


class AdamW(Adam):
    """mlx.optimizers.AdamW: the weight decay is applied to the parameter first,
    p (1 - lr wd), and Adam's update to the result."""

    def __init__(self, learning_rate, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                 bias_correction=False):
        super().__init__(learning_rate, betas, eps, bias_correction)
        self.weight_decay = weight_decay

    def apply_single(self, g, p, s):
        return super().apply_single(g, p * (1 - self.lr * self.weight_decay), s)


OPTIMIZER_CLASSES = {"SGD": SGD, "Adam": Adam, "AdamW": AdamW}

# The benchmark's three runs: (class name, keyword arguments), shared with the MLX side.
OPTIMIZERS = {
    "sgd-momentum": ("SGD", dict(learning_rate=1e-2, momentum=0.9)),
    "adam": ("Adam", dict(learning_rate=1e-3)),
    "adamw": ("AdamW", dict(learning_rate=1e-3, weight_decay=0.01)),
}


def make_optimizer(kind: str, **kw):
    return OPTIMIZER_CLASSES[kind](**kw)


def trajectory(p0: dict, x, y, kind: str, kw: dict, steps: int, record=(),
               store=None) -> tuple[dict, list]:
    """Full-batch training of the MLP from the float32 parameters ``p0`` (name ->
    array) in float64: ``steps`` updates of ``make_optimizer(kind, **kw)``. Returns
    (final float64 parameters, losses at the steps in ``record``). ``store``: applied
    to every parameter after each update (e.g. :func:`to_float32`: parameters kept in
    float32 between steps, everything else exact)."""
    p = {k: np.asarray(v, dtype=np.float64) for k, v in p0.items()}
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    opt = make_optimizer(kind, **kw)
    losses = []
    record = set(record)
    for t in range(steps):
        loss, g = mlp_grad(p, x, y)
        if t in record:
            losses.append(loss)
        p = opt.update(p, g)
        if store is not None:
            p = {k: store(v) for k, v in p.items()}
    return p, losses


def to_float32(a):
    """``a`` rounded to float32, held in float64."""
    return np.asarray(a).astype(np.float32).astype(np.float64)


def float32_hyperparameters(kind: str, kw: dict) -> dict:
    """The optimizer's keyword arguments, its defaults included, with every float
    rounded to float32: the constants plain float32 MLX computes with (a Python float
    meets a float32 array as float32), against their float64 values inside a block."""
    def r(v):
        if isinstance(v, float):
            return float(np.float32(v))
        return type(v)(r(u) for u in v) if isinstance(v, (tuple, list)) else v
    defaults = {k: q.default for k, q in
                inspect.signature(OPTIMIZER_CLASSES[kind]).parameters.items()
                if q.default is not inspect.Parameter.empty}
    return {k: r(v) for k, v in {**defaults, **kw}.items()}


def flat(tree: dict, keys=None) -> np.ndarray:
    """The float64 concatenation of the arrays of ``tree`` (in ``keys`` order)."""
    keys = keys if keys is not None else sorted(tree)
    return np.concatenate([np.asarray(tree[k], dtype=np.float64).ravel() for k in keys])


def normwise(a, ref) -> float:
    """||a - ref|| / ||ref|| (flattened)."""
    a = np.asarray(a, np.float64).ravel()
    ref = np.asarray(ref, np.float64).ravel()
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


def floor(ref) -> float:
    """The normwise error of ``ref`` rounded once to float32: the floor."""
    ref = np.asarray(ref, np.float64)
    return normwise(ref.astype(np.float32), ref)
