"""``mx.fft``: the twelve transforms in double-word (the N-D engine of
:mod:`mlx_precise.fft.nd` through :func:`..spectral.transform`), MLX's argument
conventions and casts."""

from __future__ import annotations

import inspect

import mlx.core as mx
import numpy as np

from ...core.plain import FFT_NAMES, plain
from .. import carry, spectral
from ..recipes import replayed
from ..constructor import ARRAY  # the class (mx.array is a stand-in inside blocks)
from .base import decomposed, kernel_form


def _signature(name: str) -> inspect.Signature:
    """The Python signature of MLX's ``mx.fft.<name>`` (to bind user arguments;
    ``stream`` is taken by the dispatcher)."""
    P = inspect.Parameter
    first = [P("a", P.POSITIONAL_OR_KEYWORD)]
    if name in FFT_NAMES[:4]:
        rest = [P("n", P.POSITIONAL_OR_KEYWORD, default=None),
                P("axis", P.POSITIONAL_OR_KEYWORD, default=-1)]
    else:
        axes = (-2, -1) if name.endswith("2") else None
        rest = [P("s", P.POSITIONAL_OR_KEYWORD, default=None),
                P("axes", P.POSITIONAL_OR_KEYWORD, default=axes)]
    if "norm" in (getattr(plain.fft, name).__doc__ or "").split("\n", 1)[0]:
        rest.append(P("norm", P.POSITIONAL_OR_KEYWORD, default="backward"))
    return inspect.Signature(first + rest)


def _binder(name: str):
    """``bind(args, kwargs) -> {parameter: value}`` for MLX's ``mx.fft.<name>``
    (:func:`_signature`, defaults applied). Every parameter is positional-or-keyword,
    so a binding depends only on how many arguments are positional and which are
    named: each such form is bound once by the signature (its TypeErrors) and
    then by a dict of its names (~0.5 us instead of inspect's ~4 us)."""
    sig = _signature(name)
    params = list(sig.parameters)
    defaults = {k: p.default for k, p in sig.parameters.items()
                if p.default is not inspect.Parameter.empty}
    forms = set()

    def bind(args, kwargs):
        form = (len(args), tuple(kwargs))
        if form not in forms:
            sig.bind(*args, **kwargs)  # raises for a form MLX's signature refuses
            forms.add(form)
        b = dict(defaults)
        b.update(zip(params, args))
        b.update(kwargs)
        return b

    return bind


def _operand(a, kind: str) -> mx.array:
    """MLX's input casts: rfft takes the real part of complex input (complex64 kept
    here: :func:`..spectral.transform` takes it of both words, where a cast would drop
    the carried low word); others keep complex64 and make every real dtype float32
    (float64 too, as MLX does)."""
    a = a if isinstance(a, ARRAY) else mx.array(a)
    if kind == "rfft":
        return a if a.dtype in (mx.float32, mx.complex64) else a.astype(mx.float32)
    if kind == "irfft":
        return a if a.dtype == mx.complex64 else a.astype(mx.complex64)
    return a if a.dtype in (mx.float32, mx.complex64) else a.astype(
        mx.complex64 if mx.issubdtype(a.dtype, mx.complexfloating) else mx.float32)


def _sizes(name: str, kind: str, a: mx.array, b: dict):
    """(s, axes) of one call, numpy's defaults, axes normalised."""
    nd = a.ndim
    if name in FFT_NAMES[:4]:
        axes = [b["axis"]]
        s = None if b["n"] is None else [b["n"]]
    else:
        s = None if b["s"] is None else list(b["s"])
        axes = b["axes"]
        if axes is None:
            axes = list(range(nd)) if s is None else list(range(nd - len(s), nd))
        axes = list(axes)
    axes = [int(ax) % nd for ax in axes]
    if s is None:
        s = [a.shape[ax] for ax in axes]
        if kind == "irfft":
            s[-1] = 2 * (a.shape[axes[-1]] - 1)
    return s, axes


