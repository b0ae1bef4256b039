"""The dispatcher that carries double-word values through ``extended_precision()``.

While at least one block is open (in any thread), the callables of ``mx``,
``mx.fast``, ``mx.fft``, ``mx.linalg``, ``mx.random`` and ``mx.array``'s operators,
methods and properties are replaced by thin wrappers, one per entry of
:mod:`.registry` (installed by :mod:`.standins`); so are the places that held them
before the block (:mod:`.holders`: found by a scan of the heap, and the opening
frame's locals), and compiled functions run their Python function on the arrays they
are given. When the last
block closes the originals are put back, so code outside every block runs MLX
itself, with no wrapper in between (but for the in-place operators,
:mod:`.intercept`). Each wrapper reads a context variable (per
thread and per async task): outside a block, or inside a rule, it calls MLX's op
unchanged. Inside a block it runs the op's rule (:mod:`.rules`, one rule per op, as
JAX's per-primitive rule tables) on the call's ``stream``, and counts the op in the
block's :class:`Report`: ``extended`` when the rule ran,
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

import contextlib
import contextvars
import functools
import gc
import inspect
import sys
import threading
import types
import weakref

import mlx.core as mx

from ..core import backends, context
from ..core.plain import plain
from ..core.autodiff import TransformUnsupportedError
from ..doubleword import aware as _aware
from ..doubleword.fusion import differentiating
from ..doubleword.types import DoubleWord
from . import (autodiff, blocks, carry, constructor, holders, registry, rules, scatter,
               standins, vmap)
from .report import Report, dropped


_report = carry.report
_recording = autodiff.recording  # (module globals: looked up once per op, not twice)
_Operands = rules.Operands


def _carries(args, kwargs) -> bool:
    """A non-empty array among the operands (or in a list of them) carries a low word."""
    has_words = carry.has_words  # (only arrays carry words: no type test first)
    for a in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(a, (list, tuple)):
            if any(has_words(b) and b.size for b in a):
                return True
        elif has_words(a) and a.size:
            return True
    return False


def _foreign(args) -> bool:
    """A non-float32 / complex64 array among the operands."""
    for a in args:
        if isinstance(a, constructor.ARRAY) and not rules.is_word_array(a):
            return True
    return False


def _on_host(e: ValueError, name: str):
    """For ``e``, raised by a rule or a fast path: MLX's "[eval] ... during function
    transformations" from one that computes on the host (cpu, emulate) under
    mx.compile / mx.vmap / an export raised as the named error; any other returns
    and the caller re-raises ``e`` (a bare ``raise``: raised here, ``e`` would hold
    this frame's reference to itself, a cycle that keeps the traceback's frames, and
    the MLX functions their locals hold, until the garbage collector runs, and the
    next block scans the heap for the references that went away)."""
    if "function transformations" not in str(e):
        return
    raise TransformUnsupportedError(
        f"{name} inside extended_precision() was traced by mx.compile, mx.vmap or an "
        f"export on backend {backends.backend()!r}, which computes on the host and cannot "
        "be traced: run it untraced inside the block, or use the 'metal' backend") from e


# id(an op's MLX function) -> its positional parameters (MLX's functions live as long
# as the module: an id is not reused; a tuple holding the function would be one the
# block warns it cannot rebind)
_PARAMETERS: dict = {}


def _parameter_names(fn) -> tuple:
    """The names of ``fn``'s positional parameters, in order (``self`` included), from
    nanobind's signature text (``def repeat(array: array, repeats: int, axis: ... =
    None, *, stream: ...)``): up to a ``*`` or ``*args``; () where there is none."""
    try:
        text = fn.__nb_signature__[0][0]
    except (AttributeError, IndexError, TypeError):
        return ()
    body, depth, parts, start = text[text.index("(") + 1:], 0, [], 0
    for k, ch in enumerate(body):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                parts.append(body[start:k])
                break
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(body[start:k])
            start = k + 1
    names = []
    for part in parts:
        name = part.split(":")[0].split("=")[0].strip()
        if name.startswith("*") or name == "stream":  # (stream stays a keyword)
            break
        if name and name != "/":
            names.append(name)
    return tuple(names)


def positional(original, args: tuple, kwargs: dict):
    """``args, kwargs`` with the keyword arguments that continue the positional ones
    (``mx.repeat(x, repeats=2, axis=1)``) moved into ``args``: the rules and the VJP
    rules read an op's arguments by position, whichever way the caller passed them
    (``stream`` stays a keyword)."""
    names = _PARAMETERS.get(id(original))
    if names is None:
        names = _PARAMETERS[id(original)] = _parameter_names(original)
    if len(args) >= len(names) or names[len(args)] not in kwargs:
        return args, kwargs
    args, kwargs = list(args), dict(kwargs)
    for name in names[len(args):]:
        if name not in kwargs:
            break
        args.append(kwargs.pop(name))
    return tuple(args), kwargs


def _wrapper(entry):
    """The stand-in for one MLX callable (:class:`~.registry.Entry`)."""
    name, original, kind, fast = entry.op, entry.original, entry.kind, entry.fast
    if kind == "value-free":  # (MLX's op, but watched in a trace of Python code: Watch)
        def plain_op(report, args, kwargs):
            return original(*args, **kwargs)

        replayable = not name.startswith(_STATEFUL)

        def free(*args, **kwargs):
            watch = _watch.get()
            if watch is not None:
                return watch.run(original, args, kwargs, False)
            report = _report.get()
            if report is not None and report._tape is not None:
                if not replayable:
                    blocks.stop(report)
                else:
                    return report._tape(free, plain_op, report, args, kwargs)
            return original(*args, **kwargs)

        return functools.update_wrapper(free, original)
    if type(fast) is rules.base.OfOriginal:
        fast = fast.make(original)
    with_report = getattr(fast, "with_report", False)  # (called with the report first)
    mutates = kind == "in-place" or name == "__setitem__"
    replayable = not (mutates or kind == "at" or name.startswith(_STATEFUL))

    def call(*args, **kwargs):
        report = _report.get()
        if report is None or not report.open:
            return original(*args, **kwargs)
        tape = report._tape
        if tape is not None:
            if replayable:
                return tape(call, run, report, args, kwargs)
            if mutates:  # (x op= y, x[i] = y of a result of the block's ops)
                return tape.in_place(call, run, report, args, kwargs, kind == "in-place")
            blocks.stop(report)
        return run(report, args, kwargs)

    def run(report, args, kwargs):
        watch = _watch.get()
        if watch is not None:  # (a trace of Python code: see Watch)
            return watch.run(call, args, kwargs, mutates)
        if mutates and args:  # a transpose noted for the GEMM no longer holds
            rules.linear.forget(args[0])
        token = _report.set(None)  # the rule and MLX's op below see plain MLX
        try:
            if kwargs:
                args, kwargs = positional(original, args, kwargs)
            recording = _recording()
            # (one op: a gradient records it, differentiated by its VJP rule; an
            # in-place update while recording takes _mutate's path)
            if fast is not None and not kwargs and (not recording or (
                    entry.vjp is not None and not mutates)):
                try:
                    out = fast(report, *args) if with_report else fast(*args)
                except ValueError as e:  # (a fused launch on emulate, traced)
                    _on_host(e, name)
                    raise
                if out is not None:
                    report.extended[name] += 1
                    if recording:
                        autodiff.record(name, entry.vjp, original, args, kwargs, out, report)
                    return out
            if not recording:
                return _run(entry, report, args, kwargs)
            if mutates and isinstance(args[0], constructor.ARRAY):
                return _mutate(entry, report, args, kwargs)
            mark = autodiff.mark()
            out = _run(entry, report, args, kwargs)
            if autodiff.mark() == mark:  # a composite rule records its ops
                autodiff.record(name, entry.vjp, original, args, kwargs, out, report)
            return out
        finally:
            _report.reset(token)

    return functools.update_wrapper(call, original) if callable(original) else call


_watch: contextvars.ContextVar = contextvars.ContextVar("mlx_precise_watch", default=None)
_STATEFUL = ("random.", "distributed.")  # ops that read or change state beside their
# arguments (the generator's key, other processes): never replayed (.blocks)


class Watch:
    """Watches the ops of Python code that MLX traces for a replay
    (:mod:`.updates`): a replay would hold an array the code read from outside its
    inputs as the value it had at the trace, and would not repeat an in-place
    update of an input. Set as :data:`_watch` around the traced call; each op the
    dispatcher runs (outside rules) is checked: its array operands must be inputs
    or results of the traced ops, and an in-place op must update one of the
    latter. ``foreign`` turns True where one is not."""

    __slots__ = ("known", "inputs", "foreign")

    def __init__(self, inputs):
        self.inputs = {id(a) for a in inputs}
        self.known = {id(a): a for a in inputs}
        self.foreign = False

    def run(self, call, args, kwargs, mutates: bool):
        known = self.known
        for a in _arrays((args, kwargs)):
            if known.get(id(a)) is not a:
                self.foreign = True
        if mutates and args and id(args[0]) in self.inputs:
            self.foreign = True
        token = _watch.set(None)
        try:
            out = call(*args, **kwargs)
        finally:
            _watch.reset(token)
        for a in _arrays(out):
            known[id(a)] = a
        return out

    def watching(self):
        """The ops inside are watched."""
        return context.setting(_watch, self)


def _arrays(tree) -> list:
    """The arrays among the leaves of ``tree`` (lists, tuples and dicts)."""
    return [v for v in vmap.leaves(tree) if isinstance(v, constructor.ARRAY)]


def _run(entry, report, args, kwargs):
    """The op: its rule on the call's stream, else MLX's (reported when it consumes
    a carried value)."""
    name, original, rule = entry.op, entry.original, entry.rule
    if rule is not None:
        stream = kwargs.pop("stream", None)
        backend = backends.backend()
        try:
            if stream is None:
                out = rule(_Operands(backend, None, report), original, *args, **kwargs)
            else:
                with mx.stream(stream):
                    out = rule(_Operands(backend, stream, report), original, *args, **kwargs)
                kwargs["stream"] = stream
        except ValueError as e:
            _on_host(e, name)
            raise
        if out is not NotImplemented:
            report.extended[name] += 1
            if entry.kind != "in-place":
                for a in args:
                    if out is a:  # MLX returns a new array, never an operand
                        return autodiff.snapshot(out)
            return out
    if _carries(args, kwargs):
        dropped(report, name, "it has no double-word rule for these operands"
                if rule is not None else registry.WITHOUT_RULE.get(
                    registry.canonical(name), "it has no double-word rule"))
    elif rule is not None and _foreign(args):
        report.plain[name] += 1
    out = original(*args, **kwargs)
    if entry.kind == "in-place" and args:
        carry.attach(args[0], None)  # MLX's own update: the old low word is stale
    return out


def _mutate(entry, report, args, kwargs):
    """An in-place update while a gradient records: the ops that read the array's
    old value keep reading it (an alias), the update is recorded as the function
    (old value, operands) -> new value, and the array now stands for the result."""
    x = args[0]
    old = autodiff.snapshot(x)
    autodiff.replace_input(x, old)
    out = _run(entry, report, args, kwargs)
    if entry.op == "__setitem__":
        autodiff.record("__setitem__", rules.VJPS["array.__setitem__"], _assigned,
                        (old, *args[1:]), {}, x, report)
    else:
        autodiff.record(entry.op, entry.vjp, entry.functional, (old, *args[1:]), kwargs, x,
                        report)
    return out


def _assigned(x, index, value):
    """``x[index] = value`` as a function (MLX's float32 VJP runs through it)."""
    y = x * 1
    y[index] = value
    return y


_REPORTS = "_mlx_precise_reports"  # the mark of a callable made by a factory stand-in


def made_callable(op: str, made, label: str):
    """``made``, a callable MLX made (a custom kernel, an imported function: the flow
    cannot see into it), as one that inside a block reports a call reading a carried
    value under ``label`` (``strict=True`` raises; it computes in the types it was
    made for) and records it for the flow's autodiff (MLX's VJP of it); elsewhere
    ``made`` runs as it is."""
    why = registry.WITHOUT_RULE[op]
    # (held in a Kept, which a heap scan skips: a closure cell holding the kernel
    # itself would be taken for a place of a kernel made before the import)
    kept = standins.Kept((made,))

    def call(*a, **k):
        report = _report.get()
        if report is None:
            return kept[0](*a, **k)
        blocks.stop(report)
        if _carries(a, k):
            dropped(report, label, why)
        out = kept[0](*a, **k)
        autodiff.opaque(label, kept[0], a, k, out, report)
        return out

    call.__doc__ = made.__doc__
    setattr(call, _REPORTS, True)
    return call


holders.raw_kernel_standin.append(functools.partial(made_callable, "fast.metal_kernel"))


def factory(op: str, make, always: bool):
    """``make`` (``mx.fast.metal_kernel``, ``mx.import_function``, ...; registry
    :data:`~.registry.FACTORIES`) whose results are :func:`made_callable` s named by
    the op and the first argument (the kernel's name, the file): ``always``, or
    while a block is open in this thread / task (the stand-in the flow installs for
    blocks). A result that already reports is returned as it is."""
    def make_reporting(*args, **kwargs):
        made = make(*args, **kwargs)
        if getattr(made, _REPORTS, False) or not (always or _report.get() is not None):
            return made
        first = kwargs.get("name", kwargs.get("file", args[0] if args else ""))
        return made_callable(op, made, f"{op} {first!r}")

    return functools.update_wrapper(make_reporting, make)


def _at(entry):
    """``x.at[index].add(v)`` & co. (scatter updates) inside a block."""
    getter = entry.original.__get__

    def at(x):
        report = _report.get()
        if report is None:
            return getter(x)
        return scatter.At(x, getter, report)

    return property(at, doc=entry.original.__doc__)


# ---- paths around the module attributes ----------------------------------------------
# A function MLX compiled (``mx.compile``, at import of mlx.nn or of a model package,
# before or after this package) passes new array objects to its trace, which carry
# no low word. While a block is open, a compiled function called inside it runs its
# Python function on the very arrays it was given (the flow sees every op); the
# compiled graph runs everywhere else. MLX's compiled functions share their type with
# its other transformed functions (mx.grad, mx.vmap, ...); a compiled one is told by
# what it keeps (gc.get_referents): (type, inputs, outputs, fun), where inputs and
# outputs are None or trees of captured state, while vmap keeps (type, in_axes,
# out_axes, fun) with int / None leaves and grad (type, fun).
_TRANSFORMED = type(plain.compile(lambda x: x))
_transformed_call = _TRANSFORMED.__call__


def _transformed_function(transformed):
    """``(fun, None)`` for a compiled function, ``(fun, (in_axes, out_axes))`` for
    a vmapped one, None for the others (a gradient made before the import)."""
    refs = gc.get_referents(transformed)
    if len(refs) != 4 or not callable(refs[3]):
        return None
    if refs[1] is None and refs[2] is None:
        return refs[3], None  # (compiled without state: mlx.nn's activations)
    leaves = vmap.leaves([refs[1], refs[2]])
    if any(type(x) is int for x in leaves) and all(x is None or type(x) is int
                                                   for x in leaves):
        return refs[3], (refs[1], refs[2])  # vmap's axes
    # compiled: its state trees of arrays, or none (a vmap mapping nothing is the same)
    return refs[3], None


def _call_transformed(self, *args, **kwargs):
    report = _report.get()
    if report is None:
        return _transformed_call(self, *args, **kwargs)
    found = _transformed_function(self)
    if found is not None and found[1] is None:
        return found[0](*args, **kwargs)
    if found is not None and not kwargs and report.open:
        blocks.stop(report)
        report.extended["vmap"] += 1
        return vmap.mapped(found[0], *found[1], args)
    return _opaque_call("a transformed function (a gradient made before mlx_precise was "
                        "imported)", _transformed_call, self, report, args, kwargs)


_CUSTOM = type(plain.custom_function(lambda x: x))
_custom_call = _CUSTOM.__call__


def _call_custom(self, *args, **kwargs):
    """An ``mx.custom_function`` called inside a block: its Python function runs on
    the caller's arrays through the flow (MLX would run it on new arrays, without
    their low words); while a gradient is recorded it is one op whose VJP rule is
    the function's own ``vjp`` (run on the carried primals, cotangents and outputs:
    double-word), or, without one, its ops are recorded (MLX's default VJP is the
    derivative of the forward). Keyword arguments, non-array arguments and MLX's
    own autodiff (a gradient taken outside the block) keep MLX's call (reported
    when it reads a carried value)."""
    report = _report.get()
    if report is None:
        return _custom_call(self, *args, **kwargs)
    parts = _custom_parts(self)
    if (parts is None or kwargs or not args or not report.open or differentiating()
            or not all(_array_or_arrays(a) for a in args)):
        return _opaque_call("mx.custom_function", _custom_call, self, report, args, kwargs)
    fun, vjp = parts
    blocks.stop(report)
    report.extended["mx.custom_function"] += 1
    if vjp is None or not _recording():
        return _fresh(fun(*args), args)
    with autodiff.unrecorded():
        out = _fresh(fun(*args), args)
    autodiff.record("mx.custom_function", _custom_vjp_rule(vjp),
                    functools.partial(_custom_call, self), args, {}, out, report)
    return out


def _fresh(out, args):
    """``out`` with every array that is one of the arguments, or an earlier output,
    replaced by an alias carrying its words, as MLX returns a new array for each
    output (an identity function's result recorded as its own input would send the
    cotangent round twice; one array returned twice would get both cotangents)."""
    seen = {id(a) for a in autodiff.arrays_in(args)}
    if isinstance(out, constructor.ARRAY):
        return autodiff.snapshot(out) if id(out) in seen else out
    if not isinstance(out, (list, tuple)):
        return out
    fresh = []
    for o in out:
        if isinstance(o, constructor.ARRAY):
            if id(o) in seen:
                o = autodiff.snapshot(o)
            seen.add(id(o))
        fresh.append(o)
    return type(out)(fresh)


def _array_or_arrays(a) -> bool:
    """An array, or a list / tuple of arrays (a custom function's argument the tape
    records)."""
    if isinstance(a, (list, tuple)):
        return all(isinstance(b, constructor.ARRAY) for b in a)
    return isinstance(a, constructor.ARRAY)


def _custom_parts(custom):
    """``(fun, vjp or None)`` of an ``mx.custom_function`` (what it keeps: its
    function, then its vjp / jvp / vmap functions where set, told apart by their
    parameters: ``vjp(primals, cotangents, outputs)`` takes three), None where they
    cannot be told apart."""
    refs = gc.get_referents(custom)[1:]
    if not refs or not callable(refs[0]):
        return None
    vjp = None
    for f in refs[1:]:
        try:
            n = len(inspect.signature(f).parameters)
        except (TypeError, ValueError):
            return None
        if n == 3:
            if vjp is not None:
                return None
            vjp = f
        elif n != 2:
            return None
    return refs[0], vjp


_CUSTOM_RULES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _custom_vjp_rule(vjp):
    """The VJP rule (:mod:`.autodiff`'s ``rule(entry, cotangent)``) of a custom
    function whose ``vjp`` is given: MLX's calling convention (a lone primal or
    cotangent as it is, several as a tuple), one per function (the float64 pass's
    compiled replay knows a tape by its rules)."""
    rule = _CUSTOM_RULES.get(vjp)
    if rule is not None:
        return rule

    def rule(entry, g):
        args = entry.args
        primals = args[0] if len(args) == 1 else tuple(args)
        cots = g if isinstance(entry.out, constructor.ARRAY) else tuple(g)
        wide = any(a.dtype == mx.float64 for a in autodiff.arrays_in(args))
        try:
            grads = vjp(primals, cots, entry.out)
        except (ValueError, RuntimeError, TypeError):
            if not wide:
                raise
            return NotImplemented  # float64 values it cannot take: MLX's float32 VJP
        if len(args) == 1:  # one primal: its cotangent (a list for a list of arrays)
            if isinstance(args[0], constructor.ARRAY):
                return [grads[0] if isinstance(grads, (list, tuple)) else grads]
            return [list(grads)]
        return list(grads)

    _CUSTOM_RULES[vjp] = rule
    return rule


def _opaque_call(name, call, self, report, args, kwargs):
    """A callable MLX runs on new arrays (its inputs' low words are not read):
    reported when it reads a carried value, and recorded for a gradient being
    taken (MLX's VJP of it). The ops inside still run through the flow (under
    mx.vmap on a host backend they raise TransformUnsupportedError)."""
    blocks.stop(report)
    if _carries(args, kwargs):
        dropped(report, name, "MLX runs it on new arrays, without their low words")
    with autodiff.unrecorded():
        out = call(self, *args, **kwargs)
    autodiff.opaque(name, lambda *a, **k: call(self, *a, **k), args, kwargs, out, report)
    return out


def _public_call(op, body, args, kwargs):
    """A public op of the package called inside a block (the hook of
    :func:`~mlx_precise.core.autodiff.host_guard`, outermost op only).

    A precision-aware function's extended twin (:func:`~..doubleword.aware.twin_of`)
    on float32 / complex64 arrays whose values carry low words, or while a gradient
    is being recorded or MLX differentiates the block, runs its flow twin: MLX's ops
    through the flow, so the words go in and come out and each op has its VJP rule.
    Every other call runs the op itself with the flow off (the package's internals
    are not the user's ops), recorded whole for a gradient (MLX's VJP of it, as for a
    custom function). An op with ``round_output`` computes in double-word: it reads
    carried operands' words (:func:`~..doubleword.types.read_input`) and its result
    keeps its low words (``round_output=True``: the rounded array carrying them);
    the convolutions' engines and the ops without it (``norm``, the fixed-point and
    int8 ops, ...) compute on float32 values: a carried operand is reported there."""
    report = _report.get()
    if not report.open:  # (a generator's block, ended elsewhere)
        return body(*args, **kwargs)
    blocks.stop(report)
    twin = _aware.twin_of(op)
    if twin is not None:
        flow, signature, reads_words = twin[1:]
    else:
        flow, signature = None, _signature(op)
        reads_words = "round_output" in signature.parameters
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as e:  # Python's message lacks the function's name
        raise TypeError(f"{op.__name__}(): {e}") from None
    words_out = "round_output" in signature.parameters
    round_output = bound.arguments.pop("round_output", True)
    backend = bound.arguments.pop("backend", None)
    carried, recording = _carries(args, kwargs), _recording() or differentiating()
    if flow is not None and (carried or recording) and _word_arrays(args, kwargs):
        report.extended[op.__name__] += 1
        with contextlib.nullcontext() if backend is None else backends.use_backend(backend):
            out = flow(*bound.args, **bound.kwargs)
        # (its words with a high word that is not the carried array itself: the flow's
        # w.hi + w.lo would count the low word twice)
        return out if round_output else carry.detached_words(out) or DoubleWord.exact(out)
    if carried and not reads_words:
        dropped(report, op.__name__, "it computes on its operands' float32 values (its "
                "array operands are not all float32 mx.arrays, or it has no double-word "
                "form)" if flow is not None else "it computes on its operands' float32 "
                "values")
    token = _report.set(None)
    try:
        if recording:  # recorded whole: MLX's VJP of it
            with autodiff.unrecorded():
                out = body(*args, **kwargs)
            autodiff.opaque(op.__name__, body, args, kwargs, out, report)
            return out
        if not words_out:
            return body(*args, **kwargs)
        out = body(*args, **{**kwargs, "round_output": False})
    finally:
        _report.reset(token)
    report.extended[op.__name__] += 1
    return carry.attach_words(out.hi, out) if round_output else out


@functools.lru_cache(maxsize=None)
def _signature(op):
    return inspect.signature(op)


def _word_arrays(args, kwargs) -> bool:
    """Every array operand a float32 / complex64 ``mx.array`` (no DoubleWord, no
    float64 data, no numpy array or list: those the engine reads at full precision)."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, constructor.ARRAY):
            if not rules.is_word_array(a):
                return False
        elif isinstance(a, (DoubleWord, list, tuple)) or hasattr(a, "__array__"):
            return False
    return True


context.public_runner.append(_public_call)



_lock = threading.Lock()
_open = 0  # blocks open in all threads


def _plan(previous: "standins.Plan | None") -> standins.Plan:
    """A plan of one wrapper per registry entry (:func:`_wrapper`; ``.at``, kernel
    factories, ``mx.array``'s constructor and properties wrapped to their kind) and
    of the ``__call__`` of MLX's transformed and custom functions."""
    by_owner: dict = {}
    for e in registry.entries():
        if e.kind == "at":
            replacement = _at(e)
        elif e.kind == "factory":
            replacement = factory(e.op, e.original, always=False)
        elif e.kind == "constructor":
            replacement = constructor.Constructor(_wrapper(e))
        elif e.kind == "property":
            replacement = property(_wrapper(types.SimpleNamespace(
                **{**vars(e), "original": e.original.__get__})), doc=e.original.__doc__)
        else:
            replacement = _wrapper(e)
        if replacement is not e.original:
            by_owner.setdefault(e.owner, {})[e.attr] = (e.original, replacement)
    by_owner[_TRANSFORMED] = {"__call__": (_transformed_call, _call_transformed)}
    by_owner[_CUSTOM] = {"__call__": (_custom_call, _call_custom)}
    classes = _class_standins()
    by_owner.update(classes)
    plan = standins.Plan(by_owner, previous, calls=(_TRANSFORMED, _CUSTOM, *classes))
    plan.classes_standing = tuple(classes)
    return plan


class_standins: list = []
"""Functions that return ``{a Python class of MLX's: {name: (original, stand-in)}}``
for a block to install (:mod:`.updates`: the optimizers' ``apply_gradients`` once
``mlx.optimizers`` is imported); the plan is rebuilt when the classes they return
change."""


def _class_standins() -> dict:
    """What :data:`class_standins` provide (asked again when a module was imported)."""
    modules = len(sys.modules)
    if _provided[0] != modules:
        found: dict = {}
        for provide in class_standins:
            found.update(provide())
        _provided[:] = [modules, found]
    return _provided[1]


_provided: list = [-1, {}]  # (len(sys.modules) when last asked, what was provided)



def _install() -> bool:
    """Install the stand-ins and rebind the places found so far; True when a heap
    scan is due (the first block of a plan, a place reassigned, a new reference to
    one of MLX's functions since the last block closed)."""
    # The plan is rebuilt when an owner no longer holds the original it was built
    # for (someone else replaced an MLX function since).
    plan = standins.plans[0] if standins.plans else None
    if plan is None or not plan.current() or (
            class_standins and tuple(_class_standins()) != plan.classes_standing):
        plan = _plan(plan)
        standins.plans.insert(0, plan)
        holders.watch["due"] = True
    plan.swap(True)
    constructor.install()
    holders.monitor(True)
    if not holders.apply_places():
        holders.watch["due"] = True
    return holders.watch["due"]


def _held_anew() -> bool:
    """A new reference to one of MLX's functions since the last block closed
    (compared in the same state: the stand-ins installed, the places and the
    outermost block's locals rebound)."""
    plan = standins.plans[0]
    plan.opened = plan.referenced()
    return plan.opened != plan.counted or len(sys.modules) != holders.watch["modules"]


def _uninstall() -> None:
    holders.monitor(False)
    constructor.uninstall()
    holders.restore_places()
    holders.watch["scanned"] = False
    standins.plans[0].swap(False)


def active() -> Report | None:
    """The report of the open block in this thread / task (None: the flow is off)."""
    report = _report.get()
    return report if report is not None and report.open else None


# A block opened while MLX's own autodiff traces (mx.grad & co. called outside every
# block): the forward runs double-word, the gradient is MLX's, each op's float32 VJP
# at its high words (on cpu MLX's derivative of the float64 values where it can
# take one): reported, and strict=True raises.
_MLX_GRADIENT = "gradient (MLX's autodiff, outside the block)"
_MLX_GRADIENT_WHY = ("mx.grad / value_and_grad / vjp / jvp, called outside every block, "
                     "differentiates it with each op's float32 derivative; open the block "
                     "around the gradient transform for double-word gradients")


class _FlowBlock:
    """The flow's part of one block (:func:`block`)."""

    __slots__ = ("on", "strict", "report", "token", "rebound")

    def __init__(self, on: bool, strict: bool):
        self.on, self.strict, self.report, self.token = on, strict, None, None
        self.rebound = None

    def __enter__(self):
        global _open
        outer = _report.get()
        if outer is not None:  # (its record stops: later ops read this block's results)
            blocks.stop(outer)
        if self.on:
            outside = differentiating()
            if outside and self.strict:
                dropped(Report(True), _MLX_GRADIENT, _MLX_GRADIENT_WHY)  # (raises)
            with _lock:
                # (strict: a scan at every block but where the last one accounted for
                # every reference and no count has changed since)
                sure = self.strict and not holders.watch["sealed"]
                if _open == 0:
                    due = _install() or sure
                else:  # (a strict block in a default one that did not scan)
                    due = sure and not holders.watch["scanned"]
                _open += 1
                try:
                    self.rebound = holders.rebind_locals(self.strict)
                    if not due and _open == 1:
                        due = _held_anew()
                    if due:
                        holders.rebind_held(self.strict)
                        if _open == 1:
                            standins.plans[0].opened = standins.plans[0].referenced()
                except BaseException:
                    self._close()
                    raise
            self.report = Report(self.strict)
            if outside:
                dropped(self.report, _MLX_GRADIENT, _MLX_GRADIENT_WHY)
            else:
                blocks.opened(self.report)
        self.token = _report.set(self.report)  # None: the flow is off inside
        return self.report

    def __exit__(self, *exc):
        if self.report is None:
            context.restore(_report, self.token)
            return False
        blocks.closed(self.report)
        self.report.open = False
        try:
            context.restore(_report, self.token)
        finally:
            with _lock:
                self._close()
        return False

    def _close(self):  # (under _lock)
        global _open
        if _open == 1:  # (the state the next _held_anew compares with)
            plan = standins.plans[0]
            plan.counted = plan.referenced()
            if plan.counted != plan.opened:  # (a reference appeared during the block)
                holders.watch["sealed"] = False
        if self.rebound is not None:
            holders.restore_locals(self.rebound)
            self.rebound = None
        _open -= 1
        if _open == 0:
            _uninstall()


def block(on: bool = True, strict: bool = False) -> _FlowBlock:
    """A context manager that opens a double-word block (``on``) and yields its
    :class:`Report`, or switches the flow off for a nested block (yields None)."""
    return _FlowBlock(on, strict)

