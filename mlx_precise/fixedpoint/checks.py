"""The fixed-point self-test checks (``python -m mlx_precise selftest``): every
Q1.15 / Q1.31 conversion against exact rational rounding (:func:`.qformat.exact_code`)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..core.selftest import Check, register
from .qformat import (
    Q115_THRESHOLD,
    Q131_THRESHOLD,
    ROUNDING_MODES,
    exact_code,
    float_to_q115,
    float_to_q131,
    q115_to_float,
    q131_to_float,
    simulate_q115,
    simulate_q131,
)


def _selftest_inputs(n: int, seed: int) -> np.ndarray:
    """Every 7th Q1.15 tie point (k + 1/2) / 2^15, Q1.31 tie points, near-threshold and
    special values, and random floats over all exponents."""
    rng = np.random.default_rng(seed)
    k = np.arange(-(2**15), 2**15, 7, dtype=np.float64)
    ties15 = ((k + 0.5) / 2**15).astype(np.float32)
    ties31 = (rng.integers(-(2**23), 2**23, n) * 2 + 1) / 2.0**32
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    t = np.float32(Q115_THRESHOLD)
    specials = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 2.0**-149, -(2.0**-126),
                3e38, -3e38, t, -t, np.nextafter(t, np.float32(1)), 2.0**-16, -(2.0**-32)]
    return np.concatenate([ties15, ties31.astype(np.float32), bits,
                           np.array(specials, np.float32)]).astype(np.float32)


def selftest_checks(backend: str, done=()) -> list:
    """Checks for ``python -m mlx_precise selftest``: every conversion kernel (or the
    cpu implementation) against :func:`exact_code`, for each rounding mode and both
    formats, on ~9400 Q1.15 tie points, 1000 Q1.31 ties, specials and 1000
    random bit patterns."""
    x = _selftest_inputs(1000, seed=5)
    xs = [float(v) for v in x]
    xa = mx.array(x)
    checks = []
    for bits, t0 in ((15, Q115_THRESHOLD), (31, Q131_THRESHOLD)):
        to_q = float_to_q115 if bits == 15 else float_to_q131
        sim = simulate_q115 if bits == 15 else simulate_q131
        to_f = q115_to_float if bits == 15 else q131_to_float
        for rounding in ROUNDING_MODES:
            want = np.array([exact_code(v, t0, rounding, bits) for v in xs], np.int64)
            got = np.array(to_q(xa, t0, rounding, backend=backend)).astype(np.int64)
            # The value of code q: q / 2^b rounded once to float32 (float64 holds
            # q / 2^b exactly); NaN stays NaN in the fused simulation.
            want_v = (want / 2.0**bits).astype(np.float32)
            want_v[np.isnan(x)] = np.nan
            got_v = np.array(sim(xa, t0, rounding, backend=backend))
            same_v = (got_v.view(np.uint32) == want_v.view(np.uint32)) | (
                np.isnan(got_v) & np.isnan(want_v))
            bad = int(np.count_nonzero(got != want)) + int(np.count_nonzero(~same_v))
            checks.append(Check(
                f"Q1.{bits} {rounding} [{x.size} values]", bad == 0,
                f"{bad} codes/values differ from exact rounding (need 0)"))
        codes = np.array([-(2**bits), -1, 0, 1, 2**bits - 1, 12345, -(2**bits) + 3, 2**bits // 3])
        codes = np.concatenate([codes, np.random.default_rng(bits).integers(-(2**bits), 2**bits, 100)])
        # int / int is correctly rounded, and q / 2^b is a float64: one rounding.
        want_f = np.array([int(c) / 2**bits for c in codes]).astype(np.float32)
        got_f = np.array(to_f(mx.array(codes.astype(np.int16 if bits == 15 else np.int32)),
                              backend=backend))
        bad = int(np.count_nonzero(got_f.view(np.uint32) != want_f.view(np.uint32)))
        checks.append(Check(f"Q1.{bits} code -> float [{codes.size} codes]", bad == 0,
                            f"{bad} values differ from q / 2^{bits} rounded (need 0)"))
    return checks


register(40, selftest_checks)
