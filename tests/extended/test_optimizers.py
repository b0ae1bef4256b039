"""Every optimizer of ``mlx.optimizers``, run unmodified inside the block for three
steps on both host backends: the parameters and the optimizer's state keep their
low words, the high words are the float64 oracle's values rounded once, and the
words together are within 1e-12 of it (normwise). Oracle: each optimizer's update
as MLX's documentation and source define it, written here in numpy float64 (MLX's
own float64 run is no oracle: its Python-float ** integer-step bias corrections are
float32 values). Also the integer operands those updates meet: ``b ** step`` with
an integer step (Adam's bias correction, Adafactor's decay), which the kernels
took as float32 words and raised for, and the words of unsigned integers that
float32 rounds up, which wrapped around."""

from __future__ import annotations

import math
from fractions import Fraction

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
import pytest

import mlx_precise as mp
from flow_helpers import rng_f32, value64

LR = float(np.float32(1e-2))  # MLX keeps the learning rate as a float32 array
STEPS = 3


def _rms(x):
    return np.sqrt(np.mean(np.square(x)))


def _sgd(momentum=0.0, weight_decay=0.0, dampening=0.0, nesterov=False):
    def update(p, g, s, t):
        if weight_decay:
            g = g + weight_decay * p
        if momentum <= 0:
            return p - LR * g
        v = momentum * s.get("v", np.zeros_like(p))
        v = v + ((1 - dampening) * g if dampening > 0 else g)
        s["v"] = v
        return p - LR * (g + momentum * v if nesterov else v)
    return update


def _rmsprop(alpha=0.99, eps=1e-8):
    def update(p, g, s, t):
        s["v"] = alpha * s.get("v", 0.0) + (1 - alpha) * g * g
        return p - LR * g / (np.sqrt(s["v"]) + eps)
    return update


def _adagrad(eps=1e-8):
    def update(p, g, s, t):
        s["v"] = s.get("v", 0.0) + g * g
        return p - LR * g / (np.sqrt(s["v"]) + eps)
    return update


def _adadelta(rho=0.9, eps=1e-6):
    def update(p, g, s, t):
        v = rho * s.get("v", 0.0) + (1 - rho) * g * g
        u = s.get("u", np.zeros_like(p))
        d = np.sqrt(u + eps) / np.sqrt(v + eps) * g
        s["v"], s["u"] = v, rho * u + (1 - rho) * d * d
        return p - LR * d
    return update


def _adam(b1=0.9, b2=0.999, eps=1e-8, bias_correction=False, weight_decay=None):
    def update(p, g, s, t):
        if weight_decay is not None:  # AdamW
            p = p * (1 - LR * weight_decay)
        m = s["m"] = b1 * s.get("m", 0.0) + (1 - b1) * g
        v = s["v"] = b2 * s.get("v", 0.0) + (1 - b2) * g * g
        if bias_correction:
            c1, c2 = LR / (1 - b1 ** t), 1 / math.sqrt(1 - b2 ** t)
            return p - c1 * m / (np.sqrt(v) * c2 + eps)
        return p - LR * m / (np.sqrt(v) + eps)
    return update


def _adamax(b1=0.9, b2=0.999, eps=1e-8):
    def update(p, g, s, t):
        m = s["m"] = b1 * s.get("m", 0.0) + (1 - b1) * g
        v = s["v"] = np.maximum(b2 * s.get("v", 0.0), np.abs(g))
        return p - LR * m / (v + eps)
    return update


def _lion(b1=0.9, b2=0.99, weight_decay=0.0):
    def update(p, g, s, t):
        m = s.get("m", 0.0)
        c = b1 * m + (1 - b1) * g
        s["m"] = b2 * m + (1 - b2) * g
        if weight_decay > 0:
            p = (1 - LR * weight_decay) * p
        return p - LR * np.sign(c)
    return update


