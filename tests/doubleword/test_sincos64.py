"""The cpu engine's float64 sin and cos (engine64.sincos64: Cody-Waite reduction by
pi/2 in four parts, Taylor polynomials): within 1 ulp of mpmath over wide ranges,
the doubles nearest multiples of pi/2 included; beyond 2^20 (the tan path) within
3 ulp; special values; the same bits run as one compiled loop and as separate ops,
and inside mx.compile."""

import mlx.core as mx
import mpmath
import numpy as np
import pytest

from mlx_precise.doubleword import engine64

mpmath.mp.prec = 300


def _inputs(rng) -> np.ndarray:
    k = rng.integers(1, 600_000, 300)
    near = np.array([float(mpmath.mpf(int(v)) * mpmath.pi / 2) for v in k])
    return np.concatenate([
        rng.uniform(-4, 4, 400), rng.uniform(-2.0**20, 2.0**20, 400),
        np.exp(rng.uniform(-40, 13.8, 400)) * rng.choice([-1, 1], 400),
        near, np.nextafter(near, 0), np.nextafter(near, np.inf),
        # continued-fraction convergents of pi and pi/2: very close to multiples
        [355.0, 103993.0, 104348.0, 208341.0, 312689.0, 833719.0, 1146408.0 / 2, 5e-324,
         1e-300, 2.0**-30, np.pi / 4, -np.pi / 4, 2.0**20, -(2.0**20)]])


def _ulps(got: np.ndarray, x: np.ndarray, fn) -> np.ndarray:
    out = []
    for g, v in zip(got, x):
        ref = fn(mpmath.mpf(float(v)))
        out.append(abs(float(mpmath.mpf(float(g)) - ref)) / np.spacing(abs(float(ref))))
    return np.array(out)


def _sincos(x: np.ndarray):
    with mx.stream(mx.cpu):
        return [np.array(v) for v in engine64.sincos64(mx.array(x, dtype=mx.float64))]


@pytest.mark.parametrize("repeat", [1, 20])  # separate ops; one compiled loop (> FUSE_MIN)
def test_within_one_ulp_of_mpmath(repeat):
    x = _inputs(np.random.default_rng(repeat))
    s, c = _sincos(np.tile(x, repeat))
    n = x.size
    assert _ulps(s[:n], x, mpmath.sin).max() < 1.0
    assert _ulps(c[:n], x, mpmath.cos).max() < 1.0
    assert s.tobytes() == np.tile(s[:n], repeat).tobytes()
    assert c.tobytes() == np.tile(c[:n], repeat).tobytes()


def test_beyond_the_bound_and_special_values():
    rng = np.random.default_rng(5)
    big = np.concatenate([np.exp(rng.uniform(14, 700, 300)), [2.0**20 + 1, 1e22, 1.7e308]])
    small = rng.uniform(-3, 3, 300)
    x = np.concatenate([big, -big, small])
    s, c = _sincos(x)
    assert _ulps(s, x, mpmath.sin).max() < 3.0
    assert _ulps(c, x, mpmath.cos).max() < 3.0
    # the elements within the bound: the same bits as without the far ones
    alone_s, alone_c = _sincos(small)
    assert s[-300:].tobytes() == alone_s.tobytes() and c[-300:].tobytes() == alone_c.tobytes()
    s, c = _sincos(np.array([0.0, -0.0, np.inf, -np.inf, np.nan]))
    assert np.signbit(s[:2]).tolist() == [False, True] and s[:2].tolist() == [0.0, 0.0]
    assert c[:2].tolist() == [1.0, 1.0]
    assert np.isnan(s[2:]).all() and np.isnan(c[2:]).all()


def test_inside_compile_the_same_bits():
    x = _inputs(np.random.default_rng(3))
    with mx.stream(mx.cpu):
        v = mx.array(x, dtype=mx.float64)
        eager = [np.array(a) for a in engine64.sincos64(v)]
        traced = [np.array(a) for a in mx.compile(lambda a: engine64.sincos64(a))(v)]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(eager, traced))
