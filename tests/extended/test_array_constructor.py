"""``mx.array(x)`` of a carried array inside a block: the copy carries the words
(MLX's class cannot be wrapped, so ``mx.array`` is a stand-in while blocks are open:
isinstance, attributes and pickling still behave as the class)."""

from __future__ import annotations

import pickle
from fractions import Fraction

import mlx.core as mx
import mlx.nn as nn
import numpy as np

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


def test_narrowing_or_lists_are_reported():
    y = mx.array(rng_f32(4, 31))
    with mp.extended_precision() as report:
        c = y / 3
        h = mx.array(c, dtype=mx.float16)
        mx.array([c, c])
    assert h.dtype == mx.float16
    assert report.float32["astype"] == 1 and report.float32["array"] == 1


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


# ---- host data wider than float32 -------------------------------------------------------

_DOUBLES = [0.1, 1 / 3, -2.0 / 7, 1e-40, 3e38, 1e300, -0.0, 0.5, float("nan"), float("-inf")]


def _words_of(a) -> list:
    """(hi, lo) of each element as Python floats (lo 0 where none is carried)."""
    lo = low_word(a)
    his = np.array(a).ravel().tolist()
    los = [0.0] * len(his) if lo is None else np.array(lo).ravel().tolist()
    return list(zip(his, los))


def _assert_carries(a, values, dtype=mx.float32):
    """``a``'s high words are MLX's rounding of ``values`` (float64 / complex128),
    and high plus low words are within 2^-48 of each value (exact sums)."""
    assert a.dtype == dtype
    with np.errstate(over="ignore"):
        plain = np.asarray(values).astype(np.complex64 if dtype == mx.complex64 else np.float32)
    np.testing.assert_array_equal(np.array(a).ravel(), plain.ravel())
    lo = low_word(a)
    parts = [(np.real, float), (np.imag, float)] if dtype == mx.complex64 else [(np.real, float)]
    for part, _ in parts:
        hi_v = part(np.array(a)).ravel()
        lo_v = part(np.zeros_like(np.array(a)) if lo is None else np.array(lo)).ravel()
        for h, low, v in zip(hi_v, lo_v, part(np.asarray(values, dtype=np.complex128
                                                            if dtype == mx.complex64
                                                            else np.float64)).ravel()):
            if not np.isfinite(h):
                assert low == 0 and (np.isnan(v) or h == v or abs(v) > 3.4028235e38)
                continue
            err = abs(Fraction(float(h)) + Fraction(float(low)) - Fraction(float(v)))
            # (a low word below float32's subnormals is 0: 2^-150 at most)
            assert err <= max(abs(Fraction(float(v))) / 2**48, Fraction(1, 2**150)), (v, h, low)


def test_host_doubles_enter_at_their_value(backend):
    """``mx.array`` / ``mx.asarray`` / ``mx.full`` / ``mx.full_like`` of Python floats
    and numpy float64 data: MLX's float32 array (the same bits) carrying the rest,
    as ``x * 0.1`` takes 0.1; they were float32 roundings with an empty report
    (``mx.array(0.1) * 3 - 0.3`` was 4.5e-9, not ~0)."""
    v = np.array(_DOUBLES)
    with mp.extended_precision() as report:
        made = {
            "array(list)": (mx.array(_DOUBLES), v),
            "array(float)": (mx.array(0.1), np.array(0.1)),
            "array(np.float64)": (mx.array(np.float64(1 / 3)), np.array(1 / 3)),
            "array(ndarray)": (mx.array(v), v),
            "array(ndarray, float32)": (mx.array(v, dtype=mx.float32), v),
            "asarray(ndarray)": (mx.asarray(v), v),
            "full(float)": (mx.full((2, 3), 0.1), np.full((2, 3), 0.1)),
            "full(ndarray row)": (mx.full((2, 10), v), np.broadcast_to(v, (2, 10))),
            "full_like": (mx.full_like(mx.zeros((3,)), 1 / 3), np.full(3, 1 / 3)),
        }
        tenth = mx.array(0.1) * 3 - 0.3
    assert not report.float32, report
    for name, (a, values) in made.items():
        _assert_carries(a, values)
    assert abs(value64(tenth)) <= 2**-50


def test_host_complex_and_exact_data(backend):
    """Complex host numbers carry complex low words; integers, float32 data and an
    asked narrower dtype are MLX's arrays as they are (exact, or what was asked)."""
    c = np.array([1 / 3 + 0.1j, -2.0 / 7 - 1e-3j])
    with mp.extended_precision():
        z = mx.array(c)
        z1 = mx.array(1 / 3 + 0.1j)
        exact = [mx.array([1, 2, 3]), mx.array(np.float32([0.1, 0.2])), mx.array(2**24 + 1),
                 mx.array([0.5, 0.25]), mx.full((2,), 0.5)]
        half = mx.array([0.1, 1 / 3], dtype=mx.float16)
    _assert_carries(z, c, mx.complex64)
    _assert_carries(z1, np.array(1 / 3 + 0.1j), mx.complex64)
    assert all(low_word(a) is None for a in exact)
    assert low_word(half) is None and half.dtype == mx.float16
    np.testing.assert_array_equal(np.array(half), np.array([0.1, 1 / 3], np.float16))
    # outside every block MLX's own arrays, bit for bit
    np.testing.assert_array_equal(np.array(mx.array(c)), np.array(z))


def test_full_of_a_carried_array_broadcasts_its_words(backend):
    """``mx.full(shape, y)`` of a carried ``y`` dropped its low word silently:
    ``mx.full((3, 2), x / 3) * 3`` gave x + 3e-8, not x."""
    x = mx.array(np.float32([1.0, 2.0]))
    with mp.extended_precision() as report:
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
    gradient (and no report)."""
    with mp.extended_precision() as report:
        grad = mx.grad(lambda t: mx.sum(t * mx.array([0.1, 1 / 3])))(mx.array([1.0, 2.0]))
    assert not report.float32, report
    np.testing.assert_allclose(value64(grad), [0.1, 1 / 3], rtol=2**-47)
