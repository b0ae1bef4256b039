"""Helpers of the double-word flow's tests: seeded float32 data and the share of
outputs exactly rounded against a higher-precision oracle."""

import numpy as np


def rng_f32(shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def f64(a) -> np.ndarray:
    """The float32 array's own value in float64 (its high word)."""
    return np.array(a).astype(np.float64)


def value64(a) -> np.ndarray:
    """The value an array carries: its high and low words joined in float64."""
    from mlx_precise.extended import low_word

    lo = low_word(a)
    return f64(a) if lo is None else f64(a) + f64(lo)


def share(y, ref) -> float:
    """Fraction of outputs equal to the oracle ``ref`` rounded once to float32
    (complex: both parts)."""
    y, ref = np.array(y), np.asarray(ref)
    if np.iscomplexobj(ref):
        return float(np.mean((y.real == ref.real.astype(np.float32))
                             & (y.imag == ref.imag.astype(np.float32))))
    return float(np.mean(y == ref.astype(np.float32)))
