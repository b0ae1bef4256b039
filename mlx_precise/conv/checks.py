"""The convolutions' self-test checks (``python -m mlx_precise selftest``): the
rounded double-word elementwise ops and depthwise convolution, and Hyena's forward
pass and gradients, against exact rationals / float64 sums."""

from __future__ import annotations

from fractions import Fraction

import mlx.core as mx
import numpy as np

from ..core.selftest import Check, register
from ..doubleword.checks import rounded_fraction
from ..doubleword.elementwise import complex_multiply_extended, fft_scale_extended
from .depthwise import depthwise_conv_extended
from .hyena import hyena_conv_extended
from ..core.backends import Backend


def check_extended_ops(backend: str, n: int = 2000) -> list[Check]:
    """complex_multiply_extended, fft_scale_extended and depthwise_conv_extended
    (rounded outputs) against exact rationals."""
    rng = np.random.default_rng(21)
    F = lambda v: Fraction(float(v))  # noqa: E731
    out = []
    a = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64)
    b = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64)
    z = np.array(complex_multiply_extended(mx.array(a), mx.array(b), backend=backend))
    exact = [F(x.real) * F(y.real) - F(x.imag) * F(y.imag) for x, y in zip(a, b)]
    exact += [F(x.real) * F(y.imag) + F(x.imag) * F(y.real) for x, y in zip(a, b)]
    frac, ok = rounded_fraction(np.concatenate([z.real, z.imag]), exact)
    out.append(Check(f"complex_multiply_extended [{n}]", ok and frac >= 0.999,
                     f"{100 * frac:.3f}% exactly rounded, all faithful: {ok}"))
    x = rng.standard_normal(n).astype(np.float32)
    for m in (3, 1024):
        y = np.array(fft_scale_extended(mx.array(x), m, backend=backend))
        frac, ok = rounded_fraction(y, [F(v) / m for v in x])
        out.append(Check(f"fft_scale_extended n={m} [{n}]", ok and frac >= (1.0 if m == 1024 else 0.999),
                         f"{100 * frac:.3f}% exactly rounded"))
    xs = rng.standard_normal((1, 4, n // 4)).astype(np.float32)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    bias = rng.standard_normal(4).astype(np.float32)
    y = np.array(depthwise_conv_extended(mx.array(xs), mx.array(w), mx.array(bias), backend=backend))
    ex = []
    for c in range(4):
        for t in range(n // 4):
            acc = F(bias[c])
            for j in range(3):
                s = t + j - 2
                if s >= 0:
                    acc += F(w[c, j]) * F(xs[0, c, s])
            ex.append(acc)
    frac, ok = rounded_fraction(y.ravel(), ex)
    out.append(Check(f"depthwise_conv_extended K=3 [{n}]", ok and frac >= 0.999,
                     f"{100 * frac:.3f}% exactly rounded"))
    return out


def check_hyena(backend: str) -> list[Check]:
    """hyena_conv_extended (forward, rounded) against the exact direct convolution
    in rationals, and its gradients (du, dk, dD: the VJP kernels) against direct
    float64 sums."""
    rng = np.random.default_rng(31)
    B, C, L, Lk = 2, 2, 40, 24
    u = rng.standard_normal((B, C, L)).astype(np.float32)
    k = rng.standard_normal((C, Lk)).astype(np.float32)
    D = rng.standard_normal(C).astype(np.float32)
    y = np.array(hyena_conv_extended(mx.array(u), mx.array(k), mx.array(D), backend=backend))
    F = lambda v: Fraction(float(v))  # noqa: E731
    exact = [sum((F(k[c, s]) * F(u[b, c, t - s]) for s in range(min(t + 1, Lk))), F(D[c]) * F(u[b, c, t]))
             for b in range(B) for c in range(C) for t in range(L)]
    frac, ok = rounded_fraction(y.ravel(), exact)
    out = [Check(f"hyena_conv_extended [{B}x{C}x{L}, Lk={Lk}]", ok and frac >= 0.99,
                 f"{100 * frac:.2f}% exactly rounded, all faithful: {ok}")]
    g = rng.standard_normal(u.shape).astype(np.float32)
    grads = mx.grad(lambda a, b, d: (hyena_conv_extended(a, b, d, backend=backend) * mx.array(g)).sum(),
                    argnums=(0, 1, 2))(mx.array(u), mx.array(k), mx.array(D))
    u64, k64, g64 = u.astype(np.float64), k.astype(np.float64), g.astype(np.float64)
    du = D[None, :, None] * g64
    dk = np.zeros((C, Lk))
    for j in range(Lk):
        du[..., :L - j] += k64[None, :, j, None] * g64[..., j:]
        dk[:, j] = (g64[..., j:] * u64[..., :L - j]).sum(axis=(0, 2))
    ref = (du, dk, (g64 * u64).sum(axis=(0, 2)))
    worst = max(float(np.max(np.abs(np.array(a, np.float64) - r) / np.spacing(np.abs(r).astype(np.float32))))
                for a, r in zip(grads, ref))
    out.append(Check("hyena gradients du, dk, dD", worst <= 1.0,
                     f"max error {worst:.2f} ulp vs float64 sums (need <= 1)"))
    return out


def selftest_checks(backend: Backend, done=()) -> list[Check]:
    """The extended ops and Hyena (skipped on ``metal`` when the checks before them,
    the device self-test's, failed)."""
    if backend.gpu and done and not done[-1].passed:
        return []
    return check_extended_ops(backend) + check_hyena(backend)


register(20, selftest_checks)
