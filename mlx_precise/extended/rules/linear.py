"""Matrix products and contractions: ``matmul`` (the double-word GEMM of
:mod:`mlx_precise.linalg`), ``addmm``, ``tensordot``, ``inner``, ``outer``,
two-operand ``einsum``."""

from __future__ import annotations

import functools
import math
import weakref

import mlx.core as mx

from ...core import backends
from ...linalg import gemm
from .. import arith, autodiff, carry, recipes
from ..carry import low_word
from ...doubleword import DoubleWord, fusion
from ...doubleword.types import map_words
from ..constructor import ARRAY  # the class (mx.array is a stand-in inside blocks)
from ..engine import words_op
from .base import (REAL, beside_float32, conj, decomposed, fused, is_word_array, kernel_form,
                   result, result64, small64, unbroadcast, words)

# Result of a transpose of the last two axes on a kernel backend -> the array it
# transposes: id -> (weak reference to the result, the block's report, the source's
# words as they were then: a second Python handle on its graph node, ``__copy__``,
# which an in-place update of the caller's handle does not change, and its low word
# or None). The entry is read only in the same block
# and dropped with the result or by an in-place update of it (:func:`forget`).
_transposes: dict[int, tuple[weakref.ref, object, tuple]] = {}
_COPY = ARRAY.__copy__  # MLX's own (captured at import: inside a block a stand-in)


def _swaps_last_two(ndim: int, perm) -> bool:
    return ndim >= 2 and [int(p) % ndim for p in perm] == [*range(ndim - 2), ndim - 1, ndim - 2]


def _same(z):
    return z


def noting_transposes(rule, permutation):
    """``rule`` of a transpose-like op (``transpose``, ``swapaxes``, ``.T``, ...),
    which on the kernel backends also notes a result that swaps the last two axes
    of its operand (``permutation(x, *args, **kw)``: the op's axis order),
    so that :func:`_matmul` reads the operand itself with swapped strides: the
    transpose node is then unread in a lazy graph that only multiplies by it
    (``x @ W.T``, ``nn.Linear``), and the kernel's input needs no copy."""

    def noted(ctx, original, x, *args, **kw):
        out = rule(ctx, original, x, *args, **kw)
        if ctx.backend.float64_engine or not is_word_array(x) or x.ndim < 2 or (
                isinstance(out, (list, tuple))):
            return out
        try:
            swaps = _swaps_last_two(x.ndim, permutation(x, *args, **kw))
        except (TypeError, ValueError):  # arguments MLX refuses: its error below
            swaps = False
        if not swaps:
            return out
        if out is NotImplemented:  # exact operand: MLX's op, noted
            out = original(x, *args, **kw)
        note_transpose(out, x, low_word(x), ctx.report)
        return out

    return noted


def note_transpose(out, x, lo, report) -> None:
    """Record ``out`` as the transpose of the last two axes of ``x`` (its low word
    ``lo`` or None) in the block of ``report``: an alias of x (a later in-place
    update of x does not change it), with x's packed words where it has them."""
    alias = _COPY(x)
    if lo is not None and fusion.has_packed(x, lo):  # x's packed words: the alias's
        fusion.note_moved(alias, lo, x, lo, _same)
    _note(out, (alias, lo), report)


def _note(out, words: tuple, report) -> None:
    """Record ``out`` as the transpose of the last two axes of ``words`` (the
    words' alias and low word) in the block of ``report``."""
    key = id(out)
    _transposes[key] = (weakref.ref(out, lambda _: _transposes.pop(key, None)), report, words)


def _source(x, report) -> tuple | None:
    """The words ``x`` is a noted transpose of (:func:`_untransposed`), or None."""
    entry = _transposes.get(id(x))
    if entry is None or entry[0]() is not x or entry[1] is not report:
        return None
    return entry[2]


recipes.views.append((_source, _note))  # (what a replay's trace records again)


def forget(x) -> None:
    """Drop what :func:`noting_transposes` noted about ``x`` (updated in place)."""
    _transposes.pop(id(x), None)


def _untransposed(x, report):
    """((high, low or None) words of the array whose last two axes ``x`` swaps,
    True) when this block noted ``x`` (:func:`noting_transposes`), else (x, False)."""
    entry = _transposes.get(id(x))
    if entry is None or entry[0]() is not x or entry[1] is not report:
        return x, False
    return entry[2], True


