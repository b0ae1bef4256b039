"""Double-word matrix products: ``C = A @ B (+ bias)`` with ~48-bit operands and result.

:func:`matmul` follows numpy / MLX ``matmul`` semantics (batch dimensions broadcast,
1-D operands promoted and the added dimension removed) on :class:`DoubleWord`
operands, real (float32 words) or complex (complex64 words), with an optional
``bias`` broadcast to the output (``mx.addmm``, ``nn.Linear``). One engine per
backend:

* ``metal`` / ``emulate``: one launch of the tiled kernel ``metal/kernels/dw_gemm.metal``
  (threadgroup tiles of both words of A and B; exact products by FMA, TwoProdFMA;
  Dot2-style accumulation, Ogita-Rump-Oishi 2005, with a double-word correction term;
  ``metal/include/dw_gemm.h``). Entrywise error
  ``|C - C_exact| <= (K + 12) u^2 (|bias| + |A| |B|)``, u = 2^-24 (docs/dwgemm.md).
  Complex products use four real products per term, fused in the same kernel (not
  Gauss's three: its imaginary part ``(ar + ai)(br + bi) - ar br - ai bi`` is only
  accurate relative to ``(|ar| + |ai|)(|br| + |bi|)``, and the sums ``ar + ai`` would
  need extra double-word passes); a real operand times a complex one is a real
  product per part, in the same launch.
* ``cpu``: MLX's float64 matmul on the CPU stream (lazy): the operands are exact in
  float64, the float64 sum errs by at most ``1.01 K 2^-53 (|A| |B|)`` (gamma_K), and
  splitting the result into two words adds at most ``2^-48 |C|``: within the metal
  bound for every K.

Special values follow float32: an output is NaN when a NaN meets it or Inf * 0 or
Inf - Inf occurs in its sum, +-Inf when an infinite product or the sum overflows,
with a zero low word.
"""

from __future__ import annotations

import functools
import math
import warnings

import mlx.core as mx
import numpy as np

from ..core import backends
from ..doubleword import DoubleWord, fusion
from ..doubleword.types import combine, map_words
from ..doubleword.engine64 import from64, to64
from ..core.kernels import Codes, Constants, Kernel, ParamLayout, generated_block
from ..core.streams import on_stream
from ..core.backends import Backend

F32, C64, F64 = mx.float32, mx.complex64, mx.float64

# Output tile of one threadgroup and its thread count: DW_GEMM_BM / DW_GEMM_BN /
# DW_GEMM_THREADS in metal/include/dw_gemm.h.
TILE_M = 32
TILE_N = 32
THREADS = 256
# MLX passes inputs of fewer elements in Metal's constant address space (another
# signature): every buffer is padded to at least this many.
_MIN_DEVICE_ELEMENTS = 8

DW_GEMM_PARAMS = ParamLayout("DW_GEMM_P", (
    "m", "n", "k",
    # Strides in floats of A(m, k), B(k, n), C(m, n) and the bias D(m, n) (0: broadcast).
    "sam", "sak", "sbk", "sbn", "scm", "scn", "sdm", "sdn",
    "has_bias",
    "a_lo", "b_lo", "d_lo",  # whether al, bl, dl hold a low word (else it reads as 0)
    "batch_dims",            # nb: the number of DW_GEMM_DIM records that follow
    # WIN = 1 only (a convolution's window, :func:`window_matmul`): k = t kc + c, B's
    # stride per tap t, and A's signal position m win_s + t win_d - win_lo in
    # [0, win_len) (else A reads 0)
    "kc", "sbt", "win_s", "win_d", "win_lo", "win_len",
    # WIN = 1 only: row m is the output position m out_s + oj - out_lo (oj: the batch
    # records' sj), written when in [0, out_len)
    "out_s", "out_lo", "out_len",
    # packed words (one buffer holds both words: a kernel's packed output): the
    # offsets in floats of al from ah and of bl from bh where no al / bl input is
    # declared (0 where the operand has no low word), and of C's low words from its
    # high words in the output c
    "al_at", "bl_at", "cl_at",
), size=28, dtype=np.int64)
"""The fixed part of the int64 ``p`` buffer of :data:`DW_GEMM` (``DW_GEMM_P_M`` ... in
``metal/include/dw_gemm.h``); ``batch_dims`` records of :data:`DW_GEMM_DIM` follow
it, from ``p[DW_GEMM_DIMS_AT]`` on, outermost dimension first."""

DW_GEMM_DIM = Codes("DW_GEMM_DIM", ("size", "sa", "sb", "sc", "sd", "sj"))
"""The fields of one batch dimension's record in ``p``: its size, the strides in
floats of A, B, C and D along it and (``WIN`` = 1) its step of the output position
(``DW_GEMM_DIM_SIZE`` ...; ``DW_GEMM_DIM_COUNT`` per record)."""

