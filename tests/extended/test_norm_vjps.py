"""The VJPs of ``mx.fast.layer_norm``, ``mx.fast.rms_norm``, ``mx.softmax`` and
``mx.logsumexp``: on cpu each op runs its float64 formula while a gradient records
and is recorded as one op (its closed-form VJP); on emulate the tape records the
decomposition's ops. Oracle: complex-step derivatives (Squire-Trapp 1998) of
independent numpy complex128 forms of the ops, exact to float64 rounding (no
difference quotient, so no cancellation)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.extended import autodiff
from flow_helpers import rng_f32, value64

EPS = 1e-5
STEP = 1e-30  # the complex step: f(x + i h)'s imaginary part is h f'(x) to rounding


def _layer_norm(x, w, b):
    d = x - x.mean(-1, keepdims=True)
    y = d / np.sqrt((d * d).mean(-1, keepdims=True) + EPS)
    return y * w + b


def _rms_norm(x, w, b):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w


def _softmax(axis):  # (inputs of a few units: no shift needed in complex128)
    return lambda x, w, b: np.exp(x) / np.exp(x).sum(axis, keepdims=True)


def _logsumexp(axis, keepdims):
    return lambda x, w, b: np.log(np.exp(x).sum(axis, keepdims=keepdims))


# name -> (the op under test on (x, weight, bias), its numpy form, shapes of x / weight
# / bias (None: not an input), the name its one-op recording has)
CASES = {
    "layer_norm": (lambda x, w, b: mx.fast.layer_norm(x, w, b, EPS), _layer_norm,
                   ((4, 3, 6), (6,), (6,)), "fast.layer_norm"),
    "layer_norm without weight and bias": (
        lambda x, w, b: mx.fast.layer_norm(x, None, None, EPS),
        lambda x, w, b: _layer_norm(x, 1.0, 0.0), ((5, 7), None, None), "fast.layer_norm"),
    "layer_norm, weight and bias by keyword": (
        lambda x, w, b: mx.fast.layer_norm(x, weight=w, bias=b, eps=EPS), _layer_norm,
        ((4, 6), (6,), (6,)), "fast.layer_norm"),  # (keywords: as the positional call)
    "rms_norm": (lambda x, w, b: mx.fast.rms_norm(x, w, EPS), _rms_norm,
                 ((4, 3, 6), (6,), None), "fast.rms_norm"),
    "softmax, last axis": (lambda x, w, b: mx.softmax(x, axis=-1), _softmax(-1),
                           ((4, 6), None, None), "softmax"),
    "softmax, axis 1": (lambda x, w, b: mx.softmax(x, axis=1), _softmax(1),
                        ((4, 3, 6), None, None), "softmax"),
    "softmax, axes (0, 2)": (lambda x, w, b: mx.softmax(x, axis=(0, 2)), _softmax((0, 2)),
                             ((4, 3, 6), None, None), "softmax"),
    "logsumexp, axis 0": (lambda x, w, b: mx.logsumexp(x, axis=0), _logsumexp(0, False),
                          ((4, 3, 6), None, None), "logsumexp"),
    "logsumexp, axis 1 kept": (lambda x, w, b: mx.logsumexp(x, axis=1, keepdims=True),
                               _logsumexp(1, True), ((4, 3, 6), None, None), "logsumexp"),
    "logsumexp, all axes": (lambda x, w, b: mx.logsumexp(x), _logsumexp(None, False),
                            ((4, 6), None, None), "logsumexp"),
}


def _inputs(shapes):
    return [None if s is None else 2 * rng_f32(s, 20 + i) + (1.0 if i == 1 else 0.0)
            for i, s in enumerate(shapes)]


def _filled(inputs, dtype):
    """(x, weight, bias) in ``dtype``, a missing weight 1 and bias 0."""
    x, w, b = (None if v is None else v.astype(dtype) for v in inputs)
    return [x, 1.0 if w is None else w, 0.0 if b is None else b]


def _oracle(numpy_form, inputs, c):
    """d/d(each input) of ``sum(f(x, w, b) c)`` in float64, by complex steps, one
    element at a time."""
    base = _filled(inputs, np.complex128)
    grads = []
    for k, v in enumerate(inputs):
        if v is None:
            grads.append(None)
            continue
        g = np.empty(v.shape)
        for idx in np.ndindex(v.shape):
            args = list(base)
            args[k] = base[k].copy()
            args[k][idx] += 1j * STEP
            g[idx] = (numpy_form(*args) * c).sum().imag / STEP
        grads.append(g)
    return grads


@pytest.mark.parametrize("backend", ["cpu", "cpu, flow pass", "emulate"])
@pytest.mark.parametrize("case", list(CASES))
def test_gradient_against_complex_step(backend, case, monkeypatch):
    """The gradients (x, weight, bias) are the float64 derivative to far below
    float32's rounding (the carried value), rounded once; the op is recorded as
    one op on every backend (differentiated by its VJP rule)."""
    op, numpy_form, shapes, one_op = CASES[case]
    if backend == "cpu, flow pass":  # the double-word backward (metal's, emulate's)
        monkeypatch.setattr(autodiff, "FLOAT64_PASS", False)
        backend = "cpu"
    inputs = _inputs(shapes)
    c = rng_f32(numpy_form(*_filled(inputs, np.float64)).shape, 30).astype(np.float64)
    want = _oracle(numpy_form, inputs, c)

    recorded = []
    record = autodiff.record
    monkeypatch.setattr(autodiff, "record",
                        lambda name, *a, **k: (recorded.append(name), record(name, *a, **k)))
    argnums = tuple(i for i, v in enumerate(inputs) if v is not None)
    arrays = [None if v is None else mx.array(v) for v in inputs]
    with mp.use_backend(backend), mp.extended_precision() as rep:
        cot = mx.array(c.astype(np.float32))
        got = mx.grad(lambda *a: (op(*a) * cot).sum(), argnums=argnums)(*arrays)
        mx.eval(got)
    assert not rep.float32, rep
    if one_op is not None:
        assert recorded.count(one_op) == 1 and len(recorded) == 3, recorded  # op, *, sum
    for k, g in zip(argnums, got):
        ref = want[k]
        scale = np.linalg.norm(ref)
        assert np.linalg.norm(value64(g) - ref) <= 1e-12 * scale, (k, case)
        # rounded once: the high word is the carried value's float32 rounding (not
        # ref's: a sum of float32 values can be a float32 tie that ref misses by 1e-17)
        np.testing.assert_array_equal(np.array(g), value64(g).astype(np.float32))


@pytest.mark.parametrize("values, want", [
    ([-np.inf, 1.0, 0.0], [0.0, 0.7310585786300049, 0.2689414213699951]),
    ([-np.inf, -np.inf], [np.nan, np.nan]), ([np.inf, 1.0], [np.nan, np.nan])])
@pytest.mark.parametrize("backend", ["cpu", "emulate"])
def test_logsumexp_gradient_at_infinities(values, want, backend):
    """-inf contributes nothing; a result of +Inf gives NaN throughout, as MLX's
    (the softmax of the row; it was 0 at the finite entries), on every backend."""
    with mp.use_backend(backend), mp.extended_precision():
        got = mx.grad(lambda a: mx.logsumexp(a))(mx.array(values))
    np.testing.assert_array_equal(np.array(got), np.array(want, np.float32))


def test_second_order_through_softmax():
    """A gradient inside a gradient: the inner backward runs the VJP rule with the
    flow on, recorded on the outer tape (d/dx of sum(d softmax(x)_0 / dx) = 0, as
    the softmax's entries sum to one; here the Hessian row of softmax_0 summed)."""
    x = rng_f32((5,), 40).astype(np.float64)

    def inner_numpy(v):  # d softmax_0 / dv by the closed form, then its sum's complex step
        s = np.exp(v) / np.exp(v).sum()
        return (s[0] * ((np.arange(5) == 0) - s) * np.arange(1, 6)).sum()

    want = np.array([inner_numpy(x.astype(np.complex128) + 1j * STEP * (np.arange(5) == k)
                                 ).imag / STEP for k in range(5)])
    with mp.extended_precision() as rep:
        def inner(v):
            return (mx.grad(lambda u: mx.softmax(u)[0])(v) * mx.arange(1, 6)).sum()
        got = mx.grad(inner)(mx.array(x.astype(np.float32)))
        mx.eval(got)
    assert not rep.float32, rep
    assert np.linalg.norm(value64(got) - want) <= 1e-12 * np.linalg.norm(want)
