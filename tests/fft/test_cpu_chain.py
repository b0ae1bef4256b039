"""The cpu backend's float64 FFT chain (mlx_precise.fft.cpu.chain): its two routes
(numpy writing into a buffer of MLX's allocator; scipy's threads for large steps)
give numpy's float64 transforms of the float64 value bit for bit, the norm factor
is one float64 product per part, and the operands' carried values are never
written."""

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.doubleword.engine64 import from64
from mlx_precise.extended import carry
from mlx_precise.fft import cpu, nd


def _specials(shape, complex_):
    rng = np.random.default_rng(3)
    v = rng.standard_normal(shape) * 2.0 ** rng.integers(-30, 30, shape)
    if complex_:
        v = v + 1j * rng.standard_normal(shape)
    flat = v.reshape(-1)
    flat[:6] = [np.inf, -np.inf, np.nan, 0.0, -0.0, 5e-324]
    return v


def _reference(kind, v, s, axes, norm):
    """numpy's float64 transform, step by step in nd's order, then the factor."""
    for k, n, ax in nd._steps(kind, s, axes):
        v = getattr(np.fft, k)(v, n=n, axis=ax)
    factor = nd._norm_factor(kind, int(np.prod(s)), norm)
    if factor is not None:
        c = float(factor)
        if np.iscomplexobj(v):
            v.real *= c
            v.imag *= c
        else:
            v = v * c
    return v


def _bits(v):
    """The bits of float64 values, every NaN as one (pocketfft's SIMD and scalar
    paths may give NaNs of either sign)."""
    v = np.where(np.isnan(v), np.nan, v)
    return np.ascontiguousarray(v).view(np.uint64).tobytes()


@pytest.mark.parametrize("threaded", [False, True])
@pytest.mark.parametrize("kind, s, axes, norm", [
    ("rfft", (12, 10), (0, 2), "backward"), ("irfft", (7, 16), (1, 2), "ortho"),
    ("fft", (5, 9, 12), (0, 1, 2), "forward"), ("ifft", (16,), (1,), "backward"),
    ("rfft", (20,), (2,), "forward")])
def test_chain_routes_give_numpy_float64_bits(monkeypatch, threaded, kind, s, axes, norm):
    if threaded:  # every step through scipy's threads, as on a machine with many cores
        monkeypatch.setattr(cpu, "THREADED_POINTS", 0)
        monkeypatch.setattr(cpu, "_CORES", 8)
    v = _specials((4, 9, 11), complex_=kind != "rfft")
    re = mx.array(v.real.copy(), dtype=mx.float64)
    im = mx.array(v.imag.copy(), dtype=mx.float64) if np.iscomplexobj(v) else None
    before = [_bits(np.asarray(w)) for w in (re, im) if w is not None]
    x = from64(re, im)
    y = nd.transform(kind, x, s, axes, norm, round_output=False, backend="cpu")
    got = np.asarray(y.wide[0]).astype(np.complex128)
    if y.wide[1] is not None:
        got.imag = np.asarray(y.wide[1])
    with np.errstate(invalid="ignore", over="ignore"):
        ref = _reference(kind, v, s, axes, norm)
    assert _bits(got.real) == _bits(np.real(ref)) and _bits(got.imag) == _bits(
        np.imag(ref).astype(np.float64) if np.iscomplexobj(ref) else np.zeros(ref.shape))
    # the high word is the float32 rounding of the float64 value
    hi = np.array(y.hi)
    with np.errstate(over="ignore", invalid="ignore"):
        r32 = ref.astype(hi.dtype)
    for h, r in ((hi.real, r32.real), (hi.imag, r32.imag)):
        assert np.array_equal(h, r, equal_nan=True) and np.array_equal(np.signbit(h[h == 0]),
                                                                       np.signbit(r[r == 0]))
    # the operand's float64 value was read, not written
    assert [_bits(np.asarray(w)) for w in (re, im) if w is not None] == before


def test_carried_real_value_is_read_through_a_read_only_view():
    from mlx_precise.fft import engine

    a = np.linspace(-3, 5, 24, dtype=np.float32).reshape(2, 12)
    with mp.use_backend("cpu"), mp.extended_precision():
        z = mx.array(a) * np.float32(1.1)
        w = carry.words_of(z)
        view, holder = engine._float64(w)
        assert holder is None
        with pytest.raises(ValueError):
            view[0, 0] = 0.0
        y = mx.fft.fft(z)  # a complex transform of a real carried value
        mx.eval(y)
    expected = a.astype(np.float64) * np.float64(np.float32(1.1))
    assert np.array_equal(view, expected) and np.array_equal(w.to_float64(), expected)
    w.to_float64()[0, 0] = 7.0  # the public method's array is the caller's own copy
    assert np.array_equal(w.to_float64(), expected)
