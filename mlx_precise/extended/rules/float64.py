"""Ops run in MLX float64 on the operands' exact values, each float64 result kept
in two words: ``mx.linalg`` (LAPACK, which MLX runs on the CPU on every device: so
on every backend, on the CPU stream) and, on the cpu backend, ops whose float64
form is exact on the values (``minmax``, ``unique``, ``searchsorted``; on ``metal``
/ ``emulate`` those stay on the GPU: ``searchsorted`` as exact comparisons of the
flow, the others decline and are reported). ``linalg.norm`` off cpu is MLX's
composition of ops of the flow (:func:`_norm`)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ...doubleword.engine64 import from64
from .. import autodiff, carry
from ..carry import attach_words
from .base import as64, is_word_array
from ..constructor import ARRAY  # the class (mx.array is a stand-in inside blocks)

_NAMES = ("cholesky", "cholesky_inv", "det", "eigh", "eigvalsh", "inv", "lu", "lu_factor",
          "pinv", "qr", "slogdet", "solve", "solve_triangular", "svd", "tri_inv")


def _wide(value):
    """A float64 result as words (other dtypes, such as pivots, unchanged)."""
    if isinstance(value, (list, tuple)):
        return type(value)(_wide(v) for v in value)
    if isinstance(value, ARRAY) and value.dtype == mx.float64:
        z = from64(value)
        return attach_words(z.hi, z)
    return value


def in_float64(ctx, original, *args, **kw):
    """The op in MLX float64 on the exact values (cpu), float64 results in two
    words; NotImplemented elsewhere."""
    if not ctx.backend.float64_engine:
        return NotImplemented
    return on_cpu(original, args, kw)


def _linalg(ctx, original, *args, **kw):
    """``mx.linalg``'s factorizations and solvers: MLX runs them on the CPU on
    every device (LAPACK), so on every backend they run there in MLX float64 on the
    exact values (on ``metal`` / ``emulate`` the words joined in float64 on the CPU
    stream, the results split back into words): the cost of MLX's own float32 call,
    at float64's LAPACK speed."""
    return on_cpu(original, args, kw)


def on_cpu(original, args, kw):
    """``original`` on the CPU stream in MLX float64 on the operands' exact values,
    float64 results in two words; NotImplemented without a float32 operand, or with
    operands of other dtypes."""
    arrays = [a for a in (*args, *kw.values()) if isinstance(a, ARRAY)]
    if not any(a.dtype == mx.float32 for a in arrays) or any(
            a.dtype not in (mx.float32, mx.float64) for a in arrays):
        return NotImplemented
    wide = (lambda v: as64(v) if is_word_array(v) else v)
    with mx.stream(mx.cpu):
        return _wide(original(*map(wide, args), **{k: wide(v) for k, v in kw.items()}))


def _norm_axes(a, ord, axis):
    """The axes ``linalg.norm(a, ord, axis)`` reduces, or None where
    :func:`_norm` has no composition (MLX's errors; matrix 2 / -2 / 'nuc' norms,
    which need singular values)."""
    if axis is None and ord is not None:
        if a.ndim not in (1, 2):
            return None
        axis = tuple(range(a.ndim))
    axes = tuple(range(a.ndim)) if axis is None else (
        (axis,) if isinstance(axis, int) else tuple(axis))
    if not 1 <= len(axes) <= 2 or any(not -a.ndim <= d < a.ndim for d in axes) or (
            len(set(d % a.ndim for d in axes)) < len(axes)):
        return None
    if isinstance(ord, bool) or (isinstance(ord, str) and (ord != "fro" or len(axes) != 2)):
        return None
    if len(axes) == 2 and ord not in (None, "fro", 1, -1, np.inf, -np.inf):
        return None
    return tuple(d % a.ndim for d in axes)


