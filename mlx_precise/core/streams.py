"""The ``stream=`` keyword of the public ops, read as MLX reads it.

MLX's ops take ``*, stream=None`` (a ``StreamOrDevice``: an ``mx.Stream``, an
``mx.Device`` or a device type such as ``mx.cpu``; None is the default stream).
:func:`streamed` gives a public op the same keyword: the value is checked before
anything runs (``TypeError`` for another type, ``ValueError`` for a device that
cannot run here, as ``mx.stream`` raises it) and the op's body runs inside
``with mx.stream(stream)``, so its MLX ops and kernel launches (``metal``) go to
that stream. Host computations (the ``cpu`` backend's numpy code, the emulator)
run on the host whatever the stream; float64 work stays on the CPU stream.
"""

from __future__ import annotations

import contextlib
import functools

import mlx.core as mx

STREAM_TYPES = tuple(t for t in (mx.Stream, mx.Device, mx.DeviceType,
                                 getattr(mx, "ThreadLocalStream", None)) if t is not None)


def check_stream(stream, fn: str):
    """``stream`` if it is None or a stream / device that can run here.

    Raises:
        TypeError: not an ``mx.Stream``, ``mx.Device`` or device type (naming
            ``fn`` and the argument).
        ValueError: a device MLX cannot use here (``mx.gpu`` without a GPU).
    """
    if stream is None:
        return None
    if not isinstance(stream, STREAM_TYPES):
        raise TypeError(f"{fn}(): stream must be an mx.Stream, an mx.Device (e.g. mx.cpu) "
                        f"or None, got {type(stream).__name__}")
    try:
        with mx.stream(stream):
            pass
    except ValueError as e:
        raise ValueError(f"{fn}(): stream={stream!r} cannot run here: {e}") from None
    return stream


@contextlib.contextmanager
def on_stream(stream, fn: str):
    """Check ``stream`` (:func:`check_stream`) and make it the default inside."""
    if check_stream(stream, fn) is None:
        yield
        return
    with mx.stream(stream):
        yield


def streamed(fn):
    """Decorator for a public op with a keyword-only ``stream=None``: its body runs
    :func:`on_stream` of the given stream (checked first)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with on_stream(kwargs.get("stream"), fn.__name__):
            return fn(*args, **kwargs)

    return wrapper
