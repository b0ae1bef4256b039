"""Ops the cpu backend runs in MLX float64 on the operands' exact values, each
float64 result kept in two words: ``mx.linalg`` (LAPACK, which MLX runs on the CPU),
and ops whose float64 form is exact on the values (running extrema, ``minmax``,
``unique``, ``searchsorted``). On ``metal`` / ``emulate`` there is no float64 to
run them in: the rule declines and the dispatcher reports the float32 op."""

from __future__ import annotations

import mlx.core as mx

from ...doubleword.words import from64
from ..carry import attach_words
from .base import as64, is_word_array

_NAMES = ("cholesky", "cholesky_inv", "det", "eigh", "eigvalsh", "inv", "lu", "lu_factor",
          "norm", "pinv", "qr", "slogdet", "solve", "solve_triangular", "svd", "tri_inv")


def _wide(value):
    """A float64 result as words (other dtypes, such as pivots, unchanged)."""
    if isinstance(value, (list, tuple)):
        return type(value)(_wide(v) for v in value)
    if isinstance(value, mx.array) and value.dtype == mx.float64:
        z = from64(value)
        return attach_words(z.hi, z)
    return value


def _float64(ctx, original, *args, **kw):
    arrays = [a for a in (*args, *kw.values()) if isinstance(a, mx.array)]
    if not ctx.backend.float64_engine or not any(a.dtype == mx.float32 for a in arrays) or any(
            a.dtype not in (mx.float32, mx.float64) for a in arrays):
        return NotImplemented
    wide = (lambda v: as64(v) if is_word_array(v) else v)
    with mx.stream(mx.cpu):
        return _wide(original(*map(wide, args), **{k: wide(v) for k, v in kw.items()}))


_EXACT64 = ("cummax", "cummin", "minmax", "unique", "searchsorted")

RULES = {**{f"linalg.{name}": _float64 for name in _NAMES}, "matrix_norm": _float64,
         **{name: _float64 for name in _EXACT64}}
"""Op name -> rule."""