DW_GEMM_DIMS = Constants("DW_GEMM", {"dims_at": DW_GEMM_PARAMS.size})


def codes_source() -> str:
    """The generated block of ``metal/include/dw_gemm.h`` (a test checks that the
    header holds exactly this text)."""
    return generated_block("mlx_precise.linalg.gemm.codes_source()", DW_GEMM_PARAMS,
                           DW_GEMM_DIM, DW_GEMM_DIMS)


_WORDS = ("ah", "al", "bh", "bl", "dh", "dl")


def _absent(word: str) -> str:
    """The body's definition of an input ``word`` a kernel does not declare: a low
    word of A or B is ``DW_GEMM_P_AL_AT`` / ``_BL_AT`` floats past its high word
    (packed words; never read where ``p`` says there is no low word), the bias's
    words ``ah`` (never read: no bias)."""
    if word in ("al", "bl"):
        return (f"const device float* {word} = {word[0]}h + p[DW_GEMM_P_{word.upper()}_AT];")
    return f"const device float* {word} = ah;"


def _gemm_kernel(name: str, words: tuple[str, ...] = _WORDS) -> Kernel:
    """:data:`DW_GEMM` with only the inputs ``words`` (and ``p``): the body's
    line 1 (:attr:`Kernel.prelude`) defines the others (:func:`_absent`), so that
    a launch passes no array twice and reads packed words as one input."""
    absent = [w for w in _WORDS if w not in words]
    return Kernel(
        name=name,
        body="dw_gemm.metal",
        headers=("dw_gemm.h",),
        inputs=words + ("p",),
        outputs=("cw",),
        template=("CPLX", "WIN"),
        input_dtypes={**{w: (F32,) for w in words}, "p": (mx.int64,)},
        extended=True,
        variants={"CPLX": (0, 1), "WIN": (0, 1), "cw": (F32,)},
        input_forms=dict.fromkeys(words + ("p",), ("device",)),  # _device pads
        prelude=" ".join(_absent(w) for w in absent),
    )


DW_GEMM = _gemm_kernel("dw_gemm")
"""``C = D + A B`` in double-word (see ``metal/kernels/dw_gemm.metal``): inputs
``ah, al, bh, bl, dh, dl`` float32 flat buffers (complex values as (re, im) float
pairs when ``CPLX`` is 1), ``p`` int64 launch parameters with strides in floats
(:data:`DW_GEMM_PARAMS`, then the batch records :data:`DW_GEMM_DIM`);
output ``cw`` float32 flat: C's high words, then from ``p[DW_GEMM_P_CL_AT]`` its low
words (packed); grid from :func:`gemm_grid`. ``WIN`` 1 (real
operands): A is read as a 1-D convolution's window of a signal (:func:`window_matmul`)."""
# Without a bias (matmul, the convolutions), by the low words stored apart: no
# placeholder input (each would be one more input of the launch's graph node); an
# operand whose words are packed (a kernel's output) is one input, its high word's.
DW_GEMM_HI = _gemm_kernel("dw_gemm_hi", ("ah", "bh"))
DW_GEMM_AL = _gemm_kernel("dw_gemm_al", ("ah", "al", "bh"))
DW_GEMM_BL = _gemm_kernel("dw_gemm_bl", ("ah", "bh", "bl"))
DW_GEMM_AL_BL = _gemm_kernel("dw_gemm_al_bl", ("ah", "al", "bh", "bl"))
_UNBIASED = {(False, False): DW_GEMM_HI, (True, False): DW_GEMM_AL,
             (False, True): DW_GEMM_BL, (True, True): DW_GEMM_AL_BL}


class MatmulShapeError(ValueError):
    """Operand shapes that MLX's matmul / addmm would refuse (named like MLX's)."""


