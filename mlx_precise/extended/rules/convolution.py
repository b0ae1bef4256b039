"""Dense and grouped convolutions inside ``extended_precision()``, as decompositions.

Each convolution is rewritten as ops that have double-word rules (:mod:`.`),
run with the flow on, so the result is double-word and rounded once where it
leaves the chain:

* ``pad`` (the zero padding), strided slices of the padded input, one per kernel
  tap, stacked beside each other (an im2col gather: shape and movement ops, exact
  on both words);
* one double-word matrix product ``columns @ weights`` (:mod:`mlx_precise.linalg`:
  float64 on ``cpu``, the tiled double-word GEMM on ``metal`` / ``emulate``), over
  all taps and input channels of a group at once, batched over the groups (and,
  for transposed convolutions, over the output phases): one GEMM launch per call;
* reshapes and transposes back to MLX's layout.

The gather holds T copies of the input (T = taps per output), twice (both
words): memory, not flops, is the price of the single GEMM.

On ``metal`` / ``emulate`` a 1-D convolution (``conv1d``, and ``conv_transpose1d``
whose phases share their columns, such as kernel 2s at stride s) is instead one
launch of that GEMM reading the input through each output's window, its padding
as zeros, and the weights in place (:func:`window_correlate`,
:func:`_window_transposed_plan`, ``gemm.window_matmul``): no pad, gather, weight
rearrangement or crop around it, and the same sums bit for bit (the k order of the
gathered columns). Its gradient under MLX's autodiff is MLX's convolution's VJP;
a recording of the flow's own gradients takes the composition above.

Every output is therefore a double-word dot product of exact float32 products,
with the GEMM's bound ``|y - y_exact| <= (T Cin/groups + 12) u^2 |x| |w|``
(T taps, u = 2^-24) on metal / emulate, and float64's on cpu. Gradients are
those of the sub-ops (slices, ``pad``, the matmul's float32 VJP): float32-accurate.

Transposed convolutions (``conv_transpose1d/2d/3d``) use the polyphase form: the
output position ``t = i s + k d`` (before the crop by ``padding``) of phase
``r = t mod s`` only meets the taps ``k`` with ``k d = r (mod s)``, so each phase is
an ordinary stride-1 correlation of the input with a subset of the taps; the
phases are computed in one batched GEMM (fewer taps padded with zero columns)
and interleaved. No zeros are inserted into the input, so the cost is that of
the direct sum, not ``s`` times it. ``conv_general`` inserts the zeros of its
``input_dilation`` (exact, at that cost), reverses the kernel for ``flip`` and takes
asymmetric ``(low, high)`` padding.

Layouts and dtypes are MLX's: input ``(N, *spatial, Cin)`` float32, weight
``(Cout, *kernel, Cin / groups)`` float32, output ``(N, *out_spatial, Cout)``
float32 (carrying its low word). Operands of other dtypes, negative padding, and depthwise ``conv1d`` (``groups == Cin``, weight ``(m Cin, K, 1)``,
which the table's depthwise rule sends to the dedicated double-word kernel)
return ``NotImplemented`` (the dispatcher then runs MLX's float32 op and reports
it). MLX checks the arguments first (its own errors for invalid ones), and a rule
whose output shape would differ from MLX's (an edge case MLX treats its own way,
such as ``conv_transpose`` padding beyond ``dilation (K - 1)``) declines rather
than return another answer.

Public: :data:`RULES` (MLX function name -> rule, see :mod:`.base`).
"""

from __future__ import annotations

import functools
import itertools
import math

import mlx.core as mx

from ...doubleword import DoubleWord
from ...doubleword.engine64 import from64, to64
from ...linalg import gemm
from .. import autodiff, carry, spectral
from ..engine import words_op
from ..recipes import replayed, static
from .base import beside_float32, kernel_form
from ..constructor import ARRAY  # the class (mx.array is a stand-in inside blocks)

F32 = mx.float32


# ---- arguments -----------------------------------------------------------------------

