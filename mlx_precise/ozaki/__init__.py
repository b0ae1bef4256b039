"""Ozaki-style DGEMM emulation: :func:`dgemm_emulated`.

Split-integer slices of float64 matrices multiplied exactly on the int8 GEMM
engine (:mod:`mlx_precise.int8`), the slice count chosen by ESC analysis
(:mod:`mlx_precise.esc`). The engine is :mod:`.engine`; :mod:`.checks` holds the
self-test's checks.
"""

from . import checks  # noqa: F401  (registers the self-test checks)
from .engine import dgemm_emulated

__all__ = ["dgemm_emulated"]
