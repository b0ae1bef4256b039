"""Double-word FFTs: ``mlx_precise.fft``, MLX's ``mx.fft`` surface.

The public face (:mod:`.api`): ``fft``, ``ifft``, ``rfft``, ``irfft``, ``fft2``,
``ifft2``, ``rfft2``, ``irfft2``, ``fftn``, ``ifftn``, ``rfftn``, ``irfftn`` with
MLX's arguments (precision-aware: double-word inside
:func:`~mlx_precise.extended_precision`, ``mx.fft.*`` outside), each with its
double-word twin ``*_extended``, and ``fftshift`` / ``ifftshift``.

Behind it: :mod:`.nd` (several axes, ``norm`` modes, gradients), :mod:`.engine`
(the 1-D kernels: Stockham, Bluestein, real packing), :mod:`.twiddles` (host
twiddles to ~2^-100), :mod:`.cpu` (the cpu backend's engine) and :mod:`.checks`
(the self-test's checks).
"""

from . import checks  # noqa: F401  (registers the self-test checks)
from .api import (
    fft,
    fft2,
    fft2_extended,
    fft_extended,
    fftn,
    fftn_extended,
    fftshift,
    ifft,
    ifft2,
    ifft2_extended,
    ifft_extended,
    ifftn,
    ifftn_extended,
    ifftshift,
    irfft,
    irfft2,
    irfft2_extended,
    irfft_extended,
    irfftn,
    irfftn_extended,
    rfft,
    rfft2,
    rfft2_extended,
    rfft_extended,
    rfftn,
    rfftn_extended,
)

TRANSFORMS = ("fft", "ifft", "rfft", "irfft", "fft2", "ifft2", "rfft2", "irfft2", "fftn",
              "ifftn", "rfftn", "irfftn")
__all__ = [*TRANSFORMS, *(f"{n}_extended" for n in TRANSFORMS), "fftshift", "ifftshift"]