def _norm(a, ord=None, axis=None, keepdims=False):
    """``mx.linalg.norm`` as MLX composes it (mlx/linalg.cpp): the 2-norm
    ``sqrt(sum(a^2))``, ``sum |a|``, ``max |a|``, ``min |a|``, ``sum(a != 0)``, the
    p-norm ``sum(|a|^p)^(1/p)``, and the matrix 1 / inf norms (the extreme column /
    row sum of ``|a|``); each an op of the flow, so its derivative is the
    composition's, with MLX's conventions (nan at 0 for the 2-norm, ties shared).
    Only for the cases :func:`_norm_axes` accepts."""
    axes = _norm_axes(a, ord, axis)
    if ord is None or ord == "fro" or (ord == 2 and len(axes) == 1):
        x = a.reshape(-1) if axis is None else a
        out = mx.sqrt(mx.sum(mx.square(x), axis=0 if axis is None else list(axes),
                             keepdims=keepdims))
        return out.reshape([1] * a.ndim) if axis is None and keepdims else out
    ord = float(ord)
    if len(axes) == 2:
        # |a| summed over the rows (1-norms: column sums) or over the columns
        # (inf-norms), then the extreme over the other axis
        inner, outer = axes if abs(ord) == 1 else axes[::-1]
        sums = mx.sum(mx.abs(a), axis=inner, keepdims=True)
        ext = (mx.max if ord > 0 else mx.min)(sums, axis=outer, keepdims=True)
        return ext if keepdims else mx.squeeze(ext, axes)
    if ord == 0:
        return mx.sum(a != 0, axis=list(axes), keepdims=keepdims).astype(a.dtype)
    if ord in (np.inf, -np.inf):
        return (mx.max if ord > 0 else mx.min)(mx.abs(a), axis=list(axes), keepdims=keepdims)
    if ord == 1:
        return mx.sum(mx.abs(a), axis=list(axes), keepdims=keepdims)
    return mx.power(mx.sum(mx.power(mx.abs(a), ord), axis=list(axes), keepdims=keepdims),
                    1.0 / ord)


def _norm_args(a, ord=None, axis=None, keepdims=False):
    return ord, axis, keepdims


def _norm_rule(ctx, original, a, *args, **kw):
    """``linalg.norm``: in float64 on the exact value (cpu), else :func:`_norm`."""
    out = in_float64(ctx, original, a, *args, **kw)
    if out is not NotImplemented or not (is_word_array(a) and a.dtype == mx.float32) or (
            _norm_axes(a, *_norm_args(a, *args, **kw)[:2]) is None):
        return out
    with carry.reporting(ctx.report):
        return _norm(a, *args, **kw)


def _norm_vjp(e, g):
    """The derivative of :func:`_norm` at the recorded operand: the flow's reverse
    mode through the composition, or in the float64 backward (float64 operands,
    flow off) MLX's own through the same composition (its ops are float64-exact)."""
    a = e.args[0]
    if a.dtype not in (mx.float32, mx.float64) or (
            _norm_axes(a, *_norm_args(*e.args, **e.kwargs)[:2]) is None):
        return NotImplemented
    norm = (lambda x: _norm(x, *e.args[1:], **e.kwargs))
    if a.dtype == mx.float64:
        return tuple(mx.vjp(norm, [a], [g])[1])
    return tuple(autodiff.vjp(norm, [a], [g], report=e.report)[1])