def _tuple(v, nd: int, what: str) -> tuple[int, ...]:
    """An int or a sequence of ``nd`` ints (MLX's convention) as a tuple."""
    t = (int(v),) * nd if isinstance(v, int) else tuple(int(a) for a in v)
    if len(t) != nd:
        raise ValueError(f"{what}: expected an int or {nd} ints, got {v!r}")
    return t


def _operands_ok(x, w, nd: int) -> bool:
    """float32 input (N, *spatial, Cin) and weight (Cout, *kernel, Cg) arrays."""
    return (isinstance(x, ARRAY) and isinstance(w, ARRAY) and x.dtype == F32
            and w.dtype == F32 and x.ndim == nd + 2 and w.ndim == nd + 2)


# ---- the shared core: im2col gather and one batched double-word GEMM -------------------

def _progressions(offsets) -> list[tuple[int, int, int]] | None:
    """(start, step, count) per spatial dimension when the taps ``offsets`` are the
    product (``itertools.product`` order) of one arithmetic progression per
    dimension; None otherwise (a zero tap, irregular taps)."""
    if not offsets or any(off is None for off in offsets):
        return None
    axes = [list(dict.fromkeys(off[i] for off in offsets)) for i in range(len(offsets[0]))]
    prog = [(v[0], v[1] - v[0] if len(v) > 1 else 0, len(v)) for v in axes]
    if any(v != [a + b * k for k in range(c)] for v, (a, b, c) in zip(axes, prog)):
        return None
    return prog if list(itertools.product(*axes)) == list(offsets) else None


def _columns(xp: mx.array, offsets, strides, out, lead: tuple) -> mx.array:
    """The im2col gather. ``xp`` (N, *spatial, C) (already padded); ``offsets``: one
    tuple of start indices per tap, None for a zero tap; ``strides``, ``out``: per
    spatial dimension; ``lead``: the leading shape of the result (N prod(out)
    elements). Returns (*lead, T C): tap t reads
    ``xp[:, o_0 + s_0 q_0, ..., :]`` at output position q. Taps on a grid (every
    correlation's: ``k d`` per dimension) are one ``as_strided`` window of xp's
    row-major layout (two graph nodes per word instead of 2T + 1); others, and any
    gradient's recording (the tape's VJP of ``as_strided`` would sum the cotangents
    of overlapping windows in float32; a slice's are disjoint), one slice per tap
    and a ``stack``. These ops have rules: carried low words follow exactly (the
    same values either way)."""
    N, C = xp.shape[0], xp.shape[-1]
    rows = (*lead, len(offsets) * C)
    prog = None if autodiff.recording() else _progressions(offsets)
    if prog is not None:
        st = [math.prod(xp.shape[i + 1:]) for i in range(xp.ndim)]  # row-major
        space = st[1:-1]
        # (taps, C) dims, merged from the right where adjacent in xp (undilated
        # taps along the last spatial axis read T C consecutive values): a window
        # already of the result's shape needs no reshape (a copy) after it
        tail = [(C, 1)]
        for (_, b, c), t in reversed(list(zip(prog, space))):
            if c == 1:
                continue
            if b * t == tail[0][0] * tail[0][1]:
                tail[0] = (c * tail[0][0], tail[0][1])
            else:
                tail.insert(0, (c, b * t))
        view = mx.as_strided(
            xp, (N, *out, *(c for c, _ in tail)),
            (st[0], *(s * t for s, t in zip(strides, space)), *(t for _, t in tail)),
            sum(a * t for (a, _, _), t in zip(prog, space)))
        return view.reshape(rows)
    taps = []
    for off in offsets:
        if off is None:  # a phase with fewer taps: zero columns (0 * 0, no NaN from Inf)
            taps.append(mx.zeros((N, *out, C), F32))
            continue
        index = (slice(None),) + tuple(
            slice(o, o + (n - 1) * s + 1, s) for o, s, n in zip(off, strides, out))
        taps.append(xp[index])
    return mx.stack(taps, axis=-2).reshape(rows)