_SCALARS = (int, str, type(None))


def _form(args: tuple, kwargs: dict) -> tuple | None:
    """The arguments after the operand ``args[0]`` as a key that tells apart what
    compares equal but MLX may take differently (512 and 512.0, 1 and True, a list
    and a tuple); None where one is not an int, str, None or a tuple / list of ints."""
    key = []
    for v in (*args[1:], *kwargs.values()):
        t = type(v)
        if t in _SCALARS:
            key.append(v)
        elif (t is tuple or t is list) and all(type(i) is int for i in v):
            key.append((t, *v))
        else:
            return None
    key.extend(kwargs)  # (the names: a positional and a named value are two forms)
    return tuple(key)


_TAKEN = (mx.float32, mx.complex64, mx.float64)  # and the integer dtypes
_PLANNED = (mx.float32, mx.complex64)


def _planned(ctx, a, kind: str, s: tuple, axes: tuple, norm: str) -> mx.array:
    """The transform ``kind`` of ``a`` by a plan its rule made for the call's form."""
    return spectral.transform(kind, _operand(a, kind), s, axes, norm, ctx.backend, ctx.stream)


_replayed_plan = replayed(_planned)


def _transform(name: str):
    bind = _binder(name)
    kind = name[:-1] if name[-1] in "2n" else name  # fft2, fftn -> fft
    # a call form (operand shape and dtype, the other arguments) that MLX took and
    # the engine's result matched -> its (s, axes, norm): MLX's checks and result
    # shape depend on nothing else, so a repeated form skips its lazy reference op,
    # the binding and the sizes (the oldest first out). Only float32 / complex64
    # operands (MLX's checks of float64 depend on the stream's device).
    planned: dict = {}

    def rule(ctx, original, *args, **kwargs):
        a = args[0] if args else None
        form = _form(args, kwargs) if isinstance(a, ARRAY) else None
        key = None
        if form is not None:
            key = (a.shape, a.dtype, form)
            plan = planned.get(key)
            if plan is not None:
                # (the dispatcher runs a rule with the flow off: the engine's ops are
                # MLX's; on metal a repeated structure replays: extended.recipes)
                return (_replayed_plan if kernel_form(ctx) else _planned)(ctx, a, kind, *plan)
        ref = original(*args, **kwargs)  # lazy: MLX checks the arguments, gives the shape
        b = bind(args, kwargs)
        a = b["a"]
        if not isinstance(a, ARRAY) or a.dtype not in _TAKEN and not mx.issubdtype(
                a.dtype, mx.integer):
            return NotImplemented
        a = _operand(a, kind)
        s, axes = _sizes(name, kind, a, b)
        plan = (tuple(s), tuple(axes), b.get("norm", "backward"))
        y = spectral.transform(kind, a, *plan, ctx.backend, ctx.stream)
        if tuple(y.shape) != tuple(ref.shape) or y.dtype != ref.dtype:
            raise AssertionError(f"mlx_precise: extended mx.fft.{name} gave {y.shape} "
                                 f"{y.dtype}, MLX {ref.shape} {ref.dtype}")
        if key is not None and key[1] in _PLANNED:
            planned[key] = plan
            if len(planned) > 256:
                planned.pop(next(iter(planned)), None)
        return y

    rule.planned = planned
    return rule


def _frame_geometry(n_fft, hop_length, win_length, window):
    """(hop, the window centred and zero-padded to ``n_fft``) of an STFT's
    arguments with MLX's defaults; window None when they are not valid (MLX's
    own errors then)."""
    hop = n_fft // 4 if hop_length is None else hop_length
    win = n_fft if win_length is None else win_length
    if n_fft < 1 or hop < 1 or not 0 < win <= n_fft:
        return hop, None
    if window is None:
        with carry.suspended():
            window = mx.ones((win,), mx.float32)
    if window.shape != (win,):
        return hop, None
    if win < n_fft:
        left = (n_fft - win) // 2
        window = mx.pad(window, [(left, n_fft - win - left)])
    return hop, window


