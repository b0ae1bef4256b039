"""The public transforms of :mod:`mlx_precise.fft`: MLX's whole ``mx.fft`` surface.

``fft``, ``ifft``, ``rfft``, ``irfft`` (one axis: ``n``, ``axis``), ``fft2``,
``ifft2``, ``rfft2``, ``irfft2`` (``s``, ``axes=(-2, -1)``) and ``fftn``, ``ifftn``,
``rfftn``, ``irfftn`` (``s``, ``axes=None``), each with MLX's argument names and
defaults plus ``norm`` and a keyword ``stream``; the precision-aware function
(double-word inside :func:`~mlx_precise.extended_precision`, MLX's own outside) and
its double-word twin ``*_extended`` (with ``round_output`` and ``backend``).
``fftshift`` and ``ifftshift`` move values without arithmetic (a ``DoubleWord``
keeps both words).

A thin layer, as ``numpy.fft`` over pocketfft: every function is one of four kinds
(:data:`mlx_precise.fft.nd.KINDS`) in one of three argument forms (:data:`FORMS`),
made by :func:`_pair`; :func:`plan` turns any form's arguments into numpy's
``(s, axes)`` (the one rule, shared by both twins, so the errors are the same in
and out of the block), and :func:`mlx_precise.fft.nd.transform` runs it.
"""

from __future__ import annotations

import functools
import operator
import warnings

import mlx.core as mx
import numpy as np

from ..core.autodiff import host_guard
from ..core.plain import plain as _mlx
from ..doubleword import aware as _aware
from ..doubleword.aware import precision_aware
from ..doubleword.types import DoubleWord, is_word_array, plain_input, read_input
from . import nd
from .engine import ANY, REAL, _check_n

# Argument forms, by name suffix: the default ``axes`` of each (one-axis functions
# take ``n`` and ``axis`` instead).
FORMS = {"": None, "2": (-2, -1), "n": None}
AxisError = np.exceptions.AxisError  # a ValueError and an IndexError, as numpy's


def _ints(v, name: str) -> tuple[int, ...]:
    """A sequence of ints (``s`` or ``axes``) as a tuple; TypeError naming it."""
    if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
        raise TypeError(f"{name} must be a sequence of ints, got {type(v).__name__}")
    out = []
    for i, e in enumerate(v):
        try:
            if isinstance(e, (bool, np.bool_)):
                raise TypeError
            out.append(operator.index(e))
        except TypeError:
            raise TypeError(f"{name}[{i}] must be an int, got {type(e).__name__}") from None
    return tuple(out)


