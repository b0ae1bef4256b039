"""Convolutions in double-word.

* :mod:`.depthwise`: ``depthwise_conv`` / ``depthwise3`` and their ``*_extended``
  twins (Metal kernels; native float64 on ``cpu``);
* :mod:`.hyena`: the Hyena long convolution ``fftconv`` / ``hyena_conv_extended``
  (double-word FFTs of :mod:`mlx_precise.fft`, with gradient kernels);
* :mod:`.checks`: the self-test's checks.
"""

from . import checks  # noqa: F401  (registers the self-test checks)
from .depthwise import depthwise3, depthwise3_extended, depthwise_conv, depthwise_conv_extended
from .hyena import default_fft_size, fftconv, hyena_conv_extended

__all__ = ["default_fft_size", "depthwise3", "depthwise3_extended", "depthwise_conv",
           "depthwise_conv_extended", "fftconv", "hyena_conv_extended"]