def _matmul():
    """``a @ b`` (``mx.matmul``): the double-word GEMM of :mod:`mlx_precise.linalg`
    (Dot2-style accumulation of exact products on metal / emulate, float64 on
    cpu); the gradient is MLX's float32 matmul VJP. On metal / emulate an operand
    that transposes the last two axes of an array (:func:`noting_transposes`) is
    read from that array with swapped strides."""

    def rule(ctx, original, a, b, **kw):
        if not (is_word_array(a) and is_word_array(b)):
            a, b = beside_float32(a, b)
            if not (is_word_array(a) and is_word_array(b)):
                return NotImplemented
        if ctx.backend.float64_engine or a.ndim < 2 or b.ndim < 2:
            return words_op(lambda A, B: gemm.matmul(A, B, backend=ctx.backend), original,
                            [a, b], ctx.backend)
        return (_replayed_gemm if kernel_form(ctx) else _gemm_words)(ctx, a, b)

    return rule


def _gemm_words(ctx, a, b):
    """``a @ b`` of operands of two axes or more on a kernel backend: the GEMM,
    reading an operand that transposes the last two axes of an array
    (:func:`noting_transposes`) from that array with swapped strides."""
    (sa, ta), (sb, tb) = _untransposed(a, ctx.report), _untransposed(b, ctx.report)
    if not (ta or tb):
        return words_op(lambda A, B: gemm.matmul(A, B, backend=ctx.backend), _MATMUL,
                        [a, b], ctx.backend)
    # The kernel reads the sources' words; the gradient stays MLX's matmul VJP
    # of the operands as given (through their transposes).
    sources = [(v, low_word(v)) if v is x else v for v, x in ((sa, a), (sb, b))]
    return words_op(lambda A, B: gemm.transposed_matmul(
        *(DoubleWord.exact(v) if lo is None else DoubleWord(v, lo) for v, lo in sources),
        (ta, tb), backend=ctx.backend), _MATMUL, [a, b], ctx.backend)


_replayed_gemm = recipes.replayed(_gemm_words)


_MATMUL = mx.matmul  # (MLX's, captured at import: inside a block mx.matmul is a stand-in)


def _fast_matmul(a, b):
    """``a @ b`` of small real operands on the cpu engine: one MLX float64 matmul
    of the values :func:`.base.small64` reads (what the rule's ``gemm`` computes
    there); None: the rule decides."""
    if not (isinstance(a, ARRAY) and isinstance(b, ARRAY)) or not (
            backends.backend().float64_engine):
        return None
    x = small64(a)
    if x is None:
        return None
    y = small64(b)
    return None if y is None else result64(_MATMUL(x, y, stream=mx.cpu))


def _addmm(c, a, b, alpha=1.0, beta=1.0):
    """``mx.addmm``: ``alpha (a @ b) + beta c`` (nn.Linear's bias term)."""
    ab = a @ b
    ab = ab if alpha == 1 else ab * alpha
    return ab + (c if beta == 1 else c * beta)


def _addmm_rule():
    """``mx.addmm``: :func:`_addmm`; on a kernel backend, outside gradient recording
    and MLX's autodiff, with ``alpha = beta = 1`` (``nn.Linear``), its two steps
    called directly (the matmul rule, then the fused sum's fast path: the same
    launches and bits as the decomposition, without the flow's work per step)."""
    slow, product = decomposed(_addmm), _matmul()

    def steps(ctx, c, a, b):
        ab = product(ctx, _MATMUL, a, b)
        if ab is NotImplemented:
            return ab
        z = fused("add", (ab, c), ctx.backend)
        return z if z is not None else result(
            arith.binary("add", words(ab), words(c), ctx.backend, ctx.stream))

    replayed = recipes.replayed(steps)

    def rule(ctx, original, c, a, b, alpha=1.0, beta=1.0, **kw):
        if alpha == 1 and beta == 1 and not kw and is_word_array(c) and kernel_form(ctx):
            ab = replayed(ctx, c, a, b)
            if ab is not NotImplemented:
                return ab
        return slow(ctx, original, c, a, b, alpha, beta, **kw)

    return rule