def _adafactor(lr=None, beta_1=None, eps=(1e-30, 1e-3), decay_rate=-0.8):
    def update(p, g, s, t):
        # (relative step: min(1e-2, rsqrt(t)) is 1e-2 for these steps)
        lr_t = max(eps[1], _rms(p)) * (1e-2 if lr is None else LR)
        beta_2 = 1 - t ** decay_rate
        u = g * g + eps[0]
        if p.ndim >= 2:
            row = s["exp_avg_sq_row"] = beta_2 * s.get("exp_avg_sq_row", 0.0) + (1 - beta_2) * u.mean(-1)
            col = s["exp_avg_sq_col"] = beta_2 * s.get("exp_avg_sq_col", 0.0) + (1 - beta_2) * u.mean(-2)
            r = 1 / np.sqrt(row / row.mean(-1, keepdims=True))
            u = r[..., None] * (1 / np.sqrt(col))[None] * g
        else:
            s["exp_avg_sq"] = beta_2 * s.get("exp_avg_sq", 0.0) + (1 - beta_2) * u
            u = g / np.sqrt(s["exp_avg_sq"])
        u = lr_t * (u / max(1.0, _rms(u)))
        if beta_1 is not None:
            u = s["exp_avg"] = beta_1 * s.get("exp_avg", 0.0) + (1 - beta_1) * u
        return p - u
    return update


def _muon(momentum=0.95, weight_decay=0.01, nesterov=True, steps=5):
    def orthogonal(x):
        a, b, c = 3.4445, -4.7750, 2.0315
        tall = x.shape[0] > x.shape[1]
        x = x.T if tall else x
        x = x / (np.linalg.norm(x) + 1e-7)
        for _ in range(steps):
            A = x @ x.T
            x = a * x + (b * A + c * (A @ A)) @ x
        return x.T if tall else x

    def update(p, g, s, t):
        if weight_decay:
            g = g + weight_decay * p
        v = s["v"] = momentum * s.get("v", 0.0) + (1 - momentum) * g
        u = g * (1 - momentum) + v * momentum if nesterov else v
        if u.ndim < 2:
            return p - LR * u
        return p - LR * max(1, u.shape[0] / u.shape[1]) ** 0.5 * orthogonal(u)
    return update


CASES = {  # name -> (the optimizer, its float64 update)
    "SGD": (lambda: optim.SGD(LR), _sgd()),
    "SGD momentum, weight decay, nesterov": (
        lambda: optim.SGD(LR, momentum=0.9, weight_decay=1e-3, nesterov=True),
        _sgd(0.9, 1e-3, nesterov=True)),
    "SGD dampening": (lambda: optim.SGD(LR, momentum=0.9, dampening=0.1), _sgd(0.9, dampening=0.1)),
    "RMSprop": (lambda: optim.RMSprop(LR), _rmsprop()),
    "Adagrad": (lambda: optim.Adagrad(LR), _adagrad()),
    "AdaDelta": (lambda: optim.AdaDelta(LR), _adadelta()),
    "Adam": (lambda: optim.Adam(LR), _adam()),
    "Adam bias correction": (lambda: optim.Adam(LR, bias_correction=True),
                             _adam(bias_correction=True)),
    "AdamW bias correction": (lambda: optim.AdamW(LR, bias_correction=True),
                              _adam(bias_correction=True, weight_decay=0.01)),
    "Adamax": (lambda: optim.Adamax(LR), _adamax()),
    "Lion": (lambda: optim.Lion(LR, weight_decay=0.1), _lion(weight_decay=0.1)),
    "Adafactor": (lambda: optim.Adafactor(), _adafactor()),
    "Adafactor first moment": (
        lambda: optim.Adafactor(LR, relative_step=False, beta_1=0.9), _adafactor(LR, 0.9)),
    "Muon": (lambda: optim.Muon(LR), _muon()),
}

_P = {"w": rng_f32((6, 4), 1), "b": rng_f32((4,), 2)}
_G = [{k: rng_f32(v.shape, 10 + 2 * t + j) for j, (k, v) in enumerate(_P.items())}
      for t in range(STEPS)]


def _oracle(update):
    params = {k: v.astype(np.float64) for k, v in _P.items()}
    states = {k: {} for k in _P}
    for t, grads in enumerate(_G, start=1):
        params = {k: update(params[k], grads[k].astype(np.float64), states[k], t)
                  for k in params}
    return params, states


