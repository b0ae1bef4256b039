"""``extended_precision()``: the switch user model code is wrapped in.

Inside ``with extended_precision():`` every precision-aware entry point of the
package runs its double-word implementation (``*_extended``) and rounds once at the
end; outside it the same entry points run plain float32 MLX. The state lives in a
:class:`contextvars.ContextVar`, so it nests, is per thread and per async task, and
is restored when the block exits, exceptions included.

The precision-aware entry points are exactly the functions registered with
:func:`precision_aware`; :func:`precision_aware_functions` lists them (the docs'
API page shows the same list). With ``intercept_mlx=True`` (the default) MLX's own
FFTs and depthwise ``mx.conv1d`` also run extended inside the block
(:mod:`mlx_precise.intercept`); the switch for that lives in a second context
variable, read by :func:`intercepting`.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Callable

_extended: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "mlx_precise_extended", default=False
)

_intercept: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "mlx_precise_intercept", default=False
)

# name -> the precision-aware function (filled by @precision_aware).
_REGISTRY: dict[str, Callable] = {}


def is_extended() -> bool:
    """True inside an enabled :func:`extended_precision` block."""
    return _extended.get()


def intercepting() -> bool:
    """True where MLX's own FFTs and depthwise ``mx.conv1d`` run extended: inside
    an enabled :func:`extended_precision` block with ``intercept_mlx=True``."""
    return _intercept.get()


@contextlib.contextmanager
def extended_precision(enabled: bool = True, *, intercept_mlx: bool = True):
    """Run the enclosed code with precision-aware functions in double-word
    (``enabled=True``) or plain float32 (``enabled=False``, e.g. to switch a
    sub-block off inside an enabled region).

    Args:
        enabled: switch the extended paths on (True) or off (False).
        intercept_mlx: when enabled, also run MLX's own ``mx.fft.*`` transforms
            and depthwise ``mx.conv1d`` extended, so that unmodified MLX model
            code gains accuracy (:mod:`mlx_precise.intercept`); False limits the
            block to this package's functions and layers.

    Example::

        with mlx_precise.extended_precision():
            y = model(x)        # mx.fft.* / depthwise mx.conv1d and mlx_precise
                                # layers run extended, rounded once per op
    """
    for name, v in (("enabled", enabled), ("intercept_mlx", intercept_mlx)):
        if not isinstance(v, bool):
            raise TypeError(f"extended_precision({name}) takes a bool, got {type(v).__name__}")
    token = _extended.set(enabled)
    token_i = _intercept.set(enabled and intercept_mlx)
    try:
        yield
    finally:
        _intercept.reset(token_i)
        _extended.reset(token)


def precision_aware(extended: Callable) -> Callable:
    """Decorator for a plain float32 function whose double-word twin is
    ``extended``: the decorated function runs ``extended`` inside
    :func:`extended_precision` and itself outside. Both take the same arguments
    (the extended one may take more keywords, which the plain one ignores)."""

    def wrap(plain: Callable) -> Callable:
        @functools.wraps(plain)
        def dispatch(*args, **kwargs):
            return (extended if _extended.get() else plain)(*args, **kwargs)

        dispatch.extended = extended
        dispatch.plain = plain
        _REGISTRY[plain.__name__] = dispatch
        return dispatch

    return wrap


def precision_aware_functions() -> dict[str, Callable]:
    """The precision-aware entry points of the package, by name."""
    from . import conv, elementwise, fft, hyena  # noqa: F401  (importing registers them)

    return dict(sorted(_REGISTRY.items()))
