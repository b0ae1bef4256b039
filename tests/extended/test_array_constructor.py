"""``mx.array(x)`` of a carried array inside a block: the copy carries the words
(MLX's class cannot be wrapped, so ``mx.array`` is a stand-in while blocks are open:
isinstance, attributes and pickling still behave as the class)."""

from __future__ import annotations

import pickle

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.extended import low_word
from flow_helpers import rng_f32, value64


def test_a_copy_carries_the_words(backend):
    """``mx.array(y)`` was the float32 value only: ``z - y`` gave y's low word
    (-1e-8), not 0, and ``z * 3`` missed the exact result."""
    a = rng_f32(16, 30)
    with mp.extended_precision() as report:
        y = mx.array(a) / 3
        z = mx.array(y)
        assert z is not y and low_word(z) is not None
        diff, triple = value64(z - y), value64(z * 3)
        z += 1.0  # the copy is its own array
        after = value64(y)
        wide = mx.array(y, dtype=mx.float64)
    assert not report.float32, report
    assert np.array_equal(diff, np.zeros(16))
    np.testing.assert_allclose(triple, a.astype(np.float64), rtol=2 ** -46, atol=0)
    np.testing.assert_allclose(after, a.astype(np.float64) / 3, rtol=2 ** -46)
    np.testing.assert_allclose(np.array(wide), a.astype(np.float64) / 3, rtol=2 ** -46)


def test_narrowing_converts_the_exact_value_and_lists_are_reported():
    """``mx.array(c, dtype=float16)`` of a carried value is ``astype``'s conversion of
    the exact value (rounded once); a list of carried arrays is reported."""
    y = mx.array(rng_f32(4, 31))
    with mp.extended_precision() as report:
        c = y / 3
        h = mx.array(c, dtype=mx.float16)
        mx.array([c, c])
        c64 = value64(c)
    assert h.dtype == mx.float16
    np.testing.assert_array_equal(np.array(h), c64.astype(np.float16))
    assert dict(report.float32) == {"array": 1} and report.extended["astype"] == 1


def test_the_stand_in_behaves_as_the_class_and_pickles(backend):
    a = rng_f32((3, 4), 32)
    plain_bytes = pickle.dumps(mx.array(a))
    with mp.extended_precision() as report:
        x = mx.array(a) / 3
        assert isinstance(x, mx.array) and issubclass(type(x), mx.array)
        assert isinstance(x, (np.ndarray, mx.array)) and mx.array.__name__ == "array"
        assert mx.array.__add__ is type(x).__add__
        layer = nn.Linear(4, 2)  # mlx.nn checks parameters with isinstance
        out = layer(mx.array(x))
        assert isinstance(out, mx.array) and low_word(out) is not None
        back = pickle.loads(pickle.dumps(mx.array(a)))
        grad = mx.grad(lambda v: (mx.array(v) * v).sum())(x)
        g64 = value64(grad)
    assert not report.float32, report
    assert np.array_equal(np.array(back), a)
    np.testing.assert_allclose(g64, 2 * a.astype(np.float64) / 3, rtol=2 ** -46)
    # outside every block: MLX's class and MLX's pickle, unchanged
    assert type(mx.array(a)) is mx.array and mx.array.__module__ == "mlx.core"
    assert pickle.dumps(mx.array(a)) == plain_bytes


# ---- host data ---------------------------------------------------------------------------


def test_host_data_is_mlx_own_array(backend):
    """``mx.array`` / ``mx.asarray`` / ``mx.full`` / ``mx.full_like`` of Python floats
    and numpy float64 data inside a block are MLX's float32 arrays, bits and all, with
    no low word: what MLX's own float64 run of the same code holds there too (an
    optimizer's ``learning_rate``, ``mx.full(shape, 0.3)``), so a double-word run and
    a float64 one start from the same values. A float in an op (``x * 0.1``) enters
    at its float64 value, as in the float64 run."""
    v = np.array([0.1, 1 / 3, -2.0 / 7, 1e-40, 0.5])
    with mp.extended_precision() as report:
        made = [mx.array([0.1, 1 / 3, -2.0 / 7, 1e-40, 0.5]), mx.array(v), mx.asarray(v),
                mx.array(0.1), mx.full((2, 5), v), mx.full_like(mx.zeros((5,)), 1 / 3),
                mx.array(v.astype(np.complex128) + 0.1j)]
        scaled = mx.ones((5,)) * 0.1
    assert not report.float32, report
    plain = [mx.array([0.1, 1 / 3, -2.0 / 7, 1e-40, 0.5]), mx.array(v), mx.asarray(v),
             mx.array(0.1), mx.full((2, 5), v), mx.full_like(mx.zeros((5,)), 1 / 3),
             mx.array(v.astype(np.complex128) + 0.1j)]
    for a, p in zip(made, plain):
        assert low_word(a) is None and a.dtype == p.dtype
        np.testing.assert_array_equal(np.array(a), np.array(p))
    np.testing.assert_allclose(value64(scaled), np.full(5, 0.1), rtol=2**-48, atol=0)


@pytest.mark.parametrize("strict", [False, True], ids=["report", "strict"])
def test_full_of_a_carried_array_broadcasts_its_words(backend, strict):
    """``mx.full(shape, y)`` of a carried ``y`` dropped its low word silently:
    ``mx.full((3, 2), x / 3) * 3`` gave x + 3e-8, not x."""
    x = mx.array(np.float32([1.0, 2.0]))
    with mp.extended_precision(strict=strict) as report:
        y = x / 3
        f = mx.full((3, 2), y)
        g = mx.full_like(mx.zeros((3, 2)), y)
        w = mx.full((3, 2), y, dtype=mx.float64)
        triple = f * 3
    assert not report.float32, report
    np.testing.assert_array_equal(np.array(triple), np.broadcast_to([1.0, 2.0], (3, 2)))
    for a in (f, g):
        np.testing.assert_allclose(value64(a), np.broadcast_to([1 / 3, 2 / 3], (3, 2)),
                                   rtol=2**-47, atol=0)
    np.testing.assert_allclose(np.array(w), np.broadcast_to([1 / 3, 2 / 3], (3, 2)),
                               rtol=2**-47, atol=0)


def test_host_constants_inside_a_gradient(backend):
    """A constant made from host data inside a differentiated function takes no
    gradient (and no report): the derivative is the constant, MLX's array."""
    with mp.extended_precision() as report:
        grad = mx.grad(lambda t: mx.sum(t * mx.array([0.1, 1 / 3])))(mx.array([1.0, 2.0]))
    assert not report.float32, report
    np.testing.assert_array_equal(value64(grad), np.float32([0.1, 1 / 3]).astype(np.float64))