def _stft(x, n_fft=2048, hop_length=None, win_length=None, window=None, center=True,
          pad_mode="reflect", norm="backward", onesided=None):
    """``mx.fft.stft`` by its definition, each step of the flow: the signal padded
    at both ends (reflected, repeated or zeros: moved values, exact), the frames
    gathered, times the window (centred and zero-padded to ``n_fft``), the FFT of
    each frame; (..., n_freq, n_frames)."""
    if not isinstance(x, ARRAY) or x.ndim < 1 or pad_mode not in (
            "reflect", "constant", "edge") or n_fft < 1:
        return NotImplemented  # MLX's own errors
    hop, window = _frame_geometry(n_fft, hop_length, win_length, window)
    if window is None:
        return NotImplemented
    onesided = x.dtype != mx.complex64 if onesided is None else onesided
    if center:
        p, L = n_fft // 2, x.shape[-1]
        if pad_mode == "constant":
            x = mx.pad(x, [(0, 0)] * (x.ndim - 1) + [(p, p)])
        else:
            i = np.arange(-p, L + p)
            if pad_mode == "reflect":
                if p >= L:
                    return NotImplemented
                i = np.abs(i)
                i = np.where(i > L - 1, 2 * (L - 1) - i, i)
            else:
                i = np.clip(i, 0, L - 1)
            with carry.suspended():
                i = mx.array(i.astype(np.int32))
            x = mx.take(x, i, axis=-1)
    frames = 1 + (x.shape[-1] - n_fft) // hop
    if frames < 1:
        return NotImplemented
    with carry.suspended():
        idx = mx.array((np.arange(frames)[:, None] * hop + np.arange(n_fft)[None, :])
                       .astype(np.int32))
    framed = mx.take(x, idx, axis=-1) * window  # (..., frames, n_fft)
    spectrum = (mx.fft.rfft if onesided else mx.fft.fft)(framed, axis=-1, norm=norm)
    return mx.swapaxes(spectrum, -1, -2)


def _istft(stft_matrix, n_fft=None, hop_length=None, win_length=None, window=None,
           center=True, norm="backward", onesided=None, length=None):
    """``mx.fft.istft`` by its definition, each step of the flow: the inverse FFT of
    each frame, times the window, overlap-added (a hop dividing ``n_fft``: the
    frames cut into ``n_fft / hop`` blocks, each block sequence shifted and added),
    divided by the overlap-added squared window where it is not zero (0 there, as
    MLX), from the centring offset on: to the end less that offset, or ``length``
    samples (zero-padded past the end)."""
    S = stft_matrix
    onesided = True if onesided is None else onesided
    if not isinstance(S, ARRAY) or S.ndim < 2 or not onesided:
        return NotImplemented  # two-sided (complex) inverses: MLX's
    n_freq, frames = S.shape[-2], S.shape[-1]
    n_fft = 2 * (n_freq - 1) if n_fft is None else n_fft
    hop, window = _frame_geometry(n_fft, hop_length, win_length, window)
    if window is None or n_fft % hop:
        return NotImplemented
    frame = mx.fft.irfft(mx.swapaxes(S, -1, -2), n=n_fft, axis=-1, norm=norm) * window
    R = n_fft // hop

    def overlap_add(v):  # v (..., frames, n_fft) -> (..., n_fft + hop (frames - 1))
        blocks = v.reshape(*v.shape[:-1], R, hop)
        out = None
        for c in range(R):
            part = blocks[..., c, :]  # (..., frames, hop) lands at blocks c .. c + frames
            pads = [(0, 0)] * (part.ndim - 2) + [(c, R - 1 - c), (0, 0)]
            shifted = mx.pad(part, pads)
            out = shifted if out is None else out + shifted
        return out.reshape(*out.shape[:-2], -1)

    y = overlap_add(frame)
    envelope = overlap_add(mx.broadcast_to(window * window, (frames, n_fft)))
    with carry.suspended():
        nonzero = envelope != 0
    y = mx.where(nonzero, y / mx.where(nonzero, envelope, 1.0), 0.0)
    start = n_fft // 2 if center else 0
    stop = y.shape[-1] - start if length is None else start + length
    y = y[..., start:stop]  # (``length`` counts from the centring offset, as MLX)
    if length is not None and y.shape[-1] < length:
        y = mx.pad(y, [(0, 0)] * (y.ndim - 1) + [(0, length - y.shape[-1])])
    return y


