"""Gradients of the double-word elementwise ops: the VJP runs the same kernels and
matches the analytic adjoint (float64 oracle); paths without a gradient raise."""

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.core.autodiff import NotDifferentiableError

BACKENDS = ("emulate", "cpu")


def c64(rng, shape):
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)


@pytest.mark.parametrize("backend", BACKENDS)
def test_complex_multiply_vjp_with_broadcasting(backend):
    rng = np.random.default_rng(0)
    a, b, g = c64(rng, (3, 1, 5)), c64(rng, (4, 1)), c64(rng, (3, 4, 5))
    _, (da, db) = mx.vjp(lambda x, y: mp.complex_multiply_extended(x, y, backend=backend),
                         [mx.array(a), mx.array(b)], [mx.array(g)])
    g64, a64, b64 = (v.astype(np.complex128) for v in (g, a, b))
    want_a = (g64 * np.conj(b64)).sum(axis=1, keepdims=True)  # MLX: da = g conj(b)
    want_b = (g64 * np.conj(a64)).sum(axis=(0, 2), keepdims=True)[0]
    assert da.shape == a.shape and db.shape == b.shape
    np.testing.assert_allclose(np.array(da), want_a, rtol=3e-7, atol=1e-6)
    np.testing.assert_allclose(np.array(db), want_b, rtol=3e-7, atol=1e-6)
    # same convention as MLX's own complex multiply
    _, ref = mx.vjp(lambda x, y: x * y, [mx.array(a), mx.array(b)], [mx.array(g)])
    np.testing.assert_allclose(np.array(da), np.array(ref[0]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_complex_multiply_gradient_is_exactly_rounded_elementwise(backend):
    """Without broadcasting, each gradient entry is one double-word product rounded
    once: equal to the float64 product rounded to complex64 (components well away
    from cancellation)."""
    rng = np.random.default_rng(1)
    a, b, g = c64(rng, 1000), c64(rng, 1000), c64(rng, 1000)
    _, (da, _) = mx.vjp(lambda x, y: mp.complex_multiply_extended(x, y, backend=backend),
                        [mx.array(a), mx.array(b)], [mx.array(g)])
    want = (g.astype(np.complex128) * np.conj(b.astype(np.complex128))).astype(np.complex64)
    assert np.mean(np.array(da) == want) > 0.999


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [3, 4, 1000])
def test_fft_scale_vjp(backend, n):
    rng = np.random.default_rng(n)
    for x in (rng.standard_normal((4, 6)).astype(np.float32), c64(rng, (4, 6))):
        g = rng.standard_normal(x.shape).astype(x.dtype)
        _, (dx,) = mx.vjp(lambda v: mp.fft_scale_extended(v, n, backend=backend),
                          [mx.array(x)], [mx.array(g)])
        want = (g.astype(np.float64 if x.dtype == np.float32 else np.complex128) / n).astype(x.dtype)
        np.testing.assert_array_equal(np.array(dx), want)  # one rounding of g/n


@pytest.mark.parametrize("backend", BACKENDS)
def test_precision_aware_twins_are_differentiable(backend):
    x = mx.array(np.linspace(-1, 1, 8, dtype=np.float32))
    with mp.use_backend(backend), mp.extended_precision():
        dx = mx.grad(lambda v: mp.fft_scale(v, 3).sum())(x)
        c = (x + 1j * x).astype(mx.complex64)
        dc = mx.grad(lambda v: mx.real(mp.complex_multiply(v, c)).sum())(c)
    np.testing.assert_array_equal(np.array(dx), np.full(8, np.float32(1 / 3)))
    np.testing.assert_allclose(np.array(dc), np.conj(np.array(c)), rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_gradient_raises(backend):
    x = mx.ones((4,), mx.complex64)
    d = mp.DoubleWord.from_complex64(x)
    cases = [
        lambda v: mp.complex_multiply_extended(v, v, round_output=False, backend=backend).hi,
        lambda v: mp.complex_multiply_extended(mp.DoubleWord(v, v * 0), x, backend=backend),
        lambda v: mp.fft_scale_extended(v, 3, round_output=False, backend=backend).hi,
        lambda v: mp.fft_scale_extended(mp.DoubleWord(v, v * 0), 3, backend=backend),
    ]
    for f in cases:
        with pytest.raises(NotDifferentiableError, match="not differentiable"):
            mx.grad(lambda v: mx.real(f(v)).sum())(x)
    # the values themselves are unchanged by the guard
    y = mp.fft_scale_extended(d, 4, round_output=False, backend=backend)
    np.testing.assert_array_equal(np.array(y.hi), np.full(4, 0.25 + 0j, np.complex64))


@pytest.mark.parametrize("backend", BACKENDS)
def test_second_derivatives(backend):
    """The VJPs are differentiable themselves (same kernels), matching MLX's own
    complex multiply and the exact values of a quadratic."""
    x = mx.array([1.0, 2.0, 3.0])
    h = mx.grad(lambda v: mx.grad(lambda w: (mp.fft_scale_extended(w, 3, backend=backend) ** 2).sum())(v).sum())(x)
    np.testing.assert_allclose(np.array(h), np.full(3, 2 / 9), rtol=1e-7)
    c = (x + 1j * x[::-1]).astype(mx.complex64)

    def second(mul):
        return mx.grad(lambda v: mx.real(mx.grad(lambda w: mx.real(mul(w, w)).sum())(v)).sum())(c)

    np.testing.assert_array_equal(
        np.array(second(lambda a, b: mp.complex_multiply_extended(a, b, backend=backend))),
        np.array(second(lambda a, b: a * b)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_hyena_second_derivative_raises(backend):
    u, k = mx.random.normal((1, 2, 8)), mx.random.normal((2, 8))
    with pytest.raises(NotDifferentiableError, match="second derivatives are not implemented"):
        mx.grad(lambda v: mx.grad(
            lambda w: (mp.hyena_conv_extended(w, k, backend=backend) ** 2).sum())(v).sum())(u)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scale_extended(backend):
    """x * factor for a rational factor: one rounding of the exact product (Fraction
    oracle), the same VJP, and clear errors for a bad factor."""
    from fractions import Fraction

    from mlx_precise.doubleword.elementwise import scale_extended

    x = np.linspace(-3, 3, 13, dtype=np.float32)
    f = Fraction(7, 3)
    y = np.array(scale_extended(mx.array(x), f, backend=backend))
    want = [np.float32(float(Fraction(float(v)) * f)) for v in x]  # |x f| well inside range
    np.testing.assert_array_equal(y, np.array(want, np.float32))
    _, (dx,) = mx.vjp(lambda v: scale_extended(v, f, backend=backend), [mx.array(x)],
                      [mx.ones(x.shape)])
    np.testing.assert_array_equal(np.array(dx), np.full(x.shape, np.float32(float(f))))
    for bad in (0, -1, Fraction(-1, 2)):
        with pytest.raises(ValueError, match="factor must be > 0"):
            scale_extended(mx.array(x), bad, backend=backend)
    with pytest.raises(TypeError, match="x has dtype"):
        scale_extended(mx.arange(3), f, backend=backend)