def _contract(cols: mx.array, wt: mx.array, T: int, groups: int) -> mx.array:
    """``y[p, m, o] = sum_{t, c in group(o)} cols[p, m, t, c] wt[p, o, t, c]`` by one
    (batched) double-word matmul.

    cols (P, M, T Cin), wt (P, Cout, T Cin / groups), both with (t, c) flattened;
    P independent problems (phases of a transposed convolution; the batch or 1
    otherwise: without groups, wt's P may be 1, broadcast). Returns (P, M, Cout).
    Output channel o belongs to group o // (Cout / groups), which reads input
    channels [g Cg, (g + 1) Cg)."""
    P, M, Cin = *cols.shape[:2], cols.shape[2] // T
    Cout, Cg = wt.shape[1], wt.shape[2] // T
    G, Og = groups, Cout // groups
    if G == 1:  # (the shapes as given: no reshape node)
        return cols @ wt.swapaxes(1, 2)
    # (P, M, T, G, Cg) -> (P, G, M, T Cg) against (P, G, T Cg, Og): one batched GEMM
    a = cols.reshape(P, M, T, G, Cg).transpose(0, 3, 1, 2, 4).reshape(P * G, M, T * Cg)
    b = wt.reshape(P, G, Og, T * Cg).swapaxes(2, 3).reshape(P * G, T * Cg, Og)
    y = (a @ b).reshape(P, G, M, Og)
    return y.transpose(0, 2, 1, 3).reshape(P, M, Cout)


def correlate(x: mx.array, w: mx.array, stride, padding_lo, padding_hi, dilation,
              groups: int) -> mx.array:
    """MLX's convolution (a cross-correlation, as ``mx.conv*``) in double-word.

    Args:
        x: input (N, *spatial, Cin) float32 (with or without a carried low word).
        w: weight (Cout, *kernel, Cin / groups) float32.
        stride, padding_lo, padding_hi, dilation: one int per spatial dimension
            (zero padding before / after; all >= 0).
        groups: Cin and Cout are multiples of it.

    Returns:
        (N, *out, Cout) float32, out_i = (L_i + lo_i + hi_i - d_i (K_i - 1) - 1) // s_i + 1,
        with ``y[n, q, o] = sum_{k, c} xpad[n, s q + d k, g(o) Cg + c] w[o, k, c]``.
        Must run with the flow on (its ops then have rules).
    """
    kernel = w.shape[1:-1]
    if any(padding_lo) or any(padding_hi):
        x = mx.pad(x, [(0, 0), *zip(padding_lo, padding_hi), (0, 0)])
    out = [(n - d * (k - 1) - 1) // s + 1
           for n, k, s, d in zip(x.shape[1:-1], kernel, stride, dilation)]
    offsets = [tuple(k * d for k, d in zip(tap, dilation))
               for tap in itertools.product(*(range(k) for k in kernel))]
    # without groups, the batch leads the GEMM (the weights broadcast): a 1-D
    # convolution's result then has its shape, no reshape
    N, M = x.shape[0], math.prod(out)
    cols = _columns(x, offsets, stride, out, (N, M) if groups == 1 else (1, N * M))
    y = _contract(cols, w.reshape(1, w.shape[0], -1), len(offsets), groups)
    return y.reshape(N, *out, w.shape[0])


def _dilate(x: mx.array, factors) -> mx.array:
    """Insert ``f - 1`` zeros between neighbours along each spatial axis (input
    dilation of ``conv_general``): expand, zero-pad the new axis, merge, trim.
    ``pad`` and reshapes have rules: exact on both words."""
    for axis, f in enumerate(factors, start=1):
        if f == 1:
            continue
        n = x.shape[axis]
        x = mx.expand_dims(x, axis + 1)
        widths = [(0, 0)] * x.ndim
        widths[axis + 1] = (0, f - 1)
        x = mx.pad(x, widths)
        shape = list(x.shape)
        x = x.reshape(shape[:axis] + [n * f] + shape[axis + 2:])
        x = x[(slice(None),) * axis + (slice(0, (n - 1) * f + 1),)]
    return x


