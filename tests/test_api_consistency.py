"""API consistency: every path of a function takes the same arguments and inputs.

* The plain and extended twins of every precision-aware function take the same
  arguments (checked at registration and here), and each argument has MLX's
  meaning on both paths (``norm``, ``n``, ``axis``, ``stream``); unknown keywords
  and backend names raise.
* float64 / complex128 input enters the extended ops at full precision (split into
  a DoubleWord) or is refused with a TypeError, never rounded silently.
* Every backend applies the same size limits, before allocating.
* Array-likes everywhere; float64 data from lists keeps its precision.
* DoubleWord prints its values and has arithmetic.
* ``stream=`` as MLX takes it, on every op; the API table of docs/api.md is the
  actual signatures (generated here: ``python tests/test_api_consistency.py``
  rewrites it).

Oracles: numpy float64 FFTs, exact ``fractions.Fraction`` arithmetic.
"""

import inspect
import re
import sys
from fractions import Fraction
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise import DoubleWord
from mlx_precise.doubleword.types import read_input
from mlx_precise.doubleword.aware import precision_aware, precision_aware_functions, twin_mismatch

BACKENDS = ("cpu", "emulate")
U2 = Fraction(1, 2**48)
NORMS = ("backward", "ortho", "forward")


def _np(kind, x, **kw):
    return getattr(np.fft, kind)(x, **kw)


def _rel(y, ref):
    return float(np.linalg.norm(np.asarray(y) - ref) / np.linalg.norm(ref))


# ---- the twins take the same arguments and honour them ------------------------------


def test_every_registered_pair_takes_the_same_arguments():
    fns = precision_aware_functions()
    assert len(fns) == 17  # the table in docs/api.md
    for name, fn in fns.items():
        assert twin_mismatch(fn.plain, fn.extended) is None, name
        assert inspect.signature(fn) == inspect.signature(fn.extended), name


def test_registration_refuses_twins_with_different_arguments():
    def ext(x, n=None, *, round_output=True, backend=None):
        return x

    def plain_kwargs(x, n=None, **kwargs):
        return x

    def plain_other_default(x, n=3):
        return x

    for plain in (plain_kwargs, plain_other_default):
        with pytest.raises(TypeError, match="twins take different arguments"):
            precision_aware(ext)(plain)
    assert "plain_kwargs" not in precision_aware_functions()


@pytest.mark.parametrize("kind", ["fft", "ifft", "rfft", "irfft"])
@pytest.mark.parametrize("norm", NORMS)
def test_fft_norm_outside_and_inside(kind, norm):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(12)
    if kind in ("fft", "ifft"):
        x = x + 1j * rng.standard_normal(12)
    x32 = x.astype(np.complex64 if np.iscomplexobj(x) else np.float32)
    ref = _np(kind, x32.astype(np.complex128 if np.iscomplexobj(x) else np.float64), norm=norm)
    fn = getattr(mp.fft, kind)
    assert _rel(fn(mx.array(x32), norm=norm), ref) < 1e-6  # plain float32: MLX's own
    for b in BACKENDS:
        with mp.extended_precision():
            y = fn(mx.array(x32), norm=norm, round_output=False, backend=b)
        assert _rel(y.to_float64(), ref) < 1e-13, b


def test_fft_positional_arguments_and_stream_as_mlx():
    x = mx.array(np.arange(8, dtype=np.float32).reshape(2, 4))
    ref = np.fft.rfft(np.arange(8.0).reshape(2, 4), 6, 0, "ortho")
    y = mp.fft.rfft(x, 6, 0, "ortho", stream=mx.cpu)
    assert np.allclose(np.array(y), ref, rtol=1e-6, atol=1e-6)
    with mp.extended_precision():
        y = mp.fft.rfft(x, 6, 0, "ortho", stream=mx.cpu, backend="cpu")
    assert np.allclose(np.array(y), ref, rtol=1e-7, atol=1e-7)