def _eig(values_only: bool):
    """``linalg.eig`` / ``eigvals`` (every backend): LAPACK's ``geev`` in float64 (numpy's)
    on the exact value, the complex128 results in two complex64 words. MLX has no
    complex128 (its eig computes in float32 whatever the input), so MLX's float32
    call on the high words gives the order and the signs: each float64 eigenvalue
    is matched to the nearest of MLX's, each eigenvector's sign to MLX's. Where
    that is ambiguous (repeated or clustered eigenvalues: eigenvectors are not
    unique), the rule declines (reported)."""

    def rule(ctx, original, a, **kw):
        if not is_word_array(a) or a.dtype != mx.float32 or (
                a.ndim < 2 or a.shape[-1] != a.shape[-2]):
            return NotImplemented
        with mx.stream(mx.cpu):
            ref = original(a, **kw)
            A = np.array(as64(a)).reshape(-1, *a.shape[-2:])
        w_ref = np.array(ref if values_only else ref[0]).reshape(-1, a.shape[-1])
        w, v = (np.linalg.eigvals(A), None) if values_only else np.linalg.eig(A)
        order = np.array([_match(x, r) for x, r in zip(w, w_ref)])
        if order.size and (order < 0).any():
            return NotImplemented
        w = np.take_along_axis(w, order, axis=-1)
        if v is not None:
            v = np.take_along_axis(v, order[:, None, :], axis=-1)
            sign = _signs(v, np.array(ref[1]).reshape(v.shape))
            if sign is None:
                return NotImplemented
            v = v * sign[:, None, :]
        values = _complex_words(w.reshape(a.shape[:-1]))
        return values if values_only else (values, _complex_words(v.reshape(a.shape)))

    return rule


def _match(w, ref) -> np.ndarray:
    """Indices of the float64 eigenvalues ``w`` in the order of MLX's float32 ones
    ``ref``; -1s when an eigenvalue of ``ref`` has no clearly nearest one."""
    free, out = list(range(len(w))), []
    scale = max(np.abs(w).max(initial=0), 1e-30)
    for r in ref:
        d = np.sort(np.abs(w[free] - r))
        if d[0] > 1e-3 * scale or (len(d) > 1 and d[1] <= 8 * d[0] + 1e-6 * scale):
            return -np.ones(len(w), int)
        j = free[int(np.argmin(np.abs(w[free] - r)))]
        free.remove(j)
        out.append(j)
    return np.array(out, int)


def _signs(v, ref):
    """+-1 per eigenvector (batch, n, n columns) making it MLX's (LAPACK builds
    differ in sign), or None when one is not a sign away (not unique)."""
    c = np.sum(np.conj(v) * ref, axis=-2)
    sign = np.where(c.real < 0, -1.0, 1.0)
    return sign if np.all(np.abs(c - sign) < 1e-3) else None


def _complex_words(z: np.ndarray) -> mx.array:
    """A complex128 numpy array as a complex64 array carrying its low word."""
    with mx.stream(mx.cpu):
        w = from64(mx.array(z.real, dtype=mx.float64), mx.array(z.imag, dtype=mx.float64))
    return attach_words(w.hi, w)


_COUNT_LIMIT = 2 ** 22  # comparisons searchsorted may materialise off cpu


def _searchsorted(ctx, original, a, v, side="left", **kw):
    """``searchsorted``: in float64 on cpu; elsewhere the count of the sequence's
    elements below ``v`` (``side="right"``: not above), each an exact comparison of
    the flow, while that comparison matrix has at most 2^22 entries (more:
    declines, reported). MLX's index dtype (uint32)."""
    out = in_float64(ctx, original, a, v, side, **kw)
    if out is not NotImplemented or not (is_word_array(a) or is_word_array(v)):
        return out
    if not isinstance(a, ARRAY) or a.ndim != 1 or side not in ("left", "right") or (
            a.dtype == mx.complex64 or a.size * max(getattr(v, "size", 1), 1) > _COUNT_LIMIT):
        return NotImplemented
    with carry.reporting(ctx.report):
        vv = mx.expand_dims(v, -1) if isinstance(v, ARRAY) else v
        below = (a < vv) if side == "left" else (a <= vv)
        return mx.sum(below, axis=-1).astype(mx.uint32)


_EXACT64 = ("minmax", "unique")  # (cummax / cummin: :mod:`.reductions`)

RULES = {**{f"linalg.{name}": _linalg for name in _NAMES}, "matrix_norm": in_float64,
         **{name: in_float64 for name in _EXACT64}, "linalg.norm": _norm_rule,
         "searchsorted": _searchsorted,
         "linalg.eig": _eig(False), "linalg.eigvals": _eig(True)}
"""Op name -> rule."""

VJPS = {"linalg.norm": _norm_vjp}
"""Op name -> VJP rule (see :mod:`.base`)."""