def transposed(x: mx.array, w: mx.array, stride, padding, dilation, output_padding,
               groups: int) -> mx.array:
    """MLX's transposed convolution (``mx.conv_transpose*``) in double-word.

    Args:
        x: input (N, *spatial, Cin) float32.
        w: weight (Cout, *kernel, Cin / groups) float32.
        stride, padding, dilation, output_padding: one int per spatial dimension,
            ``0 <= padding <= dilation (K - 1)``.

    Returns:
        (N, *out, Cout) float32, out_i = (L_i - 1) s_i - 2 p_i + d_i (K_i - 1) + op_i + 1,
        ``y[n, j, o] = sum_{i s + k d - p = j} sum_c x[n, i, g(o) Cg + c] w[o, k, c]``.

    Polyphase: with ``t = j + p = q s + r``, phase r takes the taps with
    ``k d = r (mod s)``, input index ``i = q - (k d - r) / s``; each phase is a
    stride-1 correlation over q (taps at offsets ``pad_lo - (k d - r) / s`` of the
    input padded by ``pad_lo`` in front), all phases in one batched GEMM.
    """
    N, Cin, Cout = x.shape[0], x.shape[-1], w.shape[0]
    kernel = w.shape[1:-1]
    out, q_len, lo, hi, flats, offsets = _polyphase(
        x.shape[1:-1], kernel, stride, padding, dilation, output_padding)
    xp = mx.pad(x, [(0, 0), *zip(lo, hi), (0, 0)]) if any(lo) or any(hi) else x
    phases = list(itertools.product(*(range(s) for s in stride)))
    T = max(1, max(len(t) for t in offsets))
    M = N * math.prod(q_len)
    if _shared_columns(offsets, groups):
        # Every phase reads the same columns (kernel 2s at stride s, ...): one gather
        # and one GEMM against the phases' weights side by side, (M, T Cin) x
        # (T Cin, P Cout): the products and sums of each output as per phase.
        cols = _columns(xp, offsets[0], (1,) * len(kernel), q_len, (1, M))
        index = [f for flat in flats for f in flat]
        wt = mx.take(w.reshape(Cout, -1, w.shape[-1]), mx.array(index), axis=1)
        wt = wt.reshape(Cout, len(phases), -1).swapaxes(0, 1).reshape(1, -1, T * Cin)
        y = _contract(cols, wt, T, 1)
        full = (N, *(q * s for q, s in zip(q_len, stride)), Cout)
        nd = len(kernel)  # (N, q_0, ..., s_0, ..., C) -> (N, q_0, s_0, q_1, s_1, ..., C)
        if nd > 1:  # (1-D: (N, q, s, C) is already in order: one reshape)
            y = y.reshape(N, *q_len, *stride, Cout).transpose(
                [0] + [a for i in range(nd) for a in (1 + i, 1 + nd + i)] + [2 * nd + 1])
        return _crop(y.reshape(full), padding, out)
    zero_w = mx.zeros((Cout, 1, w.shape[-1]), F32)
    w_flat = mx.concatenate([w.reshape(Cout, -1, w.shape[-1]), zero_w], axis=1)
    zero_tap = w_flat.shape[1] - 1
    cols, index = [], []
    for offs, flat in zip(offsets, flats):
        pad = T - len(offs)
        cols.append(_columns(xp, offs + [None] * pad, (1,) * len(kernel), q_len, (1, M)))
        index.extend(flat + [zero_tap] * pad)
    cols = mx.concatenate(cols)  # (P, M, T Cin)
    wt = mx.take(w_flat, mx.array(index), axis=1).reshape(Cout, len(phases), -1)
    y = _contract(cols, wt.swapaxes(0, 1), T, groups)  # (P, M, Cout)
    # interleave: (s_0, ..., N, q_0, ..., C) -> (N, q_0, s_0, q_1, s_1, ..., C)
    nd = len(kernel)
    y = y.reshape(*stride, N, *q_len, Cout)
    order = [nd] + [a for i in range(nd) for a in (nd + 1 + i, i)] + [2 * nd + 1]
    y = y.transpose(order).reshape(N, *(q * s for q, s in zip(q_len, stride)), Cout)
    return _crop(y, padding, out)