def _tensordot(a, b, axes=2, **kw):
    """Contract the last ``axes`` axes of a with the first of b (or the listed
    pairs) by one double-word matmul."""
    if isinstance(axes, int):
        ax_a = list(range(a.ndim - axes, a.ndim))
        ax_b = list(range(axes))
    else:
        ax_a = [int(v) % a.ndim for v in axes[0]]
        ax_b = [int(v) % b.ndim for v in axes[1]]
    free_a = [d for d in range(a.ndim) if d not in ax_a]
    free_b = [d for d in range(b.ndim) if d not in ax_b]
    k = math.prod([a.shape[d] for d in ax_a])
    A = mx.transpose(a, free_a + ax_a).reshape(-1, k)
    B = mx.transpose(b, ax_b + free_b).reshape(k, -1)
    return (A @ B).reshape([a.shape[d] for d in free_a] + [b.shape[d] for d in free_b])


def _inner(a, b, **kw):
    return _tensordot(a, b, axes=([-1], [-1])) if a.ndim and b.ndim else a * b


def _outer(a, b, **kw):
    return a.reshape(-1, 1) * b.reshape(1, -1)


@functools.lru_cache(maxsize=256)
def _einsum_plan(spec: str, ndims: tuple[int, ...]):
    """Batch / contracted / free letters of a two-operand einsum without ellipsis or
    repeated letters within an operand; None when it is not of that kind."""
    if "..." in spec or "->" not in spec:
        return None
    ins, out = spec.replace(" ", "").split("->")
    terms = ins.split(",")
    if len(terms) != 2 or any(len(set(t)) != len(t) for t in terms + [out]):
        return None
    ta, tb = terms
    if (len(ta), len(tb)) != ndims:
        return None
    batch = [c for c in out if c in ta and c in tb]
    contract = [c for c in ta if c in tb and c not in out]
    fa = [c for c in ta if c not in tb]
    fb = [c for c in tb if c not in ta]
    if any(c not in out for c in fa + fb) or set(out) != set(batch + fa + fb):
        return None
    return ta, tb, out, batch, contract, fa, fb


@functools.lru_cache(maxsize=256)
def _einsum_layout(spec: str, shape_a: tuple, shape_b: tuple):
    """The one batched matmul of an einsum (:func:`_einsum_plan`) on operands of
    these shapes: ``(a's axis order, a as (batch, m, k), b's axis order, b as
    (batch, k, n), the product's shape by letters (batch, free a, free b), the axis
    order of the result)``; an axis order is None where it is the identity."""
    ta, tb, out, batch, contract, fa, fb = _einsum_plan(spec, (len(shape_a), len(shape_b)))
    size = {**dict(zip(ta, shape_a)), **dict(zip(tb, shape_b))}
    dims = (lambda letters: [size[c] for c in letters])
    n_b, m, k, n = (math.prod(dims(x)) for x in (batch, fa, contract, fb))
    order = batch + fa + fb

    def perm(p):
        return None if p == sorted(p) else p

    return (perm([ta.index(c) for c in batch + fa + contract]), (n_b, m, k),
            perm([tb.index(c) for c in batch + contract + fb]), (n_b, k, n),
            tuple(dims(batch) + dims(fa) + dims(fb)), perm([order.index(c) for c in out]))


def _einsum(spec, *operands, **kw):
    """Two-operand contractions as one batched double-word matmul (others: MLX)."""
    if len(operands) != 2 or kw:
        return NotImplemented
    a, b = operands
    if _einsum_plan(spec, (a.ndim, b.ndim)) is None:
        return NotImplemented
    pa, sa, pb, sb, sc, pc = _einsum_layout(spec, a.shape, b.shape)
    A = (a if pa is None else mx.transpose(a, pa)).reshape(sa)
    B = (b if pb is None else mx.transpose(b, pb)).reshape(sb)
    C = (A @ B).reshape(sc)
    return C if pc is None else mx.transpose(C, pc)


