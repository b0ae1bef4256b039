"""The FFT's self-test checks (``python -m mlx_precise selftest``): the host
twiddles and each transform's kernel paths against an mpmath DFT."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from ..core.selftest import Check, register
from .api import fft_extended, ifft_extended, irfft_extended, rfft_extended
from .twiddles import roots_dd


def _mp_dft(rows: np.ndarray, inverse: bool) -> np.ndarray:
    """O(n^2) DFT of complex rows (skipping zero inputs) in mpmath at 80 bits: the
    self-test's oracle, independent of the kernels, the twiddle code and numpy."""
    import mpmath

    n = rows.shape[-1]
    out = np.empty(rows.shape, np.complex128)
    with mpmath.workprec(80):
        w = [mpmath.expj((1 if inverse else -1) * 2 * mpmath.pi * k / n) for k in range(n)]
        for i, row in enumerate(rows):
            nz = [(j, mpmath.mpc(complex(a))) for j, a in enumerate(row) if a != 0]
            for k in range(n):
                s = mpmath.fsum(v * w[(j * k) % n] for j, v in nz)
                out[i, k] = complex(s / n if inverse else s)
    return out


def selftest_checks(backend: str, done=()) -> list:
    """Each transform at small sizes (two kernels' paths: one- and two-pass
    Stockham, real packing, Bluestein) against an mpmath DFT: normwise error of
    the unrounded result <= 1e-13; plus the host twiddles against mpmath."""
    import mpmath

    checks = []
    m = 2**20
    e = np.random.default_rng(1).integers(0, m, 64)
    rh, rl, ih, il = roots_dd(m, e)
    worst = 0.0
    with mpmath.workprec(160):
        for i, ei in enumerate(e):
            z = mpmath.expj(-2 * mpmath.pi * int(ei) / m)
            worst = max(worst, float(abs(mpmath.mpf(rh[i]) + rl[i] - z.real)),
                        float(abs(mpmath.mpf(ih[i]) + il[i] - z.imag)))
    checks.append(Check("FFT twiddles 2^20 [host]", worst <= 2.0**-100,
                        f"max abs err 2^{math.log2(worst) if worst else -math.inf:.1f} "
                        "(need <= 2^-100)"))
    rng = np.random.default_rng(2)
    cases = (("fft", 64, 2), ("ifft", 2048, 1), ("rfft", 128, 2), ("irfft", 128, 1),
             ("fft", 12, 2))
    fns = {"fft": fft_extended, "ifft": ifft_extended, "rfft": rfft_extended,
           "irfft": irfft_extended}
    for kind, n, batch in cases:
        x = (rng.standard_normal((batch, n)) + 1j * rng.standard_normal((batch, n)))
        x = x.astype(np.complex64)
        if kind == "rfft":
            x = np.ascontiguousarray(x.real)
        if kind == "irfft":
            x = x[:, : n // 2 + 1]
            full = np.concatenate([x, np.conj(x[:, 1:-1][:, ::-1])], axis=1).astype(np.complex128)
            full[:, 0] = full[:, 0].real
            full[:, n // 2] = full[:, n // 2].real
            ref = _mp_dft(full, True).real
        else:
            if n > 256:  # two passes; a sparse input keeps the O(n^2) oracle cheap
                x[:, 16:] = 0
            ref = _mp_dft(x.astype(np.complex128), kind == "ifft")
            if kind == "rfft":
                ref = ref[:, : n // 2 + 1]
        d = fns[kind](mx.array(x), n=n, round_output=False, backend=backend)
        y = d.to_float64()
        err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
        checks.append(Check(f"{kind} n={n} x{batch}", err <= 1e-13,
                            f"normwise err {err:.2e} (need <= 1e-13)"))
    return checks


register(30, selftest_checks)