@pytest.mark.parametrize("strict", [False, True], ids=["report", "strict"])
@pytest.mark.parametrize("name", list(CASES))
def test_optimizer_steps_in_double_word(backend, name, strict):
    make, update = CASES[name]
    with mp.extended_precision(strict=strict) as report:
        opt = make()
        params = {k: mx.array(v) for k, v in _P.items()}
        for grads in _G:
            params = opt.apply_gradients({k: mx.array(v) for k, v in grads.items()}, params)
        mx.eval(params, opt.state)
    assert not report.float32, report
    want, states = _oracle(update)
    pairs = [(k, params[k], ref) for k, ref in want.items()]
    pairs += [(f"{k}.{name}", opt.state[k][name], ref)
              for k, state in states.items() for name, ref in state.items()]
    assert len(pairs) > len(want) or name in ("SGD",)  # the state is compared too
    for what, got, ref in pairs:
        np.testing.assert_array_equal(np.array(got), ref.astype(np.float32), err_msg=what)
        err = np.max(np.abs(value64(got) - ref)) / np.max(np.abs(ref))
        assert err <= 1e-12, (what, err)
    # the parameters keep their low words
    assert all(mp.extended.low_word(params[k]) is not None for k in want)


# ---- integer operands --------------------------------------------------------------------

_VALUES = {  # per dtype: values whose float32 rounding goes up or down, the type's ends
    mx.int32: [7, 2**24 + 1, 2**24 + 3, 2**25 + 5, 2**31 - 1, -(2**31), -(2**24 + 3)],
    mx.uint32: [7, 2**24 + 3, 2**25 + 5, 2**32 - 1, 2**31 + 3],
    mx.int64: [2**24 + 3, 2**40 + 7, 2**47 + 3, 2**53 + 1, 2**63 - 1, -(2**63), -(2**40 + 7)],
    mx.uint64: [2**24 + 3, 2**47 + 3, 2**63 + 3, 2**64 - 1, 2**64 - 2**39 - 1],
}
_NP = {mx.int32: np.int32, mx.uint32: np.uint32, mx.int64: np.int64, mx.uint64: np.uint64}


@pytest.mark.parametrize("dtype", list(_VALUES), ids=str)
def test_integer_operands_enter_at_their_value(backend, dtype):
    """``n * 1.5`` of an integer array: its words are the integer's float32
    rounding and the rest, exact below 2^48 and within 2^-47 of it above (the low
    word a float32 rounding). An unsigned integer that float32 rounds up had its
    rest computed as a wrapped-around unsigned difference: 2.8e19 for 2^24 + 3."""
    values = _VALUES[dtype]
    x = mx.array(np.array(values, dtype=_NP[dtype]))
    with mp.extended_precision():
        y = x * 1.5
        mx.eval(y)
    got = [Fraction(float(h)) + Fraction(float(lo)) for h, lo in
           zip(np.array(y), np.array(mp.extended.low_word(y)))]
    for n, g in zip(values, got):
        exact = Fraction(3 * n, 2)
        bound = 0 if abs(n) < 2**48 else abs(exact) * Fraction(1, 2**47)
        assert abs(g - exact) <= bound, (n, float(g - exact))


@pytest.mark.parametrize("case", ["0.9 ** n", "n ** -0.8", "x ** n", "arctan2(n, x)"])
def test_integer_operands_of_the_engine_functions(backend, case):
    """``b ** step`` with an integer step (Adam's bias correction, Adafactor's
    decay), and the other two-operand functions of an integer array, on every
    backend: the kernels took the integer array as float32 words and raised. The
    result against mpmath-free exact reasoning: the float64 value of the same
    expression, to double-word accuracy."""
    n = mx.array(np.array([1, 2, 3, 100], dtype=np.uint64))
    x = mx.array(np.float32([0.5, 0.9, 1.5, 0.75]))
    nf = np.array([1, 2, 3, 100], dtype=np.float64)
    xf = np.array(x).astype(np.float64)
    fn, ref = {"0.9 ** n": (lambda: 0.9 ** n, 0.9 ** nf),
               "n ** -0.8": (lambda: n ** -0.8, nf ** -0.8),
               "x ** n": (lambda: x ** n, xf ** nf),
               "arctan2(n, x)": (lambda: mx.arctan2(n, x), np.arctan2(nf, xf))}[case]
    with mp.extended_precision() as report:
        y = fn()
        mx.eval(y)
    assert not report.float32 and report.extended, report
    np.testing.assert_array_equal(np.array(y), ref.astype(np.float32))
    err = np.abs(value64(y) - ref) / np.abs(ref)
    assert np.all(err <= 2.0**-40), err
