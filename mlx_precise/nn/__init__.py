"""``mlx.nn`` layers: ``mlx_precise.nn``.

* :mod:`.layers`: :class:`FFTConv` and :class:`HyenaOperator` (their convolutions
  follow :func:`~mlx_precise.extended_precision`: :mod:`mlx_precise.conv`);
* :mod:`.int8`: W8A8 :class:`Int8Linear` and :func:`convert_linear_to_int8`
  (:mod:`mlx_precise.int8`).
"""

from .int8 import Int8Linear, convert_linear_to_int8
from .layers import FFTConv, HyenaFilter, HyenaOperator, Sin

__all__ = ["FFTConv", "HyenaFilter", "HyenaOperator", "Int8Linear", "Sin",
           "convert_linear_to_int8"]
