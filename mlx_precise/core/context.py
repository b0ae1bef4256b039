"""``extended_precision()``: the switch user model code is wrapped in.

Inside ``with extended_precision():`` every precision-aware entry point of the
package runs its double-word implementation (``*_extended``) and rounds once at the
end; outside it the same entry points run plain float32 MLX. The state lives in a
:class:`contextvars.ContextVar`, so it nests, is per thread and per async task, and
is restored when the block exits, exceptions included.

The precision-aware entry points are exactly the functions registered with
:func:`~mlx_precise.doubleword.aware.precision_aware` (the dispatch lives with the
number system, above this module); :func:`~mlx_precise.precision_aware_functions`
lists them (the docs' API page shows the same list). With ``intercept_mlx=True``
(the default) MLX's own FFTs and depthwise ``mx.conv1d`` also run extended inside
the block (:mod:`mlx_precise.extended.intercept`); the switch for that lives in a second context
variable, read by :func:`intercepting`.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Callable

_block: contextvars.ContextVar = contextvars.ContextVar("mlx_precise_block", default=None)


# The open double-word flow's report in this thread / task (mlx_precise.extended);
# None outside blocks and while package internals run (flow_suspended).
flow: contextvars.ContextVar = contextvars.ContextVar("mlx_precise_flow", default=None)


@contextlib.contextmanager
def setting(var: contextvars.ContextVar, value):
    """``var`` set to ``value`` inside, reset after (the package's mode switches)."""
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)


@contextlib.contextmanager
def switched(*flags):
    """Module-level switches, ``(module, name, value)`` each, set inside and
    restored after (the replays' ``ENABLED`` flags, for comparisons)."""
    saved = [(module, name, getattr(module, name)) for module, name, _ in flags]
    for module, name, value in flags:
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def flow_suspended():
    """Run package internals with the flow off: MLX's ops unchanged, nothing
    reported (lower layers, such as the lazy low words of the cpu backend, use it
    to build their arrays with plain MLX inside a block)."""
    return setting(flow, None)


# Set by the double-word flow (mlx_precise.extended): a public op of the package
# (one decorated with core.autodiff.host_guard) called while a block's flow is on is
# handed to it as hook(op, body, args, kwargs): its operands may carry low words and a
# gradient may be recording, which only the flow sees; ``body`` runs the op.
public_runner: list = []

# Set by the double-word flow: the DoubleWord an mx.array carries (its low word,
# kept beside it since a block made it), or None; read_input reads words through it.
carried_words: list = []


def restore(var: contextvars.ContextVar, token) -> None:
    """``var.reset(token)``, also when the block ends in another context than the
    one it opened in (a generator suspended inside its block and closed from
    another thread or task): there the variable is set back to its value before
    the block instead of raising."""
    try:
        var.reset(token)
    except ValueError:
        var.set(token.old_value if token.old_value is not contextvars.Token.MISSING
                else None)


def is_extended() -> bool:
    """True inside an enabled :func:`extended_precision` block."""
    b = _block.get()
    return b is not None and b.open and b.enabled


def intercepting() -> bool:
    """True where MLX's own FFTs and depthwise ``mx.conv1d`` run extended: inside
    an enabled :func:`extended_precision` block with ``intercept_mlx=True``."""
    b = _block.get()
    return b is not None and b.open and b.intercept


# Context managers that capabilities register to take part in every block (the
# double-word flow: mlx_precise.extended); each is called as hook(on, strict),
# on = enabled and intercept_mlx (False switches it off inside the block), and
# yields the block's report (None when off).
_block_hooks: list[Callable] = []


def register_block_hook(hook: Callable) -> None:
    """Register a context manager factory entered by every block (see
    :data:`_block_hooks`)."""
    if hook not in _block_hooks:
        _block_hooks.append(hook)


class _Block(contextlib.ContextDecorator):
    """One ``extended_precision()`` block: its context manager (a class rather than
    a generator, so that opening and closing an empty block costs microseconds),
    and the state of the innermost open block in a thread / task. ``open`` turns
    False when the block ends, also where the context variable still names it (a
    generator suspended inside its block, closed from another thread or task)."""

    __slots__ = ("enabled", "intercept", "strict", "open", "_token", "_exits")

    def __init__(self, enabled: bool, intercept: bool, strict: bool):
        self.enabled, self.intercept, self.strict = enabled, intercept, strict
        self.open, self._token, self._exits = False, None, None

    def _recreate_cm(self):  # each use as a decorator opens a block of its own
        return _Block(self.enabled, self.intercept, self.strict)

    def __enter__(self):
        if self._exits is not None:
            raise RuntimeError("this extended_precision() block is already open")
        self.open, self._exits = True, []
        self._token = _block.set(self)
        report = None
        try:
            for hook in _block_hooks:
                cm = hook(self.intercept, self.strict)
                report = cm.__enter__()
                self._exits.append(cm.__exit__)
        except BaseException as e:
            self.__exit__(type(e), e, e.__traceback__)
            raise
        return report

    def __exit__(self, kind, value, tb):
        exits, self._exits = self._exits, None
        raised = value
        try:
            while exits:  # the hooks in reverse order, each seeing what is in flight
                try:
                    if exits.pop()(kind, value, tb):
                        kind = value = tb = None
                except BaseException as e:
                    kind, value, tb = type(e), e, e.__traceback__
            if value is not None and value is not raised:
                raise value
        finally:
            self.open = False
            restore(_block, self._token)
        return raised is not None and value is None


def extended_precision(enabled: bool = True, *, intercept_mlx: bool = True,
                       strict: bool = False):
    """Run the enclosed code in double-word (``enabled=True``) or plain float32
    (``enabled=False``, e.g. to switch a sub-block off inside an enabled region).

    Inside an enabled block, the package's precision-aware functions run their
    double-word twins, and (``intercept_mlx=True``) MLX's own ops carry
    double-word values from one op to the next: every op with a double-word rule
    returns an ordinary ``mx.array`` (MLX's shape and dtype, holding the float32 /
    complex64 rounding of its result) and records the low word beside it, so a
    chain of such ops is rounded once, where its value leaves the chain
    (docs/port_guide.md lists the ops and says where rounding happens).

    Args:
        enabled: switch the extended paths on (True) or off (False).
        intercept_mlx: when enabled, also run MLX's own ops (``mx.fft.*``,
            arithmetic, shape ops, reductions, depthwise ``mx.conv1d``) extended,
            so that unmodified MLX model code gains accuracy; False limits the
            block to this package's functions and layers.
        strict: raise :class:`~mlx_precise.extended.PrecisionDropError` at the
            first op that consumes a double-word value in float32 (an op without a
            double-word rule).

    Yields:
        The block's :class:`~mlx_precise.extended.Report` (which ops ran in
        double-word, which consumed a double-word value in float32), or None
        when MLX's ops are not intercepted.

    Example::

        with mlx_precise.extended_precision() as report:
            y = model(x)        # MLX ops with a double-word rule chain in
                                # double-word; y is rounded once
        print(report)
    """
    if enabled.__class__ is not bool or intercept_mlx.__class__ is not bool or (
            strict.__class__ is not bool):
        for name, v in (("enabled", enabled), ("intercept_mlx", intercept_mlx),
                        ("strict", strict)):
            if not isinstance(v, bool):
                raise TypeError(
                    f"extended_precision({name}) takes a bool, got {type(v).__name__}")
    return _Block(enabled, enabled and intercept_mlx, strict)