def test_unknown_keywords_and_backends_raise_in_and_out_of_the_block():
    x = mx.ones(4)
    u, k = mx.ones((1, 1, 4)), mx.ones((1, 4))
    for enabled in (False, True):
        with mp.extended_precision(enabled):
            with pytest.raises(TypeError, match="fft\\(\\): got an unexpected keyword argument 'bogus_kw'"):
                mp.fft.fft(x, bogus_kw=3)
            with pytest.raises(ValueError, match="unknown backend 'bogus'"):
                mp.fftconv(u, k, backend="bogus")
            with pytest.raises(TypeError, match="unexpected keyword"):
                mp.complex_multiply(x, x, bogus=1)
            with pytest.raises(ValueError, match="norm"):
                mp.fft.fft(x, norm="bogus")


def test_plain_round_output_false_is_the_plain_result_exactly():
    x = mx.array(np.random.default_rng(0).standard_normal(8).astype(np.float32))
    d = mp.fft.rfft(x, round_output=False, backend="cpu")
    assert isinstance(d, DoubleWord)
    assert np.array_equal(np.array(d.hi), np.array(mx.fft.rfft(x)))
    assert not np.any(np.array(d.lo))


# ---- float64 input at full precision, or refused ------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_float64_input_enters_at_full_precision(backend):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(64)
    ref = np.fft.fft(x)
    for given in (x, mx.array(x, dtype=mx.float64)):
        y = mp.fft_extended(given, round_output=False, backend=backend).to_float64()
        assert _rel(y, ref) < 1e-13  # was 3e-8: x rounded to float32 first
    z = x[:32] + 1j * x[32:]
    y = mp.fft_extended(z, round_output=False, backend=backend).to_float64()
    assert _rel(y, np.fft.fft(z)) < 1e-13
    y = mp.irfft_extended(np.fft.rfft(x), round_output=False, backend=backend).to_float64()
    assert _rel(y, x) < 1e-13
    # complex multiply and scaling of complex128 / float64 data, against exact rationals
    a, b = complex(0.1, 1 / 3), complex(2 / 7, -0.3)
    p = mp.complex_multiply_extended(np.array([a]), np.array([b]), round_output=False,
                                     backend=backend).to_float64()[0]
    ar, ai, br, bi = (Fraction(v) for v in (a.real, a.imag, b.real, b.imag))
    exact = (ar * br - ai * bi, ar * bi + ai * br)
    for got, want in zip((p.real, p.imag), exact):
        assert abs(Fraction(got) - want) <= 8 * U2 * abs(want)
    s = mp.fft_scale_extended(np.array([0.1]), 3, round_output=False,
                              backend=backend).to_float64()[0]
    assert abs(Fraction(s) - Fraction(0.1) / 3) <= 5 * U2 * Fraction(0.1) / 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_float64_input_refused_where_it_cannot_enter(backend):
    x64 = np.ones((1, 2, 8))
    w = mx.ones((2, 3))
    with pytest.raises(TypeError, match="x has dtype numpy float64, which this op would have "
                                        "to round"):
        mp.depthwise_conv_extended(x64, w, backend=backend)
    with pytest.raises(TypeError, match="u has dtype mlx float64"):
        mp.hyena_conv_extended(mx.array(x64, dtype=mx.float64), w, backend=backend)


def test_read_input_policy():
    x = np.array([0.1, 1 / 3])
    with pytest.raises(TypeError, match="numpy float64"):
        read_input(x, "x")
    d = read_input(x, "x", "words")  # the double-word ops' reading: split at full precision
    ref = DoubleWord.from_float64(x)
    assert np.array_equal(np.array(d.hi), np.array(ref.hi))
    assert np.array_equal(np.array(d.lo), np.array(ref.lo))
    assert read_input([[1.0, 0.1]], "A", "float64").dtype == np.float64  # unrounded
    assert read_input([1.0], "x").dtype == mx.float32  # MLX's rule elsewhere


def test_plain_twin_reads_float64_as_the_extended_one_then_rounds():
    x = np.random.default_rng(2).standard_normal(16)
    y = mp.fft.fft(x)
    assert np.array_equal(np.array(y), np.array(mx.fft.fft(mx.array(x.astype(np.float32)))))


