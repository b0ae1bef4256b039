"""mlx-precise: extended-precision Metal kernels for MLX.

Apple GPUs have no float64. mlx-precise computes in double-word ("float-float",
about 48 significand bits, about 14 decimal digits) arithmetic inside Metal kernels
and rounds once at the end. Every kernel also runs on the CPU through the Metal
emulator (:mod:`mlx_precise.emulator`), and a native float64 ``cpu`` backend serves
machines without Metal.
"""

try:
    import mlx.core  # noqa: F401
except ImportError as _e:
    # A bare `mlx` wheel on Linux (or an install with --no-deps) fails deep inside MLX
    # with "No module named 'mlx'" or a missing libmlx.so; name the fix instead.
    raise ImportError(
        f"mlx-precise needs MLX, which cannot be imported here ({_e}). On Linux install "
        "MLX's CPU build: pip install 'mlx[cpu]' scipy (a plain `pip install mlx-precise` "
        "brings both); on a Mac: pip install mlx") from _e

from .core.backends import (
    BACKENDS,
    BackendUnavailableError,
    backend,
    default_backend,
    metal_available,
    set_backend,
    use_backend,
)
from .core.autodiff import NotDifferentiableError, TransformUnsupportedError
from .core.context import extended_precision, is_extended
from .core.kernels import DeviceCheckError, Kernel
from .doubleword import (
    DoubleWord,
    complex_multiply,
    complex_multiply_extended,
    fft_scale,
    fft_scale_extended,
    precision_aware_functions,
)
from . import fft  # (mlx_precise.fft.{fft, ifft, rfft, irfft}: precision-aware)
from .fft import fft_extended, ifft_extended, irfft_extended, rfft_extended
from .conv import (
    depthwise3,
    depthwise3_extended,
    depthwise_conv,
    depthwise_conv_extended,
    fftconv,
    hyena_conv_extended,
)
from . import esc  # (ESC analysis: mlx_precise.esc.esc, esc_estimate, slices_needed)
from .ozaki import dgemm_emulated
from .fixedpoint import (
    Q115_THRESHOLD,
    Q131_THRESHOLD,
    ROUNDING_MODES,
    SF16,
    float_to_q115,
    float_to_q131,
    q115_to_float,
    q131_to_float,
    sf16,
    sf16_boundary,
    sf16_matmul,
    simulate_q115,
    simulate_q131,
)
from .norms import Layout, block_cols, block_cyclic, block_rows, norm
from .int8 import compute_azp_adj, int8_matmul, quantize_int8, scaled_mm
from . import nn  # (mlx.nn layers: FFTConv, HyenaOperator, Int8Linear)
from . import extended  # (the double-word flow of extended_precision())
from .extended.checkpoint import load_extended, save_extended
from .extended.intercept import install_from_env as _install_interception

# MLX's own ops run extended inside extended_precision() (MLX_PRECISE_INTERCEPT=0: not)
_install_interception()

__version__ = "0.1.0"

__all__ = [
    "BACKENDS",
    "BackendUnavailableError",
    "DeviceCheckError",
    "NotDifferentiableError",
    "TransformUnsupportedError",
    "DoubleWord",
    "Kernel",
    "complex_multiply",
    "complex_multiply_extended",
    "depthwise3",
    "depthwise3_extended",
    "depthwise_conv",
    "depthwise_conv_extended",
    "extended_precision",
    "load_extended",
    "save_extended",
    "fft_scale",
    "fft_scale_extended",
    "fftconv",
    "fft",
    "fft_extended",
    "ifft_extended",
    "irfft_extended",
    "rfft_extended",
    "hyena_conv_extended",
    "compute_azp_adj",
    "dgemm_emulated",
    "esc",
    "Layout",
    "block_cols",
    "block_cyclic",
    "block_rows",
    "norm",
    "Q115_THRESHOLD",
    "Q131_THRESHOLD",
    "ROUNDING_MODES",
    "SF16",
    "float_to_q115",
    "float_to_q131",
    "q115_to_float",
    "q131_to_float",
    "sf16",
    "sf16_boundary",
    "sf16_matmul",
    "simulate_q115",
    "simulate_q131",
    "int8_matmul",
    "quantize_int8",
    "scaled_mm",
    "is_extended",
    "precision_aware_functions",
    "backend",
    "default_backend",
    "metal_available",
    "set_backend",
    "use_backend",
]