@functools.lru_cache(maxsize=256)
def _einsum_strides(spec: str, shape_a: tuple, shape_b: tuple):
    """The einsum (:func:`_einsum_plan`) as one :func:`~mlx_precise.linalg.gemm.strided_matmul`
    on the operands and the result in place: ``dict(batch, m, n, k, shape)`` with
    the strides of each letter in a, b and the output (row-major, in elements); the
    batch letters and all but the last free letter of each operand are batch
    dimensions (a free letter of a: b's stride 0). None where more than one letter
    is contracted (k is one stride)."""
    ta, tb, out, batch, contract, fa, fb = _einsum_plan(spec, (len(shape_a), len(shape_b)))
    if len(contract) > 1:
        return None
    size = {**dict(zip(ta, shape_a)), **dict(zip(tb, shape_b))}
    shape = tuple(size[c] for c in out)

    def strides(letters, dims):
        st, acc = {}, 1
        for c, d in zip(reversed(letters), reversed(dims)):
            st[c], acc = acc, acc * d
        return st

    sa, sb, so = strides(ta, shape_a), strides(tb, shape_b), strides(out, shape)
    records = ([(size[c], sa[c], sb[c], so[c]) for c in batch]
               + [(size[c], sa[c], 0, so[c]) for c in fa[:-1]]
               + [(size[c], 0, sb[c], so[c]) for c in fb[:-1]])
    m = (size[fa[-1]], sa[fa[-1]], so[fa[-1]]) if fa else (1, 0, 0)
    n = (size[fb[-1]], sb[fb[-1]], so[fb[-1]]) if fb else (1, 0, 0)
    k = (size[contract[0]], sa[contract[0]], sb[contract[0]]) if contract else (1, 0, 0)
    return dict(batch=tuple(records), m=m, n=n, k=k, shape=shape)


def _einsum_words(spec, a, b, original, backend):
    """:func:`_einsum` on a kernel backend as one op of the words: one GEMM launch
    reading the operands and writing the result in place through strides
    (:func:`_einsum_strides`), or, where several letters are contracted, the
    operands' words moved (exact) into the batched GEMM and its result's words moved
    to the output (the same launch and bits as the decomposition, without a rule per
    transpose and reshape); MLX's einsum VJP."""
    layout = _einsum_strides(spec, a.shape, b.shape)
    if layout is not None:
        return words_op(lambda A, B: gemm.strided_matmul(A, B, **layout, backend=backend),
                        lambda x, y: original(spec, x, y), [a, b], backend)
    pa, sa, pb, sb, sc, pc = _einsum_layout(spec, a.shape, b.shape)

    def moved(x: DoubleWord, perm, shape) -> DoubleWord:
        def move(w):
            w = w if perm is None else mx.transpose(w, perm)
            return w if w.shape == shape else w.reshape(shape)
        return map_words(move, x)  # (a float32 operand: no low word made)

    def forward(A, B):
        C = gemm.matmul(moved(A, pa, sa), moved(B, pb, sb), backend=backend)
        C = moved(C, None, sc)
        return C if pc is None else DoubleWord.of_words(mx.transpose(C.hi, pc),
                                                        mx.transpose(C.lo, pc))

    return words_op(forward, lambda x, y: original(spec, x, y), [a, b], backend)


def _einsum_rule(ctx, original, spec, *operands, **kw):
    if not all(is_word_array(o) for o in operands):
        operands = beside_float32(*operands)
    if not isinstance(spec, str) or not all(is_word_array(o) for o in operands):
        return NotImplemented
    if len(operands) != 2 or kw or _einsum_plan(spec, tuple(o.ndim for o in operands)) is None:
        return NotImplemented
    if kernel_form(ctx) and recipes.held(original):  # (replayed on metal)
        return _replayed_einsum(ctx, original, spec, *operands)
    if ctx.backend.has_kernels and not autodiff.recording():
        return _einsum_words(spec, *operands, original, ctx.backend)
    with carry.reporting(ctx.report):  # a recorded gradient: each step of the flow
        return _einsum(spec, *operands)


def _einsum_form(ctx, original, spec, a, b):
    return _einsum_words(spec, a, b, original, ctx.backend)


_replayed_einsum = recipes.replayed(_einsum_form)
recipes.static(mx.einsum)  # (MLX's, the rule's ``original``: a replay holds its id)


