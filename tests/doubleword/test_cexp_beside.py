"""engine64.cexp64 from FUSE_MIN elements begins e^re on a second CPU stream
(engine64._exp64_beside) while the sine and cosine of im are evaluated: against
numpy's long double (x87, 64-bit mantissa) exp, sin and cos; the same bits when
traced by mx.compile (where it stays on the current stream)."""

import mlx.core as mx
import numpy as np
import pytest

from mlx_precise.doubleword import engine64


def _values(n):
    rng = np.random.default_rng(7)
    re = rng.uniform(-30.0, 30.0, n)
    im = rng.uniform(-300.0, 300.0, n)
    re[:4] = [0.0, -800.0, 720.0, 1.0]
    im[:4] = [0.0, -0.0, 1.0, 1e6]
    return re, im


def _f64(a):
    return mx.array(a, dtype=mx.float64)


def _cexp(re, im):
    with mx.stream(mx.cpu):
        z = engine64.cexp64(engine64.from64(_f64(re)), engine64.from64(_f64(im)))
        return tuple(np.array(v) for v in z.wide)


@pytest.mark.skipif(np.finfo(np.longdouble).nmant < 63, reason="needs x87 long double")
@pytest.mark.parametrize("n", [engine64.FUSE_MIN, 3 * engine64.TRIG_PIECE])
def test_against_long_double(n):
    re, im = _values(n)
    got_re, got_im = _cexp(re, im)
    e = np.exp(re.astype(np.longdouble))
    b = im.astype(np.longdouble)
    for got, want in ((got_re, e * np.cos(b)), (got_im, e * np.sin(b))):
        with np.errstate(over="ignore"):
            want64 = want.astype(np.float64)
        finite = np.isfinite(want64) & (want64 != 0)
        assert np.array_equal(got[~finite], want64[~finite])
        err = np.abs((got[finite] - want[finite]) / want[finite])
        assert float(err.max()) < 2.0**-50, float(err.max())


def test_compiled_same_bits():
    re, im = _values(engine64.FUSE_MIN)
    eager = _cexp(re, im)

    def f(a, b):
        z = engine64.cexp64(engine64.from64(a), engine64.from64(b))
        return list(z.wide)

    with mx.stream(mx.cpu):
        traced = [np.array(v) for v in mx.compile(f)(_f64(re), _f64(im))]
    for a, b in zip(eager, traced):
        assert np.array_equal(a.view(np.uint64), b.view(np.uint64))
