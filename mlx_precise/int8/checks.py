"""The int8 self-test checks (``python -m mlx_precise selftest``): the int32 GEMM
engine against numpy's int64 product, and ``scaled_mm``'s epilogues against the
exact product with the epilogue in float64, rounded once."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..core.selftest import Check, register
from .engine import int8_matmul
from .scaled import scaled_mm


def gemm_checks(backend: str) -> list:
    """Small exact checks of the int32 GEMM (partial tiles, saturated operands)
    against numpy's int64 product."""
    rng = np.random.default_rng(8)
    checks = []
    for m, n, k in ((33, 47, 70), (1, 5, 3)):
        a = rng.integers(-128, 128, (m, k), dtype=np.int8)
        b = rng.integers(-128, 128, (k, n), dtype=np.int8)
        a[0, :] = -128  # extreme products 2^14
        b[:, 0] = -128
        want = a.astype(np.int64) @ b.astype(np.int64)
        got = np.array(int8_matmul(mx.array(a), mx.array(b), backend=backend))
        bad = int(np.count_nonzero(got.astype(np.int64) != want))
        checks.append(Check(f"int8 GEMM int32 [{m}x{k} @ {k}x{n}]", bad == 0,
                            f"{bad} of {m * n} outputs differ from the exact product"))
    return checks


def selftest_checks(backend: str, done=()) -> list:
    """The int8 GEMM engine, and scaled_mm with each epilogue and output dtype, on
    small shapes with partial tiles, against an exact integer product with the
    epilogue in float64, rounded once (numpy; float16 directly, bfloat16 by integer
    rounding of the float64 significand)."""
    checks = gemm_checks(backend)
    rng = np.random.default_rng(88)
    m, n, k = 35, 40, 50
    aq = rng.integers(-128, 128, (m, k), dtype=np.int8)
    bq = rng.integers(-128, 128, (k, n), dtype=np.int8)
    s_a = rng.uniform(0.001, 0.02, (m, 1)).astype(np.float32)
    s_b = rng.uniform(-0.02, 0.02, (1, n)).astype(np.float32)
    bias = rng.normal(0, 3, n).astype(np.float32)
    zp = rng.integers(-128, 128, m).astype(np.int32)
    adj = bq.astype(np.int64).sum(axis=0)
    acc = aq.astype(np.int64) @ bq.astype(np.int64)
    cases = (
        ("scaled", {}, acc, False),
        ("bias", {"bias": bias}, acc, True),
        ("azp per-tensor", {"bias": bias, "azp_adj": (7 * adj).astype(np.int32)},
         acc - 7 * adj[None, :], True),
        ("azp per-token", {"bias": bias, "azp_adj": adj.astype(np.int32), "azp": zp},
         acc - zp[:, None].astype(np.int64) * adj[None, :], True),
    )
    dtypes = (mx.float32, mx.float16, mx.bfloat16, mx.float32)
    for (label, extra, x, has_bias), dt in zip(cases, dtypes):
        sa_used = s_a if label != "azp per-tensor" else s_a[:1, :1]
        want = sa_used.astype(np.float64) * (s_b.astype(np.float64) * x)
        if has_bias:
            want = want + bias.astype(np.float64)[None, :]
        want = _selftest_round(want, dt)
        got = scaled_mm(mx.array(aq), mx.array(bq), mx.array(sa_used), mx.array(s_b),
                        **{kk: mx.array(v) for kk, v in extra.items()}, out_dtype=dt,
                        backend=backend)
        got = np.array(got.astype(mx.float32), dtype=np.float64)
        equal = float(np.mean(got == want))
        checks.append(Check(f"int8 scaled_mm {label} -> {str(dt).split('.')[-1]}",
                            equal >= 0.999,
                            f"{100 * equal:.2f}% equal to the float64 epilogue rounded once"))
    return checks


def _selftest_round(y: np.ndarray, dt) -> np.ndarray:
    """Round float64 to ``dt`` (float32/float16 by numpy's direct conversion,
    bfloat16 by rounding the scaled significand to 8 bits half-to-even), back as
    float64. Independent of :func:`_round_once`."""
    if dt == mx.float32:
        return y.astype(np.float32).astype(np.float64)
    if dt == mx.float16:
        return y.astype(np.float16).astype(np.float64)
    mant, exp = np.frexp(y)  # y = mant 2^exp, 0.5 <= |mant| < 1
    return np.ldexp(np.rint(np.ldexp(mant, 8)), exp - 8)


register(50, selftest_checks)
