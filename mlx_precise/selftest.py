"""``python -m mlx_precise selftest``: every kernel at small sizes against exact oracles.

Each check prints one line, ``PASS``/``FAIL``, its name and the measured figure. The
oracle is exact rational arithmetic (:mod:`fractions`), independent of the kernels.
This is what a Mac user runs to prove the Metal path on real hardware::

    python -m mlx_precise selftest --backend metal
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from fractions import Fraction

import mlx.core as mx
import numpy as np

from . import backends

U = Fraction(1, 2**24)  # unit roundoff of float32


@dataclass
class Check:
    name: str
    passed: bool
    figure: str

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}  {self.name:<34} {self.figure}"


def _operands(n: int, seed: int, ordered: bool):
    """Normalised double-word operands with exponents in [-40, 40]."""
    rng = np.random.default_rng(seed)

    def dw():
        hi = (rng.uniform(1, 2, n) * 2.0 ** rng.integers(-40, 41, n)).astype(np.float32)
        hi *= rng.choice(np.float32([-1, 1]), n)
        lo = (hi.astype(np.float64) * rng.uniform(-2**-24, 2**-24, n)).astype(np.float32)
        s = (hi + lo).astype(np.float32)  # Fast2Sum renormalisation
        return s, (hi.astype(np.float64) - s + lo).astype(np.float32)

    (xh, xl), (yh, yl) = dw(), dw()
    if ordered:  # Fast2Sum needs |x| >= |y|
        swap = np.abs(xh) < np.abs(yh)
        xh[swap], yh[swap] = yh[swap], xh[swap].copy()
    return xh, xl, yh, yl


def _exact(op: int, x: Fraction, y_hi: Fraction, y: Fraction) -> Fraction:
    if op in (0, 1):
        return x + y_hi
    if op == 2:
        return x * y_hi
    if op == 3:
        return x + y_hi
    if op == 4:
        return x + y
    if op == 5:
        return x * y_hi
    if op == 6:
        return x * y
    return x / y


# (OP code of the dw_ops kernel, name, bound in units of u^2; 0 = exact)
_DW_CHECKS = (
    (0, "TwoSum", 0),
    (1, "Fast2Sum", 0),
    (2, "TwoProdFMA", 0),
    (3, "DW+FP (JMP alg 4)", 2),
    (4, "DW+DW (JMP alg 6)", 3 + 13 * U),
    (5, "DW*FP (JMP alg 9)", 2),
    (6, "DW*DW (JMP alg 12)", 4),
    (7, "DW/DW (JMP alg 18)", Fraction(98, 10)),
)


def check_doubleword_ops(backend: str, n: int = 2000) -> list[Check]:
    from .doubleword import DW_OPS

    out = []
    for op, name, bound in _DW_CHECKS:
        xh, xl, yh, yl = _operands(n, seed=op, ordered=op == 1)
        if op in (0, 1, 2):  # error-free transforms take plain floats
            xl = np.zeros_like(xl)
        zh, zl = DW_OPS(
            inputs=[mx.array(a) for a in (xh, xl, yh, yl)], template={"OP": op},
            grid=(n, 1, 1), threadgroup=(256, 1, 1), output_shapes=[(n,), (n,)],
            output_dtypes=[mx.float32, mx.float32], backend=backend)
        zh, zl = np.array(zh), np.array(zl)
        worst = Fraction(0)
        for i in range(n):
            x = Fraction(float(xh[i])) + Fraction(float(xl[i]))
            y = Fraction(float(yh[i])) + Fraction(float(yl[i]))
            exact = _exact(op, x, Fraction(float(yh[i])), y)
            got = Fraction(float(zh[i])) + Fraction(float(zl[i]))
            if exact != 0:
                worst = max(worst, abs(got - exact) / abs(exact))
            elif got != 0:
                worst = Fraction(10**9)
        in_u2 = worst / U**2
        ok = worst == 0 if bound == 0 else in_u2 <= bound
        what = "exact" if bound == 0 else f"<= {float(bound):.4g} u^2"
        out.append(Check(f"{name} [{n} pairs]", ok,
                         f"max rel err {float(in_u2):.3g} u^2 (need {what})"))
    return out


def check_complex_ops(backend: str, n: int = 1000) -> list[Check]:
    """Complex double-word add (per component, DW+DW bound) and multiply (normwise,
    (4 sqrt(2) + 3) u^2 < 8.66 u^2, derived in metal/include/doubleword.h)."""
    from .doubleword import CDW_OPS

    parts = _operands(n, seed=11, ordered=False) + _operands(n, seed=12, ordered=False)
    xrh, xrl, yrh, yrl, xih, xil, yih, yil = parts
    ins = [xrh, xrl, xih, xil, yrh, yrl, yih, yil]
    out = []
    for op, name, bound in ((0, "complex DW add", 3 + 13 * U), (1, "complex DW mul", Fraction(866, 100))):
        z = CDW_OPS(inputs=[mx.array(a) for a in ins], template={"OP": op},
                    grid=(n, 1, 1), threadgroup=(256, 1, 1), output_shapes=[(n,)] * 4,
                    output_dtypes=[mx.float32] * 4, backend=backend)
        zrh, zrl, zih, zil = (np.array(a) for a in z)

        def f(h, lo, i):
            return Fraction(float(h[i])) + Fraction(float(lo[i]))

        worst = Fraction(0)
        for i in range(n):
            xr, xi, yr, yi = f(xrh, xrl, i), f(xih, xil, i), f(yrh, yrl, i), f(yih, yil, i)
            er, ei = (xr + yr, xi + yi) if op == 0 else (xr * yr - xi * yi, xr * yi + xi * yr)
            gr, gi = f(zrh, zrl, i), f(zih, zil, i)
            if op == 0:  # per component
                for g, e in ((gr, er), (gi, ei)):
                    if e:
                        worst = max(worst, (abs(g - e) / abs(e)) ** 2)
            elif er or ei:  # normwise, squared to stay rational
                worst = max(worst, ((gr - er) ** 2 + (gi - ei) ** 2) / (er**2 + ei**2))
        in_u2 = math.sqrt(worst) / float(U**2)
        out.append(Check(f"{name} [{n} pairs]", worst <= (bound * U**2) ** 2,
                         f"max rel err {in_u2:.3g} u^2 (need <= {float(bound):.4g} u^2)"))
    return out


def check_eft(backend: str) -> Check:
    from .doubleword import eft_selftest
    from .kernels import DeviceCheckError

    try:
        eft_selftest(backend)
        return Check("device EFT self-test", True, "TwoSum and fma residual exact")
    except DeviceCheckError as e:
        return Check("device EFT self-test", False, str(e))


def check_split_join(n: int = 2000) -> Check:
    from .doubleword import join, split

    rng = np.random.default_rng(7)
    x = rng.standard_normal(n) * 2.0 ** rng.integers(-60, 60, n)
    hi, lo = split(x)
    back = join(hi, lo)
    err = max(abs(Fraction(float(b)) - Fraction(float(a))) / abs(Fraction(float(a)))
              for a, b in zip(x, back))
    # hi + lo carries 48 bits at least: relative error <= 2^-48 (u^2).
    return Check("split/join float64 [host]", err <= U**2, f"max rel err {float(err / U**2):.3g} u^2")


def _rounded_fraction(got, exact) -> tuple[float, bool]:
    """(fraction of float32 results equal to RN(exact), all within one ulp)."""
    from .elementwise import rn32_rational

    hits, faithful = 0, True
    for g, e in zip(got, exact):
        r = float(rn32_rational(e))
        toward = np.float32(np.inf if e > Fraction(r) else -np.inf)
        other = r if Fraction(r) == e else float(np.nextafter(np.float32(r), toward))
        hits += float(g) == r
        faithful &= float(g) in (r, other)  # one of the two floats around e
    return hits / max(len(exact), 1), faithful


def check_extended_ops(backend: str, n: int = 2000) -> list[Check]:
    """complex_multiply_extended, fft_scale_extended and depthwise_conv_extended
    (rounded outputs) against exact rationals."""
    from .conv import depthwise_conv_extended
    from .elementwise import complex_multiply_extended, fft_scale_extended

    rng = np.random.default_rng(21)
    F = lambda v: Fraction(float(v))  # noqa: E731
    out = []
    a = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64)
    b = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64)
    z = np.array(complex_multiply_extended(mx.array(a), mx.array(b), backend=backend))
    exact = [F(x.real) * F(y.real) - F(x.imag) * F(y.imag) for x, y in zip(a, b)]
    exact += [F(x.real) * F(y.imag) + F(x.imag) * F(y.real) for x, y in zip(a, b)]
    frac, ok = _rounded_fraction(np.concatenate([z.real, z.imag]), exact)
    out.append(Check(f"complex_multiply_extended [{n}]", ok and frac >= 0.999,
                     f"{100 * frac:.3f}% exactly rounded, all faithful: {ok}"))
    x = rng.standard_normal(n).astype(np.float32)
    for m in (3, 1024):
        y = np.array(fft_scale_extended(mx.array(x), m, backend=backend))
        frac, ok = _rounded_fraction(y, [F(v) / m for v in x])
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
    frac, ok = _rounded_fraction(y.ravel(), ex)
    out.append(Check(f"depthwise_conv_extended K=3 [{n}]", ok and frac >= 0.999,
                     f"{100 * frac:.3f}% exactly rounded"))
    return out


def check_hyena(backend: str) -> list[Check]:
    """hyena_conv_extended (forward, rounded) against the exact direct convolution
    in rationals, and its gradients (du, dk, dD: the VJP kernels) against direct
    float64 sums."""
    from .hyena import hyena_conv_extended

    rng = np.random.default_rng(31)
    B, C, L, Lk = 2, 2, 40, 24
    u = rng.standard_normal((B, C, L)).astype(np.float32)
    k = rng.standard_normal((C, Lk)).astype(np.float32)
    D = rng.standard_normal(C).astype(np.float32)
    y = np.array(hyena_conv_extended(mx.array(u), mx.array(k), mx.array(D), backend=backend))
    F = lambda v: Fraction(float(v))  # noqa: E731
    exact = [sum((F(k[c, s]) * F(u[b, c, t - s]) for s in range(min(t + 1, Lk))), F(D[c]) * F(u[b, c, t]))
             for b in range(B) for c in range(C) for t in range(L)]
    frac, ok = _rounded_fraction(y.ravel(), exact)
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


# Modules of the package that contribute checks: each has
# ``selftest_checks(backend: str) -> list[Check]`` (small sizes, exact oracles).
CHECK_MODULES: tuple[str, ...] = ("fft", "fixedpoint", "int8", "norms", "ozaki")


def run(backend: str | None = None, verbose: bool = True) -> list[Check]:
    """Run every check on ``backend`` (default: the active one); returns the checks."""
    import importlib

    name = backends.resolve(backend)
    checks = [check_split_join()]
    if name in ("metal", "emulate"):
        checks.append(check_eft(name))
        if checks[-1].passed:
            checks += check_doubleword_ops(name)
            checks += check_complex_ops(name)
    if name != "metal" or checks[-1].passed:
        checks += check_extended_ops(name)
        checks += check_hyena(name)
    for mod in CHECK_MODULES:
        checks += importlib.import_module(f"{__package__}.{mod}").selftest_checks(name)
    if verbose:
        for c in checks:
            print(c.line(), flush=True)
    return checks


def main(backend: str | None = None) -> int:
    name = backends.resolve(backend)
    print(f"mlx-precise selftest on backend '{name}' (MLX {mx.__version__})", flush=True)
    t0 = time.perf_counter()
    checks = run(name)
    failed = sum(not c.passed for c in checks)
    print(f"{len(checks) - failed} passed, {failed} failed ({time.perf_counter() - t0:.1f} s)")
    return 1 if failed else 0
