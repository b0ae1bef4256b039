"""float16 and bfloat16 arrays next to double-word float32 values inside a block.

MLX promotes a float16 / bfloat16 array to float32 next to a float32 one (``x / 3 +
h``, ``x @ h``, ``mx.concatenate([x, h])``); its values are float32 values, so the
flow takes them exactly and the result is double-word. Before, the rules declined
such operands: MLX's float32 op on the high words, reported as a float32 rounding.
Ops of half arrays alone stay MLX's (their results are half). Oracle: exact
rationals (``x / 3`` of integers, half values) in mpmath at 80 bits.
"""

from fractions import Fraction

import mlx.core as mx
import mpmath
import numpy as np
import pytest

import mlx_precise as mp

from flow_helpers import value64

mpmath.mp.prec = 80

X = np.array([[1, 2, 4], [5, -7, 11]], np.float32)  # carried: x / 3
HALF = np.array([[0.5, -0.25, 1.5], [3.0, 0.1, -2.5]], np.float16)


def _third():
    return [[Fraction(int(v), 3) for v in row] for row in X]


def _halves():
    return [[Fraction(float(v)) for v in row] for row in HALF]


def _check(y, ref, bound=2.0 ** -44):
    ref = np.array([[float(mpmath.mpf(v.numerator) / v.denominator) if isinstance(v, Fraction)
                     else float(v) for v in row] for row in ref])
    got = value64(y)
    np.testing.assert_array_less(np.abs(got - ref), bound * np.abs(ref) + 1e-300)
    np.testing.assert_array_equal(np.array(y), ref.astype(np.float32))


def _block(fn, h):
    with mp.extended_precision(strict=True) as report:
        y = fn(mx.array(X) / 3, h)
        mx.eval(y)
    assert y.dtype == mx.float32
    assert sum(report.extended.values()) >= 2 and not report.float32 and not report.plain
    return y


BINARY = {
    "add": (lambda a, b: a + b, lambda p, q: p + q),
    "sub": (lambda a, b: b - a, lambda p, q: q - p),
    "mul": (lambda a, b: a * b, lambda p, q: p * q),
    "div": (lambda a, b: a / b, lambda p, q: p / q),
    "maximum": (lambda a, b: mx.maximum(a, b), max),
    "where": (lambda a, b: mx.where(a > 1.0, a, b), lambda p, q: p if p > 1 else q),
}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_ops_with_a_half_operand(backend, name, dtype):
    op, exact = BINARY[name]
    h = mx.array(HALF).astype(getattr(mx, dtype))
    hv = [[Fraction(float(v)) for v in row] for row in np.array(h.astype(mx.float32))]
    y = _block(op, h)
    _check(y, [[exact(p, q) for p, q in zip(r, s)] for r, s in zip(_third(), hv)])


def test_power_and_arctan2_with_a_half_operand(backend):
    h = mx.array(np.abs(HALF))
    y = _block(lambda a, b: mx.abs(a) ** b, h)
    ref = [[mpmath.power(mpmath.mpf(abs(p.numerator)) / p.denominator, float(q)) for p, q in
            zip(r, s)] for r, s in zip(_third(), np.abs(HALF))]
    _check(y, ref, 2.0 ** -42)
    y = _block(lambda a, b: mx.arctan2(a, b), mx.array(HALF))
    ref = [[mpmath.atan2(mpmath.mpf(p.numerator) / p.denominator, float(q)) for p, q in
            zip(r, s)] for r, s in zip(_third(), HALF)]
    _check(y, ref, 2.0 ** -42)


@pytest.mark.parametrize("form", ["matmul", "einsum", "addmm"])
def test_products_with_a_half_operand(backend, form):
    h = mx.array(HALF.T.copy())  # (3, 2)
    fn = {"matmul": lambda a, b: a @ b, "einsum": lambda a, b: mx.einsum("ij,jk->ik", a, b),
          "addmm": lambda a, b: mx.addmm(mx.zeros((2, 2)), a, b)}[form]
    y = _block(fn, h)
    t, hv = _third(), [[Fraction(float(v)) for v in row] for row in HALF.T]
    _check(y, [[sum(t[i][k] * hv[k][j] for k in range(3)) for j in range(2)] for i in range(2)])


def test_concatenate_and_stack_with_half_and_integer_arrays(backend):
    h, i = mx.array(HALF), mx.array(np.array([[2**24 + 1, 2, 3]], np.int32))
    y = _block(lambda a, b: mx.concatenate([a, b, i]) * 3, h)
    ref = [[3 * v for v in row] for row in _third() + _halves() + [[2**24 + 1, 2, 3]]]
    _check(y, ref)
    y = _block(lambda a, b: mx.stack([a, b])[1] * 3 + a, h)
    _check(y, [[3 * q + p for p, q in zip(r, s)] for r, s in zip(_third(), _halves())])


def test_ops_of_half_arrays_alone_stay_half(backend):
    """``h + h``, ``h * 0.5``, ``mx.exp(h)``: MLX's half results (counted as plain)."""
    h = mx.array(HALF)
    for fn in (lambda v: v + v, lambda v: v * 0.5, lambda v: mx.exp(v)):
        with mp.extended_precision() as report:
            y = fn(h)
        assert y.dtype == mx.float16 and not report.float32
        assert np.array_equal(np.array(y), np.array(fn(h)))


@pytest.mark.parametrize("dtype", ["int32", "float16", "bfloat16"])
def test_convolution_with_integer_or_half_weights(backend, dtype):
    """conv1d of a double-word input with integer or half-precision weights (MLX
    promotes them to float32): the weights' exact values in the double-word
    convolution. Oracle: the sums of exact rational products."""
    rng = np.random.default_rng(3)
    # (positive: no sum cancels to 0, where a double-word sum is not exactly rounded)
    x = rng.integers(1, 10, (1, 6, 2)).astype(np.float32)
    w = (rng.integers(1, 5, (3, 2, 2)) * (1 if dtype == "int32" else 0.375)).astype(
        np.int32 if dtype == "int32" else np.float32)
    wm = mx.array(w).astype(getattr(mx, dtype))
    with mp.extended_precision(strict=True) as report:
        y = mx.conv1d(mx.array(x) / 3, wm)[0]
        mx.eval(y)
    assert y.dtype == mx.float32 and not report.float32 and report.extended["conv1d"] == 1
    ref = [[sum(Fraction(int(x[0, t + k, c]), 3) * Fraction(float(w[o, k, c]))
                for k in range(2) for c in range(2)) for o in range(3)] for t in range(5)]
    _check(y, ref)