RULES = {f"fft.{name}": _transform(name) for name in FFT_NAMES}
RULES["fft.istft"] = decomposed(_istft)
RULES["fft.stft"] = decomposed(_stft)
"""Op name -> rule."""


# ---- derivatives ---------------------------------------------------------------------
# Each transform is linear; its VJP (MLX's convention: the cotangent of a complex value
# is d/d re + i d/d im) is its adjoint, itself a transform of the flow:
#   fft(norm)   -> ifft(dual norm), the result fitted back to the input's shape;
#   rfft        -> the spectrum embedded in the full length (zeros above n/2), then
#                  the real part of ifft(dual norm);
#   irfft(norm) -> rfft(dual norm) with weight 2 on the bins counted twice by the
#                  Hermitian extension (all but 0 and, for even n, n/2).
# (backward <-> forward, ortho <-> ortho: the adjoint of F / n is F^H / n.)
_DUAL = {"backward": "forward", "forward": "backward", "ortho": "ortho"}


def _fit(v, shape, axes):
    """``v`` truncated or zero-padded along ``axes`` to ``shape``'s sizes there."""
    index = [slice(None)] * v.ndim
    pads = [(0, 0)] * v.ndim
    for ax in axes:
        n = shape[ax]
        if v.shape[ax] > n:
            index[ax] = slice(0, n)
        elif v.shape[ax] < n:
            pads[ax] = (0, n - v.shape[ax])
    v = v[tuple(index)]
    return mx.pad(v, pads) if any(p != (0, 0) for p in pads) else v


def _transform_vjp(name: str):
    bind = _binder(name)
    kind = name[:-1] if name[-1] in "2n" else name

    def vjp(e, g):
        b = bind(e.args, e.kwargs)
        a = b["a"]
        if not isinstance(a, ARRAY) or a.dtype not in (mx.float32, mx.complex64):
            return NotImplemented
        s, axes = _sizes(name, kind, _operand(a, kind), b)
        dual = _DUAL[b.get("norm", "backward")]
        if kind == "fft":
            return (_fit(mx.fft.ifftn(g, axes=axes, norm=dual), a.shape, axes),)
        if kind == "ifft":
            return (_fit(mx.fft.fftn(g, axes=axes, norm=dual), a.shape, axes),)
        if kind == "rfft":
            full = _fit(g, tuple(s[axes.index(ax)] if ax in axes else g.shape[ax]
                                 for ax in range(g.ndim)), axes[-1:])
            return (_fit(mx.real(mx.fft.ifftn(full, axes=axes, norm=dual)), a.shape, axes),)
        n, ax = s[-1], axes[-1]
        spectrum = mx.fft.rfftn(g, axes=axes, norm=dual)
        m = spectrum.shape[ax]
        weight = np.full(m, 2.0, np.float32)
        weight[0] = 1.0
        if n % 2 == 0:
            weight[-1] = 1.0
        with carry.suspended():
            w = mx.array(weight).reshape([m if d == ax else 1 for d in range(g.ndim)])
        return (_fit(spectrum * w, a.shape, axes),)

    return vjp


VJPS = {f"fft.{name}": _transform_vjp(name) for name in FFT_NAMES}
"""Op name -> VJP rule (see :mod:`.base`)."""