def plan(kind: str, shape, s, axes, one_axis: bool = False):
    """numpy's ``(s, axes)`` of a call: sizes and distinct non-negative axes.

    ``axes`` None means the last ``len(s)`` axes, or every axis when ``s`` is None
    too (numpy's rule; MLX 0.32 refuses ``s`` without ``axes`` for the ``*n``
    functions). ``s`` None means the input's sizes, except that irfft's last
    output length is ``2 * (m - 1)``, m the input's length on the last axis.
    With ``one_axis``, ``s`` and ``axes`` are the one-element ``(n,)`` and
    ``(axis,)`` and the messages name ``n`` and ``axis``.

    Raises:
        TypeError: s or axes not a sequence of ints.
        ValueError: a size < 1 (also irfft's default), s and axes of different
            lengths, a repeated or no axis, more sizes than dimensions.
        numpy.exceptions.AxisError (a ValueError and an IndexError): an axis out
            of range, or a 0-d input.
    """
    ndim = len(shape)
    s_name, ax_name = ("n", "axis") if one_axis else ("s", "axes")
    if ndim == 0:
        raise AxisError("a must have at least one dimension, got a 0-d array")
    s = None if s is None else _ints(s, s_name)
    if axes is None:
        if s is not None and len(s) > ndim:
            raise ValueError(f"s has {len(s)} sizes but a has only {ndim} dimension(s)")
        axes = range(ndim - (ndim if s is None else len(s)), ndim)
    axes = _ints(axes, ax_name)
    if not axes:
        raise ValueError(f"{ax_name} must name at least one axis, got an empty sequence")
    for i, ax in enumerate(axes):
        if not -ndim <= ax < ndim:
            what = ax_name if one_axis else f"{ax_name}[{i}] ="
            raise AxisError(f"{what} {ax} is out of range for a with {ndim} dimension(s)")
    axes = tuple(ax % ndim for ax in axes)
    if len(set(axes)) != len(axes):
        raise ValueError(f"axes must be distinct, got {axes} (normalised)")
    if s is None:
        s = [shape[ax] for ax in axes]
        if kind == "irfft":
            s[-1] = 2 * (s[-1] - 1)
            if s[-1] < 1:
                last = s_name if one_axis else "s[-1]"
                raise ValueError(f"{last} must be >= 1: the default {last} = {s[-1]} "
                                 f"(2 * (m - 1) for a length m = {shape[axes[-1]]}) is "
                                 f"invalid for this input; pass {s_name} explicitly")
        return tuple(s), axes
    if len(s) != len(axes):
        raise ValueError(f"s and axes must have the same length, got {len(s)} and {len(axes)}")
    for i, n in enumerate(s):
        if n < 1:
            raise ValueError(f"s[{i}] must be >= 1 (a transform length), got {n}")
    return s, axes


def _one_axis_args(n, axis):
    """The one-axis form ``(n, axis)`` as ``(s, axes)`` (n checked as before:
    ValueError for anything but an integer >= 1)."""
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis must be an int, got {type(axis).__name__}")
    return (None if n is None else (_check_n(n, 1),)), (axis,)


def _extended(kind, a, s, axes, one_axis, norm, round_output, backend, stream):
    a = read_input(a, "a", "words", REAL if kind == "rfft" else ANY)
    s, axes = plan(kind, a.shape, s, axes, one_axis)
    return nd.transform(kind, a, s, axes, norm, round_output=round_output, backend=backend,
                        stream=stream)


def _plain(kind, a, s, axes, one_axis, norm, stream, fft=_mlx.fft):
    """MLX's transform of the input read as the extended twin reads it (array-likes,
    float64 data, DoubleWords), rounded once to float32 / complex64 first. ``fft``:
    the module whose transform runs (MLX's own; the flow twin passes ``mx.fft``,
    whose names are the flow's inside a block)."""
    a = plain_input(a, "a", ANY)
    s, axes = plan(kind, a.shape, s, axes, one_axis)
    nd.check_norm(norm)
    return getattr(fft, kind + "n")(a, s=list(s), axes=list(axes), norm=norm, stream=stream)


_SUMMARY = {
    "fft": "Discrete Fourier transform ``X_k = sum_j x_j exp(-2 pi i jk / n)``",
    "ifft": "Inverse DFT ``x_j = (1/n) sum_k X_k exp(2 pi i jk / n)``",
    "rfft": "DFT of real input, the ``n//2 + 1`` non-negative frequencies of the last "
            "transformed axis",
    "irfft": "Inverse of the real DFT: real output whose spectrum is the Hermitian "
             "extension of ``a``",
}
_OVER = {"": "along ``axis``", "2": "over two axes (default the last two)",
         "n": "over several axes (default all)"}
_SIZES = {
    "": ("n: transform length along ``axis`` (default ``a.shape[axis]``; irfft: the "
         "output length, default ``2 * (m - 1)``); the input is cut or zero-padded to it.\n"
         "        axis: the transformed axis (negative counts from the end)."),
    "2": ("s: sizes along ``axes`` (default the input's; irfft2: ``s[-1]`` is the real "
          "output length, default ``2 * (m - 1)``); each axis is cut or zero-padded.\n"
          "        axes: the two transformed axes (default ``(-2, -1)``)."),
    "n": ("s: sizes along ``axes`` (default the input's; irfftn: ``s[-1]`` is the real "
          "output length, default ``2 * (m - 1)``); each axis is cut or zero-padded.\n"
          "        axes: the transformed axes (default the last ``len(s)`` axes, or all "
          "axes when ``s`` is None too; numpy's rule)."),
}


