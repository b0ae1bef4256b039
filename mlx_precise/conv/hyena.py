"""The Hyena FFT long convolution in double-word, rounded once, with gradients.

Semantics of ``fftconv_ref`` in HazyResearch's safari (Poli et al., Hyena Hierarchy, 2023)::

    y   = irfft(rfft(u, N) * rfft(k, N) / N, N, norm="forward")[..., :L]
    out = y + u * D[:, None]

i.e. ``out[t] = sum_s k[s] u[t - s] + D u[t]`` (a causal linear convolution) when
``N >= L + Lk - 1``, and exactly what the FFT formula gives (wrapping around) for an
explicit smaller ``fft_size``. On the ``metal``/``emulate`` backends every stage is
double-word: both forward FFTs, the product, the inverse FFT with its 1/N, and the
skip term; one rounding at the end. On ``cpu`` the same formula runs in float64.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..core import backends
from ..doubleword import pow2scale
from ..core.arrays import as_int
from ..core.autodiff import guarded, host_guard
from ..doubleword.aware import precision_aware
from ..core.streams import on_stream, streamed
from .depthwise import check_conv_operands, check_layout, from_ncl
from ..doubleword.engine64 import from_float64_result
from ..doubleword.types import DoubleWord
from ..doubleword.elementwise import complex_multiply_extended
from ..fft import api as fft_api
from ..fft.cpu import fftconv_rows
from ..fft.nd import check_limits
from ..core.kernels import Kernel, elementwise_grid
from ..core.backends import Backend

_F32 = (mx.float32,)

SKIP = Kernel(
    name="ext_skip",
    body="ext_skip.metal",
    headers=("doubleword.h",),
    inputs=("y_hi", "y_lo", "u", "D"),
    outputs=("out_hi", "out_lo"),
    template=("HAS_D", "ROUND"),
    input_dtypes={n: _F32 for n in ("y_hi", "y_lo", "u", "D")},
    grid=lambda arrays, t: elementwise_grid(arrays[2].size),
    variants={"HAS_D": (False, True), "ROUND": (False, True), "out_hi": _F32, "out_lo": _F32},
)

SUM0 = Kernel(
    name="ext_sum0",
    body="ext_sum0.metal",
    headers=("doubleword.h",),
    inputs=("x_hi", "x_lo"),
    outputs=("out_hi", "out_lo"),
    template=("ROUND",),
    input_dtypes={"x_hi": _F32, "x_lo": _F32},
    grid=lambda arrays, t: elementwise_grid(arrays[0].shape[1]),
    variants={"ROUND": (False, True), "out_hi": _F32, "out_lo": _F32},
)

CHANNEL_DOT = Kernel(
    name="ext_channel_dot",
    body="ext_channel_dot.metal",
    headers=("doubleword.h",),
    inputs=("a", "v"),
    outputs=("out",),
    input_dtypes={"a": _F32, "v": _F32},
    grid=lambda arrays, t: ((arrays[0].shape[1] * 256, 1, 1), (256, 1, 1)),
    variants={"out": _F32},
)


def default_fft_size(L: int, Lk: int) -> int:
    """Smallest power of two >= L + Lk - 1: the FFT product is then the linear
    convolution (safari uses 2L; with Lk <= L both give the same result)."""
    return 1 << max(L + Lk - 2, 0).bit_length()


def _check(u, k, D, fft_size, layout: str, fn: str):
    """((u, k, D) as arrays, u as (batch, channels, L), N) after checking the
    operands, the layout and the FFT size."""
    u, k, D = check_conv_operands(u, k, D, check_layout(layout, fn), names=("u", "k", "D"),
                                  taps="Lk")
    N = _fft_size(u, k, fft_size)
    check_limits("rfft", u.shape, (N,), (2,))  # every backend, before allocating
    return (u, k, D), N


def _fft_size(u, k, fft_size) -> int:
    L, Lk = u.shape[2], k.shape[1]
    if L < 1 or Lk < 1:
        raise ValueError(f"u and k need at least one step, got L={L}, Lk={Lk}")
    if fft_size is None:
        return default_fft_size(L, Lk)
    n = as_int(fft_size)
    if n is None:
        raise TypeError(f"fft_size must be an int, got {fft_size!r}")
    fft_size = n
    if fft_size < L:
        raise ValueError(f"fft_size={fft_size} must be >= L={L}")
    if Lk > fft_size:
        raise ValueError(f"k has Lk={Lk} steps, more than fft_size={fft_size}")
    return int(fft_size)


def _skip(y: DoubleWord, u, D, round_output, backend):
    """RN(y + D u) (or its double-word) on a kernel backend; y (B, C, L) DoubleWord."""
    shape = tuple(u.shape)
    hi, lo = SKIP(
        inputs=[y.hi, y.lo, u, D if D is not None else mx.zeros((1,), mx.float32)],
        template={"HAS_D": D is not None, "ROUND": round_output},
        output_shapes=[shape, (1,) if round_output else shape],
        output_dtypes=[mx.float32, mx.float32], backend=backend)
    return hi if round_output else DoubleWord(hi, lo)


def _correlate(a: DoubleWord, b: DoubleWord, N: int, length: int, backend) -> DoubleWord:
    """irfft(A * conj(B), N)[..., :length] in double-word: the circular
    cross-correlation sum_t a[t] b[(t - s) mod N]; A, B double-word spectra."""
    f = fft_api
    conj = DoubleWord(mx.conj(b.hi), mx.conj(b.lo))  # exact
    p = complex_multiply_extended(a, conj, round_output=False, backend=backend)
    y = f.irfft_extended(p, n=N, round_output=False, backend=backend)
    return DoubleWord(y.hi[..., :length], y.lo[..., :length])


def _forward(u, k, D, N, round_output, backend: Backend):
    """The extended convolution on a resolved backend."""
    L = u.shape[2]
    if not backend.has_kernels:
        return _forward_cpu(u, k, D, N, round_output)
    f = fft_api
    (u_s, a), (k_s, b) = _spectrum_range(u, N), _spectrum_range(k, N)
    U = f.rfft_extended(u_s, n=N, round_output=False, backend=backend)
    K = f.rfft_extended(k_s, n=N, round_output=False, backend=backend)
    P = complex_multiply_extended(U, DoubleWord(K.hi[None], K.lo[None]), round_output=False,
                                  backend=backend)
    y = f.irfft_extended(P, n=N, round_output=False, backend=backend)  # includes 1/N
    y = _unscaled(DoubleWord(y.hi[..., :L], y.lo[..., :L]), a, b[None])
    return _skip(y, u, D, round_output, backend)


def _spectrum_range(x, N: int):
    """(x * 2^-e, e) per row of x (..., L), e >= 0 the least exponent with
    N max|row| < 2^62: a product of two such spectra stays below 2^124, so it cannot
    overflow where the convolution itself is in range (the FFTs scale their own
    intermediates, :mod:`mlx_precise.doubleword.pow2scale`)."""
    e = pow2scale.row_exponents(x, N.bit_length() + pow2scale.HEADROOM - 62)
    return pow2scale.scale(x, e), e


def _unscaled(y: DoubleWord, *exps) -> DoubleWord:
    """y * 2^(sum of exps), one exact power-of-two step per exponent."""
    hi, lo = y.hi, y.lo
    for e in exps:
        hi, lo = pow2scale.unscale(hi, lo, e)
    return DoubleWord(hi, lo)


def _backward(u, k, D, g, N, backend: Backend):
    """(du, dk, dD) for the cotangent g of the rounded output, in double-word."""
    L, Lk = u.shape[2], k.shape[1]
    if not backend.has_kernels:
        return _backward_cpu(u, k, D, g, N)
    f = fft_api
    (g_s, c_e), (u_s, a), (k_s, b) = (_spectrum_range(x, N) for x in (g, u, k))
    G = f.rfft_extended(g_s, n=N, round_output=False, backend=backend)
    U = f.rfft_extended(u_s, n=N, round_output=False, backend=backend)
    K = f.rfft_extended(k_s, n=N, round_output=False, backend=backend)
    # du[s] = sum_t g[t] k[(t - s) mod N] + D g[s]
    du = _unscaled(_correlate(G, DoubleWord(K.hi[None], K.lo[None]), N, L, backend), c_e, b[None])
    du = _skip(du, g, D, True, backend)
    # dk[j] = sum_b sum_t g[b, t] u[b, (t - j) mod N] (rows unscaled before the batch sum)
    c = _unscaled(_correlate(G, U, N, Lk, backend), c_e, a)
    B, C = u.shape[0], u.shape[1]
    dk_hi, _ = SUM0(inputs=[c.hi.reshape(B, C * Lk), c.lo.reshape(B, C * Lk)],
                    template={"ROUND": True}, output_shapes=[(C * Lk,), (1,)],
                    output_dtypes=[mx.float32, mx.float32], backend=backend)
    dD = None
    if D is not None:
        (dD,) = CHANNEL_DOT(inputs=[g, u], output_shapes=[(C,)], output_dtypes=[mx.float32],
                            backend=backend)
    return du, dk_hi.reshape(C, Lk), dD


def _skip_cpu(y: np.ndarray, v: np.ndarray, D: np.ndarray | None) -> np.ndarray:
    """y + D v in float64, in place (y float64 (c, L), v (c, L), D (c,) or None)."""
    if D is not None:
        y += D[:, None].astype(np.float64) * v
    return y


def _forward_cpu(u, k, D, N, round_output):
    """The formula in float64 (scipy.fft, chunks of channels), rounded once to
    float32 per chunk, or split into a DoubleWord."""
    u_, k_ = np.asarray(u), np.asarray(k)
    D_ = None if D is None else np.asarray(D)
    L = u_.shape[2]
    out = np.empty(u_.shape, np.float32 if round_output else np.float64)
    for b, c0, c1, y in fftconv_rows(u_, k_, N, L):
        out[b, c0:c1] = _skip_cpu(y, u_[b, c0:c1], None if D_ is None else D_[c0:c1])
    # (split lazily, keeping the float64 value for the next cpu step)
    return from_float64_result(out, round_output)


def _backward_cpu(u, k, D, g, N):
    """(du, dk, dD) in float64 (correlations by the same chunked FFTs), rounded once."""
    u_, k_, g_ = np.asarray(u), np.asarray(k), np.asarray(g)
    D_ = None if D is None else np.asarray(D)
    (_, C, L), Lk = u_.shape, k_.shape[1]
    du = np.empty(u_.shape, np.float32)
    # du[s] = sum_t g[t] k[(t - s) mod N] + D g[s]
    for b, c0, c1, y in fftconv_rows(g_, k_, N, L, conj=True):
        du[b, c0:c1] = _skip_cpu(y, g_[b, c0:c1], None if D_ is None else D_[c0:c1])
    # dk[j] = sum_b sum_t g[b, t] u[b, (t - j) mod N]
    dk = np.zeros((C, Lk))
    for b, c0, c1, y in fftconv_rows(g_, u_, N, Lk, conj=True):
        dk[c0:c1] += y
    dD = None
    if D_ is not None:
        dD = np.einsum("bcl,bcl->c", g_.astype(np.float64), u_.astype(np.float64))
    return (mx.array(du), mx.array(dk.astype(np.float32)),
            None if dD is None else mx.array(dD.astype(np.float32)))


_custom: dict = {}


def _differentiable(has_D: bool, N: int, backend: Backend):
    """The rounded extended convolution as an ``mx.custom_function`` whose VJP runs
    the same double-word kernels (one per (has_D, N, backend))."""
    key = (has_D, N, backend)
    if key in _custom:
        return _custom[key]

    @mx.custom_function
    def conv(u, k, *D):
        return _forward(u, k, D[0] if has_D else None, N, True, backend)

    @conv.vjp
    def conv_vjp(primals, cotangent, output):
        u, k, *D = primals

        def grads(u, k, g, *D):
            du, dk, dD = _backward(u, k, D[0] if has_D else None, g, N, backend)
            return (du, dk, dD) if has_D else (du, dk)

        # The VJP is not itself differentiable: a second derivative raises
        # instead of coming back as zeros through the host computation.
        return guarded(grads, [u, k, cotangent, *D], "the gradient of hyena_conv_extended",
                       "second derivatives are not implemented")

    _custom[key] = conv
    return conv


@host_guard
@streamed
def hyena_conv_extended(u, k, D=None, *, fft_size: int | None = None, layout: str = "NCL",
                        round_output: bool = True, backend: str | None = None, stream=None):
    """Hyena long convolution in double-word, rounded once.

    Args:
        u: float32 (batch, channels, L), or (batch, L, channels) with
            ``layout="NLC"``.
        k: float32 (channels, Lk), Lk <= fft_size.
        D: float32 (channels,) skip weights, or None.
        fft_size: FFT length N >= L (default: the smallest power of two >= L + Lk - 1,
            which makes the result the exact linear convolution).
        layout: ``"NCL"`` (default) or ``"NLC"`` (MLX's channels-last): the layout
            of ``u`` and of the result; the same numbers either way.
        round_output: float32 result if True (differentiable: gradients with
            respect to u, k and D use the same double-word kernels), else a
            DoubleWord (not differentiable).
        backend: ``"metal"``, ``"emulate"``, ``"cpu"`` or None (active backend).
        stream: MLX stream or device (``mx.Stream``, ``mx.Device``) of the ops and
            kernel launches; None: the default stream.

    Returns:
        float32 (batch, channels, L) (or ``u``'s NLC layout):
        ``out[t] = sum_s k[s] u[t-s] + D u[t]`` (with wrap-around when
        fft_size < L + Lk - 1), or a DoubleWord.

    Raises:
        TypeError: non-float32 inputs, a non-int fft_size, a ``stream`` that is not
        a stream or device. ValueError: wrong ranks, channel mismatch,
        fft_size < L, Lk > fft_size, unsupported FFT size, unknown ``layout``.
    """
    (u, k, D), N = _check(u, k, D, fft_size, layout, "hyena_conv_extended")
    name = backends.resolve(backend)
    if not round_output:
        return from_ncl(_forward(u, k, D, N, False, name), layout)
    args = (u, k) if D is None else (u, k, D)
    return from_ncl(_differentiable(D is not None, N, name)(*args), layout)


def _fftconv_float32(u, k, D, fft_size, layout: str):
    """Plain float32 MLX: the safari formula with ``mx.fft``."""
    (u, k, D), N = _check(u, k, D, fft_size, layout, "fftconv")
    L = u.shape[2]
    k_f = mx.fft.rfft(k, n=N) / N
    u_f = mx.fft.rfft(u, n=N)
    y = mx.fft.irfft(u_f * k_f[None], n=N)[..., :L] * N  # numpy-style irfft divides by N
    return from_ncl(y + u * D[None, :, None] if D is not None else y, layout)


@precision_aware(hyena_conv_extended, words=False)
def fftconv(u, k, D=None, *, fft_size: int | None = None, layout: str = "NCL", stream=None):
    """Hyena FFT convolution: double-word inside
    :func:`~mlx_precise.extended_precision` (:func:`hyena_conv_extended`), plain
    float32 ``mx.fft`` outside (the safari formula, on ``stream``); ``layout`` as
    there."""
    with on_stream(stream, "fftconv"):
        return _fftconv_float32(u, k, D, fft_size, layout)
