"""``python -m mlx_precise demo``: a realistic Hyena long convolution, four ways.

Batch 1, 64 channels, L = 16384, Hyena-like exponentially decaying filters: plain
float32 MLX (the safari formula with ``mx.fft``), the same unmodified MLX code run
inside ``extended_precision()`` (MLX's FFTs intercepted, each rounded once; the
product of the spectra stays float32), the extended convolution on the
chosen backend, and a high-precision oracle from the same float32 inputs (numpy
longdouble where it has a 64-bit significand, else float64). For each: normwise
error, max error (relative to max |y|), the share of outputs exactly rounded, time.
The last row, the oracle rounded once to float32, is the best any float32 output
can do.
"""

from __future__ import annotations

import time

import mlx.core as mx
import numpy as np

from ..core import backends
from ..core.context import extended_precision
from ..conv.hyena import default_fft_size, fftconv, hyena_conv_extended


def _oracle_dtype():
    ld = np.longdouble
    return (ld, "longdouble (64-bit significand)") if np.finfo(ld).nmant > 52 else (
        np.float64, "float64")


def _inputs(batch: int, channels: int, L: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((batch, channels, L)).astype(np.float32)
    rates = rng.uniform(1, 20, (channels, 1))
    k = (rng.standard_normal((channels, L)) * np.exp(-np.arange(L)[None] * rates / L))
    D = rng.standard_normal(channels).astype(np.float32)
    return u, k.astype(np.float32), D


def _wrapped(u, k, D, name: str):
    """The plain MLX formula, unchanged, inside an extended block."""
    with backends.use_backend(name), extended_precision():
        return fftconv.plain(u, k, D)


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    mx.eval(out)
    return out, time.perf_counter() - t


def run(backend: str | None = None, batch: int = 1, channels: int = 64, L: int = 16384,
        seed: int = 0) -> list[dict]:
    """Run the comparison; returns one dict per row (name, normwise, max_err,
    exactly_rounded, seconds) and prints the table."""
    name = backends.resolve(backend)
    dtype, dname = _oracle_dtype()
    print(f"Hyena long convolution: batch {batch}, channels {channels}, L = {L}, "
          f"decaying filters, FFT size {default_fft_size(L, L)}")
    print(f"backend for the extended path: {name}; oracle: {dname} FFT of the same inputs")
    u, k, D = _inputs(batch, channels, L, seed)
    t = time.perf_counter()
    N = default_fft_size(L, L)
    ul = u.astype(dtype)
    ref = np.fft.irfft(np.fft.rfft(ul, N) * np.fft.rfft(k.astype(dtype), N), N)[..., :L]
    ref = ref + D.astype(dtype)[None, :, None] * ul
    t_ref = time.perf_counter() - t
    print(f"  oracle computed in {t_ref:.1f} s", flush=True)
    uu, kk, DD = mx.array(u), mx.array(k), mx.array(D)
    rows = []
    ref32 = ref.astype(np.float32)
    scale = float(np.abs(ref).max())
    for label, fn in (
        ("float32 MLX (mx.fft)", lambda: fftconv.plain(uu, kk, DD)),
        ("unmodified MLX code inside extended_precision()", lambda: _wrapped(uu, kk, DD, name)),
        (f"extended ({name})", lambda: hyena_conv_extended(uu, kk, DD, backend=name)),
    ):
        fn()  # warm-up: kernel compilation, caches
        y, secs = _timed(fn)
        y = np.array(y)
        diff = (y - ref).astype(np.float64)
        rows.append(dict(
            name=label,
            normwise=float(np.linalg.norm(diff) / np.linalg.norm(ref.astype(np.float64))),
            max_err=float(np.abs(diff).max()) / scale,
            exactly_rounded=float((y == ref32).mean()),
            seconds=secs,
        ))
        print(f"  {label} done in {secs:.2f} s", flush=True)
    # The best any float32 output can do: the oracle rounded once to float32.
    d32 = (ref32 - ref).astype(np.float64)
    rows.append(dict(name="oracle rounded to float32", seconds=t_ref, exactly_rounded=1.0,
                     normwise=float(np.linalg.norm(d32) / np.linalg.norm(ref.astype(np.float64))),
                     max_err=float(np.abs(d32).max()) / scale))
    print()
    w = max(len(r["name"]) for r in rows)
    print(f"| {'method':<{w}} | normwise error | max error / max|y| | exactly rounded | time (s) |")
    print(f"|{'-' * (w + 2)}|----------------|--------------------|-----------------|----------|")
    for r in rows:
        print(f"| {r['name']:<{w}} | {r['normwise']:14.3e} | {r['max_err']:18.3e} | "
              f"{100 * r['exactly_rounded']:14.4f}% | {r['seconds']:8.2f} |")
    return rows