def _doc(kind: str, form: str, extended: bool) -> str:
    name = kind + form
    head = f"{_SUMMARY[kind]}, {_OVER[form]}"
    if not extended:
        return (f"{head}: double-word inside :func:`~mlx_precise.extended_precision` "
                f"(:func:`{name}_extended`), MLX's ``mx.fft.{name}`` outside (float64 or "
                "DoubleWord input rounded once to float32 / complex64 first). Arguments "
                f"and errors as :func:`{name}_extended` (less ``round_output`` and "
                "``backend``, which the dispatcher honours).")
    return f"""{head}, in double-word, rounded once (numpy's ``{name}`` conventions).

    Args:
        a: float32 or complex64 ``mx.array`` or a DoubleWord (rfft: real only);
            float64 / complex128 data enters at full precision (split into a
            DoubleWord); array-likes follow ``mx.array``'s rules.
        {_SIZES[form]}
        norm: ``"backward"`` (1/n on the inverse; the default), ``"ortho"``
            (1/sqrt(n) both ways) or ``"forward"`` (1/n forward), n the product of
            the sizes: one double-word product inside the single rounding.
        round_output: complex64 (irfft: float32) rounded once if True, else a
            DoubleWord (unrounded words).
        backend: ``"metal"``, ``"emulate"``, ``"cpu"`` or None (the active one).
        stream: MLX stream for the kernels.

    Returns:
        complex64 (irfft: float32) ``mx.array``, or a DoubleWord; rfft has
        ``s[-1]//2 + 1`` points on the last transformed axis. Normwise relative
        error of the unrounded result below 1e-13 (docs/fft.md).

    Raises:
        TypeError: ``a`` of another dtype (complex for rfft); ``s`` / ``axes`` not
            sequences of ints, ``axis`` not an int.
        ValueError: a size < 1 (``n`` not an integer >= 1), ``s`` and ``axes`` of
            different lengths, repeated or no axes, unknown ``norm``, more than
            2^30 points in one 1-D step (:func:`mlx_precise.fft.nd.check_limits`).
        numpy.exceptions.AxisError (a ValueError and an IndexError): an axis out
            of range or a 0-d ``a``.

    Differentiable (``mx.grad``, any order) for an ``mx.array`` input with
    ``round_output=True``; otherwise a gradient raises
    :class:`~mlx_precise.core.autodiff.NotDifferentiableError`.
    """


def _named(fn, name: str, doc: str):
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return fn


