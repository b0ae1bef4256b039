"""The public transforms of :mod:`mlx_precise.fft`: the double-word
``fft_extended``, ``ifft_extended``, ``rfft_extended``, ``irfft_extended`` and their
precision-aware twins ``fft``, ``ifft``, ``rfft``, ``irfft``.

A thin layer (argument binding, docstrings) over the autodiff / N-D layer
(:mod:`.nd`), which runs the 1-D engine (:mod:`.engine`: Stockham, Bluestein, real
packing; the cpu engine in :mod:`.cpu`).
"""

from __future__ import annotations

import mlx.core as mx

from ..core.autodiff import host_guard
from ..doubleword.aware import precision_aware
from ..doubleword.words import DoubleWord
from . import nd
from .engine import _as_input


@host_guard
def fft_extended(x, n=None, axis=-1, norm="backward", *, round_output=True, backend=None,
                 stream=None):
    """Discrete Fourier transform along ``axis`` in double-word, rounded once.

    ``X_k = sum_j x_j exp(-2 pi i jk / n)``, numpy's ``fft`` conventions.

    Args:
        x: float32 or complex64 ``mx.array``, or a DoubleWord (float32 or complex64
            words), any shape with at least one dimension. float64 / complex128
            data (numpy or ``mx.float64``) enters at full precision, split into a
            DoubleWord (:func:`mlx_precise.core.arrays.as_array`); array-likes follow
            ``mx.array``'s rules.
        n: transform length (default ``x.shape[axis]``): the input is truncated or
            zero-padded to n along ``axis``. Any n >= 1 (powers of two directly,
            others through Bluestein).
        axis: the transformed axis (negative counts from the end).
        norm: ``"backward"`` (no factor forward, 1/n inverse; the default),
            ``"ortho"`` (1/sqrt(n) both ways) or ``"forward"`` (1/n forward, none
            inverse), as ``mx.fft`` / ``numpy.fft``; the factor is one double-word
            product from the exact rational, inside the single rounding.
        round_output: return complex64 rounded once if True, else a complex
            DoubleWord.
        backend: ``"metal"``, ``"emulate"``, ``"cpu"`` or None (the active one).
        stream: MLX stream for the kernels.

    Returns:
        complex64 ``mx.array`` (or complex DoubleWord) of x's shape with
        ``shape[axis] = n``. Normwise relative error of the unrounded result
        (against the exact DFT of the exact input) 2e-15 ... 8e-15 measured, below
        the 1e-13 the tests assert (docs/fft.md). Full accuracy for magnitudes
        from about 2^-78 to 2^127 (float32 subnormals flush to zero).

    Raises:
        TypeError: x is not float32 / complex64 / float64 / complex128 /
            DoubleWord, or axis is not an int.
        ValueError: n < 1 or not an integer, axis out of range, 0-d x, unknown
            norm, or more than 2^30 points in one transform (Bluestein's padded
            length included), checked on every backend before anything is
            allocated (:func:`mlx_precise.fft.nd.check_limits`).

    Differentiable when ``x`` is an ``mx.array`` and ``round_output=True``: the
    VJP runs the same double-word FFT (:mod:`mlx_precise.fft.nd`); with a
    DoubleWord input or output ``mx.grad`` raises
    :class:`~mlx_precise.core.autodiff.NotDifferentiableError`.
    """
    return nd.one_axis("fft", x, n, axis, norm, round_output, backend, stream)


@host_guard
def ifft_extended(x, n=None, axis=-1, norm="backward", *, round_output=True, backend=None,
                  stream=None):
    """Inverse DFT ``x_j = (1/n) sum_k X_k exp(2 pi i jk / n)`` in double-word,
    rounded once; arguments, shapes, dtypes and errors as :func:`fft_extended`.
    The 1/n scaling is exact for powers of two and a double-word product
    otherwise."""
    return nd.one_axis("ifft", x, n, axis, norm, round_output, backend, stream)


