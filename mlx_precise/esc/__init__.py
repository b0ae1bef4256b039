"""ESC analysis (``mlx_precise.esc``): how many bits the exact product of two
float64 matrices spans, and how many Ozaki slices it needs.

:func:`esc` (exact), :func:`esc_estimate` (block bound) and :func:`slices_needed`;
the engine (row / column exponent scans: Metal kernels, threaded numpy on ``cpu``)
is :mod:`.engine`. :mod:`mlx_precise.ozaki` builds on it.
"""

from .engine import (
    DEFAULT_BLOCK,
    ESC_UNBOUNDED,
    METHODS,
    TIGHT_GUARD,
    esc,
    esc_estimate,
    slices_needed,
)

__all__ = ["DEFAULT_BLOCK", "ESC_UNBOUNDED", "METHODS", "TIGHT_GUARD", "esc", "esc_estimate",
           "slices_needed"]