def _old_input_name(fn, old: str):
    """Accept the input under its old keyword ``old`` (``x`` / ``X``) with a
    DeprecationWarning; positional calls are unchanged."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if old in kwargs:
            if args or "a" in kwargs:
                raise TypeError(f"{fn.__name__}(): got the input twice (a and {old})")
            warnings.warn(f"{fn.__name__}({old}=...) is deprecated: the input is named a, "
                          f"as in mx.fft; pass a= or pass it positionally",
                          DeprecationWarning, stacklevel=2)
            kwargs["a"] = kwargs.pop(old)
        return fn(*args, **kwargs)

    return call


def _pair(kind: str, form: str):
    """(precision-aware function, ``*_extended`` twin) for ``kind`` + ``form``."""
    name = kind + form
    if form == "":
        def ext(a, n=None, axis=-1, norm="backward", *, round_output=True, backend=None,
                stream=None):
            return _extended(kind, a, *_one_axis_args(n, axis), True, norm, round_output,
                             backend, stream)

        def pln(a, n=None, axis=-1, norm="backward", *, stream=None):
            return _plain(kind, a, *_one_axis_args(n, axis), True, norm, stream)

        def flow(a, n=None, axis=-1, norm="backward", *, stream=None):
            return _plain(kind, a, *_one_axis_args(n, axis), True, norm, stream, mx.fft)
    else:
        default = FORMS[form]

        def ext(a, s=None, axes=default, norm="backward", *, round_output=True, backend=None,
                stream=None):
            return _extended(kind, a, s, axes, False, norm, round_output, backend, stream)

        def pln(a, s=None, axes=default, norm="backward", *, stream=None):
            return _plain(kind, a, s, axes, False, norm, stream)

        def flow(a, s=None, axes=default, norm="backward", *, stream=None):
            return _plain(kind, a, s, axes, False, norm, stream, mx.fft)

    ext = host_guard(_named(ext, f"{name}_extended", _doc(kind, form, True)))
    # (flow: inside a block, on carried values, MLX's transform through the flow; mx.fft's
    # names are the flow's there)
    aware = precision_aware(ext, flow)(_named(pln, name, _doc(kind, form, False)))
    if form == "":  # the one-axis functions named their input x (irfft: X)
        old = "X" if kind == "irfft" else "x"
        ext, aware = _old_input_name(ext, old), _old_input_name(aware, old)
        # The public function is the registered one (precision_aware_functions());
        # precision_aware has no option for a renamed argument yet.
        _aware._REGISTRY[name] = aware
    return aware, ext


# One pair per kind and form, in the order of the loops below.
((fft, fft_extended), (ifft, ifft_extended), (rfft, rfft_extended), (irfft, irfft_extended),
 (fft2, fft2_extended), (ifft2, ifft2_extended), (rfft2, rfft2_extended),
 (irfft2, irfft2_extended), (fftn, fftn_extended), (ifftn, ifftn_extended),
 (rfftn, rfftn_extended), (irfftn, irfftn_extended)) = [
    _pair(kind, form) for form in FORMS for kind in nd.KINDS]


# ---- shifts: no arithmetic ---------------------------------------------------------


def _shift(a, axes, stream, sign: int):
    if not is_word_array(a):  # (an array of words moves as it is: mx.roll carries its low word)
        a = read_input(a, "a", "words")  # float64 data: split; any other dtype moves
    if isinstance(a, DoubleWord):  # both words move
        return DoubleWord(_shift(a.hi, axes, stream, sign), _shift(a.lo, axes, stream, sign))
    if a.ndim == 0:
        raise AxisError("a must have at least one dimension, got a 0-d array")
    if axes is None:
        axes = range(a.ndim)
    axes = _ints((axes,) if isinstance(axes, (int, np.integer)) else axes, "axes")
    for i, ax in enumerate(axes):
        if not -a.ndim <= ax < a.ndim:
            raise AxisError(f"axes[{i}] = {ax} is out of range for a with {a.ndim} "
                            "dimension(s)")
    # mx.roll, not MLX's fftshift: inside extended_precision() the flow carries a
    # low word through roll.
    return mx.roll(a, [sign * (a.shape[ax] // 2) for ax in axes], list(axes), stream=stream)


def fftshift(a, axes=None, *, stream=None):
    """Move the zero frequency to the centre: ``mx.fft.fftshift`` (a roll by
    ``shape[ax] // 2`` along each of ``axes``, default all). ``a``: any
    ``mx.array``, array-like (as the transforms read it) or DoubleWord (both words
    move; no rounding). AxisError (a ValueError and an IndexError) for an axis out
    of range; TypeError for axes that are not ints."""
    return _shift(a, axes, stream, 1)


def ifftshift(a, axes=None, *, stream=None):
    """Inverse of :func:`fftshift` (a roll by ``-(shape[ax] // 2)``), as
    ``mx.fft.ifftshift``; arguments as :func:`fftshift`."""
    return _shift(a, axes, stream, -1)