# ---- one size check for every backend, before allocating ----------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_size_limits_on_every_backend(backend):
    z = mx.zeros((1,), mx.complex64)
    for n in (2**30 + 1, 2**31):
        with pytest.raises(ValueError, match="at most 2\\^30 points"):
            mp.fft_extended(z, n=n, backend=backend)
    with pytest.raises(ValueError, match="at most 2\\^30 points"):
        mp.rfft_extended(mx.zeros((1,)), n=2**40, backend=backend)
    with pytest.raises(ValueError, match="Bluestein's padded transform"):
        mp.fft_extended(mx.zeros((2**10,), mx.complex64), n=2**29 + 1, backend=backend)
    u, k = mx.zeros((1, 1, 4)), mx.zeros((1, 4))
    with pytest.raises(ValueError, match="at most 2\\^30 points"):
        mp.hyena_conv_extended(u, k, fft_size=2**31, backend=backend)
    with pytest.raises(ValueError, match="at most 2\\^30 points"):
        mp.fftconv(u, k, fft_size=2**31)  # the plain twin too


# ---- array-likes --------------------------------------------------------------------


def test_array_likes_with_float64_data_keep_full_precision():
    v = mp.norm([[1.0, 2.0], [3.0, 4.0]])
    assert float(v) == np.sqrt(30.0)
    c = mp.dgemm_emulated([[0.1, 0.2]], [[3.0], [1 / 3]])
    exact = Fraction(0.1) * 3 + Fraction(0.2) * Fraction(1 / 3)
    # float64 precision (a float32 rounding of 0.1 would be off by 1e-9)
    assert abs(Fraction(float(np.array(c)[0, 0])) - exact) <= exact / 2**51
    d = DoubleWord.from_float64([0.1, 0.2])
    ref = DoubleWord.from_float64(np.array([0.1, 0.2]))
    assert np.array_equal(d.to_float64(), ref.to_float64())
    for got, want in zip(_exact(d), (Fraction(0.1), Fraction(0.2))):  # not float32's 1e-9
        assert abs(got - want) <= want / 2**48


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_arguments_as_arrays(backend):
    x = mx.array([1.0, 2.0, 3.0])
    want = np.array(mp.fft_scale_extended(x, 3, backend=backend))
    for n in (mx.array(3), np.int64(3), np.array(3)):
        assert np.array_equal(np.array(mp.fft_scale_extended(x, n, backend=backend)), want)
        assert np.allclose(np.array(mp.fft_scale(x, n)), want)
    for bad in (mx.array(3.0), mx.array([3]), mx.array(True)):
        with pytest.raises(ValueError, match="n must be an integer >= 1"):
            mp.fft_scale_extended(x, bad, backend=backend)


# ---- DoubleWord repr and arithmetic -------------------------------------------------


def test_repr_shows_values():
    d = DoubleWord.from_float64(np.array([0.1, 1 / 3]))
    assert repr(d) == "DoubleWord([0.1, 0.333333333333333], dtype=float32)"
    assert repr(DoubleWord.from_float64(np.array(1 + 2j))) == "DoubleWord(1+2j, dtype=complex64)"
    assert "0.1" in repr(-d) and "-0.1" in repr(-d)


def _exact(d: DoubleWord):
    hi, lo = np.array(d.hi), np.array(d.lo)
    return [Fraction(float(h)) + Fraction(float(low)) for h, low in zip(hi.ravel(), lo.ravel())]


def _check(z: DoubleWord, want, bound):
    got = _exact(z)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert abs(g - w) <= bound * abs(w), (float(g), float(w))


