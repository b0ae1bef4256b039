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

from .backends import (
    BACKENDS,
    BackendUnavailableError,
    backend,
    default_backend,
    metal_available,
    set_backend,
    use_backend,
)
from .context import extended_precision, is_extended, precision_aware_functions
from .conv import (
    depthwise3,
    depthwise3_extended,
    depthwise_conv,
    depthwise_conv_extended,
)
from .doubleword import DoubleWord
from .elementwise import (
    complex_multiply,
    complex_multiply_extended,
    fft_scale,
    fft_scale_extended,
)
from . import fft  # noqa: E402  (mlx_precise.fft.{fft, ifft, rfft, irfft}: precision-aware)
from .fft import fft_extended, ifft_extended, irfft_extended, rfft_extended
from . import esc  # noqa: E402  (ESC analysis: mlx_precise.esc.esc, esc_estimate, slices_needed)
from .fixedpoint import (
    Q115_THRESHOLD,
    Q131_THRESHOLD,
    ROUNDING_MODES,
    float_to_q115,
    float_to_q131,
    q115_to_float,
    q131_to_float,
    simulate_q115,
    simulate_q131,
)
from .hyena import fftconv, hyena_conv_extended
from .norms import norm
from .ozaki import dgemm_emulated
from .norms_distributed import Layout, block_cols, block_cyclic, block_rows
from .sf16 import SF16, sf16, sf16_boundary, sf16_matmul  # noqa: E402  (function shadows module)
from .int8 import compute_azp_adj, quantize_int8, scaled_mm
from .int8_gemm import int8_matmul
from .kernels import DeviceCheckError, Kernel
from . import nn  # noqa: E402  (mlx.nn layers: FFTConv, HyenaOperator)
from . import intercept  # noqa: E402  (MLX's FFTs / depthwise conv1d inside extended_precision)
from .autodiff import NotDifferentiableError, TransformUnsupportedError

intercept.install_from_env()

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
