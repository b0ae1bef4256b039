"""The Ozaki DGEMM's self-test checks (``python -m mlx_precise selftest``): the
worked example, exact products, and ESC exact / estimate."""

from __future__ import annotations

import numpy as np

from ..core.selftest import Check, register
from ..esc import engine as _esc
from .engine import dgemm_emulated


def selftest_checks(backend: str, done=()) -> list:
    """Small checks of every kernel of the product on ``backend`` against exact
    rational arithmetic (:mod:`fractions`), for ``python -m mlx_precise selftest``:
    the worked example, an integer-valued product that must be correctly rounded
    bit for bit (each output against ``float(Fraction)``), and the exact and
    estimated ESC against a direct evaluation with ``math.frexp``."""
    import math
    from fractions import Fraction

    checks = []
    x = np.array([[2.0**8, 2.0**-8, 2.0**-8]])
    y = np.array([[2.0**-4], [2.0**8], [2.0**8]])
    c, info = dgemm_emulated(x, y, return_info=True, backend=backend)
    c2 = dgemm_emulated(x, y, slices=2, slice_bits=8, backend=backend)
    got = (float(np.array(c)[0, 0]), float(np.array(c2)[0, 0]), info["esc"])
    checks.append(Check("ozaki worked example", got == (18.0, 16.0, 12),
                        f"auto {got[0]:g} (18), 2 x 8-bit slices {got[1]:g} (16), ESC {got[2]} (12)"))

    rng = np.random.default_rng(6)
    M, K, N = 12, 45, 10
    a = rng.integers(-(2**15), 2**15, (M, K)) * 2.0 ** rng.integers(-20, 20, (M, 1))
    b = rng.integers(-(2**15), 2**15, (K, N)) * 2.0 ** rng.integers(-20, 20, (1, N))
    a[3] = 0.0
    c, info = dgemm_emulated(a, b, slices="tight", return_info=True, backend=backend)
    c = np.array(c)
    bad = 0
    for i in range(M):
        for j in range(N):
            exact = sum(Fraction(float(a[i, k])) * Fraction(float(b[k, j])) for k in range(K))
            bad += float(exact) != c[i, j]
    checks.append(Check(f"ozaki exact product [{M}x{K} @ {K}x{N}]", bad == 0,
                        f"{bad} of {M * N} outputs not correctly rounded "
                        f"({info['slices']} slices)"))

    f = rng.standard_normal((M, K)) * 2.0 ** rng.integers(-9, 9, (M, K))
    g = rng.standard_normal((K, N)) * 2.0 ** rng.integers(-9, 9, (K, N))
    f[f > 1.5] = 0.0
    e = lambda v: math.frexp(v)[1] - 1  # noqa: E731  floor(log2|v|), v != 0
    want = np.zeros((M, N), dtype=np.int64)
    for i in range(M):
        for j in range(N):
            terms = [e(f[i, k]) + e(g[k, j]) for k in range(K) if f[i, k] and g[k, j]]
            rows = [e(v) for v in f[i] if v]
            cols = [e(v) for v in g[:, j] if v]
            want[i, j] = max(rows) + max(cols) - max(terms) if terms else 0
    exact = np.array(_esc.esc(f, g, backend=backend))
    est = np.array(_esc.esc_estimate(f, g, backend=backend))
    checks.append(Check("ozaki ESC exact / estimate", bool(np.array_equal(exact, want)
                                                            and np.all(est >= want)),
                        f"exact: {int(np.count_nonzero(exact != want))} mismatches; "
                        f"estimate - exact in [{int((est - want).min())}, {int((est - want).max())}]"))
    return checks


register(70, selftest_checks)