@pytest.mark.parametrize("backend", BACKENDS)
def test_arithmetic_against_exact_rationals(backend):
    rng = np.random.default_rng(4)
    n = 200
    a = DoubleWord.from_float64(rng.standard_normal(n) * 2.0 ** rng.integers(-20, 20, n))
    b = DoubleWord.from_float64(rng.standard_normal(n) * 2.0 ** rng.integers(-20, 20, n))
    f32 = rng.standard_normal(n).astype(np.float32)
    ea, eb, ef = _exact(a), _exact(b), [Fraction(float(v)) for v in f32]
    add_b, mul_b, div_b = 3 * U2 + 13 * U2 / 2**24, 4 * U2, Fraction(98, 10) * U2
    with mp.use_backend(backend):
        _check(a + b, [x + y for x, y in zip(ea, eb)], add_b)
        _check(a - b, [x - y for x, y in zip(ea, eb)], add_b)
        _check(a * b, [x * y for x, y in zip(ea, eb)], mul_b)
        _check(a / b, [x / y for x, y in zip(ea, eb)], div_b)
        _check(a * mx.array(f32), [x * y for x, y in zip(ea, ef)], mul_b)
        _check(f32 - a, [y - x for x, y in zip(ea, ef)], add_b)  # numpy defers to __rsub__
        # Python scalars enter at their float64 value: 0.1 is not rounded to float32
        _check(a + 0.1, [x + Fraction(0.1) for x in ea], add_b)
        _check(1 / a, [1 / x for x in ea], div_b)
        _check(0.1 - a, [Fraction(0.1) - x for x in ea], add_b)
        _check(-a, [-x for x in ea], 0)
        # broadcasting with a 0-d operand, and a float64 numpy operand
        _check(a * np.float64(1 / 3), [x * Fraction(1 / 3) for x in ea], mul_b)


