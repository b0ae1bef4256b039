"""MLX's original functions, captured when the package is first imported, before
:mod:`mlx_precise.extended.intercept` puts its dispatchers in their place: the
package's own plain (float32) paths call these, never the dispatchers."""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx

FFT_NAMES = ("fft", "ifft", "rfft", "irfft", "fft2", "ifft2", "rfft2", "irfft2",
             "fftn", "ifftn", "rfftn", "irfftn")

plain = SimpleNamespace(fft=SimpleNamespace(**{n: getattr(mx.fft, n) for n in FFT_NAMES}),
                        conv1d=mx.conv1d, compile=mx.compile, real=mx.real, imag=mx.imag,
                        grad=mx.grad, value_and_grad=mx.value_and_grad, vjp=mx.vjp, jvp=mx.jvp,
                        checkpoint=mx.checkpoint, custom_function=mx.custom_function,
                        vmap=mx.vmap, metal_kernel=mx.fast.metal_kernel)
