"""The dispatcher that carries double-word values through ``extended_precision()``.

While at least one block is open (in any thread), MLX's functions and
``mx.array``'s operators, methods and properties are replaced by thin wrappers;
when the last block closes the originals are put back, so code outside every
block runs MLX itself, with no wrapper in between. Each wrapper reads a context
variable (per thread and per async task): outside a block, or inside a rule, it
calls MLX's op unchanged. Inside a block it looks the op up in the table of
:mod:`.rules` (one rule per op, as JAX's per-primitive rule tables), runs the rule
and counts the op in the block's :class:`Report`: ``extended`` when the rule ran,
``float32`` when an op without a rule (or a rule that declined) consumed an array
that carries a low word (that value is rounded to float32 there), and ``plain``
when a supported op got operands it does not extend (float16, bfloat16, integer
arrays: MLX runs them unchanged). With ``strict=True`` the first ``float32`` event
raises :class:`PrecisionDropError`.

Where values leave the chain (printing, ``.item()``, ``np.array(x)``, an op
without a rule) they are the float32 / complex64 rounding of the double-word
result: rounded once.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import threading

import mlx.core as mx

from ..core import backends
from . import rules
from . import carry
from .carry import low_word, suspended


class PrecisionDropError(RuntimeError):
    """Raised inside ``extended_precision(strict=True)`` when an op consumes a
    double-word value in float32 (it has no double-word rule)."""


class Report:
    """What ran inside one ``extended_precision()`` block, op by op.

    Attributes:
        extended: ``Counter`` op name -> calls computed in double-word.
        float32: op name -> calls that consumed a double-word value in float32.
        plain: op name -> calls of supported ops on operands they do not extend
            (float16, bfloat16, integer arrays), run by MLX unchanged.
        strict: whether the first ``float32`` event raises.
    """

    def __init__(self, strict: bool = False):
        self.extended: collections.Counter = collections.Counter()
        self.float32: collections.Counter = collections.Counter()
        self.plain: collections.Counter = collections.Counter()
        self.strict = strict

    def __repr__(self) -> str:
        def fmt(c):
            return ", ".join(f"{k}: {v}" for k, v in sorted(c.items())) or "-"

        return (f"Report(extended: {fmt(self.extended)}; float32: {fmt(self.float32)}; "
                f"plain: {fmt(self.plain)})")


_report = carry.report

# Callables that are not ops on array values: never wrapped.
_NOT_OPS = frozenset({
    "array", "asarray", "eval", "async_eval", "grad", "value_and_grad", "vjp", "jvp", "vmap",
    "compile", "custom_function", "checkpoint", "stream", "new_stream", "default_stream",
    "default_device", "set_default_device", "set_default_stream", "disable_compile",
    "enable_compile", "export_function", "import_function", "export_to_dot", "exporter",
    "load", "save", "savez", "savez_compressed", "save_gguf", "save_safetensors",
    "synchronize", "clear_cache", "clear_streams", "get_active_memory", "get_cache_memory",
    "get_peak_memory", "reset_peak_memory", "get_memory_limit", "set_memory_limit",
    "set_cache_limit", "set_wired_limit", "get_array_buffer_size", "device_count",
    "device_info", "is_available", "printoptions", "get_printoptions", "set_printoptions",
    "new_thread_local_stream", "new_thread_unsafe_stream", "issubdtype", "isdtype",
    "can_cast", "result_type", "broadcast_shapes", "finfo", "iinfo", "from_dlpack",
    "depends", "stop_gradient",
    # constructors that take no array value
    "zeros", "ones", "full", "eye", "identity", "tri", "empty",
    "bartlett", "blackman", "hamming", "hanning",
})
# mx.array methods where a value leaves the chain (rounded once) or that read no value.
_EXITS = frozenset({"item", "tolist", "view", "at", "shape", "dtype", "ndim", "size",
                    "itemsize", "nbytes"})
_OPERATORS = ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
              "__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__",
              "__rmod__", "__pow__", "__rpow__", "__matmul__", "__rmatmul__", "__neg__",
              "__abs__", "__getitem__", "__lt__", "__le__", "__gt__", "__ge__", "__eq__",
              "__ne__", "__divmod__", "__setitem__", "__iter__", "__iadd__", "__isub__",
              "__imul__", "__itruediv__", "__ipow__", "__imatmul__", "__ifloordiv__",
              "__imod__")
# In-place ops: after MLX's own (float32) update, x's old low word no longer applies.
_INPLACE = frozenset(n for n in _OPERATORS if n.startswith("__i") and n != "__iter__") | {
    "__setitem__"}


def _carries(args, kwargs) -> bool:
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            if any(isinstance(b, mx.array) and low_word(b) is not None for b in a):
                return True
        elif isinstance(a, mx.array) and low_word(a) is not None:
            return True
    return False


def _foreign(args) -> bool:
    """A non-float32 / complex64 array among the operands."""
    return any(isinstance(a, mx.array) and not rules.is_word_array(a) for a in args)


def _wrapper(name: str, original, rule):
    """The stand-in for one MLX callable."""

    def call(*args, **kwargs):
        report = _report.get()
        if report is None:
            return original(*args, **kwargs)
        token = _report.set(None)  # the rule and MLX's op below see plain MLX
        nested = carry.any_nested(args)
        try:
            if rule is not None:
                ctx = rules.Operands(backends.backend(), None, report)
                out = rule(ctx, original, *args, **kwargs)
                if out is not NotImplemented:
                    report.extended[name] += 1
                    if nested:
                        carry.tag_nested(out)
                    return out
            if _carries(args, kwargs):
                report.float32[name] += 1
                if report.strict:
                    raise PrecisionDropError(
                        f"{name} consumed a double-word value in float32 inside "
                        "extended_precision(strict=True): it has no double-word rule for "
                        "these operands")
            elif rule is not None and _foreign(args):
                report.plain[name] += 1
            out = original(*args, **kwargs)
            if name in _INPLACE and args:
                carry.attach(args[0], None)
            if nested:
                carry.tag_nested(out)
            return out
        finally:
            _report.reset(token)

    return functools.update_wrapper(call, original) if callable(original) else call


_GRADIENTS = ("grad", "value_and_grad", "vjp", "jvp")


def _gradient_wrapper(name: str, original):
    """``mx.grad`` & co. inside a block: their results, when computed inside an
    enclosing gradient trace, are tagged (see carry.check_traceable)."""

    def transform(*args, **kwargs):
        if name in ("vjp", "jvp"):  # computes at once
            return _traced(original, args, kwargs)
        fn = original(*args, **kwargs)
        return functools.update_wrapper(lambda *a, **k: _traced(fn, a, k), fn, updated=())

    return functools.update_wrapper(transform, original)


def _traced(fn, args, kwargs):
    outer = carry.depth.get()
    token = carry.depth.set(outer + 1)
    try:
        out = fn(*args, **kwargs)
    finally:
        carry.depth.reset(token)
    if outer and _report.get() is not None:
        carry.tag_nested(out)
    return out


def _targets():
    """(owner, attribute name, replacement factory) of every op the flow wraps."""
    out = []
    for name in dir(mx):
        value = getattr(mx, name)
        # nb_func: MLX's own functions; conv1d: mlx_precise's interception of it
        if name.startswith("_") or name in _NOT_OPS or (
                type(value).__name__ != "nb_func" and name not in rules.FUNCTIONS):
            continue
        out.append((mx, name, value, rules.FUNCTIONS.get(name)))
    for name in dir(mx.array):
        value = getattr(mx.array, name)
        if name in rules.PROPERTIES or name in _EXITS:
            continue
        if (name.startswith("_") and name not in _OPERATORS) or isinstance(value, property):
            continue
        out.append((mx.array, name, value, rules.METHODS.get(name)))
    for name, rule in rules.PROPERTIES.items():
        prop = getattr(mx.array, name)
        out.append((mx.array, name, prop, rule))
    for name, rule in rules.FAST.items():
        out.append((mx.fast, name, getattr(mx.fast, name), rule))
    for name in _GRADIENTS:
        out.append((mx, name, getattr(mx, name), _gradient_wrapper))
    return out


@functools.lru_cache(maxsize=1)
def _uncompiled_activations() -> dict:
    """mlx.nn's activation functions as plain Python functions.

    mlx.nn compiles them at import (``mx.compile(shapeless=True)``); a compiled
    function passes its inputs as new array objects, which carry no low word, so
    inside a block it would round its inputs to float32 without a word. Executing
    the installed module's own source once more with ``mx.compile`` as the identity
    gives the same functions uncompiled; they stand in for the compiled ones while
    a block is open (module globals, so the nn layers call them too)."""
    import inspect

    import mlx.nn.layers.activations as act

    names = [n for n in dir(act) if type(getattr(act, n)).__name__ == "_gc_func"]
    namespace = {"__name__": act.__name__, "__file__": act.__file__}
    compile_ = mx.compile
    mx.compile = lambda fun=None, *a, **k: fun if fun is not None else (lambda f: f)
    try:
        exec(compile(inspect.getsource(act), act.__file__, "exec"), namespace)
    finally:
        mx.compile = compile_
    return {n: namespace[n] for n in names if callable(namespace.get(n))}


_lock = threading.Lock()
_open = 0  # blocks open in all threads
_saved: list = []  # (owner, name, original) while installed


def _install() -> None:
    # Functions MLX compiled before this package was imported (mlx.nn's gelu,
    # silu, ...) would replay a float32 trace: with compilation off they run their
    # Python ops, which the flow sees. (MLX_DISABLE_COMPILE set: leave it alone.)
    if not os.environ.get("MLX_DISABLE_COMPILE"):
        mx.disable_compile()
    import mlx.nn
    import mlx.nn.layers.activations as act

    for name, fn in _uncompiled_activations().items():
        compiled = getattr(act, name)
        for owner in (act, mlx.nn):
            if getattr(owner, name, None) is compiled:
                _saved.append((owner, name, compiled))
                setattr(owner, name, fn)
    for owner, name, original, replacement in _plan():
        setattr(owner, name, replacement)
        _saved.append((owner, name, original))


_cached_plan: list = []  # (owner, name, original, replacement)


def _plan() -> list:
    """The stand-ins to install, built once (functools wrappers for ~1400 names
    cost milliseconds) and rebuilt only when an attribute no longer is the
    original it was built for (someone else replaced an MLX function)."""
    if not _cached_plan or any(getattr(owner, name, None) is not original
                               for owner, name, original, _ in _cached_plan):
        plan = []
        for owner, name, original, rule in _targets():
            if rule is _gradient_wrapper:
                replacement = _gradient_wrapper(name, original)
            elif isinstance(original, property):
                replacement = property(_wrapper(name, original.__get__, rule),
                                       doc=original.__doc__)
            else:
                replacement = _wrapper(name, original, rule)
            plan.append((owner, name, original, replacement))
        _cached_plan[:] = plan
    return _cached_plan


def _uninstall() -> None:
    if not os.environ.get("MLX_DISABLE_COMPILE"):
        mx.enable_compile()
    while _saved:
        owner, name, original = _saved.pop()
        setattr(owner, name, original)


def active() -> Report | None:
    """The report of the open block in this thread / task (None: the flow is off)."""
    return _report.get()


@contextlib.contextmanager
def block(on: bool = True, strict: bool = False):
    """Open a double-word block (``on``) and yield its :class:`Report`, or switch
    the flow off for a nested block (yields None)."""
    global _open
    if not on:
        with suspended():
            yield None
        return
    with _lock:
        if _open == 0:
            _install()
        _open += 1
    report = Report(strict)
    token = _report.set(report)
    try:
        yield report
    finally:
        _report.reset(token)
        with _lock:
            _open -= 1
            if _open == 0:
                _uninstall()
