"""On the metal backend the kernels are MLX primitives, so the Python glue around
them must never force evaluation (no numpy round trip, no ``.item()`` of a lazy
value): otherwise ``mx.compile`` fails, and every call synchronises the GPU. Linux
has no Metal, so the metal executor is replaced here by a lazy stand-in (outputs
that are MLX ops on the inputs) and each public op is traced by ``mx.compile``."""

import mlx.core as mx
import pytest

import mlx_precise as mp
from mlx_precise.core import kernels


mx.random.seed(0)
X = mx.random.normal((2, 64))
C = (X + 1j * X[::-1]).astype(mx.complex64)
U, K, D = mx.random.normal((1, 2, 64)), mx.random.normal((2, 64)), mx.ones((2,))
QA = mx.random.randint(-100, 100, (16, 32)).astype(mx.int8)
QB = mx.random.randint(-100, 100, (32, 8)).astype(mx.int8)

OPS = {
    "complex_multiply": (lambda c: mp.complex_multiply_extended(c, c, backend="metal"), (C,)),
    "fft_scale": (lambda x: mp.fft_scale_extended(x, 3, backend="metal"), (X,)),
    "depthwise3": (lambda u: mp.depthwise3_extended(u, mx.ones((2, 3)), backend="metal"), (U,)),
    "depthwise": (lambda u, k: mp.depthwise_conv_extended(u, k[:, :5], backend="metal"), (U, K)),
    "fft": (lambda c: mp.fft_extended(c, backend="metal"), (C,)),
    "fft Bluestein": (lambda c: mp.fft_extended(c[:, :50], backend="metal"), (C,)),
    "ifft": (lambda c: mp.ifft_extended(c, n=48, backend="metal"), (C,)),
    "rfft": (lambda x: mp.rfft_extended(x, backend="metal"), (X,)),
    "irfft": (lambda c: mp.irfft_extended(c, n=126, backend="metal"), (C,)),
    "hyena": (lambda u, k, d: mp.hyena_conv_extended(u, k, d, backend="metal"), (U, K, D)),
    "hyena gradient": (lambda u, k, d: mx.grad(
        lambda u, k: mp.hyena_conv_extended(u, k, d, backend="metal").sum(), argnums=(0, 1))(u, k),
        (U, K, D)),
    "norm": (lambda x: mp.norm(x, "fro", backend="metal"), (X,)),
    "norm one": (lambda x: mp.norm(x, "one", backend="metal"), (X,)),
    "simulate_q115": (lambda x: mp.simulate_q115(x, backend="metal"), (X,)),
    "float_to_q131": (lambda x: mp.float_to_q131(x, backend="metal"), (X,)),
    "scaled_mm": (lambda a, b: mp.scaled_mm(a, b, mx.ones((16, 1)), mx.ones((1, 8)),
                                            backend="metal"), (QA, QB)),
    "int8_matmul": (lambda a, b: mp.int8_matmul(a, b, backend="metal"), (QA, QB)),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_metal_glue_traces_under_compile(lazy_metal, name):
    fn, args = OPS[name]
    out = mx.compile(fn)(*args)
    mx.eval(out)


def test_the_stand_in_would_catch_an_eager_glue(lazy_metal):
    """The probe is not vacuous: glue that evaluates (here ``.item()``) fails."""
    def eager(x):
        (y,) = kernels.Kernel(name="ext_probe", body="eft_selftest.metal", inputs=("a",),
                              outputs=("r",), extended=False)(
            inputs=[x], output_shapes=[(8,)], output_dtypes=[mx.float32],
            grid=(1, 1, 1), threadgroup=(1, 1, 1), backend="metal")
        return y * y[0].item()
    with pytest.raises(ValueError, match="eval"):
        mx.compile(eager)(X.reshape(-1)[:8])
