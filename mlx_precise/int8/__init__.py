"""int8 GEMM with CUTLASS-style scaled epilogues.

* :mod:`.engine`: the int8 x int8 -> int32 GEMM kernel (:func:`int8_matmul`);
* :mod:`.scaled`: :func:`quantize_int8`, :func:`compute_azp_adj` and
  :func:`scaled_mm` (per-tensor / per-token / per-channel scales, bias, azp);
* :mod:`.checks`: the self-test's checks.

The W8A8 ``mlx.nn`` layers are in :mod:`mlx_precise.nn`.
"""

from . import checks  # noqa: F401  (registers the self-test checks)
from .engine import int8_matmul
from .scaled import compute_azp_adj, quantize_int8, scaled_mm

__all__ = ["compute_azp_adj", "int8_matmul", "quantize_int8", "scaled_mm"]
