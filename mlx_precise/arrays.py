"""Array-like inputs, accepted as MLX's own ops accept them."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

_ARRAY_LIKE = (np.ndarray, np.generic, list, tuple, int, float, complex)


def as_array(x, name: str) -> mx.array:
    """``x`` as an ``mx.array``: an ``mx.array`` as it is; a numpy array, list, tuple
    or number through ``mx.array`` (so its dtype follows MLX's rules, e.g. a list
    of floats is float32). Anything else raises TypeError naming the argument."""
    if isinstance(x, mx.array):
        return x
    if isinstance(x, _ARRAY_LIKE) and not isinstance(x, bool):
        try:
            return mx.array(x)
        except (TypeError, ValueError) as e:
            raise TypeError(f"{name} is not a valid array: {e}") from None
    raise TypeError(
        f"{name} must be an mx.array or array-like (numpy array, list, number), "
        f"got {type(x).__name__}")
