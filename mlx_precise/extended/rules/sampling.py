"""``mx.random`` samplers given carried parameters (``normal(loc=, scale=)``,
``uniform(low, high)``, ``categorical(logits)``, ``bernoulli(p)``, ...): MLX's own
draw (the same random bits, one key taken from the global sequence when none is
given, as MLX's call would), then MLX's transform of it (mlx/random.cpp) in
double-word. Parameters that carry nothing: MLX's sampler, unchanged.

Where the sample is discrete (``bernoulli``, ``randint``, ``categorical``) the
double-word transform decides it exactly: MLX's float32 draw compared with the
parameter's full value, not with its float32 rounding."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from .. import carry
from ..carry import has_words
from .base import ARRAY, operand_array, words

_BELOW_MINUS_ONE = float(np.nextafter(np.float32(-1), np.float32(0)))
_SQRT2 = math.sqrt(2.0)  # float64, two words


def _draw(fn, *args, **kw):
    """An MLX sampler called plainly (its float32 / integer draw)."""
    with carry.suspended():
        return fn(*args, **kw)


def _symmetric(shape, key):
    """MLX's uniform draw on (nextafter(-1, 0), 1) that ``normal`` and ``laplace``
    transform (the same float32 ops on the same bits)."""
    return _draw(mx.random.uniform, _BELOW_MINUS_ONE, 1.0, shape, mx.float32, key=key)


def _sampler(fn):
    """A rule from ``fn(*args, **kw)`` (the sampler's transform in ops of the flow,
    NotImplemented for a dtype other than float32); it runs when an array
    parameter carries a low word (Python scalars then enter at their float64
    value). Scalar parameters alone (``uniform(-s, s)`` in mlx.nn's initialisers):
    MLX's sampler, as outside blocks."""

    def rule(ctx, original, *args, **kw):
        if not any(isinstance(v, ARRAY) and has_words(v) for v in (*args, *kw.values())):
            return NotImplemented
        with carry.reporting(ctx.report):
            return fn(*args, **kw)

    return rule


def _normal(shape=(), dtype=mx.float32, loc=None, scale=None, key=None):
    """``loc + scale sqrt(2) erfinv(u)`` (the double-word erfinv of MLX's draw u)."""
    if dtype != mx.float32:
        return NotImplemented
    z = mx.erfinv(_symmetric(list(shape), key)) * _SQRT2
    z = z if scale is None else scale * z
    return z if loc is None else loc + z


def _uniform(low=0.0, high=1.0, shape=(), dtype=mx.float32, key=None):
    """``low + (high - low) u`` with MLX's draw u in [0, 1)."""
    if dtype != mx.float32:
        return NotImplemented
    low, high = operand_array(low), operand_array(high)
    range_ = high - low
    if tuple(np.broadcast_shapes(tuple(shape), range_.shape)) != tuple(shape):
        return NotImplemented  # MLX's error
    return low + range_ * _draw(mx.random.uniform, shape=list(shape), key=key)


def _laplace(shape=(), dtype=mx.float32, loc=0.0, scale=1.0, key=None):
    """``loc + scale sign(u) log1p(-|u|)``."""
    if dtype != mx.float32:
        return NotImplemented
    u = _symmetric(list(shape), key)
    return loc + scale * (mx.sign(u) * mx.log1p(-mx.abs(u)))


def _truncated_normal(lower, upper, shape=None, dtype=mx.float32, key=None):
    """``sqrt(2) erfinv(u)``, u uniform between ``erf(lower / sqrt(2))`` and
    ``erf(upper / sqrt(2))`` (MLX's draw in [0, 1) placed there), clipped to the
    bounds."""
    if dtype != mx.float32:
        return NotImplemented
    lower, upper = operand_array(lower), operand_array(upper)
    if shape is None:
        shape = np.broadcast_shapes(lower.shape, upper.shape)
    a, b = mx.erf(lower / _SQRT2), mx.erf(upper / _SQRT2)
    out = mx.erfinv(a + (b - a) * _draw(mx.random.uniform, shape=list(shape), key=key)) * _SQRT2
    return mx.maximum(mx.minimum(upper, out), lower)


def _categorical(logits, axis=-1, shape=None, num_samples=None, key=None):
    """MLX's categorical_impl: ``argmax(g + logits)`` with its Gumbel draw g (the
    sum and argmax in double-word); one row of logits with a sample shape: the
    inverse CDF, ``searchsorted`` of the scaled draw in the exclusive cumulative
    sum of ``exp(logits - max)``."""
    if shape is not None and num_samples is not None:
        return NotImplemented  # MLX's error
    if not -logits.ndim <= axis < logits.ndim:
        return NotImplemented
    axis %= logits.ndim
    if num_samples is not None:
        logits = mx.expand_dims(logits, -1)
        shape = [*logits.shape[:axis], *logits.shape[axis + 1:-1], num_samples]
    elif shape is None:
        shape = [*logits.shape[:axis], *logits.shape[axis + 1:]]
    shape = list(shape)
    n = logits.shape[axis]
    if n > 0 and logits.size == n and shape:
        x = logits.reshape(n)
        m = mx.max(x)
        # an infinite maximum: uniform among the maximal entries (MLX's weights)
        w = mx.where(mx.isinf(m), (x == m).astype(mx.float32), mx.exp(x - m))
        cdf = mx.cumsum(w, inclusive=False)
        u = _draw(mx.random.uniform, shape=shape, key=key) * mx.sum(w)
        return mx.searchsorted(cdf, u, side="right") - mx.array(1, mx.uint32)
    offset = axis + len(shape) - logits.ndim + 1
    g = _draw(mx.random.gumbel, shape[:offset] + [n] + shape[offset:], key=key)
    return mx.argmax(g + logits, axis=offset)


_BERNOULLI_SCALE = float(np.nextafter(np.float32(2.0**32), np.float32(np.inf)))  # 2^32 + 2^9


def _bernoulli(p=0.5, shape=None, key=None):
    """MLX's ``bits < p (2^32 + 2^9)`` (its raw 32-bit draw, rounded to float32 r,
    against p placed on [0, 2^32 + 2^9]: p >= 1 always true), with the product
    in double-word (rounded once, 2^-48 relative) and the comparison exact, where
    MLX rounds p and the product to float32. r is ``2^32 u`` for MLX's uniform
    draw u of the same key (``u = min(r 2^-32, 1 - 2^-24)``; the draws that r
    rounds to 2^32, one in 2^25, are read as 2^32 - 2^8: they differ only for
    p within 2^-24 of 1)."""
    p = operand_array(p)
    shape = p.shape if shape is None else tuple(shape)
    if tuple(np.broadcast_shapes(tuple(shape), p.shape)) != tuple(shape):
        return NotImplemented  # MLX's error
    with carry.suspended():
        r = _draw(mx.random.uniform, shape=list(shape), key=key) * 2.0**32  # exact
    return r < p * _BERNOULLI_SCALE


def _randint(low, high, shape=(), dtype=mx.int32, key=None):
    """MLX's ``clip(floor(low + (high - low) u), low, high - 1)`` of its float32
    draw u, converted to ``dtype`` (truncation), each step on the exact value:
    floor and clip of double-word values are exact, and the integer is read from
    both words (an integer's float32 rounding and its remainder are integers)."""
    if not (mx.issubdtype(dtype, mx.integer) or dtype == mx.bool_):
        return NotImplemented  # MLX's error
    low, high = operand_array(low), operand_array(high)
    u = _uniform(low, high, shape, key=key)
    if u is NotImplemented:
        return u
    v = mx.trunc(mx.minimum(mx.maximum(mx.floor(u), low), high - 1))
    w = words(v)
    with carry.suspended():
        return (w.hi.astype(mx.int64) + w.lo.astype(mx.int64)).astype(dtype)


def _multivariate_normal(mean, cov, shape=(), dtype=mx.float32, key=None):
    """MLX's ``mean + z S`` with ``S = U sqrt(s) V^T`` from the SVD of ``cov`` (the
    principal square root of a covariance: unique, whatever the SVD's signs) and
    its standard normal draw z of shape ``shape + (n,)``; S from ``mx.linalg.svd``
    in float64 (LAPACK, on the CPU stream on every backend), z and the product in
    double-word."""
    if dtype != mx.float32 or not (
            isinstance(mean, ARRAY) and isinstance(cov, ARRAY)):
        return NotImplemented
    if mean.ndim < 1 or cov.ndim < 2 or cov.shape[-1] != cov.shape[-2] or (
            mean.shape[-1] != cov.shape[-1]):
        return NotImplemented  # MLX's error
    n = mean.shape[-1]
    batch = np.broadcast_shapes(tuple(mean.shape[:-1]), tuple(cov.shape[:-2]))
    shape = tuple(shape) or tuple(batch)
    if tuple(np.broadcast_shapes(shape, batch)) != shape:
        return NotImplemented
    u, s, vt = mx.linalg.svd(cov, stream=mx.cpu)
    root = (u * mx.expand_dims(mx.sqrt(s), -2)) @ vt
    z = _normal((*shape, n), key=key)
    return mean + mx.squeeze(mx.expand_dims(z, -2) @ root, -2)


def _permutation(x, axis=0, key=None):
    """MLX's permutation of the indices, then ``take`` (each element moved whole)."""
    if not isinstance(x, ARRAY):
        return NotImplemented
    return mx.take(x, _draw(mx.random.permutation, x.shape[axis], key=key), axis=axis)


RULES = {"random.normal": _sampler(_normal), "random.uniform": _sampler(_uniform),
         "random.laplace": _sampler(_laplace),
         "random.truncated_normal": _sampler(_truncated_normal),
         "random.categorical": _sampler(_categorical),
         "random.permutation": _sampler(_permutation),
         "random.bernoulli": _sampler(_bernoulli), "random.randint": _sampler(_randint),
         "random.multivariate_normal": _sampler(_multivariate_normal)}
"""Op name -> rule."""
