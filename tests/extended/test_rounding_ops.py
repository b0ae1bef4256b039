"""``mx.round`` with ``decimals``, and the sign of a zero that ``round`` / ``ceil`` /
``trunc`` give. ``round(x, d)`` was MLX's float32 op on the high word (reported):
its product and quotient round, so round(x, 2) missed the nearest float32 to x's
value to 2 decimals. A carried negative value that rounds to zero came out +0
(numpy and MLX: -0). Oracle: exact rationals (fractions) of each value's words."""

from __future__ import annotations

from fractions import Fraction

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from flow_helpers import rng_f32, value64


def _to_decimals(v: float, d: int) -> np.float32:
    """v to d decimals (half to even on the exact value), rounded once to float32."""
    q = round(Fraction(v) * Fraction(10) ** d)  # (Fraction rounds half to even)
    return np.float32(float(Fraction(q) / Fraction(10) ** d))


@pytest.mark.parametrize("strict", [False, True], ids=["report", "strict"])
@pytest.mark.parametrize("decimals", [1, 2, 3, -1, -2])
def test_round_to_decimals(backend, decimals, strict):
    a = rng_f32(64, 51) * 50
    with mp.extended_precision(strict=strict) as report:
        x = mx.array(a)
        carried = x / 3
        got = [mx.round(x, decimals), mx.round(carried, decimals=decimals)]
        mx.eval(got)
    assert not report.float32, report
    for y, v in zip(got, (a.astype(np.float64), value64(carried))):
        want = np.array([_to_decimals(float(t), decimals) for t in v])
        np.testing.assert_array_equal(np.array(y), want)


def test_integer_parts_keep_the_sign_of_zero(backend):
    a = np.float32([-0.3, 0.3, -0.7, -0.5, 0.5, -1e-30, 1e-30, -0.0, 0.0, -2.5])
    with mp.extended_precision(strict=True):  # (nothing leaves double-word: no raise)
        y = mx.array(a) / 1.0000001  # carried
        got = {k: getattr(mx, k)(y) for k in ("round", "floor", "ceil", "trunc")}
        mx.eval(got)
    v = np.array(y)  # (the high words: what numpy's float32 op sees; no tie here)
    for k, r in got.items():
        want = getattr(np, k)(v)
        np.testing.assert_array_equal(np.array(r), want, err_msg=k)
        np.testing.assert_array_equal(np.signbit(np.array(r)), np.signbit(want), err_msg=k)
