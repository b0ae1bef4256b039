"""MLX transforms on the host backends: ``mx.compile`` / ``mx.vmap`` of a public op
on ``cpu`` or ``emulate`` raise :class:`TransformUnsupportedError` naming the op and
the way out (never MLX's bare eval error, never a plain result); ops whose cpu path
is made of lazy MLX ops trace and give the same bits; ops with no VJP raise under
``mx.grad`` instead of returning zeros. (The Metal path's tracing is in
test_lazy_glue.py.)"""

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.core.autodiff import NotDifferentiableError, TransformUnsupportedError

BACKENDS = ("cpu", "emulate")
mx.random.seed(1)
X = mx.random.normal((4, 16))
C = (X + 1j * X[::-1]).astype(mx.complex64)
U, K = mx.random.normal((1, 4, 16)), mx.random.normal((4, 16))
A64 = mx.random.normal((8, 8)).astype(mx.float64, stream=mx.cpu)


def ops(be):
    return {
        "complex_multiply_extended": (lambda c: mp.complex_multiply_extended(c, c, backend=be), C),
        "fft_scale_extended": (lambda x: mp.fft_scale_extended(x, 3, backend=be), X),
        "depthwise3_extended": (lambda u: mp.depthwise3_extended(u, K[:, :3], backend=be), U),
        "fft_extended": (lambda c: mp.fft_extended(c, backend=be), C),
        "irfft_extended": (lambda c: mp.irfft_extended(c, n=30, backend=be), C),
        "hyena_conv_extended": (lambda u: mp.hyena_conv_extended(u, K, backend=be), U),
        "norm": (lambda x: mp.norm(x, backend=be), X),
        "dgemm_emulated": (lambda a: mp.dgemm_emulated(a, a, backend=be), A64),
    }


LAZY_ON_CPU = {"fft_scale_extended"}  # MLX float64 ops on cpu: they trace (test below)


@pytest.mark.parametrize("backend, name", [(be, name) for be in BACKENDS for name in sorted(ops(be))
                                           if be != "cpu" or name not in LAZY_ON_CPU])
@pytest.mark.parametrize("transform", ["compile", "vmap"])
def test_host_backends_refuse_tracing_clearly(backend, name, transform):
    fn, x = ops(backend)[name]
    if transform == "vmap":  # a batch of two: fn sees x's shape
        t, x = mx.vmap(fn), mx.stack([x, x])
    else:
        t = mx.compile(fn)
    with pytest.raises(TransformUnsupportedError, match=f"{name} on backend '{backend}' computes on the host"):
        mx.eval(t(x))


@pytest.mark.parametrize("name", sorted(LAZY_ON_CPU))
def test_lazy_cpu_ops_trace_with_the_same_bits(name):
    fn, x = ops("cpu")[name]
    eager = np.array(fn(x))
    np.testing.assert_array_equal(np.array(mx.compile(fn)(x)), eager)
    np.testing.assert_array_equal(np.array(mx.vmap(fn)(mx.stack([x, x]))), np.stack([eager, eager]))


def test_fixed_point_on_cpu_traces_with_the_same_bits():
    """The cpu fixed-point path is MLX ops, so it compiles and vmaps."""
    x = mx.random.uniform(-1.2, 1.2, (4, 257))
    eager = mp.simulate_q115(x, backend="cpu")
    for t in (mx.compile, mx.vmap):
        np.testing.assert_array_equal(np.array(t(lambda v: mp.simulate_q115(v, backend="cpu"))(x)),
                                      np.array(eager))


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_vjp_raises(backend):
    with pytest.raises(NotDifferentiableError, match="norm is not differentiable"):
        mx.grad(lambda x: mp.norm(x, backend=backend))(X)
    with pytest.raises(NotDifferentiableError, match="dgemm_emulated is not differentiable"):
        mx.grad(lambda x: mp.dgemm_emulated(x.astype(mx.float64, stream=mx.cpu), A64,
                                            backend=backend).astype(mx.float32).sum())(
            mx.random.normal((8, 8)))
