"""Array-like inputs, accepted as MLX's own ops accept them, and the package's one
policy for float64 data (docs/api.md, "Inputs").

MLX's ``mx.array`` rounds numpy float64 data to float32 without a word. No public
op of this package lets that happen: every input goes through :func:`as_array`,
which, depending on what the op computes in,

* ``wide="refuse"`` (ops on float32 words): refuses float64 / complex128 data with
  a ``TypeError`` that names the argument and the way to full precision;
* the double-word ops split it into a :class:`~mlx_precise.DoubleWord`
  (``hi = RN32(x)``, ``lo = RN32(x - hi)``), so it enters at full precision:
  :func:`mlx_precise.doubleword.words.as_words`, this function with that one step
  added (the number system lives above this module);
* ``wide="float64"`` (ops on float64 data: ``norm``, ``dgemm_emulated``,
  ``DoubleWord.from_float64``): keeps it as float64, and reads lists and Python
  numbers as the float64 (complex128) values they are.

Elsewhere lists and Python numbers follow ``mx.array``'s rule (a list of floats is
float32), as in MLX.
"""

from __future__ import annotations

import numbers

import mlx.core as mx
import numpy as np

_PYTHON = (list, tuple, int, float, complex)
_ARRAY_LIKE = (np.ndarray, np.generic) + _PYTHON
_WIDE_NP = (np.float64, np.complex128, np.longdouble, np.clongdouble)
WIDE_MODES = ("refuse", "float64")


def is_wide(x) -> bool:
    """True for float64 / complex128 data: an ``mx.float64`` array, or numpy data
    of dtype float64, complex128 or wider."""
    if isinstance(x, mx.array):
        return x.dtype == mx.float64
    return isinstance(x, (np.ndarray, np.generic)) and x.dtype in _WIDE_NP


def float64_data(x, name: str) -> np.ndarray:
    """Lists, tuples and Python numbers as numpy float64 (real) or complex128
    data: the values Python holds, unrounded. Other inputs are returned as they
    are."""
    if not isinstance(x, _PYTHON) or isinstance(x, bool):
        return x
    try:
        a = np.asarray(x)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} is not a valid array: {e}") from None
    if a.dtype.kind in "iuf":
        return a.astype(np.float64)
    if a.dtype.kind == "c":
        return a.astype(np.complex128)
    raise TypeError(f"{name} must hold numbers, got numpy dtype {a.dtype} from "
                    f"{type(x).__name__}")


def as_array(x, name: str, *, wide: str = "refuse"):
    """``x`` as an ``mx.array``: an ``mx.array`` as it is; a numpy array, list,
    tuple or number through ``mx.array`` (so its dtype follows MLX's rules, e.g. a
    list of floats is float32), except float64 / complex128 data, which follows
    ``wide`` (see the module docstring): "refuse" raises TypeError, "float64" returns a float64 ``mx.array``
    (complex128 data, which MLX lacks, stays a numpy array) and reads lists and
    Python numbers as float64 / complex128.

    Raises:
        TypeError: not an array-like (naming the argument), or float64 data where
            ``wide="refuse"``.
    """
    if wide not in WIDE_MODES:
        raise ValueError(f"wide must be one of {WIDE_MODES}, got {wide!r}")
    if isinstance(x, bool) or not isinstance(x, (mx.array,) + _ARRAY_LIKE):
        raise TypeError(
            f"{name} must be an mx.array or array-like (numpy array, list, number), "
            f"got {type(x).__name__}")
    if wide == "float64":
        x = float64_data(x, name)
    if is_wide(x):
        return _wide(x, name, wide)
    if isinstance(x, mx.array):
        return x
    try:
        return mx.array(x)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} is not a valid array: {e}") from None


def _wide(x, name: str, wide: str):
    """float64 / complex128 data by the policy ``wide``."""
    if wide == "refuse":
        kind = (f"mlx {str(x.dtype).split('.')[-1]}" if isinstance(x, mx.array)
                else f"numpy {x.dtype}")
        raise TypeError(
            f"{name} has dtype {kind}, which this op would have to round to float32: "
            "convert it yourself (e.g. x.astype(np.float32)) to accept that rounding, "
            "or use an op that takes double-word input (DoubleWord.from_float64)")
    if isinstance(x, mx.array):
        return x
    a = np.asarray(x)
    if a.dtype.kind == "c":
        return a.astype(np.complex128)
    return mx.array(a.astype(np.float64), dtype=mx.float64)


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