def _polyphase(spatial, kernel, stride, padding, dilation, output_padding):
    """The polyphase plan of a transposed convolution (:func:`transposed`): ``out``
    and ``q_len`` (output points, and rows per phase, per dimension), the padding
    ``lo``, ``hi`` of the input, and per phase (``itertools.product`` of the
    strides' ranges) its taps' flat kernel indices ``flats`` and their start
    offsets in the padded input ``offsets`` (tuples, one int per dimension)."""
    out = [(n - 1) * s - 2 * p + d * (k - 1) + op + 1 for n, k, s, p, d, op in
           zip(spatial, kernel, stride, padding, dilation, output_padding)]
    q_len = [-(-(p + o) // s) for p, o, s in zip(padding, out, stride)]  # ceil
    # per dimension and phase r: [(k, shift m = (k d - r) / s)]
    taps = [[[(k, (k * d - r) // s) for k in range(K) if (k * d) % s == r] for r in range(s)]
            for K, s, d in zip(kernel, stride, dilation)]
    lo = [max((k * d) // s for k in range(K)) for K, s, d in zip(kernel, stride, dilation)]
    hi = [max(q - n, 0) for q, n in zip(q_len, spatial)]
    per_phase = [list(itertools.product(*(taps[i][r] for i, r in enumerate(ph))))
                 for ph in itertools.product(*(range(s) for s in stride))]
    flats = [[sum(k * math.prod(kernel[i + 1:]) for i, (k, _) in enumerate(tap))
              for tap in combo] for combo in per_phase]
    offsets = [[tuple(lo[i] - m for i, (_, m) in enumerate(tap)) for tap in combo]
               for combo in per_phase]
    return out, q_len, lo, hi, flats, offsets


def _shared_columns(offsets: list, groups: int) -> bool:
    """Whether every phase of a transposed convolution reads the same input columns
    (``offsets``: each phase's tap offsets), so that one GEMM serves them all."""
    return groups == 1 and bool(offsets[0]) and all(o == offsets[0] for o in offsets)


def _crop(y: mx.array, padding, out) -> mx.array:
    """The output window of a transposed convolution: ``out`` points from ``padding``
    along each spatial axis of y (N, *spatial, C)."""
    return y[(slice(None),) + tuple(slice(p, p + o) for p, o in zip(padding, out))
             + (slice(None),)]


# ---- 1-D on the kernel backends: the GEMM reads the window in place ------------------

def _affine(values: list[int]) -> int | None:
    """The common difference of ``values`` (an arithmetic progression), else None
    (0 for one value)."""
    step = values[1] - values[0] if len(values) > 1 else 0
    return step if values == [values[0] + step * i for i in range(len(values))] else None


def window_correlate(x: DoubleWord, w: DoubleWord, stride: int, padding: int,
                     dilation: int, groups: int, backend) -> DoubleWord:
    """:func:`correlate` of a 1-D convolution in one launch of the double-word GEMM
    reading x (N, L, Cin) through the window of each output (its zero padding
    included) and w (Cout, K, Cin / groups) in place (:func:`gemm.window_matmul`):
    no pad, gather or reshape around it, the same sums bit for bit (the k order
    (tap, channel) of the gathered columns). The groups are a batch dimension.
    Returns the words of the (N, Q, Cout) result."""
    (N, L, Cin), (Cout, K, Cg) = x.shape, w.shape
    Q = (L + 2 * padding - dilation * (K - 1) - 1) // stride + 1
    Og = Cout // groups
    dims = [dict(size=N, sa=L * Cin, sb=0, sc=Q * Cout)]
    if groups > 1:  # group g reads channels [g Cg, (g + 1) Cg), writes [g Og, (g + 1) Og)
        dims.append(dict(size=groups, sa=Cg, sb=Og * K * Cg, sc=Og))
    return gemm.window_matmul(
        x, w, taps=K, channels=Cg, rows=Q, cols=Og, window=(stride, dilation, padding, L),
        a_strides=(Cin, 1), b_strides=(Cg, 1, K * Cg), c_strides=(Cout, 1), dims=dims,
        shape=(N, Q, Cout), backend=backend)


@functools.lru_cache(maxsize=256)  # (a pure function of the shapes and arguments)
def _window_transposed_plan(x_shape, w_shape, stride: int, padding: int, dilation: int,
                            output_padding: int, groups: int):
    """``run(x, w, backend)`` of a 1-D transposed convolution (:func:`transposed`)
    whose phases share their columns and take their taps by a progression in the
    phase and in the tap (``kernel 2s`` at stride s, ...): one launch of the GEMM
    reading x's window in place, the phases a batch dimension of the weights' taps,
    each row written interleaved where the crop keeps it; the same sums bit for bit.
    None otherwise."""
    (N, L, Cin), (Cout, K, _) = x_shape, w_shape
    out, (q_len,), (lo,), _, flats, offsets = _polyphase(
        (L,), (K,), (stride,), (padding,), (dilation,), (output_padding,))
    if not _shared_columns(offsets, groups):
        return None
    starts = [o[0] for o in offsets[0]]
    step_t = _affine(starts)
    tap_t = [_affine(f) for f in flats]
    step_r = _affine([f[0] for f in flats])
    if step_t is None or step_r is None or flats[0][0] != 0 or any(
            t != tap_t[0] for t in tap_t) or any(len(f) != len(starts) for f in flats):
        return None
    T, P = len(starts), stride
    # phase r: the taps from r step_r, output positions q P + r - padding
    dims = [dict(size=N, sa=L * Cin, sb=0, sc=out[0] * Cout),
            dict(size=P, sa=0, sb=step_r * Cin, sc=0, sj=1)]

    def run(x: DoubleWord, w: DoubleWord, backend) -> DoubleWord:
        return gemm.window_matmul(
            x, w, taps=T, channels=Cin, rows=q_len, cols=Cout,
            window=(1, step_t, lo - starts[0], L), a_strides=(Cin, 1),
            b_strides=(tap_t[0] * Cin, 1, K * Cin), c_strides=(Cout, 1), dims=dims,
            shape=(N, out[0], Cout), crop=(P, padding, out[0]), backend=backend)

    return run


def _direct(ctx, original, x, w, args, kw, run):
    """``run(X, W, backend)`` (a 1-D convolution in one GEMM launch) as the rule's
    result on the kernel backends, outside a gradient's recording (whose tape takes
    the composition's ops); None elsewhere. Its VJP is MLX's convolution's."""
    if run is None or not ctx.backend.has_kernels or autodiff.recording():
        return None
    return words_op(lambda X, W: run(X, W, ctx.backend),
                    lambda a, b: original(a, b, *args, **kw), [x, w], ctx.backend)


def _planned(plan, original, x, w, args, kw):
    """``plan``'s ``(compute, shape, run)`` for the call, or None where it declines
    or its shape is not MLX's (MLX's own call, lazy, checks the arguments)."""
    ref = original(x, w, *args, **kw)
    planned = plan(x, w, *args, **kw)
    if planned is None or tuple(planned[1]) != tuple(ref.shape):
        return None
    return planned


def _one_gemm(plan):
    """The kernel form of a 1-D convolution in one GEMM launch (:func:`_direct`),
    NotImplemented where the call has none; on metal a repeated structure replays
    (:mod:`..recipes`: the planning, MLX's argument check and the GEMM's launch
    set-up are then not run again)."""

    def form(ctx, original, x, w, *args):
        planned = _planned(plan, original, x, w, args, {})
        out = None if planned is None else _direct(ctx, original, x, w, args, {}, planned[2])
        return NotImplemented if out is None else out

    return replayed(form)


# ---- the rules -----------------------------------------------------------------------

def _rule(nd: int, plan, skip=None):
    """A rule for an ``nd``-dimensional MLX convolution. ``plan(x, w, *args)``
    normalises the call's remaining arguments and returns ``(compute, shape, run)``
    (``compute()`` runs the decomposition; ``shape`` its output shape; ``run``: the
    same sums in one GEMM launch on the kernel backends, :func:`_direct`, or None)
    or None to decline. ``skip(x, w, *args)``: calls left to another rule, declined before
    anything runs."""
    one_gemm = _one_gemm(plan) if nd == 1 else None

    def rule(ctx, original, x=None, w=None, *args, **kw):
        if not _operands_ok(x, w, nd):
            return NotImplemented
        if skip is not None and skip(x, w, *args, **kw):
            return NotImplemented
        if one_gemm is not None and not kw and kernel_form(ctx):
            out = one_gemm(ctx, original, x, w, *args)
            if out is not NotImplemented:
                return out
        planned = _planned(plan, original, x, w, args, kw)
        if planned is None:
            return NotImplemented
        compute, _, run = planned
        direct = _direct(ctx, original, x, w, args, kw, run)
        if direct is not None:
            return direct
        with carry.reporting(ctx.report):
            return compute()

    return rule


def _forward_plan(nd: int):
    def plan(x, w, stride=1, padding=0, dilation=1, groups=1):
        s, p, d = (_tuple(v, nd, n) for v, n in ((stride, "stride"), (padding, "padding"),
                                                 (dilation, "dilation")))
        groups = int(groups)
        shape = (x.shape[0], *((n + 2 * pp - dd * (k - 1) - 1) // ss + 1 for n, k, ss, pp, dd
                               in zip(x.shape[1:-1], w.shape[1:-1], s, p, d)), w.shape[0])
        run = None
        if nd == 1:
            run = (lambda X, W, backend: window_correlate(X, W, s[0], p[0], d[0], groups,
                                                          backend))
        return (lambda: correlate(x, w, s, p, p, d, groups)), shape, run

    return plan


def _transpose_plan(nd: int):
    def plan(x, w, stride=1, padding=0, dilation=1, output_padding=0, groups=1):
        s, p, d, op = (_tuple(v, nd, n) for v, n in (
            (stride, "stride"), (padding, "padding"), (dilation, "dilation"),
            (output_padding, "output_padding")))
        kernel = w.shape[1:-1]
        if any(pp < 0 or pp > dd * (k - 1) for pp, dd, k in zip(p, d, kernel)):
            return None  # MLX's own convention there (its output length differs)
        shape = (x.shape[0], *((n - 1) * ss - 2 * pp + dd * (k - 1) + o + 1 for n, k, ss, pp, dd, o
                               in zip(x.shape[1:-1], kernel, s, p, d, op)), w.shape[0])
        run = None if nd > 1 else _window_transposed_plan(x.shape, w.shape, *s, *p, *d, *op,
                                                          int(groups))
        return (lambda: transposed(x, w, s, p, d, op, int(groups))), shape, run

    return plan


def _general_rule(ctx, original, x=None, w=None, stride=1, padding=0, kernel_dilation=1,
                  input_dilation=1, groups=1, flip=False, **kw):
    """``mx.conv_general``: input dilation by zero insertion (exact, the cost of
    the dilated input), asymmetric padding, ``flip`` (true convolution) by reversing
    the kernel's spatial axes, then :func:`correlate`."""
    if not (isinstance(x, ARRAY) and x.ndim >= 3):
        return NotImplemented
    nd = x.ndim - 2
    if not _operands_ok(x, w, nd):
        return NotImplemented
    ref = original(x, w, stride, padding, kernel_dilation, input_dilation, groups, flip)
    s = _tuple(stride, nd, "stride")
    d = _tuple(kernel_dilation, nd, "kernel_dilation")
    di = _tuple(input_dilation, nd, "input_dilation")
    if (isinstance(padding, (list, tuple)) and len(padding) == 2
            and all(isinstance(v, (list, tuple)) for v in padding)):
        lo, hi = _tuple(padding[0], nd, "padding"), _tuple(padding[1], nd, "padding")
    else:
        lo = hi = _tuple(padding, nd, "padding")
    if min(lo + hi) < 0:
        return NotImplemented
    shape = (x.shape[0], *(((n - 1) * f + 1 + a + b - dd * (k - 1) - 1) // ss + 1 for
                           n, f, a, b, k, ss, dd in
                           zip(x.shape[1:-1], di, lo, hi, w.shape[1:-1], s, d)), w.shape[0])
    if tuple(shape) != tuple(ref.shape):
        return NotImplemented
    with carry.reporting(ctx.report):
        xd = _dilate(x, di)
        wf = w[(slice(None),) + (slice(None, None, -1),) * nd + (slice(None),)] if flip else w
        return correlate(xd, wf, s, lo, hi, d, int(groups))


def _depthwise(x, w, stride=1, padding=0, dilation=1, groups=1):
    """Depthwise conv1d: the dedicated double-word kernel's case (_conv1d)."""
    return spectral.is_depthwise(x, w, groups)


_CONV1D = _rule(1, _forward_plan(1), skip=_depthwise)


def _conv1d(ctx, original, input, weight, stride=1, padding=0, dilation=1, groups=1):
    """``mx.conv1d``: depthwise convolutions through the double-word depthwise
    kernel (spectral.depthwise), words in and out; the others by
    the im2col GEMM above."""
    if not spectral.is_depthwise(input, weight, groups):
        return _CONV1D(ctx, original, input, weight, stride, padding, dilation, groups)
    geometry = (int(stride), int(padding), int(dilation))
    if autodiff.recording():  # the sum over the taps, in ops the tape differentiates
        with carry.reporting(ctx.report):
            return spectral.taps(input, weight, *geometry)
    plain = mx.conv1d if original is None else original
    if ctx.backend.float64_engine:  # one float64 sum over the taps of the operands' values
        return words_op(
            lambda X, W: from64(spectral.depthwise64(to64(X)[0], to64(W)[0], *geometry)),
            lambda x, w: plain(x, w, *geometry, groups), [input, weight], ctx.backend)
    return (_replayed_depthwise if kernel_form(ctx) else _depthwise_words)(
        ctx, plain, input, weight, geometry, groups)


def _depthwise_words(ctx, plain, x, w, geometry: tuple, groups):
    """The depthwise convolution of :func:`_conv1d` on a kernel backend (on metal a
    repeated structure replays: :mod:`..recipes`)."""
    return spectral.conv(
        lambda x, w: spectral.depthwise(x, w, *geometry, ctx.backend, None),
        lambda x, w: plain(x, w, *geometry, groups), x, w, ctx.backend, None)


_replayed_depthwise = replayed(_depthwise_words)


def _promoting(rule):
    """``rule`` of a convolution whose float32 operand's partner may be an integer,
    bool, float16 or bfloat16 array (weights kept in half precision): MLX promotes
    it to float32, so it enters at its exact value (:func:`.base.beside_float32`),
    once MLX's own call has checked the operands as given (it refuses integer
    inputs)."""

    def wrapped(ctx, original, x=None, w=None, *args, **kw):
        if isinstance(x, ARRAY) and isinstance(w, ARRAY) and x.dtype != w.dtype:
            original(x, w, *args, **kw)  # (lazy: its errors only)
            x, w = beside_float32(x, w)
        return rule(ctx, original, x, w, *args, **kw)

    return wrapped


for _name in ("conv1d", "conv_transpose1d"):  # (MLX's, passed to the rules as
    static(getattr(mx, _name))  # ``original``: a replay's structure holds it)

RULES = {name: _promoting(rule) for name, rule in {
    "conv1d": _conv1d,
    "conv2d": _rule(2, _forward_plan(2)),
    "conv3d": _rule(3, _forward_plan(3)),
    "conv_transpose1d": _rule(1, _transpose_plan(1)),
    "conv_transpose2d": _rule(2, _transpose_plan(2)),
    "conv_transpose3d": _rule(3, _transpose_plan(3)),
    "conv_general": _general_rule,
}.items()}
"""MLX function name -> double-word rule ``rule(ctx, original, *args, **kwargs)``."""
