"""The cpu flow's N-D FFTs read a carried value's float64 value and keep the float64
result (no join of the words in between, no split on the way out): the result
equals numpy's float64 transform of the float64 operand (pocketfft both: to a few
float64 ulps of the largest component), its high word is that value's float32
rounding, and a second transform of it stays float64."""

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.extended import carry


def _value(y):
    re, im = carry.wide_value(y)
    v = np.array(re).astype(np.complex128)
    if im is not None:
        v.imag = np.array(im)
    return v


@pytest.mark.parametrize("name, axes", [("rfft2", (-2, -1)), ("fftn", (0, 1, 2)),
                                        ("rfftn", (0, 2))])
def test_cpu_fft_reads_and_keeps_the_float64_value(name, axes):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((6, 10, 16)).astype(np.float32)
    c = np.float32(1.1)
    with mp.use_backend("cpu"), mp.extended_precision():
        z = mx.array(a) * c  # carried: its float64 value a * c, not a float32
        y = getattr(mx.fft, name)(z, axes=axes)
        back = mx.fft.ifftn(y, axes=axes)
        mx.eval(y, back)
    assert carry.wide_value(y) is not None and carry.wide_value(back) is not None
    v64 = a.astype(np.float64) * np.float64(c)
    ref = getattr(np.fft, name)(v64, axes=axes)
    got = _value(y)
    assert np.abs(got - ref).max() <= 1e-14 * np.abs(ref).max()
    hi = np.array(y)
    assert hi.real.tobytes() == got.real.astype(np.float32).tobytes()
    assert hi.imag.tobytes() == got.imag.astype(np.float32).tobytes()
    full = np.fft.ifftn(ref, axes=axes)
    assert np.abs(_value(back) - full).max() <= 1e-14 * np.abs(full).max()
