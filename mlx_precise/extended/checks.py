"""The self-test's checks of the block's own kernels: the double-word row sums of
scatter-adds and gradients (``dw_rows_add``), on a kernel backend."""

from __future__ import annotations

from fractions import Fraction

import mlx.core as mx
import numpy as np

from ..core import backends
from ..core.selftest import Check, register
from ..doubleword.checks import U
from .carry import attach, low_word, suspended
from .rules.shape import rows_add


def check_rows_add(backend, n: int = 600, rows: int = 40, m: int = 3) -> Check:
    """Rows named repeatedly (about 15 values each, negative indices included) against
    exact rational sums: the compensated sum's error is at most 2u^2 |sum| plus
    (4k + O(1)) u^3 times the sum of magnitudes for k terms (dw_acc in doubleword.h);
    required here: 4u^2 times the sum of magnitudes."""
    rng = np.random.default_rng(17)
    hi = rng.standard_normal((n, m)).astype(np.float32)
    lo = (hi * np.float32(2.0**-30) * rng.choice([-1, 1], (n, m))).astype(np.float32)
    idx = rng.integers(-rows, rows, n).astype(np.int32)
    with suspended():  # (a carried array: the words as given)
        v = attach(mx.array(hi), mx.array(lo))
    with backends.use_backend(backends.of(backend).name):
        out = rows_add(rows, mx.array(idx), v)
        got_hi, got_lo = np.array(out), np.array(low_word(out))
    worst = Fraction(0)
    for r in range(rows):
        sel = np.nonzero(idx % rows == r)[0]
        for c in range(m):
            terms = [Fraction(float(hi[k, c])) + Fraction(float(lo[k, c])) for k in sel]
            total, mags = sum(terms, Fraction(0)), sum((abs(t) for t in terms), Fraction(0))
            got = Fraction(float(got_hi[r, c])) + Fraction(float(got_lo[r, c]))
            if mags:
                worst = max(worst, abs(got - total) / mags)
    return Check(f"scatter-add row sums [{n} values, {rows} rows]", worst <= 4 * U**2,
                 f"max err {float(worst / U**2):.3g} u^2 of the magnitudes (need <= 4)")


def selftest_checks(backend, done=()) -> list[Check]:
    return [check_rows_add(backend)] if backends.of(backend).has_kernels else []


register(80, selftest_checks)