@pytest.mark.parametrize("backend", BACKENDS)
def test_complex_arithmetic(backend):
    rng = np.random.default_rng(5)
    n = 50
    za = rng.standard_normal(n) + 1j * rng.standard_normal(n)
    zb = rng.standard_normal(n) + 1j * rng.standard_normal(n)
    a, b = DoubleWord.from_float64(za), DoubleWord.from_float64(zb)
    with mp.use_backend(backend):
        p, s, q = a * b, a - 0.5, a / b
    (pr, pi), (sr, si), (ar, ai), (br, bi), (qr, qi) = (
        [_exact(w) for w in d.parts()] for d in (p, s, a, b, q))
    for i in range(n):
        xr, xi, yr, yi = ar[i], ai[i], br[i], bi[i]  # the operands' exact values
        wr, wi = xr * yr - xi * yi, xr * yi + xi * yr
        err2 = (pr[i] - wr) ** 2 + (pi[i] - wi) ** 2
        assert err2 <= (Fraction(866, 100) * U2) ** 2 * (wr**2 + wi**2)
        assert abs(sr[i] - (xr - Fraction(1, 2))) <= 4 * U2 * abs(xr - Fraction(1, 2))
        assert si[i] == xi
        d2 = yr**2 + yi**2  # x / y = x conj(y) / |y|^2, exactly
        vr, vi = (xr * yr + xi * yi) / d2, (xi * yr - xr * yi) / d2
        assert (qr[i] - vr) ** 2 + (qi[i] - vi) ** 2 <= (32 * U2) ** 2 * (vr**2 + vi**2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_complex_division_far_from_one(backend):
    """Complex quotients with |y| beyond 1.8e19 (|y|^2 would overflow float32) or
    below 1e-19 (it would underflow), and |x| near float32's maximum: the kernel
    path scales by powers of two first. Operands stay above 1e-28 (~2^-93), where
    a low word is still a normal float32 (the emulator flushes subnormals, as Apple
    GPUs do). Oracle: exact rationals of the operands."""
    rng = np.random.default_rng(9)
    n = 40
    mag_y = 10.0 ** rng.uniform(-28, 38.5, n)
    mag_y[:4] = [3e38, 2e19, 1e-19, 1e-28]
    mag_x = 10.0 ** rng.uniform(-28, 38.5, n)
    mag_x[:4] = [3e38, 1e30, 1e-20, 1e-28]
    za = mag_x * np.exp(1j * rng.uniform(0, 2 * np.pi, n))
    zb = mag_y * np.exp(1j * rng.uniform(0, 2 * np.pi, n))
    a, b = DoubleWord.from_float64(za), DoubleWord.from_float64(zb)
    with mp.use_backend(backend):
        q = a / b
    (ar, ai), (br, bi) = ([_exact(w) for w in d.parts()] for d in (a, b))
    qh, ql = np.array(q.hi), np.array(q.lo)
    checked = 0
    for i in range(n):
        d2 = br[i] ** 2 + bi[i] ** 2
        vr, vi = (ar[i] * br[i] + ai[i] * bi[i]) / d2, (ai[i] * br[i] - ar[i] * bi[i]) / d2
        size = vr**2 + vi**2
        if not Fraction(2) ** -200 < size < Fraction(2) ** 250:  # outside float32's range:
            continue  # the quotient itself over/underflows (checked by float32 elsewhere)
        checked += 1
        qr, qi = (Fraction(float(part(qh[i]))) + Fraction(float(part(ql[i])))
                  for part in (np.real, np.imag))
        assert (qr - vr) ** 2 + (qi - vi) ** 2 <= (32 * U2) ** 2 * size, i
    assert checked >= 25


@pytest.mark.parametrize("backend", BACKENDS)
def test_arithmetic_special_values(backend):
    a = DoubleWord.from_float64(np.array([1.0, -2.5, 3e38]))
    with mp.use_backend(backend):
        z = a * mx.array(np.array([np.inf, 0.0, 10.0], np.float32))
        assert np.array(z.hi).tolist()[0] == np.inf and np.array(z.hi)[2] == np.inf
        assert not np.any(np.array(z.lo)[[0, 2]])
        with pytest.raises(TypeError, match="expected float32 or complex64"):
            a + mx.array([1, 2, 3])
        with pytest.raises(ValueError, match="do not broadcast"):
            a + mx.ones(2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_complex_division_special_values_follow_float32(backend):
    """x / 0, x / Inf, Inf / y, NaN operands and a quotient that overflows: MLX's
    complex64 quotient (Inf, 0, NaN: never NaN where float32 gives Inf), with a
    zero low word."""
    za = np.array([1 + 1j, 1 + 1j, np.inf + 0j, 0j, np.nan + 1j, 3e38 + 3e38j, -2 + 0j],
                  np.complex64)
    zb = np.array([0j, np.inf + 0j, 1 + 1j, 1 + 1j, 1 + 1j, 1e-10 + 0j, -0.0 + 0j],
                  np.complex64)
    want = np.array(mx.array(za) / mx.array(zb))
    a, b = DoubleWord.from_array(mx.array(za)), DoubleWord.from_array(mx.array(zb))
    with mp.use_backend(backend):
        q = a / b
    hi, lo = np.array(q.hi), np.array(q.lo)
    assert np.array_equal(hi, want, equal_nan=True), (hi, want)
    assert not np.any(lo)


# ---- stream=: MLX's keyword on every op that computes --------------------------------


def _stream_cases():
    """(name, call(backend, **kw), takes backend) for every public op with ``stream``;
    small shapes that other tests use (the emulator's kernels are cached)."""
    rng = np.random.default_rng(20)
    f32 = lambda *s: mx.array(rng.standard_normal(s).astype(np.float32))  # noqa: E731
    u, k, D, w = f32(1, 2, 16), f32(2, 16), f32(2), f32(2, 3)
    A, B = rng.standard_normal((8, 16)), rng.standard_normal((16, 8))
    x = f32(4, 8)
    q16 = mx.array(rng.integers(-2**15, 2**15, (4, 8)).astype(np.int16))
    q32 = mx.array(rng.integers(-2**31, 2**31, (4, 8)).astype(np.int32))
    a8 = mx.array(rng.integers(-128, 128, (4, 16)).astype(np.int8))
    b8 = mx.array(rng.integers(-128, 128, (16, 8)).astype(np.int8))
    dwa, dwb = DoubleWord.from_float64(A), DoubleWord.from_float64(B)

    def in_block(fn):  # the extended twin through the precision-aware entry point
        def call(**kw):
            with mp.extended_precision():
                return fn(**kw)
        return call

    def sf16_boundary(backend, **kw):
        with mp.sf16(None, backend=backend):
            return mp.sf16_boundary(x, **kw)

    def sf16_matmul(backend, **kw):
        with mp.sf16(None, backend=backend):
            return mp.sf16_matmul(x, x.T, **kw)

    return [
        ("hyena_conv_extended", lambda b, **kw: mp.hyena_conv_extended(u, k, D, backend=b, **kw), 1),
        ("fftconv", lambda b, **kw: mp.fftconv(u, k, D, **kw), 0),
        ("fftconv (extended)", lambda b, **kw: in_block(mp.fftconv)(
            u=u, k=k, D=D, backend=b, **kw), 1),
        ("depthwise_conv_extended", lambda b, **kw: mp.depthwise_conv_extended(
            u, w, D, backend=b, **kw), 1),
        ("depthwise3_extended", lambda b, **kw: mp.depthwise3_extended(u, w, backend=b, **kw), 1),
        ("depthwise_conv", lambda b, **kw: mp.depthwise_conv(u, w, D, **kw), 0),
        ("depthwise3", lambda b, **kw: mp.depthwise3(u, w, **kw), 0),
        ("norm", lambda b, **kw: mp.norm(A, backend=b, **kw), 1),
        ("dgemm_emulated", lambda b, **kw: mp.dgemm_emulated(A, B, backend=b, **kw), 1),
        ("esc", lambda b, **kw: mp.esc.esc(A, B, backend=b, **kw), 1),
        ("esc_estimate", lambda b, **kw: mp.esc.esc_estimate(A, B, backend=b, **kw), 1),
        ("slices_needed", lambda b, **kw: mp.esc.slices_needed(A, B, backend=b, **kw), 1),
        ("float_to_q115", lambda b, **kw: mp.float_to_q115(x, backend=b, **kw), 1),
        ("float_to_q131", lambda b, **kw: mp.float_to_q131(x, backend=b, **kw), 1),
        ("q115_to_float", lambda b, **kw: mp.q115_to_float(q16, backend=b, **kw), 1),
        ("q131_to_float", lambda b, **kw: mp.q131_to_float(q32, backend=b, **kw), 1),
        ("simulate_q115", lambda b, **kw: mp.simulate_q115(x, backend=b, **kw), 1),
        ("simulate_q131", lambda b, **kw: mp.simulate_q131(x, backend=b, **kw), 1),
        ("sf16_boundary", sf16_boundary, 1),
        ("sf16_matmul", sf16_matmul, 1),
        ("quantize_int8", lambda b, **kw: mp.quantize_int8(x, **kw), 0),
        ("compute_azp_adj", lambda b, **kw: mp.compute_azp_adj(b8, 3, **kw), 0),
        ("int8_matmul", lambda b, **kw: mp.int8_matmul(a8, b8, backend=b, **kw), 1),
        ("scaled_mm", lambda b, **kw: mp.scaled_mm(a8, b8, mx.array([0.5]), mx.array([0.25]),
                                                    backend=b, **kw), 1),
        ("linalg.matmul", lambda b, **kw: mp.linalg.matmul(dwa, dwb, backend=b, **kw), 1),
    ]


_STREAM_CASES = _stream_cases()


def _flat(r):
    """A result as a list of numpy arrays / Python values (bit-exact comparison)."""
    if isinstance(r, DoubleWord):
        return [np.array(r.hi), np.array(r.lo)]
    if isinstance(r, (tuple, list)):
        return [v for x in r for v in _flat(x)]
    return [np.array(r)] if isinstance(r, mx.array) else [r]


def _same(a, b) -> bool:
    fa, fb = _flat(a), _flat(b)
    return len(fa) == len(fb) and all(
        np.array_equal(x, y, equal_nan=True) if isinstance(x, np.ndarray) else x == y
        for x, y in zip(fa, fb))


def _mlx_error(bad) -> type:
    """The exception MLX's own ops raise for ``stream=bad``."""
    try:
        mx.add(mx.zeros(1), 1, stream=bad)
    except Exception as e:  # noqa: BLE001 - we want MLX's class, whatever it is
        return type(e)
    raise AssertionError(f"MLX accepted stream={bad!r}")


def _bad_streams():
    bad = ["cpu", 2.5]
    if not mp.metal_available():
        bad.append(mx.gpu)  # MLX: ValueError, no GPU stream without a GPU backend
    return bad


@pytest.mark.parametrize("name,call,has_backend", _STREAM_CASES, ids=[c[0] for c in _STREAM_CASES])
def test_stream_is_mlx_keyword_and_changes_nothing(name, call, has_backend):
    """A given stream (mx.cpu, a CPU stream, a new CPU stream) gives the result of
    none, bit for bit; a bad value raises the exception class MLX's ops raise,
    naming the function and the argument."""
    fn = name.split(" ")[0].split(".")[-1]
    if name.endswith("(extended)"):  # inside the block the extended twin runs
        fn = mp.precision_aware_functions()[fn].extended.__name__
    for backend in (BACKENDS if has_backend else (None,)):
        want = call(backend)
        for s in (mx.cpu, mx.default_stream(mx.cpu), mx.new_stream(mx.cpu), mx.Device(mx.cpu)):
            assert _same(call(backend, stream=s), want), (name, backend, s)
        for bad in _bad_streams():
            with pytest.raises(_mlx_error(bad), match=rf"{fn}\(\): stream"):
                call(backend, stream=bad)


def test_every_op_with_a_stream_is_tested():
    """The cases above cover every public function that takes ``stream`` (less the
    FFT family and the double-word elementwise ops, tested with their modules)."""
    tested = {c[0].split(" ")[0].split(".")[-1] for c in _STREAM_CASES}
    skip = {"complex_multiply", "complex_multiply_extended", "fft_scale", "fft_scale_extended"}
    have = {n for n in mp.__all__ if callable(getattr(mp, n)) and not isinstance(getattr(mp, n), type)
            and "stream" in inspect.signature(getattr(mp, n)).parameters} - skip
    have |= {n for n in ("esc", "esc_estimate", "slices_needed")}
    have -= {n for n in have if n.endswith("fft_extended")}
    assert have <= tested, sorted(have - tested)


@pytest.mark.parametrize("case", ["hyena_conv_extended", "int8_matmul", "simulate_q115", "esc"])
def test_kernels_launch_on_the_given_stream(monkeypatch, case):
    """The kernels (emulate here, metal alike) launch with the given stream as MLX's
    default: what ``mx.fast.metal_kernel`` and the ops around it run on."""
    from mlx_precise.core import kernels

    seen = []
    build = kernels._build

    def spy(kernel, backend):
        fn = build(kernel, backend)

        def launch(**kw):
            seen.append(mx.default_stream(mx.default_device()))
            return fn(**kw)
        return launch

    monkeypatch.setattr(kernels, "_build", spy)
    s = mx.new_stream(mx.cpu)
    call = dict((c[0], c[1]) for c in _STREAM_CASES)[case]
    mx.eval(*[v for v in _flat(call("emulate", stream=s)) if isinstance(v, mx.array)])
    assert seen and all(x == s for x in seen), (seen, s)


# ---- docs/api.md's table of the public API: the signatures themselves ----------------

API_MD = Path(__file__).resolve().parent.parent / "docs" / "api.md"
TABLE_BEGIN = "<!-- api-table: generated from inspect.signature by tests/test_api_consistency.py -->"
TABLE_END = "<!-- /api-table -->"
_LAYERS_ON_BACKEND = {"FFTConv", "HyenaOperator", "Int8Linear"}  # call the ops below
_FIXED_LAYOUT = {"nn.HyenaOperator": "NLC only: (batch, L, d_model)"}


def _public_api() -> list[tuple[str, object]]:
    """(name as written in the table, object) of the public operations and layers:
    ``mlx_precise``'s functions outside its foundation (``core``), the flow
    (``extended``) and the registry of twins (documented with the context), then ``mlx_precise.fft``,
    ``mlx_precise.esc``, ``mlx_precise.linalg`` and ``mlx_precise.nn``."""
    out = []
    for name in mp.__all__:
        obj = getattr(mp, name)
        if inspect.isfunction(obj) and not obj.__module__.startswith(
                ("mlx_precise.core", "mlx_precise.extended", "mlx_precise.doubleword.aware")):
            out.append((name, obj))
    for mod in ("fft", "esc", "linalg", "nn"):
        m = getattr(mp, mod)
        for name in m.__all__:
            obj = getattr(m, name)
            if inspect.isfunction(obj) or (mod == "nn" and inspect.isclass(obj)):
                out.append((f"{mod}.{name}", obj))
    return out


def _arguments(obj) -> str:
    sig = inspect.signature(obj)
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def _row(name: str, obj) -> str:
    params = inspect.signature(obj).parameters
    from mlx_precise.conv.depthwise import LAYOUTS

    default = params["layout"].default if "layout" in params else None
    if default in LAYOUTS:  # (norm's layout= is a distributed Layout)
        layouts = ", ".join(f"`{v}`" + (" (default)" if v == default else "") for v in LAYOUTS)
    else:
        layouts = _FIXED_LAYOUT.get(name, "")
    stream = "yes" if "stream" in params else ""
    aware = obj in precision_aware_functions().values()
    if aware:
        backends = "plain MLX; cpu, emulate, metal inside `extended_precision()`"
    elif "backend" in params:
        backends = "cpu, emulate, metal"
    elif name.split(".")[-1] in _LAYERS_ON_BACKEND:
        backends = "the active one"
    else:
        backends = "MLX ops" if stream else ""
    args = _arguments(obj).replace("|", "\\|")
    cells = [f"`{name}`", f"`{args}`", layouts, stream, backends]
    return "| " + " | ".join(c or "-" for c in cells) + " |"


def api_table() -> str:
    rows = [_row(n, o) for n, o in _public_api()]
    head = ["| function | arguments | layouts | stream | backends |", "|---|---|---|---|---|"]
    return "\n".join([TABLE_BEGIN, *head, *rows, TABLE_END])


def _documented_table() -> str:
    text = API_MD.read_text()
    m = re.search(re.escape(TABLE_BEGIN) + ".*?" + re.escape(TABLE_END), text, re.S)
    assert m, f"docs/api.md has no generated API table ({TABLE_BEGIN})"
    return m.group(0)


def test_api_table_is_the_signatures():
    """docs/api.md's table of the public API is generated from the signatures; a
    changed signature fails here until ``python tests/test_api_consistency.py``
    regenerates it."""
    assert _documented_table() == api_table(), (
        "docs/api.md's API table differs from the signatures: run "
        "`python tests/test_api_consistency.py` to regenerate it")


def test_api_table_rows():
    """The generator itself: a function with each kind of column, and the table
    lists every public op (so a new one cannot be left out)."""
    rows = {r.split("`")[1]: r for r in api_table().splitlines()[3:-1]}
    assert rows["hyena_conv_extended"] == (
        "| `hyena_conv_extended` | `(u, k, D=None, *, fft_size=None, layout='NCL', "
        "round_output=True, backend=None, stream=None)` | `NCL` (default), `NLC` | yes | "
        "cpu, emulate, metal |")
    assert rows["fftconv"].endswith("| yes | plain MLX; cpu, emulate, metal inside "
                                    "`extended_precision()` |")
    assert rows["quantize_int8"].endswith("| - | yes | MLX ops |")
    assert rows["nn.HyenaOperator"].endswith("| NLC only: (batch, L, d_model) | - | the active one |")
    for name in ("esc.slices_needed", "linalg.matmul", "fft.rfftn", "nn.FFTConv", "norm",
                 "dgemm_emulated", "simulate_q131", "sf16_matmul", "int8_matmul", "scaled_mm"):
        assert name in rows, name
        assert ("stream" in rows[name]) == ("| yes |" in rows[name]), name


if __name__ == "__main__":  # regenerate docs/api.md's table
    text = API_MD.read_text()
    new = re.sub(re.escape(TABLE_BEGIN) + ".*?" + re.escape(TABLE_END),
                 lambda _: api_table(), text, flags=re.S)
    if new == text and TABLE_BEGIN not in text:
        sys.exit(f"{API_MD}: no {TABLE_BEGIN} marker to fill")
    API_MD.write_text(new)
    print(f"{API_MD}: API table regenerated")
