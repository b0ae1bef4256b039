"""Integer arguments (``n``, ``fft_size``) as MLX's ops take them. Array inputs are
read by :func:`mlx_precise.doubleword.types.read_input` (docs/api.md, "Inputs")."""

from __future__ import annotations

import numbers

import mlx.core as mx
import numpy as np


def as_int(v):
    """``v`` as a Python int when it is an integer: int, numpy integer, or a 0-d
    integer numpy / MLX array (bools excluded); else None, so that the caller
    raises its own error."""
    if isinstance(v, (bool, np.bool_)):
        return None
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, mx.array):
        integer = mx.issubdtype(v.dtype, mx.integer)
    else:
        integer = isinstance(v, np.ndarray) and v.dtype.kind in "iu"
    return int(v.item()) if integer and v.ndim == 0 else None