def gemm_grid(m: int, n: int, batches: int):
    """``(grid, threadgroup)`` of :data:`DW_GEMM`: one threadgroup of
    :data:`THREADS` threads per 32 x 32 output tile of each batch."""
    tiles_n = max(-(-int(n) // TILE_N), 1)
    tiles_m = max(-(-int(m) // TILE_M), 1)
    return (tiles_n * THREADS, tiles_m, max(int(batches), 1)), (THREADS, 1, 1)


def _fmt(shape) -> str:
    return "(" + ",".join(str(int(s)) for s in shape) + ")"


def _check(a, b, bias, transposed=(False, False)):
    """Validate the operands (``transposed``: a / b given as the transpose of their
    last two axes); return (a shape, b shape as 2-D+ operands, batch shape, output
    shape, whether a / b were 1-D)."""
    for name, x in (("a", a), ("b", b)) + ((("bias", bias),) if bias is not None else ()):
        if not isinstance(x, DoubleWord):
            raise TypeError(f"{name} must be a DoubleWord (make one with DoubleWord.from_array), "
                            f"got {type(x).__name__}")
    return _shapes(a.shape, b.shape, None if bias is None else bias.shape, transposed)


@functools.lru_cache(maxsize=1024)
def _shapes(a_shape: tuple, b_shape: tuple, bias_shape: tuple | None, transposed: tuple):
    """The shape part of :func:`_check`, cached (a layer multiplies the same shapes
    at every call; an error is raised again every time, never cached)."""
    if not a_shape or not b_shape:
        raise MatmulShapeError(
            "[matmul] Got 0 dimension input. Inputs must have at least one dimension.")
    a_vec, b_vec = len(a_shape) == 1, len(b_shape) == 1
    sa = (1,) + a_shape if a_vec else _logical(a_shape, transposed[0])
    sb = b_shape + (1,) if b_vec else _logical(b_shape, transposed[1])
    if sa[-1] != sb[-2]:
        raise MatmulShapeError(
            f"[matmul] Last dimension of first input with shape {_fmt(sa)} must match second "
            f"to last dimension of second input with shape {_fmt(sb)}.")
    try:
        batch = tuple(mx.broadcast_shapes(sa[:-2], sb[:-2]))
    except ValueError as e:
        raise MatmulShapeError(str(e)) from None
    out = batch + ((sa[-2],) if not a_vec else ()) + ((sb[-1],) if not b_vec else ())
    if bias_shape is not None:
        try:
            ok = tuple(mx.broadcast_shapes(bias_shape, out)) == out
        except ValueError:
            ok = False
        if not ok:
            raise MatmulShapeError(
                f"[addmm] bias with shape {_fmt(bias_shape)} must broadcast to the output "
                f"shape {_fmt(out)}.")
    return sa, sb, batch, out, a_vec, b_vec


def _logical(shape: tuple, swapped: bool) -> tuple:
    """The shape of an operand stored as the transpose of its last two axes."""
    return shape[:-2] + (shape[-1], shape[-2]) if swapped else shape


# The options matmul once took positionally, in that order (now keyword-only).
_FORMERLY_POSITIONAL = ("backend", "stream", "bias")


def _keyword_only_options(fn):
    """``fn(a, b, *, backend, stream, bias)`` that still accepts the old positional
    options, with a DeprecationWarning (callers outside this package may pass
    ``backend`` positionally)."""

    @functools.wraps(fn)
    def wrapper(a, b, *options, **kwargs):
        if options:
            if len(options) > len(_FORMERLY_POSITIONAL):
                raise TypeError(
                    f"matmul() takes 2 positional arguments (a, b) but {2 + len(options)} "
                    "were given; backend, stream and bias are keyword-only")
            names = _FORMERLY_POSITIONAL[:len(options)]
            for n in names:
                if n in kwargs:
                    raise TypeError(f"matmul() got multiple values for argument {n!r}")
            warnings.warn(
                f"mlx_precise.linalg.matmul: passing {', '.join(names)} positionally is "
                f"deprecated; write matmul(a, b, {names[0]}=...): backend, stream and "
                "bias are keyword-only, as in every other function of the package",
                DeprecationWarning, stacklevel=2)
            kwargs.update(zip(names, options))
        return fn(a, b, **kwargs)

    return wrapper


@_keyword_only_options
def matmul(a: DoubleWord, b: DoubleWord, *, backend: str | None = None, stream=None,
           bias: DoubleWord | None = None) -> DoubleWord:
    """``bias + a @ b`` in double-word arithmetic.

    Args:
        a: DoubleWord ``[..., M, K]`` or ``[K]`` (float32 or complex64 words).
        b: DoubleWord ``[..., K, N]`` or ``[K]``. Batch dimensions ``...`` of ``a``
            and ``b`` broadcast; a 1-D ``a`` is a row ``[1, K]`` and a 1-D ``b`` a
            column ``[K, 1]``, the added dimension removed from the result (MLX).
        backend: ``"metal"``, ``"emulate"``, ``"cpu"`` or None (the active one);
            keyword-only (positional use still works, with a DeprecationWarning).
        stream: MLX stream or device of the kernel launch and the ops around it
            (metal / emulate; the cpu path computes in float64 on the CPU stream).
        bias: optional DoubleWord broadcast to the output shape, added before the
            one rounding of each output (``mx.addmm(bias, a, b)``).
    Returns:
        A normalised DoubleWord of shape ``broadcast(...) + [M, N]`` (less the
        removed dimensions), complex64 words if any operand is complex. K = 0
        gives the bias (or zeros). Error per output (metal / emulate):
        ``<= (K + 12) u^2 (|bias| + sum_k |a_k| |b_k|)``, u = 2^-24, for
        operands whose products stay above ~2^-78 in magnitude (float32's flush
        of subnormals, see ``doubleword.h``); cpu: ``<= 1.01 K 2^-53 (...) + 2^-48 |C|``.

    Raises:
        TypeError: an operand is not a DoubleWord; a ``stream`` that is not a
            stream or device; more than two positional arguments.
        MatmulShapeError (ValueError): 0-d operands, mismatched K, batch shapes that
            do not broadcast, a bias that does not broadcast to the output.
        ValueError / BackendUnavailableError: unknown or unavailable backend.
    """
    return transposed_matmul(a, b, (False, False), backend=backend, stream=stream, bias=bias)


def transposed_matmul(a: DoubleWord, b: DoubleWord, transposed: tuple[bool, bool], *,
                      backend: str | None = None, stream=None,
                      bias: DoubleWord | None = None) -> DoubleWord:
    """:func:`matmul` of operands that may be stored transposed.

    Args:
        a, b, backend, stream, bias: as in :func:`matmul`.
        transposed: ``(ta, tb)``: ``a`` (``b``) is given as the transpose of the
            operand's last two axes (at least 2-D), e.g. the weight ``W`` of
            ``x @ W.T``: the product is then ``swapaxes(a, -1, -2) @ b`` (likewise
            for ``b``). The metal / emulate kernel reads it with swapped strides:
            no transpose and no copy of it.

    Returns:
        :func:`matmul`'s result (the same bits as with the transposed operand).

    Raises:
        :func:`matmul`'s errors; MatmulShapeError for a transposed 1-D operand.
    """
    transposed = (bool(transposed[0]), bool(transposed[1]))
    if transposed[0] and a.ndim < 2 or transposed[1] and b.ndim < 2:
        raise MatmulShapeError("[matmul] a transposed operand must have at least two dimensions.")
    sa, sb, batch, out, a_vec, b_vec = _check(a, b, bias, transposed)
    name = backends.resolve(backend)
    if stream is None:  # (on_stream's own shortcut, without its context manager)
        return _matmul(a, b, bias, sa, sb, batch, out, a_vec, b_vec, name, stream, transposed)
    with on_stream(stream, "matmul"):
        return _matmul(a, b, bias, sa, sb, batch, out, a_vec, b_vec, name, stream, transposed)


def _matmul(a, b, bias, sa, sb, batch, out, a_vec, b_vec, name: Backend,
            stream, transposed=(False, False)) -> DoubleWord:
    if not name.has_kernels:
        a, b = (map_words(lambda w: mx.swapaxes(w, -1, -2), x) if t else x
                for x, t in zip((a, b), transposed))
        return _cpu(a, b, bias)
    # The kernel reads the operands' flat buffers through strides computed from
    # their 2-D+ shapes (``sa``, ``sb``, the bias's at the output's rank), so no
    # reshape of the operands is built: each would be one more graph node per call.
    sd = None
    if bias is not None:  # to the unsqueezed output's rank, size 1 where a / b were 1-D
        d = (1,) * (len(out) - bias.ndim) + bias.shape
        sd = d[:len(batch)] + ((d[len(batch)],) if not a_vec else (1,)) \
            + ((d[-1],) if not b_vec else (1,))
    return _kernel(a, b, bias, sa, sb, sd, batch, out, name, stream, transposed)


def _stored_hi(x: DoubleWord) -> mx.array:
    """The high word as a device buffer: complex words as the floats a kernel wrote
    (:func:`~mlx_precise.doubleword.fusion.words_of`; no float32 view of them)."""
    words = fusion.words_of(x) if x.is_complex else None
    return _device(x.hi if words is None else words[0])


def _stored_lo(x: DoubleWord) -> mx.array | None:
    """The low word as a device buffer, or None for a float32 operand (zero)."""
    if x._lo is None and x.wide is None:
        return None
    words = fusion.words_of(x) if x.is_complex else None
    return _device(x.lo if words is None else words[1])


# ---- cpu: float64 -----------------------------------------------------------------

def _cpu(a: DoubleWord, b: DoubleWord, bias: DoubleWord | None) -> DoubleWord:
    with mx.stream(mx.cpu):
        (ar, ai), (br, bi) = to64(a), to64(b)
        mm = (lambda x, y: mx.matmul(x, y, stream=mx.cpu))
        re = mm(ar, br)
        im = None
        if ai is not None and bi is not None:
            re, im = re - mm(ai, bi), mm(ar, bi) + mm(ai, br)
        elif ai is not None or bi is not None:
            im = mm(ai, br) if ai is not None else mm(ar, bi)
        if bias is not None:
            dr, di = to64(bias)
            re = re + dr
            if di is not None:
                im = di + (0.0 if im is None else im)
        return from64(re) if im is None else from64(*mx.broadcast_arrays(re, im))


# ---- metal / emulate: the tiled kernel ----------------------------------------------

def _device(x: mx.array) -> mx.array:
    """float32 words (complex64 as (re, im) pairs), padded to a device buffer. The
    kernel indexes its inputs flat and MLX hands them row-contiguous (copied only
    where ``x``'s strides require, as a reshape would), so a large enough array
    keeps its shape: no reshape node."""
    words = x.view(F32) if x.dtype == C64 else x
    if words.size >= _MIN_DEVICE_ELEMENTS:
        return words
    flat = words.reshape(-1)
    return mx.concatenate([flat, mx.zeros((_MIN_DEVICE_ELEMENTS - flat.size,), F32)])


def _strides(shape, parts: int, like) -> list[int]:
    """Row-major strides in floats of an array of ``shape`` (``parts`` floats per
    value), aligned to the dimensions of ``like`` from the right; 0 where the array
    has size 1 or lacks the dimension (broadcast)."""
    st, acc = [], parts
    for s in reversed(shape):
        st.append(acc if s != 1 else 0)
        acc *= s
    st.reverse()
    return [0] * (len(like) - len(shape)) + st


def _swapped(strides: list[int], swap: bool) -> list[int]:
    """The strides of the transpose of the last two axes (``swap``)."""
    return strides[:-2] + [strides[-1], strides[-2]] if swap else strides


def _kernel(a: DoubleWord, b: DoubleWord, d: DoubleWord | None, sa: tuple, sb: tuple,
            sd: tuple | None, batch: tuple, out: tuple, name: str, stream,
            transposed=(False, False)) -> DoubleWord:
    """a of shape ``sa`` = ``[..., M, K]``, b of ``sb`` = ``[..., K, N]``, d (bias) of
    ``sd`` (rank ``len(batch) + 2``) broadcasting to ``batch + [M, N]``, each given
    in any shape of the same size (their buffers are read flat); one launch of
    :data:`DW_GEMM`, the result of shape ``out`` (``batch + [M, N]`` less the
    dimensions of 1-D operands). ``transposed``: a / b stored as the transpose of
    their last two axes (``sa`` / ``sb`` are the operands' shapes, not the stored
    ones): read with swapped strides. What the launch derives from the shapes (the
    kernel, its parameter buffer, the grid) is cached: a repeated layer pays a
    lookup and MLX's launch."""
    cx = a.is_complex or b.is_complex or (d is not None and d.is_complex)
    if cx and not (a.is_complex or b.is_complex):
        # Real product, complex bias: the imaginary part is the bias's (exact).
        dr, di = d.parts()
        re = _kernel(a, b, dr, sa, sb, sd, batch, out, name, stream, transposed)
        im = map_words(lambda w: mx.broadcast_to(w, out), di)
        return combine(re, im)
    if cx and d is not None and not d.is_complex:
        d = map_words(lambda w: w.astype(C64), d)  # exact: zero imaginary part
    # (with a bias, the kernel of every word apart)
    za, zb = (None, None) if d is not None else (_packed(a), _packed(b))
    key = (sa, sb, sd, batch, out, transposed, a.is_complex, b.is_complex, cx,
           _lows(a, za), _lows(b, zb), None if d is None else _stores_lo(d))
    plan = _planned(key, _gemm_plan, key)
    if plan is None:  # an empty result
        z = mx.zeros(out, C64 if cx else F32)
        return DoubleWord(z, mx.zeros_like(z))
    return _result(_run(plan, a, b, d, name, stream, za, zb), cx, out)


def _result(words: tuple, cx: bool, out: tuple) -> DoubleWord:
    """The DoubleWord of shape ``out`` of a launch's output words (:func:`_run`):
    complex ones the (re, im) pairs seen as complex64 in place, recorded as the
    floats a kernel wrote (a kernel reads them as such, no float32 view)."""
    ch, cl = (w.view(C64) for w in words) if cx else words
    if ch.shape != out:  # (a 0-d output only)
        ch, cl = ch.reshape(out), cl.reshape(out)
    if cx:
        fusion.note_parts(ch, cl, words)
    return DoubleWord.of_words(ch, cl)


def strided_matmul(a: DoubleWord, b: DoubleWord, *, batch: tuple, m: tuple, n: tuple,
                   k: tuple, shape: tuple, backend: Backend, stream=None) -> DoubleWord:
    """A batched product ``C = A B`` whose operands and result are read and written
    in place through strides (an einsum's contraction without a transpose or a
    reshape of any operand or of the result): one launch of :data:`DW_GEMM`, each
    output the sum over k in k's order, as :func:`matmul` computes it.

    Args:
        a, b: DoubleWords, real or complex, read flat in their row-major order
            (complex as (re, im) pairs).
        batch: ``((size, sa, sb, sc), ...)``, the batch dimensions outermost first:
            the strides in elements of a, b and C along each (0: broadcast).
        m, n: ``(size, s_operand, sc)``: the rows of A (stride in a) and the
            columns of B (stride in b), and C's strides along them.
        k: ``(size, sa, sb)``: the contracted dimension (size 1, strides 0: none).
        shape: C's shape (row-major; the strides place each element once).
        backend: a kernel backend (:class:`~mlx_precise.core.backends.Backend`).

    Returns:
        The DoubleWord of ``shape``, complex where a or b is.
    """
    cx = a.is_complex or b.is_complex
    za, zb = _packed(a), _packed(b)
    key = ("strided", batch, m, n, k, shape, a.is_complex, b.is_complex, _lows(a, za),
           _lows(b, zb))
    plan = _planned(key, _strided_plan, key[1:])
    if plan is None:  # an empty result
        z = mx.zeros(shape, C64 if cx else F32)
        return DoubleWord(z, mx.zeros_like(z))
    return _result(_run(plan, a, b, None, backends.resolve(backend), stream, za, zb), cx,
                   shape)


def _strided_plan(batch, m, n, k, shape, a_cx, b_cx, a_lo, b_lo) -> tuple | None:
    """The launch of :func:`strided_matmul` for its key (:func:`_plan`): strides in
    floats (complex: pairs), a mixed real x complex product one more batch
    dimension (the parts, as :func:`_gemm_plan`); None for an empty result."""
    pa, pb, pc = (2 if x else 1 for x in (a_cx, b_cx, a_cx or b_cx))
    dims = [dict(size=s, sa=x * pa, sb=y * pb, sc=z * pc, sd=0, sj=0) for s, x, y, z in batch]
    if (a_cx or b_cx) and not (a_cx and b_cx):
        dims.append(dict(size=2, sa=int(a_cx), sb=int(b_cx), sc=1, sd=0, sj=0))
    if math.prod(x["size"] for x in dims) * m[0] * n[0] == 0:
        return None
    fields = dict(m=m[0], n=n[0], k=k[0], sam=m[1] * pa, sak=k[1] * pa, sbk=k[2] * pb,
                  sbn=n[1] * pb, scm=m[2] * pc, scn=n[2] * pc, sdm=0, sdn=0)
    shape_w = shape[:-1] + (shape[-1] * pc,) if shape else (pc,)
    return _plan(dims, fields, shape_w, {"CPLX": int(a_cx and b_cx), "WIN": 0},
                 (a_lo, b_lo, None))


def _packed(x: DoubleWord) -> mx.array | None:
    """The packed words of ``x`` (:func:`~mlx_precise.doubleword.fusion.packed`):
    real x's, complex x's where its words are a kernel's floats (the (re, im) pairs
    in x's row-major order, :func:`~mlx_precise.doubleword.fusion.words_of`), or
    None."""
    if x._lo is None:
        return None
    return fusion.packed_words(x) if x.is_complex else fusion.packed(x.hi, x._lo)


def _lows(x: DoubleWord, z: mx.array | None):
    """How the kernel reads x's low word: False (none: it reads 0), True (an input of
    its own), or the plane of x's packed words ``z`` (its offset from the high
    word, in floats)."""
    return z.size // 2 if z is not None else _stores_lo(x)


_PLANS: dict = {}  # the launchers' keys -> their plans (the oldest entry first out)
_PLAN_CACHE = 1024


def _planned(key: tuple, build, args: tuple):
    """The plan of ``key`` (:data:`_PLANS`), made by ``build(*args)`` on a miss."""
    plan = _PLANS.get(key, _PLANS)
    if plan is _PLANS:
        plan = _PLANS[key] = build(*args)
        if len(_PLANS) > _PLAN_CACHE:
            _PLANS.pop(next(iter(_PLANS)), None)
    return plan


def _stores_lo(x: DoubleWord) -> bool:
    """x has a low word (a float32 operand stores none: the kernel reads 0)."""
    return x._lo is not None or x.wide is not None


def _gemm_plan(sa, sb, sd, batch, out, transposed, a_cx, b_cx, cx, a_lo, b_lo, d_lo):
    """The launch of :func:`_kernel` for its key (:func:`_plan`), or None for an
    empty result."""
    both = a_cx and b_cx
    pa, pb, pc = (2 if x else 1 for x in (a_cx, b_cx, cx))
    M, K, N = sa[-2], sa[-1], sb[-1]
    lead = list(batch) + [M, N]
    sc = _strides(lead, pc, lead)
    sd = _strides(sd, pc, lead) if d_lo is not None else [0] * len(lead)
    sa = _swapped(_strides(_logical(sa, transposed[0]), pa, lead), transposed[0])
    sb = _swapped(_strides(_logical(sb, transposed[1]), pb, lead), transposed[1])
    dims = [dict(size=s, sa=sa[i], sb=sb[i], sc=sc[i], sd=sd[i], sj=0)
            for i, s in enumerate(batch)]
    if cx and not both:
        # Mixed real x complex: each part of the complex operand is a real product,
        # one more batch dimension (size 2, stride 1 in the complex arrays).
        dims.append(dict(size=2, sa=int(a_cx), sb=int(b_cx), sc=1, sd=int(d_lo is not None),
                         sj=0))
    if math.prod(x["size"] for x in dims) * M * N == 0:
        return None
    # the output's float32 words in its own shape (complex: (re, im) pairs along the
    # last axis), so that the result needs no reshape
    shape_w = out[:-1] + (out[-1] * pc,) if out else (pc,)
    return _plan(dims, dict(m=M, n=N, k=K, sam=sa[-2], sak=sa[-1], sbk=sb[-2], sbn=sb[-1],
                            scm=sc[-2], scn=sc[-1], sdm=sd[-2], sdn=sd[-1]),
                 shape_w, {"CPLX": int(both), "WIN": 0}, (a_lo, b_lo, d_lo))


_NO_WINDOW = dict(kc=0, sbt=0, win_s=0, win_d=0, win_lo=0, win_len=0, out_s=0, out_lo=0,
                  out_len=0)


def _plan(dims: list[dict], fields: dict, shape: tuple, template: dict, lows: tuple) -> tuple:
    """What a launch of :data:`DW_GEMM` derives from its shapes: ``dims`` its batch
    records (:data:`DW_GEMM_DIM` fields by name), ``fields`` the sizes and strides of
    :data:`DW_GEMM_PARAMS` (the window's too when ``template["WIN"]``), ``shape``
    that of each output word; ``template`` ``{"CPLX": .., "WIN": ..}`` in that
    order; ``lows``: how a, b and the bias (None: no bias) store low words
    (:func:`_lows`; the bias's apart or not at all). Returns ``(kernel, parameters,
    grid, threadgroup, shape, template)`` (:func:`_run`)."""
    a_lo, b_lo, d_lo = lows
    # float32 operands (and no bias) store no zero words: the kernel reads 0 there;
    # packed words are one input (their low words a plane past the high ones)
    apart = tuple(lo is True for lo in (a_lo, b_lo))
    kernel = _UNBIASED[apart] if d_lo is None else DW_GEMM
    planes = {f"{w}_at": 0 if lo is True else int(lo) for w, lo in (("al", a_lo),
                                                                    ("bl", b_lo))}
    p = DW_GEMM_PARAMS.pack(
        [x[f] for x in dims for f in DW_GEMM_DIM.names],  # the records, by name
        **{**_NO_WINDOW, **fields}, has_bias=d_lo is not None, a_lo=bool(a_lo),
        b_lo=bool(b_lo), d_lo=bool(d_lo), batch_dims=len(dims), cl_at=math.prod(shape),
        **planes)
    grid, tg = gemm_grid(fields["m"], fields["n"], math.prod(x["size"] for x in dims))
    return kernel, p, grid, tg, shape, list(template.items())


def _run(plan: tuple, a: DoubleWord, b: DoubleWord, d: DoubleWord | None, name,
         stream, za: mx.array | None = None, zb: mx.array | None = None) -> list[mx.array]:
    """One launch of :data:`DW_GEMM` (:func:`_plan`) on the words of a, b and the
    bias d (or None), on the resolved kernel backend ``name``; ``za``, ``zb``: the
    packed words of a, b (:func:`_packed`) where the plan reads them so. Returns
    (ch, cl), the halves of the packed output (recorded as such)."""
    kernel, p, grid, tg, shape, template = plan
    if d is None:  # a kernel without the absent words' inputs
        words = [za] if za is not None else [_stored_hi(a), _stored_lo(a)]
        words += [zb] if zb is not None else [_stored_hi(b), _stored_lo(b)]
        words = [w for w in words if w is not None]
    else:
        words = [_stored_hi(a), _stored_lo(a), _stored_hi(b), _stored_lo(b),
                 _stored_hi(d), _stored_lo(d)]
        words = [words[0] if w is None else w for w in words]  # never read
    # (the declared inputs by construction: float32 words padded to device buffers,
    # p int64 of more than 8 values: no per-call checks)
    (c,) = kernel.unchecked(inputs=words + [p], template=template, grid=grid, threadgroup=tg,
                            output_shapes=[fusion.packed_shape(shape)], output_dtypes=[F32],
                            backend=name, stream=stream)
    return fusion.unpacked(c, shape)


def window_matmul(signal: DoubleWord, b: DoubleWord, *, taps: int, channels: int,
                  rows: int, cols: int, window: tuple[int, int, int, int],
                  a_strides: tuple[int, int], b_strides: tuple[int, int, int],
                  c_strides: tuple[int, int], dims: list[dict], shape: tuple,
                  crop: tuple[int, int, int] | None = None, backend: Backend,
                  stream=None) -> DoubleWord:
    """A 1-D convolution's product ``C = A B`` with A the window of ``signal``
    (im2col read in place: no padded or gathered copy), one launch of
    :data:`DW_GEMM` (``WIN`` = 1): per output the sum of :func:`matmul` of the
    gathered columns, bit for bit (the same k order; positions outside the signal
    read as the zeros of its padding).

    Args:
        signal: real DoubleWord, read flat through the strides below.
        b: real DoubleWord (the weights), read flat through ``b_strides``.
        taps, channels: T and kc: the depth is K = T kc, k = t kc + c.
        rows, cols: M and N of each batch's product.
        window: ``(s, d, lo, length)``: row m, tap t reads the signal at position
            ``m s + t d - lo``, zero outside ``[0, length)``.
        a_strides: ``(sam, sak)``: floats per position and per channel of the signal.
        b_strides: ``(sbt, sbk, sbn)``: B(t kc + c, n) at ``t sbt + c sbk + n sbn``.
        c_strides: ``(scm, scn)``: C(m, n) at ``j scm + n scn``, j the output
            position of row m (``m``, or as ``crop`` says).
        dims: batch records ``dict(size, sa, sb, sc)`` (:data:`DW_GEMM_DIM`, offsets
            in floats), outermost first, with ``sj`` (the step of the output position
            along the dimension; 0 if not given).
        shape: the shape of each output word (float32, row-major); the records and
            ``c_strides`` place every output in it exactly once.
        crop: ``(out_s, out_lo, out_len)``: row m of a batch index with position
            steps ``oj`` is the output position ``j = m out_s + oj - out_lo``, and
            is written only for j in ``[0, out_len)``; None: ``j = m``.
        backend: a kernel backend (:class:`~mlx_precise.core.backends.Backend`).

    Returns:
        The DoubleWord of ``shape``.
    """
    if math.prod(x["size"] for x in dims) * rows * cols == 0:
        z = mx.zeros(shape, F32)
        return DoubleWord(z, z)
    za, zb = _packed(signal), _packed(b)
    key = (taps, channels, rows, cols, tuple(window), tuple(a_strides), tuple(b_strides),
           tuple(c_strides), tuple(tuple(x.items()) for x in dims), tuple(shape),
           None if crop is None else tuple(crop), _lows(signal, za), _lows(b, zb))
    plan = _planned(key, _window_plan, key)
    return DoubleWord(*_run(plan, signal, b, None, backends.resolve(backend), stream, za, zb))


def _window_plan(taps, channels, rows, cols, window, a_strides, b_strides, c_strides, dims,
                 shape, crop, a_lo, b_lo) -> tuple:
    """The launch of :func:`window_matmul` for its key (:func:`_plan`)."""
    s, d, lo, length = window
    fields = dict(m=rows, n=cols, k=taps * channels, sam=a_strides[0], sak=a_strides[1],
                  sbk=b_strides[1], sbn=b_strides[2], scm=c_strides[0], scn=c_strides[1],
                  sdm=0, sdn=0, kc=channels, sbt=b_strides[0], win_s=s, win_d=d, win_lo=lo,
                  win_len=length)
    fields.update(zip(("out_s", "out_lo", "out_len"), crop or (1, 0, rows)))
    dims = [dict(sd=0, sj=0) | dict(x) for x in dims]
    return _plan(dims, fields, shape, {"CPLX": 0, "WIN": 1}, (a_lo, b_lo, None))