def _gather_mm(a, b, lhs_indices=None, rhs_indices=None, *, sorted_indices=False):
    """``mx.gather_mm``: the matrices named by the flat batch indices, gathered
    (exact), then one batched double-word matmul (broadcast over the indices)."""
    A = a.reshape(-1, *a.shape[-2:])
    B = b.reshape(-1, *b.shape[-2:])
    with carry.suspended():  # the default indices: every batch entry in order
        if lhs_indices is None:
            lhs_indices = mx.arange(A.shape[0]).reshape(a.shape[:-2])
        if rhs_indices is None:
            rhs_indices = mx.arange(B.shape[0]).reshape(b.shape[:-2])
    return mx.take(A, lhs_indices, axis=0) @ mx.take(B, rhs_indices, axis=0)


def _block_mask(mask, block_size, rows, cols):
    """A block mask (..., ceil(rows / bs), ceil(cols / bs)) expanded to elements
    (..., rows, cols): each block's value repeated (exact)."""
    m = mx.repeat(mx.repeat(mask, block_size, axis=-2), block_size, axis=-1)
    return m[..., :rows, :cols]


def _block_masked_mm(a, b, block_size=64, mask_out=None, mask_lhs=None, mask_rhs=None):
    """``mx.block_masked_mm``: the operands' blocks multiplied by their masks
    (boolean: kept or zeroed; floating: scaled), one double-word matmul, the
    output's blocks multiplied by theirs."""
    if a.ndim < 2 or b.ndim < 2 or block_size not in (32, 64):
        return NotImplemented  # MLX's errors
    (m, k), n = a.shape[-2:], b.shape[-1]
    if mask_lhs is not None:
        a = a * _block_mask(mask_lhs, block_size, m, k)
    if mask_rhs is not None:
        b = b * _block_mask(mask_rhs, block_size, k, n)
    out = a @ b
    return out if mask_out is None else out * _block_mask(mask_out, block_size, m, n)


def _segmented_mm(a, b, segments):
    """``mx.segmented_mm``: per segment ``[start, end)`` of the inner dimension,
    ``a[..., start:end] @ b[start:end]``, as one batched double-word matmul of a
    masked by each segment (exact 0 / 1 factors): no segment bound is read on the
    host."""
    k = a.shape[-1]
    with carry.suspended():
        pos = mx.arange(k)
        start, end = segments[..., :1], segments[..., 1:]
        inside = ((pos >= start) & (pos < end)).astype(mx.float32)  # (..., S, K)
    return (mx.expand_dims(a, -3) * mx.expand_dims(inside, -2)) @ mx.expand_dims(b, -3)


def _kron(a, b):
    """``kron(a, b)``: every product ``a[i] b[j]`` (exact in double-word), laid out
    as numpy's: the axes of both, interleaved, merged pairwise."""
    nd = max(a.ndim, b.ndim)
    sa = [1] * (nd - a.ndim) + list(a.shape)
    sb = [1] * (nd - b.ndim) + list(b.shape)
    A = a.reshape([v for s in sa for v in (s, 1)])
    B = b.reshape([v for s in sb for v in (1, s)])
    return (A * B).reshape([x * y for x, y in zip(sa, sb)])


def _convolve(a, v, mode="full"):
    """``convolve(a, v, mode)`` of 1-D arrays: the sum over the taps of shifted
    copies of the longer one times the taps of the shorter one, reversed."""
    if a.ndim != 1 or v.ndim != 1 or mode not in ("full", "same", "valid") or not (
            a.size and v.size):
        return NotImplemented  # MLX's own errors
    if v.shape[0] > a.shape[0]:
        a, v = v, a
    n, k = a.shape[0], v.shape[0]
    padded = mx.pad(a, [(k - 1, k - 1)])
    full = None
    for j in range(k):  # full[t] = sum_j v[j] a[t - j]
        term = padded[k - 1 - j:k - 1 - j + n + k - 1] * v[j]
        full = term if full is None else full + term
    if mode == "full":
        return full
    if mode == "valid":
        return full[k - 1:n]
    start = (k - 1) // 2
    return full[start:start + n]


def _trace(a, offset=0, axis1=0, axis2=1, dtype=None):
    if dtype is not None and dtype != a.dtype:
        return NotImplemented
    return mx.sum(mx.diagonal(a, offset, axis1, axis2), axis=-1)


def _vecdot(a, b, axis=-1):
    """``sum(conj(a) b)`` over ``axis`` (numpy's and MLX's definition)."""
    return mx.sum(mx.conj(a) * b if a.dtype == mx.complex64 else a * b, axis=axis)


