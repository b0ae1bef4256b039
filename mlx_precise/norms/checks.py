"""The norms' self-test checks (``python -m mlx_precise selftest``): every kind and
structure against an exact reference (:mod:`fractions`), in ulps."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from ..core.selftest import Check, register
from .api import norm
from .engine import _KIND_NAMES, FRO, GENERAL, HERMITIAN, MAX, ONE, Spec, make_spec
from ..core.backends import Backend


def _ref_norm(a: np.ndarray, spec: Spec):
    """Independent reference for the self-test, by LAPACK's definitions over the
    entries read: exact Fractions for real data (a norm, or for "fro" its square),
    float64 (hypot, exactly summed with fsum) for complex data. Returns
    ``(value, squared)``."""
    from fractions import Fraction

    m, n = a.shape
    ent = {}
    for j in range(n):
        for i in range(m):
            if spec.structure != GENERAL and (i > j if spec.upper else i < j):
                continue
            if spec.unit and i == j:
                ent[(i, j)] = (1.0, 0.0)
                continue
            z = complex(a[i, j])
            ent[(i, j)] = (z.real, 0.0 if (spec.structure == HERMITIAN and i == j) else z.imag)
    if spec.complex:
        mag = {k: math.hypot(*v) for k, v in ent.items()}
        tot = lambda vals: math.fsum(vals)  # noqa: E731
    else:
        mag = {k: abs(Fraction(v[0])) for k, v in ent.items()}
        tot = lambda vals: sum(vals, Fraction(0))  # noqa: E731
    if spec.kind == MAX:
        return max(mag.values()), False
    if spec.kind == FRO:
        return sum(((2 if spec.symmetric and i != j else 1)
                    * (Fraction(v[0]) ** 2 + Fraction(v[1]) ** 2)
                    for (i, j), v in ent.items()), Fraction(0)), True
    axis = 1 if spec.kind == ONE or spec.symmetric else 0
    lines: dict = {}
    for (i, j), v in mag.items():
        lines.setdefault((i, j)[axis], []).append(v)
        if spec.symmetric and i != j:
            lines.setdefault((i, j)[1 - axis], []).append(v)
    return max(tot(v) for v in lines.values()), False


def _ulp_error(got: float, ref, squared: bool, dtype) -> float:
    """|got - ref| in ulps of ``got`` (ref = sqrt(ref) when ``squared``), from the
    exact relative error (|g^2 - S| / S ~ 2 |g - sqrt(S)| / sqrt(S))."""
    from fractions import Fraction

    g, r = Fraction(float(got)), Fraction(ref)
    if r == 0 or g == 0:
        return 0.0 if g == r else math.inf
    rel = float(abs(g * g - r) / r) / 2 if squared else float(abs(g - r) / r)
    return rel * abs(float(got)) / float(np.spacing(dtype(abs(got))))


def selftest_checks(backend: Backend, done=()) -> list:
    """Every norm kind at small sizes against exact definitions: float32 and
    complex64 through the kernels on ``metal``/``emulate``, float64 through the cpu
    path on ``cpu``; plus Inf/NaN propagation and entries whose squares leave
    float32's range. Each check passes within 1 ulp (float32) / 4 ulps (float64)."""
    rng = np.random.default_rng(2024)
    kernels = backend.has_kernels
    cases = (("general", "lower", "nonunit", (11, 7)), ("trapezoid", "upper", "unit", (7, 11)),
             ("symmetric", "lower", "nonunit", (9, 9)), ("hermitian", "upper", "nonunit", (9, 9)))
    dtypes = (np.float32, np.complex64) if kernels else (np.float64, np.complex128)
    checks = []
    for dt in dtypes:
        real = np.dtype(dt).kind == "f"
        out = np.float32 if dt in (np.float32, np.complex64) else np.float64
        bound = 1.0 if out is np.float32 else 4.0
        for kind in _KIND_NAMES:
            worst = 0.0
            for structure, uplo, diag, shape in cases:
                a = rng.standard_normal(shape) * 2.0 ** rng.integers(-8, 9, shape)
                if not real:
                    a = a + 1j * rng.standard_normal(shape)
                a = a.astype(dt)
                spec = make_spec(kind, structure, uplo, diag, not real)
                ref, sq = _ref_norm(a.astype(np.complex128 if not real else np.float64), spec)
                arr = mx.array(a) if kernels else a  # float64 stays numpy (mx.array would cast)
                got = float(norm(arr, kind, structure=structure, uplo=uplo, diag=diag,
                                 tile=4, backend=backend).item())
                worst = max(worst, _ulp_error(got, ref, sq, out))
            checks.append(Check(f"norm {kind} {np.dtype(dt).name} [4 structures]",
                                worst <= bound,
                                f"max err {worst:.3g} ulp (need <= {bound:g})"))
    # Entries whose squares overflow or underflow the working format, together:
    # 1e36 and 1e-30 for float32, 1e300 and 1e-300 for float64.
    big, tiny = (1e36, 1e-30) if kernels else (1e300, 1e-300)
    a = np.array([[big, -3 * tiny], [2.5 * big, tiny]], dtype=np.float64)
    dt = np.float32 if kernels else np.float64
    a = a.astype(dt)
    ref, _ = _ref_norm(a.astype(np.float64), make_spec("fro", "general", "lower", "nonunit", False))
    arr = mx.array(a) if kernels else a
    got = float(norm(arr, "fro", backend=backend).item())
    err = _ulp_error(got, ref, True, dt)
    checks.append(Check(f"norm fro, entries {big:g} and {tiny:g}", err <= 1.0,
                        f"err {err:.3g} ulp, no overflow (need <= 1)"))
    a = np.ones((9, 9), dtype=dt)
    a[8, 0], a[0, 8] = np.inf, np.nan  # (0, 8) is outside the lower triangle: never read
    arr = mx.array(a) if kernels else a
    got = [float(norm(arr, k, structure="symmetric", tile=4, backend=backend).item())
           for k in _KIND_NAMES]
    checks.append(Check("norm Inf/NaN propagation", all(math.isinf(g) for g in got),
                        f"symmetric lower with Inf read, NaN unread: {got}"))
    return checks


register(60, selftest_checks)