@host_guard
def rfft_extended(x, n=None, axis=-1, norm="backward", *, round_output=True, backend=None,
                  stream=None):
    """DFT of real data, the ``n//2 + 1`` non-negative frequencies, in double-word.

    Args:
        x: float32 ``mx.array`` or a float32 DoubleWord (float64 data: split, as
            :func:`fft_extended`), at least one dimension.
        n, axis, norm, round_output, backend, stream: as :func:`fft_extended`.

    Returns:
        complex64 ``mx.array`` (or complex DoubleWord) of x's shape with
        ``shape[axis] = n//2 + 1``.

    Raises:
        TypeError: x is complex or not float32 / DoubleWord; axis not an int.
        ValueError: as :func:`fft_extended`.

    Differentiable as :func:`fft_extended`.
    """
    return nd.one_axis("rfft", x, n, axis, norm, round_output, backend, stream)


@host_guard
def irfft_extended(X, n=None, axis=-1, norm="backward", *, round_output=True, backend=None,
                   stream=None):
    """Inverse of :func:`rfft_extended`: real ``x`` of length n whose spectrum is
    the Hermitian extension of ``X``, in double-word, rounded once.

    Args:
        X: complex64 or float32 ``mx.array``, or a DoubleWord, at least one
            dimension: the non-negative frequencies along ``axis``.
        n: output length (default ``2 * (X.shape[axis] - 1)``); the first
            ``n//2 + 1`` points of X are used (zero-padded if fewer); the
            imaginary parts of ``X[0]`` and (n even) ``X[n/2]`` are ignored.
        axis, norm, round_output, backend, stream: as :func:`fft_extended`.

    Returns:
        float32 ``mx.array`` (or float32 DoubleWord) of X's shape with
        ``shape[axis] = n``, scaled by 1/n (norm "backward").

    Raises:
        TypeError, ValueError: as :func:`fft_extended`; also when the default n
            would be < 1 (X of length 1 needs an explicit n).

    Differentiable as :func:`fft_extended`.
    """
    return nd.one_axis("irfft", X, n, axis, norm, round_output, backend, stream)


def _plain(x, name: str):
    """The plain twins' input: as the extended one reads it (array-likes, float64
    data split at full precision, DoubleWords), then rounded once to float32 /
    complex64, the precision the plain path computes in."""
    x = _as_input(x, name)
    return x.round() if isinstance(x, DoubleWord) else x


# ---- precision-aware entry points ------------------------------------------------


@precision_aware(fft_extended)
def fft(x, n=None, axis=-1, norm="backward", *, stream=None):
    """DFT along ``axis``: double-word inside :func:`~mlx_precise.extended_precision`
    (see :func:`fft_extended`), plain ``mx.fft.fft`` outside, every argument as MLX
    takes it (float64 or DoubleWord input is rounded once to complex64 / float32
    first)."""
    return mx.fft.fft(_plain(x, "x"), n, axis, norm=norm, stream=stream)


@precision_aware(ifft_extended)
def ifft(x, n=None, axis=-1, norm="backward", *, stream=None):
    """Inverse DFT: double-word inside :func:`~mlx_precise.extended_precision` (see
    :func:`ifft_extended`), plain ``mx.fft.ifft`` outside (arguments as :func:`fft`)."""
    return mx.fft.ifft(_plain(x, "x"), n, axis, norm=norm, stream=stream)


@precision_aware(rfft_extended)
def rfft(x, n=None, axis=-1, norm="backward", *, stream=None):
    """Real-input DFT: double-word inside :func:`~mlx_precise.extended_precision`
    (see :func:`rfft_extended`), plain ``mx.fft.rfft`` outside (arguments as
    :func:`fft`)."""
    return mx.fft.rfft(_plain(x, "x"), n, axis, norm=norm, stream=stream)


@precision_aware(irfft_extended)
def irfft(X, n=None, axis=-1, norm="backward", *, stream=None):
    """Inverse real DFT: double-word inside :func:`~mlx_precise.extended_precision`
    (see :func:`irfft_extended`), plain ``mx.fft.irfft`` outside (arguments as
    :func:`fft`)."""
    return mx.fft.irfft(_plain(X, "X"), n, axis, norm=norm, stream=stream)
