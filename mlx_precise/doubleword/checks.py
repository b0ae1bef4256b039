"""The number system's self-test checks (``python -m mlx_precise selftest``): host
split/join, the device EFT self-test, and every double-word operation of
``metal/include/doubleword.h`` (``dw_ops`` / ``cdw_ops``) against exact rationals
(:mod:`fractions`), independent of the kernels."""

from __future__ import annotations

import math
from fractions import Fraction

import mlx.core as mx
import numpy as np

from ..core import backends
from ..core.kernels import DeviceCheckError, eft_selftest
from ..core.selftest import Check, register
from .elementwise import rn32_rational
from .dw_kernels import CDW_OPS, DW_OP, DW_OPS
from .hostsplit import join
from .types import split

U = Fraction(1, 2**24)  # unit roundoff of float32


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


def _exact(op: str, x: Fraction, y_hi: Fraction, y: Fraction) -> Fraction:
    """The exact result of ``dw_ops`` operation ``op`` (a name of :data:`DW_OP`)."""
    if op in ("two_sum", "fast_two_sum", "add_fp"):
        return x + y_hi
    if op in ("two_prod", "mul_fp"):
        return x * y_hi
    if op == "add":
        return x + y
    if op == "mul":
        return x * y
    return x / y


# (operation of the dw_ops kernel, name, bound in units of u^2; 0 = exact)
_DW_CHECKS = (
    ("two_sum", "TwoSum", 0),
    ("fast_two_sum", "Fast2Sum", 0),
    ("two_prod", "TwoProdFMA", 0),
    ("add_fp", "DW+FP (JMP alg 4)", 2),
    ("add", "DW+DW (JMP alg 6)", 3 + 13 * U),
    ("mul_fp", "DW*FP (JMP alg 9)", 2),
    ("mul", "DW*DW (JMP alg 12)", 4),
    ("div", "DW/DW (JMP alg 18)", Fraction(98, 10)),
)


def check_doubleword_ops(backend: str, n: int = 2000) -> list[Check]:
    out = []
    for op, name, bound in _DW_CHECKS:
        xh, xl, yh, yl = _operands(n, seed=DW_OP[op], ordered=op == "fast_two_sum")
        if op in ("two_sum", "fast_two_sum", "two_prod"):  # EFTs take plain floats
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
    parts = _operands(n, seed=11, ordered=False) + _operands(n, seed=12, ordered=False)
    xrh, xrl, yrh, yrl, xih, xil, yih, yil = parts
    ins = [xrh, xrl, xih, xil, yrh, yrl, yih, yil]
    out = []
    for op, name, bound in (("add", "complex DW add", 3 + 13 * U),
                            ("mul", "complex DW mul", Fraction(866, 100))):
        z = CDW_OPS(inputs=[mx.array(a) for a in ins], template={"OP": op},
                    grid=(n, 1, 1), threadgroup=(256, 1, 1), output_shapes=[(n,)] * 4,
                    output_dtypes=[mx.float32] * 4, backend=backend)
        zrh, zrl, zih, zil = (np.array(a) for a in z)

        def f(h, lo, i):
            return Fraction(float(h[i])) + Fraction(float(lo[i]))

        worst = Fraction(0)
        for i in range(n):
            xr, xi, yr, yi = f(xrh, xrl, i), f(xih, xil, i), f(yrh, yrl, i), f(yih, yil, i)
            er, ei = (xr + yr, xi + yi) if op == "add" else (xr * yr - xi * yi, xr * yi + xi * yr)
            gr, gi = f(zrh, zrl, i), f(zih, zil, i)
            if op == "add":  # per component
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
    try:
        eft_selftest(backend)
        return Check("device EFT self-test", True, "TwoSum and fma residual exact")
    except DeviceCheckError as e:
        return Check("device EFT self-test", False, str(e))


def check_split_join(n: int = 2000) -> Check:
    rng = np.random.default_rng(7)
    x = rng.standard_normal(n) * 2.0 ** rng.integers(-60, 60, n)
    hi, lo = split(x)
    back = join(hi, lo)
    err = max(abs(Fraction(float(b)) - Fraction(float(a))) / abs(Fraction(float(a)))
              for a, b in zip(x, back))
    # hi + lo carries 48 bits at least: relative error <= 2^-48 (u^2).
    return Check("split/join float64 [host]", err <= U**2, f"max rel err {float(err / U**2):.3g} u^2")


def rounded_fraction(got, exact) -> tuple[float, bool]:
    """(fraction of float32 results equal to RN(exact), all within one ulp)."""
    hits, faithful = 0, True
    for g, e in zip(got, exact):
        r = float(rn32_rational(e))
        toward = np.float32(np.inf if e > Fraction(r) else -np.inf)
        other = r if Fraction(r) == e else float(np.nextafter(np.float32(r), toward))
        hits += float(g) == r
        faithful &= float(g) in (r, other)  # one of the two floats around e
    return hits / max(len(exact), 1), faithful


def selftest_checks(backend: str, done=()) -> list[Check]:
    """Host split/join; on a kernel backend the device EFT self-test and, when it
    passes, every double-word operation."""
    checks = [check_split_join()]
    if backends.of(backend).has_kernels:
        checks.append(check_eft(backend))
        if checks[-1].passed:
            checks += check_doubleword_ops(backend)
            checks += check_complex_ops(backend)
    return checks


register(10, selftest_checks)
