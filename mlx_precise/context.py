"""``extended_precision()``: the switch user model code is wrapped in.

Inside ``with extended_precision():`` every precision-aware entry point of the
package runs its double-word implementation (``*_extended``) and rounds once at the
end; outside it the same entry points run plain float32 MLX. The state lives in a
:class:`contextvars.ContextVar`, so it nests, is per thread and per async task, and
is restored when the block exits, exceptions included.

The precision-aware entry points are exactly the functions registered with
:func:`precision_aware`; :func:`precision_aware_functions` lists them (the docs'
API page shows the same list).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Callable

_extended: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "mlx_precise_extended", default=False
)

# name -> the precision-aware function (filled by @precision_aware).
_REGISTRY: dict[str, Callable] = {}


def is_extended() -> bool:
    """True inside an enabled :func:`extended_precision` block."""
    return _extended.get()


@contextlib.contextmanager
def extended_precision(enabled: bool = True):
    """Run the enclosed code with precision-aware functions in double-word
    (``enabled=True``) or plain float32 (``enabled=False``, e.g. to switch a
    sub-block off inside an enabled region).

    Example::

        with mlx_precise.extended_precision():
            y = model(x)        # its mlx_precise layers/functions run extended
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"extended_precision(enabled) takes a bool, got {type(enabled).__name__}")
    token = _extended.set(enabled)
    try:
        yield
    finally:
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
