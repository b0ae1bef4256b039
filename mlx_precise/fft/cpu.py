"""The ``cpu`` backend's FFTs: float64 transforms through ``scipy.fft`` with threads.

Every cpu transform is the float64 (complex128) FFT of the exact float64 value of
the input, rounded once to float32 / complex64 (or split into a DoubleWord) by the
caller. ``scipy.fft`` (pocketfft, the ``cpu`` extra) runs real transforms natively
and spreads the rows of a batch over ``workers`` threads; without scipy, numpy's
single-threaded pocketfft computes the same transforms.

The Hyena convolution (:func:`fftconv_rows`) streams over chunks of channels, so
its float64 temporaries are a few chunk-sized spectra instead of full-size copies
of the input, the spectra and the padded output.
"""

from __future__ import annotations

import numpy as np

try:
    import scipy.fft as _sfft
except ImportError:  # a Mac without the cpu extra: numpy's pocketfft, one thread
    _sfft = None

WORKERS = -1  # scipy.fft: one thread per CPU core
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


def chain(steps, x: np.ndarray) -> np.ndarray:
    """The 1-D transforms ``steps`` ((kind, n, axis), in order) of our own float64 /
    complex128 ``x``, one after another on the host: the N-D transform of
    :mod:`mlx_precise.fft.nd` with the same float64 steps, without a round trip
    through MLX arrays between them."""
    for kind, n, axis in steps:
        x = transform(kind, x, n, axis, overwrite=True)
    return x


def scale(y: np.ndarray, c: float) -> None:
    """``y *= c`` in place, each part of a complex ``y`` times c alone (one IEEE
    product per part, as MLX float64 multiplies the parts; numpy's complex product
    would also form 0 * Inf = NaN cross terms)."""
    if np.iscomplexobj(y):
        y.real *= c
        y.imag *= c
    else:
        y *= c
