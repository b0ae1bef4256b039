"""The ``cpu`` backend's FFTs: float64 transforms through ``scipy.fft`` with threads.

Every cpu transform is the float64 (complex128) FFT of the exact float64 value of
the input, rounded once to float32 / complex64 (or split into a DoubleWord) by the
caller. ``scipy.fft`` (pocketfft, the ``cpu`` extra) runs real transforms natively
and spreads the rows of a batch over ``workers`` threads; without scipy, numpy's
single-threaded pocketfft computes the same transforms (the same code: bit for bit
the same results, measured).

:func:`chain` (the N-D transforms of the double-word flow) writes its result into a
buffer of MLX's allocator (:func:`buffer`) through numpy 2's ``out=``: the
float64 value then enters MLX without a copy, and no fresh pages are touched
(MLX reuses its freed buffers; a new numpy array of 1 MB costs ~0.6 ms of page
faults on a shared Linux VM, measured). Only large transforms on more than two
cores take scipy's threads instead (:data:`THREADED_POINTS`).

The Hyena convolution (:func:`fftconv_rows`) streams over chunks of channels, so
its float64 temporaries are a few chunk-sized spectra instead of full-size copies
of the input, the spectra and the padded output.
"""

from __future__ import annotations

import inspect
import os

import mlx.core as mx
import numpy as np

try:
    import scipy.fft as _sfft
except ImportError:  # a Mac without the cpu extra: numpy's pocketfft, one thread
    _sfft = None

WORKERS = -1  # scipy.fft: one thread per CPU core
THREADED_POINTS = 1 << 20
"""Points (rows times length) of a step of :func:`chain` from which scipy's threads
run it, where there are more than two cores (on two shared cores, measured, they
did not pay even at 2^22 points)."""
_CORES = os.cpu_count() or 1  # (15 us a call)
_NUMPY_OUT = "out" in inspect.signature(np.fft.rfft).parameters  # numpy >= 2
_CHUNK_BYTES = 8 << 20  # float64 bytes of one chunk of padded rows (cache-sized)


def transform(kind: str, x: np.ndarray, n: int, axis: int, overwrite: bool = False):
    """``<kind>(x, n, axis)`` for kind in fft, ifft, rfft, irfft, numpy's
    conventions (norm "backward"), in x's float64 / complex128 precision.
    ``overwrite``: x is a temporary the transform may reuse. Non-finite inputs
    propagate quietly (as in the kernels)."""
    if _sfft is None:
        with np.errstate(invalid="ignore", over="ignore"):
            return getattr(np.fft, kind)(x, n=n, axis=axis)
    return getattr(_sfft, kind)(x, n=n, axis=axis, overwrite_x=overwrite, workers=WORKERS)


def _chunk_rows(n_fft: int) -> int:
    """Rows per chunk: about _CHUNK_BYTES of float64, at least 2 (two threads)."""
    return max(2, _CHUNK_BYTES // (8 * n_fft))


def fftconv_rows(a: np.ndarray, h: np.ndarray, n_fft: int, length: int, *,
                 conj: bool = False):
    """Circular convolutions (or correlations) of length ``n_fft`` by real FFTs,
    chunk by chunk of channels.

    Args:
        a: float32 or float64 (B, C, La), La <= n_fft.
        h: float32 or float64 (C, Lh) (one filter per channel) or (B, C, Lh).
        n_fft: FFT length N.
        length: outputs kept per row (<= N).
        conj: correlate (multiply by conj(H)) instead of convolve.

    Yields:
        ``(b, c0, c1, y)`` with y float64 (c1 - c0, length):
        ``irfft(rfft(a[b, c0:c1], N) * H, N)[:, :length]``, H = rfft(h, N) or its
        conjugate, all in float64 (the product of two float64 spectra, one
        rounding per operation: the same formula as the float64 reference).
    """
    B, C = a.shape[:2]
    step = _chunk_rows(n_fft)
    per_batch = h.ndim == 3
    for c0 in range(0, C, step):
        c1 = min(C, c0 + step)
        H = None
        if not per_batch:  # one filter spectrum per chunk, shared by the batch
            H = transform("rfft", h[c0:c1].astype(np.float64), n_fft, -1, overwrite=True)
            if conj:
                np.conjugate(H, out=H)
        for b in range(B):
            if per_batch:
                H = transform("rfft", h[b, c0:c1].astype(np.float64), n_fft, -1, overwrite=True)
                if conj:
                    np.conjugate(H, out=H)
            X = transform("rfft", a[b, c0:c1].astype(np.float64), n_fft, -1, overwrite=True)
            X *= H
            yield b, c0, c1, transform("irfft", X, n_fft, -1, overwrite=True)[:, :length]


def buffer(shape, complex_: bool) -> tuple[mx.array, np.ndarray]:
    """(a new MLX float64 array, a writable numpy view of it): ``shape``, or
    ``shape + (2,)`` seen as complex128 of ``shape`` (interleaved parts). MLX's
    arrays are immutable once shared: the view is written before the array is
    handed on, and never after."""
    with mx.stream(mx.cpu):
        a = mx.zeros(tuple(shape) + ((2,) if complex_ else ()), mx.float64)
        mx.eval(a)
    v = np.asarray(a)
    if not (v.flags.c_contiguous and v.flags.writeable and v.size == a.size):
        # (MLX's Full primitive gives each zeros array a buffer of its own; were
        # it ever a broadcast view of one scalar, writing it would corrupt others)
        raise RuntimeError("mlx_precise.fft.cpu.buffer: MLX gave a shared buffer")
    return a, (v.view(np.complex128)[..., 0] if complex_ else v)


def _threaded(x: np.ndarray, n: int, axis: int) -> bool:
    return x.size // max(x.shape[axis], 1) * n >= THREADED_POINTS and _CORES > 2


def _out_shape(kind: str, shape, n: int, axis: int) -> tuple:
    shape = list(shape)
    shape[axis] = n // 2 + 1 if kind == "rfft" else n
    return tuple(shape)


def chain(steps, x: np.ndarray, a: mx.array | None = None) -> tuple[np.ndarray, mx.array | None]:
    """The 1-D transforms ``steps`` ((kind, n, axis), in order) of ``x`` (float64 /
    complex128, ours to overwrite where complex), one after another on the host:
    the N-D transform of :mod:`mlx_precise.fft.nd` with the same float64 steps,
    without a round trip through MLX arrays between them. ``a``: the MLX array
    (:func:`buffer`) that holds ``x``, if one does (a complex step of the same
    length then writes over it).

    Returns:
        (y, a): the result, and the MLX float64 array that holds it, or None where
        it is numpy's own (numpy < 2, or a threaded step).
    """
    for kind, n, axis in steps:
        if not (_NUMPY_OUT and x.size) or (_sfft is not None and _threaded(x, n, axis)):
            a, x = None, transform(kind, x, n, axis, overwrite=True)
            continue
        if a is not None and kind in ("fft", "ifft") and x.shape[axis] == n:
            out = x  # in place (numpy buffers what overlaps)
        else:
            a, out = buffer(_out_shape(kind, x.shape, n, axis), kind != "irfft")
        with np.errstate(invalid="ignore", over="ignore"):
            x = getattr(np.fft, kind)(x, n=n, axis=axis, out=out)
    return x, a


def scale(y: np.ndarray, c: float) -> None:
    """``y *= c`` in place, each part of a complex ``y`` times c alone (one IEEE
    product per part, as MLX float64 multiplies the parts; numpy's complex product
    would also form 0 * Inf = NaN cross terms)."""
    if np.iscomplexobj(y):
        y.real *= c
        y.imag *= c
    else:
        y *= c
