"""``mx.fast``: ``layer_norm``, ``rms_norm``, ``scaled_dot_product_attention``,
``rope``, ``cross_entropy`` and ``gated_delta_update`` by their definitions, each
step double-word."""

from __future__ import annotations

import functools
import math

import mlx.core as mx
import numpy as np

from ...doubleword import engine64, functions, fusion
from ...doubleword.types import map_words
from ...linalg import gemm
from .. import arith, carry
from ..recipes import replayed
from .base import (ARRAY, REAL, Operands, decomposed, float64_form, is_word_array,
                   kernel_form, result, unbroadcast, words)
from .constructors import grid
from .linear import RULES as _LINEAR
from .reductions import _softmax_words


_LOWEST = float(np.finfo(np.float32).min)
_MATMUL_RULE = _LINEAR["matmul"]


def _sdpa(q, k, v, *, scale, mask=None, sinks=None, force_fused=False, stream=None):
    """``mx.fast.scaled_dot_product_attention``: ``softmax(q k^T scale + mask) v``
    with grouped-query heads repeated (MLX's definition), each op double-word.
    ``sinks`` (one logit per head, gpt-oss): an extra key that takes part in the
    softmax's normalization and contributes no value."""
    heads, kv_heads = q.shape[-3], k.shape[-3]
    if heads != kv_heads:
        k, v = (mx.repeat(t, heads // kv_heads, axis=-3) for t in (k, v))
    s = (q * scale) @ mx.swapaxes(k, -1, -2)
    # Masked scores become float32's lowest finite value, as in MLX: a row with
    # every key masked (more queries than keys under "causal") averages v.
    if isinstance(mask, str):  # "causal": query i sees keys j <= i + (S - L)
        L, S = s.shape[-2], s.shape[-1]
        with carry.suspended():
            keep = mx.arange(S)[None, :] <= mx.arange(L)[:, None] + (S - L)
        s = mx.where(keep, s, _LOWEST)
    elif mask is not None and mask.dtype == mx.bool_:
        s = mx.where(mask, s, _LOWEST)
    elif mask is not None:
        s = s + mask
    if sinks is not None:
        column = mx.broadcast_to(sinks.reshape(-1, 1, 1), (*s.shape[:-1], 1))
        return mx.softmax(mx.concatenate([column, s], axis=-1), axis=-1)[..., 1:] @ v
    return mx.softmax(s, axis=-1) @ v


def _rope(a, dims, *, traditional, base, scale, offset, freqs=None, **kw):
    """``mx.fast.rope`` by its definition (MLX's reference form): positions
    ``(arange(T) + offset) scale`` along axis -2, inverse frequencies
    ``base^(-i / (dims/2))`` (in float64 on the host, two words) or ``1 / freqs``,
    angles ``theta = positions x inverse frequencies`` (an offset per batch element:
    per-example angles) and their double-word cos / sin,
    then each pair (the halves of the first ``dims`` features, or neighbours with
    ``traditional``) rotated; features past ``dims`` pass through."""
    T, half = a.shape[-2], dims // 2
    if freqs is None:
        inv = grid(np.exp(-np.arange(half) * (math.log(base) / half)), None)
    else:
        inv = 1.0 / freqs
    if isinstance(offset, ARRAY) and offset.size > 1:
        # one offset per batch element: positions (B, 1, ..., 1, T), angles
        # broadcast over the axes between the batch and the sequence
        offset = offset.reshape(-1, *([1] * (a.ndim - 2)))
    positions = (mx.arange(T, dtype=mx.float32) + offset) * scale
    theta = mx.expand_dims(positions, -1) * inv
    c, s = mx.cos(theta), mx.sin(theta)
    if traditional:
        x1, x2 = a[..., 0:dims:2], a[..., 1:dims:2]
    else:
        x1, x2 = a[..., :half], a[..., half:dims]
    y1, y2 = x1 * c - x2 * s, x1 * s + x2 * c
    if traditional:
        y = mx.stack([y1, y2], axis=-1).reshape(*a.shape[:-1], dims)
    else:
        y = mx.concatenate([y1, y2], axis=-1)
    return y if dims == a.shape[-1] else mx.concatenate([y, a[..., dims:]], axis=-1)


def _positions(T: int, scale, offset, b, s) -> mx.array:
    """:func:`_rope`'s positions ``(arange(T) + offset) scale`` for an offset given
    as a number, by its steps, launched once per block (llama's q and k read them:
    an operand of each call's replay, ``extended.recipes``)."""
    memo = fusion.block_memo()
    key = ("rope positions", T, *(arith.scalar_key(v) for v in (scale, offset)))
    p = None if memo is None else memo.get(key)
    if p is None:
        p = _replayed_positions(Operands(b, s), T, scale, offset)
        if memo is not None:
            memo[key] = p
    return p


def _positions_words(ctx, T: int, scale, offset) -> mx.array:
    """:func:`_positions`' steps (on metal a repeated call replays: no operand)."""
    b, s = ctx.backend, ctx.stream
    with fusion.deferred():
        w = arith.scalar_binary("add", arith.exact(mx.arange(T, dtype=mx.float32)),
                                offset, b, s)
        return result(arith.scalar_binary("mul", w, scale, b, s))


_replayed_positions = replayed(_positions_words)


def _angles(a, dims, base, scale, offset, freqs, b, s, positions=None) -> tuple:
    """The cos and sin words of :func:`_rope`'s angles for ``a``'s positions, by its
    steps (inside :func:`_rope_words`' ``fusion.deferred()``; ``positions``: those of
    :func:`_positions`); for an offset given as a number and no ``freqs``, computed
    once per block (they depend on the options and the sequence length alone:
    llama's q and k share them)."""
    T, half = a.shape[-2], dims // 2
    memo = key = None
    if freqs is None and not isinstance(offset, ARRAY):
        memo = fusion.block_memo()
        key = ("rope", T, half, *(arith.scalar_key(v) for v in (base, scale, offset)), b, s)
        angles = None if memo is None else memo.get(key)
        if angles is not None:
            return angles
    if freqs is None:
        inv = words(grid(np.exp(-np.arange(half) * (math.log(base) / half)), None))
    else:
        inv = fusion.apply("div", [fusion.constant(1.0, 0.0), words(freqs)], b, s)
    if positions is not None:
        positions = words(positions)
    elif isinstance(offset, ARRAY):
        if offset.size > 1:  # one offset per batch element (see _rope)
            offset = offset.reshape(-1, *([1] * (a.ndim - 2)))
        positions = arith.binary("add", arith.exact(mx.arange(T, dtype=mx.float32)),
                                 words(offset), b, s)
        positions = arith.scalar_binary("mul", positions, scale, b, s)
    else:
        positions = words(_positions(T, scale, offset, b, s))
    theta = arith.binary("mul", map_words(lambda t: mx.expand_dims(t, -1), positions), inv, b, s)
    angles = functions.unary("cos", theta, b, s), functions.unary("sin", theta, b, s)
    if memo is not None:
        memo[key] = angles
    return angles


def _rope_words(ctx, a, dims, *, traditional, base, scale, offset, freqs=None,
                positions=None):
    """:func:`_rope` on a kernel backend: its steps called on the words (each the
    rule its op runs, on the same operands: the same fused programs, so the same
    bits), the fused ones launched only where read (the positions, the two
    rotated halves: a movement reads them)."""
    if not (type(offset) in (int, float) or isinstance(offset, ARRAY)) or (
            type(scale) not in (int, float)):
        return NotImplemented
    b, s = ctx.backend, ctx.stream
    half = dims // 2
    A = words(a)
    with fusion.deferred():
        c, sn = _angles(a, dims, base, scale, offset, freqs, b, s, positions)
        if traditional:
            x1, x2 = (map_words(lambda t: t[..., k:dims:2], A) for k in (0, 1))
        else:
            x1, x2 = map_words(lambda t: t[..., :half], A), map_words(lambda t: t[..., half:dims], A)
        mul = functools.partial(arith.binary, "mul", backend=b, stream=s)
        y1 = arith.binary("sub", mul(x1, c), mul(x2, sn), b, s)
        y2 = arith.binary("add", mul(x1, sn), mul(x2, c), b, s)
        if traditional:
            y = map_words(lambda u, v: mx.stack([u, v], axis=-1).reshape(*a.shape[:-1], dims),
                       y1, y2)
        else:
            y = map_words(lambda u, v: mx.concatenate([u, v], axis=-1), y1, y2)
        if dims != a.shape[-1]:
            y = map_words(lambda u, v: mx.concatenate([u, v[..., dims:]], axis=-1), y, A)
        return result(y)


_replayed_rope = replayed(_rope_words)


def _rope_rule(ctx, original, a, dims, **kw):
    offset, freqs = kw.get("offset", 0), kw.get("freqs")
    if not is_word_array(a) or a.dtype != mx.float32:
        return NotImplemented
    if dims % 2 or dims > a.shape[-1] or a.ndim < 2 or (
            isinstance(offset, ARRAY) and offset.size not in (1, a.shape[0])) or (
            isinstance(offset, ARRAY) and offset.size > 1 and a.ndim < 3):
        return NotImplemented  # MLX's own errors
    if freqs is not None and not (is_word_array(freqs) and freqs.shape == (dims // 2,)):
        return NotImplemented
    if isinstance(offset, ARRAY) and offset.size == 1:
        kw["offset"] = offset.reshape(())
    if kernel_form(ctx):
        if type(offset) in (int, float) and type(kw.get("scale")) in (int, float):
            # (the block's positions: an operand of the replay, made once)
            kw["positions"] = _positions(a.shape[-2], kw["scale"], offset, ctx.backend,
                                         ctx.stream)
        out = _replayed_rope(ctx, a, dims, **kw)
        if out is not NotImplemented:
            return out
    with carry.reporting(ctx.report):
        return _rope(a, dims, **kw)


def _causal(L: int, S: int) -> mx.array:
    """The keys query i sees, ``j <= i + (S - L)`` (:func:`_sdpa`'s "causal"),
    made once per block and shape."""
    memo = fusion.block_memo()
    keep = None if memo is None else memo.get(("causal", L, S))
    if keep is None:
        keep = mx.arange(S)[None, :] <= mx.arange(L)[:, None] + (S - L)
        if memo is not None:
            memo[("causal", L, S)] = keep
    return keep


def _sdpa_words(ctx, q, k, v, *, scale, mask=None, sinks=None, **kw):
    """:func:`_sdpa` on a kernel backend: its steps called on the words, each the
    rule its op runs on the same operands (the same fused programs and GEMMs, so
    the same bits): ``q k^T`` the GEMM reading k with swapped strides (the rule of
    ``q @ swapaxes(k)``), the softmax's kernel form, the product by v its rule."""
    heads, kv_heads = q.shape[-3], k.shape[-3]
    if type(scale) not in (int, float) or heads % kv_heads or 0 in (q.size, k.size, v.size) or (
            isinstance(mask, ARRAY) and mask.dtype not in (mx.bool_, mx.float32)):
        return NotImplemented
    b, st = ctx.backend, ctx.stream
    K, V = words(k), words(v)
    if heads != kv_heads:
        K, V = (map_words(lambda t: mx.repeat(t, heads // kv_heads, axis=-3), W) for W in (K, V))
        v = result(V)
    with fusion.deferred():
        qs = result(arith.scalar_binary("mul", words(q), scale, b, st))  # (read by the GEMM)
        s = gemm.transposed_matmul(words(qs), K, (False, True), backend=b)
        if isinstance(mask, str):  # "causal" (see _sdpa)
            s = arith.where(_causal(*s.shape[-2:]), s, arith.constant(_LOWEST), b)
        elif mask is not None and mask.dtype == mx.bool_:
            s = arith.where(mask, s, arith.constant(_LOWEST), b)
        elif mask is not None:
            s = arith.binary("add", s, words(mask), b, st)
        if sinks is not None:
            column = map_words(lambda t: mx.broadcast_to(t.reshape(-1, 1, 1), (*s.shape[:-1], 1)),
                            words(sinks))
            s = map_words(lambda c, t: mx.concatenate([c, t], axis=-1), column, s)
        p = _softmax_words(ctx, result(s), axis=-1)
        if sinks is not None:
            p = result(map_words(lambda t: t[..., 1:], words(p)))
    return _MATMUL_RULE(ctx, mx.matmul, p, v)


_replayed_sdpa = replayed(_sdpa_words)


def _sdpa_rule(ctx, original, q, k, v, **kw):
    mask = kw.get("mask")
    sinks = kw.get("sinks")
    if not (mask is None or isinstance(mask, ARRAY) or (
            isinstance(mask, str) and mask == "causal")) or not (sinks is None or (
            isinstance(sinks, ARRAY) and sinks.dtype == mx.float32 and
            sinks.shape == (q.shape[-3],))):
        return NotImplemented
    if not all(is_word_array(t) and t.dtype == mx.float32 for t in (q, k, v)):
        return NotImplemented
    if kernel_form(ctx):
        if isinstance(mask, str):  # (the block's one mask per shape: an operand)
            kw["mask"] = _causal(q.shape[-2], k.shape[-2])
        out = _replayed_sdpa(ctx, q, k, v, **kw)
        if out is not NotImplemented:
            return out
    with carry.reporting(ctx.report):
        return _sdpa(q, k, v, **kw)


def _layer_norm(x, weight, bias, eps):
    """``mx.fast.layer_norm`` over the last axis: two-pass mean and variance."""
    mean = mx.mean(x, axis=-1, keepdims=True)
    d = x - mean
    y = d * mx.rsqrt(mx.mean(d * d, axis=-1, keepdims=True) + eps)
    y = y if weight is None else y * weight
    return y if bias is None else y + bias


def _rms_norm(x, weight, eps):
    y = x * mx.rsqrt(mx.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if weight is None else y * weight


def _cross_entropy(logits, targets):
    """``logsumexp(logits, -1) - logits[..., target]`` (MLX's definition)."""
    if mx.issubdtype(targets.dtype, mx.floating):
        return NotImplemented  # MLX's own checks
    picked = mx.take_along_axis(logits, mx.expand_dims(targets, -1), axis=-1)
    return mx.logsumexp(logits, axis=-1) - mx.squeeze(picked, -1)


def _norm64(x, weight, bias, eps, centred: bool):
    if not all(v is None or is_word_array(v) and v.dtype == mx.float32
               for v in (x, weight, bias)) or x.ndim == 0 or x.size == 0:
        return NotImplemented
    w, b = (None if v is None else words(v) for v in (weight, bias))
    return result(engine64.norm64(words(x), w, b, float(eps), centred))


def _layer_norm64(x, weight, bias, eps):
    return _norm64(x, weight, bias, eps, True)


def _rms_norm64(x, weight, eps):
    return _norm64(x, weight, None, eps, False)


def _norm_words(ctx, x, weight, bias, eps, centred: bool):
    """:func:`_layer_norm` (``centred``) or :func:`_rms_norm` on a kernel backend:
    the decomposition's steps, in its order and on its operands, called on the
    words (each step the rule its op runs: the same fused programs and launches,
    so the same bits) without going through the flow op by op."""
    if not all(v is None or is_word_array(v) and v.dtype == mx.float32
               for v in (x, weight, bias)) or type(eps) not in (int, float) or (
            x.ndim == 0 or x.size == 0):
        return NotImplemented
    b, s = ctx.backend, ctx.stream
    axes, n = (x.ndim - 1,), x.shape[-1]

    def mean(v):  # the mean rule (reductions._reduction)
        return arith.scalar_binary("div", arith.reduce_sum(v, axes, True, b, s), n, b, s)

    X = words(x)
    with fusion.deferred():  # launched: the two sums and the result
        d = arith.binary("sub", X, mean(X), b, s) if centred else X
        r = arith.scalar_binary("add", mean(arith.binary("mul", d, d, b, s)), eps, b, s)
        y = arith.binary("mul", d, functions.unary("rsqrt", r, b, s), b, s)
        for op, v in (("mul", weight), ("add", bias)):
            if v is not None:
                y = arith.binary(op, y, words(v), b, s)
        return result(y)


def _layer_norm_words(ctx, x, weight, bias, eps):
    return _norm_words(ctx, x, weight, bias, eps, True)


def _rms_norm_words(ctx, x, weight, eps):
    return _norm_words(ctx, x, weight, None, eps, False)


def _gated_delta(q, k, v, gamma, beta, initial_state=None, mask=None):
    """``mx.fast.gated_delta_update`` by its recurrence (gated DeltaNet, Yang et al.
    2024), step by step in double-word: with S [B, Hv, Dv, Dk] (0 without
    ``initial_state``) and the key heads repeated to Hv, each step t
    ``S = gamma S``, ``S += k (beta (v - S k))^T``, ``y = S q``; where ``mask``
    [B, T] is False the step leaves S unchanged and y is 0 (MLX's). Returns
    [y [B, T, Hv, Dv], S]."""
    arrays = [a for a in (q, k, v, gamma, beta, initial_state) if a is not None]
    if any(not isinstance(a, ARRAY) or a.dtype != mx.float32 for a in arrays):
        return NotImplemented
    b, steps, hk, dk = q.shape
    hv, dv = v.shape[-2:]
    if not steps or hv % hk:
        return NotImplemented  # MLX's result or error
    if hv != hk:
        q, k = (mx.repeat(a, hv // hk, axis=-2) for a in (q, k))
    state = mx.zeros((b, hv, dv, dk)) if initial_state is None else initial_state
    ys = []
    for t in range(steps):
        s = state * gamma[:, t, :, None, None]
        kt = mx.expand_dims(k[:, t], -2)  # [B, Hv, 1, Dk]
        delta = (v[:, t] - mx.sum(s * kt, axis=-1)) * beta[:, t, :, None]
        s = s + kt * mx.expand_dims(delta, -1)
        y = mx.sum(s * mx.expand_dims(q[:, t], -2), axis=-1)
        if mask is not None:
            on = mask[:, t]
            s = mx.where(on[:, None, None, None], s, state)
            y = mx.where(on[:, None, None], y, 0.0)
        state = s
        ys.append(y)
    return [mx.stack(ys, axis=1), state]


RULES = {"fast.layer_norm": float64_form(_layer_norm64, _layer_norm, replayed(_layer_norm_words)),
         "fast.rms_norm": float64_form(_rms_norm64, _rms_norm, replayed(_rms_norm_words)),
         "fast.scaled_dot_product_attention": _sdpa_rule, "fast.rope": _rope_rule,
         "fast.cross_entropy": decomposed(_cross_entropy),
         "fast.gated_delta_update": decomposed(_gated_delta)}
"""Op name -> rule."""


# ---- derivatives ---------------------------------------------------------------------


def _norm_vjp(names: tuple[str, ...]):
    """The VJP of ``layer_norm`` (``names`` x, weight, bias, eps) or ``rms_norm``
    (x, weight, eps), recorded as one op where the cpu backend computes it by its
    float64 formula. With ``xhat = (x - mean) r`` (rms_norm: ``x r``),
    ``r = 1 / sqrt(mean((x - mean)^2) + eps)`` over the last axis and
    ``gy = g weight``, the closed form
    ``dx = r (gy - mean(gy) - xhat mean(gy xhat))`` (rms_norm: without
    ``mean(gy)``), ``dweight = sum(g xhat)``, ``dbias = sum(g)`` over the
    broadcast axes."""
    centred = "bias" in names

    def vjp(e, g):
        given = dict(zip(names, e.args), **e.kwargs)
        x, weight, bias = given["x"], given["weight"], given.get("bias")
        if any(isinstance(v, ARRAY) and v.dtype not in REAL for v in (x, weight, bias)):
            return NotImplemented
        d = x - mx.mean(x, axis=-1, keepdims=True) if centred else x
        r = mx.rsqrt(mx.mean(d * d, axis=-1, keepdims=True) + given["eps"])
        xhat = d * r
        gy = g if weight is None else g * weight
        gx = gy - xhat * mx.mean(gy * xhat, axis=-1, keepdims=True)
        if centred:
            gx = gx - mx.mean(gy, axis=-1, keepdims=True)
        cots = {"x": gx * r, "weight": unbroadcast(g * xhat, weight),
                "bias": unbroadcast(g, bias)}
        return tuple(cots.get(n) for n in names[:len(e.args)])

    return vjp


VJPS = {"fast.layer_norm": _norm_vjp(("x", "weight", "bias", "eps")),
        "fast.rms_norm": _norm_vjp(("x", "weight", "eps"))}
"""Op name -> VJP rule (see :mod:`.base`)."""
