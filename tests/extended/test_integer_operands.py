"""``power`` and ``arctan2`` with an integer or bool array operand inside a block.

MLX promotes the integer array to float32 (``mx.arange(1, 6) ** 0.5``, ``0.9 **
step`` with an integer step, ``mx.arctan2(i, x)``); the flow takes integers
exactly (their two words), as its arithmetic does. On the kernel backends the
rules passed the integer array itself to the double-word kernels, which read
float32 words only: the block raised where MLX computes. Oracle: mpmath at 80 bits
on the exact integers and float32 values.
"""

import mlx.core as mx
import mpmath
import numpy as np
import pytest

import mlx_precise as mp

from flow_helpers import value64

mpmath.mp.prec = 80

# small, negative, and above 2^24 (not a float32 value: the low word holds the rest)
INTS = np.array([1, 2, 3, 7, 100, 2**24 + 1, 2**30 + 3, 123456789], np.int32)
SIGNED = np.array([-5, -1, 0, 1, 3, 2**24 + 1, -(2**30 + 3), 123456789], np.int32)
FLOATS = np.array([0.5, -1.25, 3.0, 0.1, 2.5, -7.0, 1e-3, 0.3], np.float32)


def _check(y, ref, bound=2.0 ** -44):
    """The carried value within ``bound`` (relative) of the oracle, the high word
    its float32 rounding (no oracle value lies that close to a tie here)."""
    ref = np.array([float(r) for r in ref])
    got = value64(y)
    np.testing.assert_array_less(np.abs(got - ref), bound * np.abs(ref) + 1e-300)
    np.testing.assert_array_equal(np.array(y), ref.astype(np.float32))


def _block(fn, *args):
    with mp.extended_precision(strict=True) as report:
        y = fn(*args)
        mx.eval(y)
    assert y.dtype == mx.float32
    assert sum(report.extended.values()) >= 1 and not report.float32 and not report.plain
    return y


@pytest.mark.parametrize("exponent", [0.5, 2.0, -1.5, 1 / 3])
def test_integer_array_to_float_power(backend, exponent):
    y = _block(lambda a: a ** exponent, mx.array(INTS))
    _check(y, [mpmath.mpf(int(i)) ** mpmath.mpf(exponent) for i in INTS])


@pytest.mark.parametrize("base", [0.9, 0.999, 2.0])
def test_float_to_integer_array_power(backend, base):
    steps = np.array([1, 2, 3, 10, 57, 100, 0, 4], np.int32)
    y = _block(lambda t: base ** t, mx.array(steps))
    # (the base's two words hold its float64 value to ~2^-48: t times that in the power)
    _check(y, [mpmath.mpf(base) ** int(t) for t in steps], bound=2.0 ** -40)


def test_power_of_integer_and_float32_arrays(backend):
    i, x = mx.array(INTS[:5]), mx.array(FLOATS[:5])
    _check(_block(mx.power, i, x),
           [mpmath.mpf(int(a)) ** mpmath.mpf(float(b)) for a, b in zip(INTS[:5], FLOATS[:5])])
    k = np.array([1, 2, 3, 7, 30], np.int32)  # (2.5 ** 30: no overflow)
    _check(_block(mx.power, mx.abs(x), mx.array(k)),
           [abs(mpmath.mpf(float(b))) ** int(a) for a, b in zip(k, FLOATS[:5])])


def test_bool_array_power(backend):
    b = np.array([True, False, True, False])
    y = _block(lambda t: 0.5 ** t, mx.array(b))
    np.testing.assert_array_equal(value64(y), np.where(b, 0.5, 1.0))


def test_arctan2_integer_operand(backend):
    i, x = mx.array(SIGNED), mx.array(FLOATS)
    _check(_block(mx.arctan2, i, x),
           [mpmath.atan2(int(a), float(b)) for a, b in zip(SIGNED, FLOATS)])
    _check(_block(mx.arctan2, x, i),
           [mpmath.atan2(float(b), int(a)) for a, b in zip(SIGNED, FLOATS)])
