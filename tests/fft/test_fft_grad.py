"""Gradients of the double-word FFTs (public *_extended, the precision-aware twins,
and MLX's own mx.fft.* inside extended_precision()) against the analytic adjoint:
the Jacobian of numpy's longdouble transform, built column by column. MLX's
convention for complex values: the VJP of y = f(x) for cotangent g is the
gradient d/dRe x + i d/dIm x of the real loss Re(sum conj(g) y)."""


import mlx.core as mx
import numpy as np
import pytest
from helpers import float64_gradients

import mlx_precise as mp
from mlx_precise import DoubleWord, NotDifferentiableError, extended_precision

from mlx_fftconv_block import fftconv_ref

BACKENDS = ("cpu", "emulate")
LD, CLD = np.longdouble, np.clongdouble


def adjoint(f, x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """The VJP of the linear map ``f`` (numpy, longdouble) at cotangent g:
    d/dRe x_j + i d/dIm x_j of Re(sum conj(g) f(x)), from f of unit vectors."""
    def loss(v):
        return float(np.real(np.sum(np.conj(g.astype(CLD)) * f(v))))

    out = np.zeros(x.shape, np.complex128)
    for j in np.ndindex(x.shape):
        e = np.zeros(x.shape, CLD if np.iscomplexobj(x) else LD)
        e[j] = 1
        out[j] = loss(e) + (1j * loss(1j * e) if np.iscomplexobj(x) else 0)
    return out if np.iscomplexobj(x) else out.real


def rel(a, b) -> float:
    return float(np.linalg.norm(np.array(a) - b) / np.linalg.norm(b))


def _operands(kind, shape, out_shape, rng):
    x = rng.standard_normal(shape) + (0 if kind == "rfft" else 1j * rng.standard_normal(shape))
    g = rng.standard_normal(out_shape) + (0 if kind == "irfft" else 1j * rng.standard_normal(out_shape))
    x = x.astype(np.float32 if kind == "rfft" else np.complex64)
    return x, g.astype(np.float32 if kind == "irfft" else np.complex64)


ONE_D = [("fft", 12, 0), ("fft", 7, 1), ("ifft", 16, 1), ("ifft", 5, 0), ("rfft", 12, 1),
         ("rfft", 6, 0), ("irfft", 10, 1), ("irfft", 7, 0), ("irfft", 16, 1)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_axis_vjps_match_the_adjoint(backend):
    """fft/ifft/rfft/irfft_extended with n (padding and cutting) and axis."""
    rng = np.random.default_rng(0)
    worst = {}
    for kind, n, axis in ONE_D:
        shape = (5, 9)
        out_len = n // 2 + 1 if kind == "rfft" else n
        out_shape = tuple(out_len if i == axis else s for i, s in enumerate(shape))
        x, g = _operands(kind, shape, out_shape, rng)
        fn = getattr(mp, f"{kind}_extended")
        _, (v,) = mx.vjp(lambda a: fn(a, n=n, axis=axis, backend=backend), [mx.array(x)],
                         [mx.array(g)])
        ref = adjoint(lambda a: getattr(np.fft, kind)(a, n=n, axis=axis), x, g)
        _, (v_plain,) = mx.vjp(lambda a: getattr(mx.fft, kind)(a, n=n, axis=axis),
                               [mx.array(x)], [mx.array(g)])
        assert v.shape == ref.shape and v.dtype == v_plain.dtype, kind
        worst[kind, n, axis] = (rel(v, ref), rel(v_plain, ref))
        # rounded once from a double-word value: at most u = 6e-8 normwise
        assert worst[kind, n, axis][0] <= 4e-8, (kind, n, axis, worst[kind, n, axis])
    print(backend, {k: f"{a:.1e} (float32 MLX {b:.1e})" for k, (a, b) in worst.items()})


ND = [("fft2", "fft", {"s": (4, 6), "norm": "ortho"}),
      ("ifftn", "ifft", {"axes": (0, 2), "norm": "forward"}),
      ("rfft2", "rfft", {"axes": (2, 0)}),
      ("irfftn", "irfft", {"s": (3, 6), "axes": (1, 2), "norm": "forward"}),
      ("irfft2", "irfft", {"norm": "ortho"})]


@pytest.mark.parametrize("backend", BACKENDS)
def test_intercepted_mlx_fft_gradients(backend):
    """mx.grad through MLX's own mx.fft.* inside the block: extended VJPs."""
    rng = np.random.default_rng(1)
    for name, kind, kw in ND:
        shape = (3, 4, 5)
        x, _ = _operands(kind, shape, shape, rng)
        y_shape = getattr(np.fft, name)(x.astype(CLD if np.iscomplexobj(x) else LD), **kw).shape
        _, g = _operands(kind, y_shape, y_shape, rng)
        with mp.use_backend(backend), extended_precision():
            _, (v,) = mx.vjp(lambda a: getattr(mx.fft, name)(a, **kw), [mx.array(x)],
                             [mx.array(g)])
        ref = adjoint(lambda a: getattr(np.fft, name)(a, **kw), x, g)
        _, (v_plain,) = mx.vjp(lambda a: getattr(mx.fft, name)(a, **kw), [mx.array(x)],
                               [mx.array(g)])
        print(f"{backend} {name} {kw}: normwise {rel(v, ref):.1e} "
              f"(float32 MLX {rel(v_plain, ref):.1e})")
        assert rel(v, ref) <= 4e-8, (name, kw, rel(v, ref))


@pytest.mark.parametrize("backend", BACKENDS)
def test_twins_second_order_and_model_gradients(backend):
    rng = np.random.default_rng(2)
    x = mx.array(rng.standard_normal((2, 24)).astype(np.float32))
    v = mx.array(rng.standard_normal((2, 24)).astype(np.float32))

    def energy(a):  # Parseval: sum |rfft(a, 48)|^2 weighted = quadratic form in a
        y = mp.fft.fft(a, n=48)
        return mx.sum(mx.real(y * mx.conj(y)))

    with mp.use_backend(backend), extended_precision():
        g = mx.grad(energy)(x)
    # Second order: the outer sum and product of the inner gradient run on the host
    # on emulate, which MLX cannot differentiate through (tests/extended/test_flow.py
    # ::test_nested_gradients_never_return_zeros); the twins alone are differentiable
    # twice on every backend.
    with mp.use_backend(backend), extended_precision(intercept_mlx=backend == "cpu"):
        hv = mx.grad(lambda a: mx.sum(mx.grad(energy)(a) * v))(x)
    # sum |fft_48(a)|^2 = 48 sum a^2: gradient 96 a, Hessian 96 I.
    assert rel(g, 96 * np.array(x, np.float64)) <= 1e-7
    assert rel(hv, 96 * np.array(v, np.float64)) <= 1e-7
    # the unmodified model: gradients with respect to u, k, D
    u = rng.standard_normal((2, 3, 40)).astype(np.float32)
    k = (rng.standard_normal((3, 40)) * 0.3).astype(np.float32)
    D = rng.standard_normal(3).astype(np.float32)
    w = rng.standard_normal(u.shape).astype(np.float32)

    def loss(u, k, D):
        return (fftconv_ref(u, k, D) * mx.array(w)).sum()

    args = [mx.array(a) for a in (u, k, D)]
    with mp.use_backend(backend), extended_precision():
        grads = mx.grad(loss, argnums=(0, 1, 2))(*args)
    plain = mx.grad(loss, argnums=(0, 1, 2))(*args)
    for name, got, p, ref in zip("ukD", grads, plain, float64_gradients(u, k, D, w)):
        print(f"{backend} d{name}: normwise {rel(got, ref):.1e} (float32 MLX {rel(p, ref):.1e})")
        assert rel(got, ref) <= 1e-7
        # dD = sum g u involves no FFT: float32 VJPs on emulate (the same ops as
        # MLX's), float64 ones on cpu (the flow's arithmetic is MLX float64 there)
        assert rel(got, ref) < rel(p, ref) if name != "D" else rel(got, ref) <= rel(p, ref)


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_differentiable_paths_raise(backend):
    x = mx.array(np.arange(16, dtype=np.float32))
    cases = [lambda a: mp.fft_extended(a, round_output=False, backend=backend).round(),
             lambda a: mp.rfft_extended(DoubleWord(a, mx.zeros_like(a)), backend=backend),
             lambda a: mp.irfft_extended(mp.rfft_extended(a, round_output=False,
                                                          backend=backend), backend=backend)]
    for f in cases:
        with pytest.raises(NotDifferentiableError, match="not differentiable"):
            mx.grad(lambda a: mx.sum(mx.abs(f(a))))(x)
        mx.eval(f(x))  # the forward value itself is fine


# mlx_precise.fft's N-D functions, differentiable as mx.fft's are: (name, kwargs, complex input?)
GRAD_CALLS = [("fft2", {"s": (4, 6), "norm": "ortho"}, False),
              ("fft2", {"axes": (0, 2)}, True),
              ("ifftn", {"axes": (0, 2), "norm": "forward"}, True),
              ("rfftn", {"s": (3, 6), "axes": (1, 2)}, False),
              ("irfft2", {"axes": (1, 0), "norm": "ortho"}, True)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_through_the_nd_functions(backend):
    """mx.grad of the nonlinear loss sum w |y|^2, y = mp.fft.<name>_extended(x) and
    the precision-aware mp.fft.<name> inside the block, against the analytic
    gradient: the adjoint of numpy's long double transform at g = 2 w y(x) (the
    loss's differential is Re(sum conj(2 w y) dy)). Rounding y to float32 on the
    way costs about u = 6e-8."""
    rng = np.random.default_rng(3)
    for name, kw, cplx in GRAD_CALLS:
        x, _ = _operands("fft" if cplx else "rfft", (3, 4, 5), (1,), rng)
        y_ld = getattr(np.fft, name)(x.astype(CLD if cplx else LD), **kw)
        w = rng.uniform(0.5, 2.0, y_ld.shape).astype(np.float32)
        ref = adjoint(lambda a: getattr(np.fft, name)(a, **kw), x, 2 * w * y_ld)

        def loss(fn):
            return lambda a: mx.sum(mx.array(w) * mx.real(fn(a) * mx.conj(fn(a))))

        ext = getattr(mp.fft, f"{name}_extended")
        got = mx.grad(loss(lambda a: ext(a, backend=backend, **kw)))(mx.array(x))
        with mp.use_backend(backend), extended_precision():
            aware = mx.grad(loss(lambda a: getattr(mp.fft, name)(a, **kw)))(mx.array(x))
        plain = mx.grad(loss(lambda a: getattr(mp.fft, name)(a, **kw)))(mx.array(x))
        print(f"{backend} {name} {kw}: normwise {rel(got, ref):.1e} "
              f"(float32 MLX {rel(plain, ref):.1e})")
        assert got.shape == x.shape and got.dtype == plain.dtype, name
        assert rel(got, ref) <= 1e-7, (name, kw, rel(got, ref))
        assert np.array_equal(np.array(aware), np.array(got)), name
