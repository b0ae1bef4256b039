"""Fixed-point simulation: Q1.15 / Q1.31 and the SF16 training mode.

* :mod:`.qformat`: float <-> Q1.15 / Q1.31 conversions and their fused
  simulation (Metal kernels; exact integer arithmetic on ``cpu``);
* :mod:`.sf16mode`: SF16 training (:func:`sf16`, :class:`SF16`,
  :func:`sf16_boundary`, :func:`sf16_matmul`);
* :mod:`.checks`: the self-test's checks.
"""

from . import checks  # noqa: F401  (registers the self-test checks)
from .qformat import (
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
from .sf16mode import SF16, sf16, sf16_boundary, sf16_matmul

__all__ = ["Q115_THRESHOLD", "Q131_THRESHOLD", "ROUNDING_MODES", "SF16", "float_to_q115",
           "float_to_q131", "q115_to_float", "q131_to_float", "sf16", "sf16_boundary",
           "sf16_matmul", "simulate_q115", "simulate_q131"]
