"""Double-word FFTs: ``mlx_precise.fft``.

The public face (:mod:`.api`): :func:`fft`, :func:`ifft`, :func:`rfft`,
:func:`irfft` (precision-aware: double-word inside
:func:`~mlx_precise.extended_precision`, ``mx.fft.*`` outside) and their
double-word twins :func:`fft_extended`, :func:`ifft_extended`,
:func:`rfft_extended`, :func:`irfft_extended`.

Behind it: :mod:`.nd` (several axes, ``norm`` modes, gradients), :mod:`.engine`
(the 1-D kernels: Stockham, Bluestein, real packing), :mod:`.twiddles` (host
twiddles to ~2^-100), :mod:`.cpu` (the cpu backend's engine) and :mod:`.checks`
(the self-test's checks).
"""

from . import checks  # noqa: F401  (registers the self-test checks)
from .api import (
    fft,
    fft_extended,
    ifft,
    ifft_extended,
    irfft,
    irfft_extended,
    rfft,
    rfft_extended,
)

__all__ = ["fft", "ifft", "rfft", "irfft", "fft_extended", "ifft_extended",
           "rfft_extended", "irfft_extended"]