def _cross(a, b, axis=-1):
    """The cross product of 3-vectors along ``axis``, each component a double-word
    difference of products."""
    if a.shape[axis] != 3 or b.shape[axis] != 3:
        return NotImplemented  # MLX's own rules (and errors) for other lengths
    x, y = ([mx.take(v, k, axis=axis) for k in range(3)] for v in (a, b))
    return mx.stack([x[1] * y[2] - x[2] * y[1], x[2] * y[0] - x[0] * y[2],
                     x[0] * y[1] - x[1] * y[0]], axis=axis % a.ndim)


def _hadamard_factor(n: int):
    """``n = m 2^k`` with m in (1, 12, 20, 28) (MLX's sizes): (m, 2^k), or None."""
    for m in (1, 12, 20, 28):
        if n % m == 0 and n // m & (n // m - 1) == 0 and n // m <= 8192:
            return m, n // m
    return None


def _hadamard_transform(a, scale=None):
    """``mx.hadamard_transform`` along the last axis: ``y = x @ R``, ``R = kron(R_m,
    S)`` with S the Sylvester matrix of order 2^k, applied by k butterfly stages
    (each a double-word sum and difference), and R_m (m = 12, 20, 28) MLX's own
    +-1 matrix (its transform of the identity, exact), by one double-word matmul;
    then the scale, 1/sqrt(n) by default (in float64, two words)."""
    n = a.shape[-1] if a.ndim else 1
    factor = _hadamard_factor(n)
    if a.dtype != mx.float32 or factor is None:
        return NotImplemented  # MLX's error, or another dtype
    m, p = factor
    x = a.reshape(*a.shape[:-1], m, p)
    h = 1
    while h < p:  # Sylvester: [[S, S], [S, -S]]
        x = x.reshape(*a.shape[:-1], m, p // (2 * h), 2, h)
        u, v = x[..., 0, :], x[..., 1, :]
        x = mx.stack([u + v, u - v], axis=-2).reshape(*a.shape[:-1], m, p)
        h *= 2
    if m > 1:
        with carry.suspended():
            rm = mx.hadamard_transform(mx.eye(m), scale=1.0)
        x = mx.swapaxes(mx.swapaxes(x, -1, -2) @ rm, -1, -2)
    y = x.reshape(a.shape)
    return y * (1 / math.sqrt(n) if scale is None else scale)


RULES = {
    "matmul": _matmul(), "addmm": _addmm_rule(), "tensordot": decomposed(_tensordot),
    "inner": decomposed(_inner), "outer": decomposed(_outer), "einsum": _einsum_rule,
    "trace": decomposed(_trace), "vecdot": decomposed(_vecdot),
    "gather_mm": decomposed(_gather_mm), "kron": decomposed(_kron),
    "convolve": decomposed(_convolve),
    "linalg.cross": decomposed(_cross), "hadamard_transform": decomposed(_hadamard_transform),
    "block_masked_mm": decomposed(_block_masked_mm), "segmented_mm": decomposed(_segmented_mm),
}
"""Op name -> rule."""


# ---- derivatives ---------------------------------------------------------------------


def _matmul_vjp(e, g):
    """``a @ b``: g @ b^H and a^H @ g (conjugate transposes: MLX's convention for
    complex values), vectors promoted to matrices as matmul does, batch axes summed
    back to each operand's shape."""
    a, b = e.args[:2]
    if a.dtype not in (*REAL, mx.complex64) or b.dtype not in (*REAL, mx.complex64):
        return NotImplemented
    a, b = conj(a), conj(b)
    a2 = a[None] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    g2 = g
    if a.ndim == 1:
        g2 = mx.expand_dims(g2, -2)
    if b.ndim == 1:
        g2 = mx.expand_dims(g2, -1)
    ga = unbroadcast(g2 @ mx.swapaxes(b2, -1, -2), a2)
    gb = unbroadcast(mx.swapaxes(a2, -1, -2) @ g2, b2)
    return (ga.reshape(a.shape), gb.reshape(b.shape))


VJPS = {"matmul": _matmul_vjp}

FAST = {"matmul": _fast_matmul}
"""Op name -> VJP rule (see :mod:`.base`)."""
