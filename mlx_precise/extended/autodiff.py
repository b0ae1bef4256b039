"""Gradients in double-word: the flow's own reverse mode.

MLX's ``mx.grad`` traces a function with new arrays (tracers) that carry no low
word, and sums the cotangents of a value used several times in float32. Inside a
block the flow differentiates instead, as JAX keeps a derivative rule per
primitive: while a gradient's function runs, every op that reads a value depending
on the differentiated inputs is recorded on a tape (the op, its arguments, its
outputs); then the tape is walked backwards, each op's cotangents computed by its
VJP rule (declared next to its rule, :mod:`.rules`) out of flow ops, so in
double-word, and the cotangents of a value used several times summed in
double-word. The inputs are the caller's own arrays (their low words kept), and the
gradients are arrays that carry low words like any other value.

* Composite rules (a rule that runs ops of the flow, such as ``softmax`` or the
  convolutions) are not recorded: their sub-ops are.
* An op without a VJP rule (or without a rule) gets MLX's float32 VJP of its
  high words, and the block reports it (``"<op> (gradient)"``; ``strict=True``
  raises).
* The VJP rules run with the flow on, so a gradient taken inside another gradient
  records its own backward pass on the outer tape: higher-order derivatives.

Public: :func:`grad`, :func:`value_and_grad`, :func:`vjp`, :func:`jvp` (what
``mx.grad`` & co. become while a block is open in the calling thread).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy

import mlx.core as mx

from ..core import backends, context, jit
from ..doubleword.engine64 import from64
from ..core.plain import plain
from ..doubleword import fusion
from . import carry, recipes
from .carry import as64
from .constructor import ARRAY  # the class (mx.array is a stand-in inside blocks)
from .report import Report, dropped

# False: the backward pass runs with the flow on on every backend (tests compare
# the two passes on cpu; :func:`backward`).
FLOAT64_PASS = True

# The tapes of the gradients being taken in this thread / task, innermost last.
_tapes: contextvars.ContextVar[tuple] = contextvars.ContextVar("mlx_precise_tapes",
                                                               default=())


class Tape:
    """The ops recorded while one gradient's function runs."""

    def __init__(self):
        self.entries: list = []
        self.tracked: dict[int, mx.array] = {}  # id -> the array (kept alive)
        self.complex = False  # a complex value was recorded (no float64 pass)

    def watch(self, a: mx.array) -> None:
        self.tracked[id(a)] = a
        self.complex = self.complex or a.dtype == mx.complex64

    def tracks(self, a) -> bool:
        return isinstance(a, ARRAY) and self.tracked.get(id(a)) is a


class Entry:
    """One recorded op: its name, VJP rule (None: MLX's float32 VJP of
    ``original``), arguments, output (``outs``: its arrays) and block report."""

    def __init__(self, name, vjp, original, args, kwargs, out, outs, report):
        self.name, self.vjp, self.original, self.report = name, vjp, original, report
        self.args, self.kwargs, self.out, self.outs = args, kwargs, out, outs


def recording() -> bool:
    return bool(_tapes.get())


def unrecorded():
    """Run code whose ops no tape records (the caller records it as one op)."""
    return context.setting(_tapes, ())


def mark() -> int:
    """How many ops the open tapes hold (a rule that recorded ops is composite)."""
    tapes = _tapes.get()
    return len(tapes[0].entries) if len(tapes) == 1 else sum(len(t.entries) for t in tapes)


def arrays_in(value) -> list:
    """The arrays in an argument (an array, or a list / tuple of them)."""
    if isinstance(value, ARRAY):
        return [value]
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in arrays_in(v)]
    return []


_INEXACT = frozenset((mx.float32, mx.float64, mx.complex64, mx.float16, mx.bfloat16))
_F32, _F64, _C64 = mx.float32, mx.float64, mx.complex64


def _held(value):
    """An op's argument as the tape keeps it: lists copied (MLX reads a shape or an
    axis list at the call, and callers reuse the list afterwards: nn.Upsample's
    nearest mode reshapes with a list it then edits for the next reshape)."""
    if isinstance(value, list):
        return [_held(v) for v in value]
    if isinstance(value, tuple) and any(isinstance(v, list) for v in value):
        return tuple(_held(v) for v in value)
    return value


def record(name: str, vjp, original, args, kwargs, out, report) -> None:
    """Record one op on every tape whose differentiated inputs it reads."""
    # (once per op while a gradient records: plain loops, no comprehension or
    # generator where one array is the common case)
    ins = args
    for a in args:
        if not isinstance(a, ARRAY):  # lists of arrays, scalars
            ins = None
            break
    if ins is None or kwargs:
        ins = [a for v in (*args, *kwargs.values()) for a in arrays_in(v)]
    outs = held = None
    for tape in _tapes.get():
        tracked = tape.tracked
        for a in ins:
            if tracked.get(id(a)) is a:
                break
        else:
            continue
        if outs is None:
            if isinstance(out, ARRAY):
                outs = [out]
                kind = out.dtype
                if kind not in _INEXACT:
                    return  # booleans and integers take no gradient
                inexact, complex_ = outs, kind == _C64
            else:
                outs = arrays_in(out)
                inexact = [o for o in outs if o.dtype in _INEXACT]
                if not inexact:
                    return
                complex_ = any(o.dtype == _C64 for o in outs)
            for a in ins:
                if complex_:
                    break
                complex_ = a.dtype == _C64
        if held is None:
            held = _held(args), {k: _held(v) for k, v in kwargs.items()} if kwargs else kwargs
        tape.entries.append(Entry(name, vjp, original, *held, out, outs, report))
        if complex_:
            tape.complex = True
        for o in inexact:
            tracked[id(o)] = o


def opaque(name: str, fn, args, kwargs, out, report) -> None:
    """Record a call the flow cannot see into (a precision-aware function of this
    package, a vmapped or custom function, ...): if it read a differentiated value,
    its derivative is MLX's VJP of ``fn`` (reported when the backward pass runs)."""
    if _tapes.get() and report is not None:
        record(name, None, fn, args, kwargs, out, report)


def replace_input(old: mx.array, new: mx.array) -> None:
    """``old`` is about to change in place: the recorded ops that read it read
    ``new`` (an alias of its current value) instead."""
    for tape in _tapes.get():
        if not tape.tracks(old):
            continue
        for e in tape.entries:
            e.args = _swap(e.args, old, new)
            if e.out is old or any(o is old for o in e.outs):
                e.out = _swap(e.out, old, new)
                e.outs = arrays_in(e.out)
        tape.tracked.pop(id(old))
        tape.watch(new)


def _swap(value, old, new):
    if value is old:
        return new
    if isinstance(value, (list, tuple)):
        return type(value)(_swap(v, old, new) for v in value)
    return value


def snapshot(x: mx.array) -> mx.array:
    """An alias of ``x``'s current value that an in-place update of ``x`` leaves
    alone, carrying x's low word (MLX's copy shares the value). With the flow on,
    an enclosing gradient records the copy (a leaf of a gradient inside a
    gradient depends on the outer one's)."""
    return snapshots([x])[0]


def snapshots(xs: list) -> list:
    """:func:`snapshot` of each of ``xs`` (the flow suspended once for all)."""
    with contextlib.nullcontext() if _tapes.get() else carry.suspended():
        return [carry.copy(x, copy.copy(x)) for x in xs]


# ---- the reverse pass -------------------------------------------------------------


def _slots(entry):
    """Where the arrays of an op's arguments are: (position or keyword, index in a
    list argument or None, the array)."""
    def inexact(a):  # integer operands (indices) take no gradient: MLX refuses them
        return isinstance(a, ARRAY) and mx.issubdtype(a.dtype, mx.inexact)

    out = []
    for key, v in (*enumerate(entry.args), *entry.kwargs.items()):
        if inexact(v):
            out.append((key, None, v))
        elif isinstance(v, (list, tuple)):
            out.extend((key, j, a) for j, a in enumerate(v) if inexact(a))
    return out


def _float32_vjp(entry, gs):
    """MLX's float32 VJP of an op's high words (no double-word rule for it):
    cotangents of its positional arguments (a list for a list argument) and a dict
    of those of its keyword arguments."""
    slots = _slots(entry)

    def f(*arrays):
        args, kwargs = list(entry.args), dict(entry.kwargs)
        for (key, j, _), a in zip(slots, arrays):
            target = args if isinstance(key, int) else kwargs
            if j is None:
                target[key] = a
            else:
                items = list(target[key])
                items[j] = a
                target[key] = type(target[key])(items)
        return entry.original(*args, **kwargs)

    cots = list(gs) if isinstance(entry.out, (list, tuple)) else [gs]
    primals = [a for _, _, a in slots]

    def pullback(*arrays):
        with carry.suspended():
            return mx.vjp(f, list(arrays[:len(primals)]), list(arrays[len(primals):]))[1]

    grads = pullback(*primals, *cots) if slots else []
    # a gradient being taken of this backward pass (second order) sees it too
    record(f"{entry.name} (gradient)", None, pullback, (*primals, *cots), {}, list(grads),
           entry.report)
    out = [[None] * len(a) if isinstance(a, (list, tuple)) else None for a in entry.args]
    named = {}
    for (key, j, a), g in zip(slots, grads):
        g = g if mx.issubdtype(a.dtype, mx.inexact) else None
        if not isinstance(key, int):
            named[key] = g
        elif j is None:
            out[key] = g
        else:
            out[key][j] = g
    dropped(entry.report, f"{entry.name} (gradient)",
            "its derivative has no double-word rule: MLX's float32 VJP ran")
    return out, named


def _accumulate(cot: dict, a: mx.array, g, wide: bool) -> None:
    """Add ``g`` to the cotangent of ``a`` (in float64 for a float32 ``a`` on the
    float64 pass, else in ``a``'s dtype)."""
    if g is None:
        return
    if g.shape != a.shape:
        raise AssertionError(f"mlx_precise: a VJP rule gave a cotangent of shape "
                             f"{g.shape} for an operand of shape {a.shape}")
    kind = a.dtype
    want = _F64 if wide and kind == _F32 else kind
    if g.dtype != want and kind != _F64 and mx.issubdtype(kind, mx.floating):
        g = mx.real(g) if mx.issubdtype(g.dtype, mx.complexfloating) and not mx.issubdtype(
            kind, mx.complexfloating) else g.astype(want)
    key = id(a)
    prev = cot.get(key)
    cot[key] = g if prev is None else prev + g  # double-word, or float64


def _float64_pass(tape: Tape) -> bool:
    """Whether ``tape``'s backward pass runs in MLX float64 with the flow off: on a
    float64 engine (cpu, where the values are carried as float64 anyway), with no
    enclosing gradient recording (an outer tape must see the backward's ops:
    higher order, jvp), and real values only (MLX has no complex128)."""
    return (FLOAT64_PASS and not tape.complex and not _tapes.get()
            and backends.backend().float64_engine)


class _Float64Values:
    """float32 arrays -> their exact float64 values (high + low word), each array
    converted once per backward pass; other values as they are."""

    def __init__(self):
        self.seen = {}  # id -> (array, its float64 value)

    def array(self, v: mx.array):
        hit = self.seen.get(id(v))
        if hit is None or hit[0] is not v:
            hit = self.seen[id(v)] = (v, as64(v))  # (as64 leaves other dtypes alone)
        return hit[1]

    def __call__(self, v):
        if isinstance(v, ARRAY):
            return self.array(v)
        if isinstance(v, (list, tuple)):
            return type(v)([self(x) for x in v])
        if isinstance(v, dict):
            return {k: self(x) for k, x in v.items()} if v else v
        return v

    def entry(self, e: Entry) -> Entry:
        """``e`` with its operands and output at their float64 values (what its VJP
        rule reads on the float64 pass)."""
        array = self.array
        args = tuple([array(v) if isinstance(v, ARRAY) else self(v) for v in e.args])
        out = array(e.out) if isinstance(e.out, ARRAY) else self(e.out)
        return Entry(e.name, e.vjp, e.original, args, self(e.kwargs) if e.kwargs else e.kwargs,
                     out, None, e.report)


class _Traced(_Float64Values):
    """The float64 values of a pass being traced: every array's is given (an input
    of the compiled function); any other array would be a constant of the trace."""

    def __init__(self, seen: dict):
        self.seen = seen

    def array(self, v: mx.array):
        hit = self.seen.get(id(v))
        if hit is None or hit[0] is not v:
            raise _Untraceable("an array outside the tape")
        return hit[1]


def _zeros_for(o: mx.array, wide: bool) -> mx.array:
    return mx.zeros(o.shape, mx.float64) if wide and o.dtype == mx.float32 else mx.zeros_like(o)


def backward(tape: Tape, seeds: list, report, wanted: list | None = None) -> dict:
    """Walk ``tape`` backwards from ``seeds`` ((array, cotangent) pairs); returns
    id(array) -> cotangent (with ``wanted``, a list of arrays: at least theirs).

    Two ways, with the same VJP rules: on the cpu backend (outside any enclosing
    gradient, real values) the rules run with the flow off on the float64 values
    of the operands, and the cotangents are float64 arrays (MLX's float64 ops, 53
    bits, where the flow's would be ~48: no per-op dispatch, no split into words
    between steps); elsewhere they run with the flow on, in double-word, and the
    pass is itself recorded by an enclosing gradient. :func:`narrowed` turns a
    float64 cotangent into the array the user gets. The float64 pass of a tape
    whose structure was seen ``COMPILE_AT`` times replays as one compiled MLX
    function (:func:`_replayed`: a training loop's step); on metal the flow's pass
    of a structure seen :data:`~.recipes.REPLAY_AT` times does
    (:func:`_replayed_flow`)."""
    wide = _float64_pass(tape)
    if wanted is not None and COMPILED_PASS and _tracing.get() is None:
        if wide:
            cot = _replayed(tape, seeds, wanted)
        elif not _tapes.get() and recipes.gpu_replays(backends.backend()):
            cot = _replayed_flow(tape, seeds, wanted, report)
        else:
            cot = None
        if cot is not None:
            return cot
    cot: dict = {}
    with contextlib.ExitStack() as stack:
        if wide:
            stack.enter_context(carry.suspended())
            stack.enter_context(mx.stream(mx.cpu))
            value = _Float64Values()
        else:
            stack.enter_context(carry.reporting(report))
            value = None
        _reverse(tape, seeds, cot, value, wide)
    return cot


def _reverse(tape: Tape, seeds: list, cot: dict, value, wide: bool, strict: bool = False):
    """The walk of :func:`backward` (``value``: the float64 values of the operands on
    the float64 pass, else None); ``strict``: an op without a double-word VJP
    raises :class:`_Untraceable` instead of running MLX's float32 VJP."""
    for a, g in seeds:
        _accumulate(cot, a, g if value is None else value(g), wide)
    tracked = tape.tracked
    for e in reversed(tape.entries):
        out = e.out
        if isinstance(out, ARRAY):  # (most ops: one output)
            g = cot.get(id(out))
            if g is None:
                continue
            gs = None
        else:
            gs = [cot.get(id(o)) for o in e.outs]
            if all(g is None for g in gs):
                continue
            g = gs = [_zeros_for(o, wide) if g is None else g for o, g in zip(e.outs, gs)]
        grads, named = None, {}
        if e.vjp is not None and not (e.kwargs and any(
                tape.tracks(a) for v in e.kwargs.values() for a in arrays_in(v))):
            grads = e.vjp(e if value is None else value.entry(e), g)
        if grads is None or grads is NotImplemented:
            if strict:
                raise _Untraceable(e.name)
            if wide:  # MLX's float32 VJP reads the float32 values (reported)
                g = g.astype(out.dtype) if gs is None else [
                    x.astype(o.dtype) for x, o in zip(gs, e.outs)]
            grads, named = _float32_vjp(e, g)
        for key, ga in named.items():
            if ga is not None and tape.tracks(e.kwargs[key]):
                _accumulate(cot, e.kwargs[key], ga, wide)
        for arg, ga in zip(e.args, grads):
            if ga is None:
                continue
            if isinstance(arg, ARRAY):
                if tracked.get(id(arg)) is arg:
                    _accumulate(cot, arg, ga, wide)
            elif isinstance(arg, (list, tuple)):
                for a, gi in zip(arg, ga):
                    if gi is not None and tape.tracks(a):
                        _accumulate(cot, a, gi, wide)


# ---- the float64 pass replayed --------------------------------------------------------
# A training loop records the same tape at every step: the same ops on arrays of the
# same shapes, only the values differ. Its float64 pass, traced once by mx.compile
# (MLX's float64 ops, the same ones in the same order: the compiler fuses elementwise
# ops into loops without contracting a * b + c, so the same bits; but it writes a
# scalar constant -0.0 as 0, so a tape with one is not compiled), then replays without
# running the VJP rules' Python. A tape is known by its structure (:func:`_structure`:
# each op's VJP rule, its non-array arguments, and for each array its place among the
# pass's arrays, shape, dtype and whether it is differentiated), compiled when seen
# COMPILE_AT times (a trace costs about ten op-by-op passes where MLX has built its
# CPU kernels before, and seconds where it has not: MLX compiles them with the system
# C++ compiler, about 7 s for the benchmark MLP's pass on a fresh temporary folder,
# measured; so gradients taken a few dozen times never compile) and dropped when it cannot be traced (an op without a
# double-word VJP, a rule that reads values).

COMPILED_PASS = True
COMPILE_AT = jit.COMPILE_AT
# structure -> _Pass / _FlowPass, or None (cannot be traced); bounded
_passes = recipes.Sightings(seen_max=256, made_max=64)
# (the pass a compiled call is for, read by its trace; a float64 pass inside it runs
# op by op, traced with it)
_tracing: contextvars.ContextVar = contextvars.ContextVar("mlx_precise_tracing", default=None)


class _Untraceable(Exception):
    """The float64 pass of this tape cannot be one compiled function."""


_KEYED = (int, bool, str, type(None), type(Ellipsis), type(mx.float32))


def _structure(tape: Tape, seeds: list, wanted: list):
    """(key, arrays): the structure of the float64 pass over ``tape`` (a hashable
    tuple: each value written as a self-delimiting run of items) and the distinct
    arrays it reads, in order of first use; raises :class:`_Untraceable` for an
    argument it cannot key."""
    w = _Writing(tape.tracked)
    w.add(str(backends.backend()))
    w.add(len(seeds))
    for a, g in seeds:
        w.write((a, g))
    for e in tape.entries:
        w.add(e.name)
        w.add(e.vjp)
        w.write((e.args, e.kwargs, e.out))
    w.write(wanted)
    return tuple(w.key), w.arrays


class _Writing:
    """A pass's structure being written (:func:`_structure`). (A class, not a
    recursive closure: that is a reference cycle, which would hold the tape's
    arrays until the garbage collector ran.)"""

    __slots__ = ("index", "arrays", "key", "add", "tracked")

    def __init__(self, tracked: dict):
        self.index: dict = {}
        self.arrays: list = []
        self.key: list = []
        self.add = self.key.append
        self.tracked = tracked

    def write(self, values) -> None:
        # each value: an array as its index among ``arrays`` when seen before, else
        # its shape (a tuple), dtype and whether it is differentiated; any other
        # value as its type, then its contents (one call per container, not per item)
        add, index, arrays = self.add, self.index, self.arrays
        for v in values:
            if isinstance(v, ARRAY):
                i = index.get(id(v))
                if i is None:
                    index[id(v)] = len(arrays)
                    arrays.append(v)
                    add(v.shape)
                    add(v.dtype)
                    add(self.tracked.get(id(v)) is v)
                else:
                    add(i)
                continue
            t = type(v)
            add(t)
            if t is tuple or t is list:
                add(len(v))
                self.write(v)
            elif t is dict:
                add(len(v))
                for k, x in v.items():
                    add(k)
                    self.write((x,))
            elif t in _KEYED:
                add(v)
            elif t is float or t is complex:
                # (MLX's compiled CPU kernels write a scalar constant -0.0 as 0: a
                # pass with one would replay with +0.0)
                if recipes.negative_zero(v):
                    raise _Untraceable("-0.0")
                add(repr(v))
            elif t is slice:
                self.write((v.start, v.stop, v.step))
            else:
                raise _Untraceable(t.__name__)


class _Pass:
    """One structure's float64 pass, compiled: called with the tape being walked
    (read only while tracing), returns the cotangents of ``wanted``."""

    def __init__(self):
        self.compiled = jit.compile(self._trace, at_once=True)
        # for each of ``wanted`` (set by the trace): 0 no cotangent, 1 its cotangent,
        # 2 its float64 cotangent and that rounded to float32 (narrowed in the graph)
        self.outputs = None

    def _trace(self, *values):
        tape, seeds, wanted, arrays = _tracing.get()
        value = _Traced({id(a): (a, v) for a, v in zip(arrays, values)})
        cot: dict = {}
        _reverse(tape, seeds, cot, value, True, strict=True)
        kinds, outs = [], []
        for a in wanted:
            g = cot.get(id(a))
            if g is None:
                kinds.append(0)
            elif g.dtype == _F64 and a.dtype == _F32:
                kinds.append(2)
                outs += [g, g.astype(_F32)]
            else:
                kinds.append(1)
                outs.append(g)
        self.outputs = kinds
        return outs

    def __call__(self, tape, seeds, wanted, arrays) -> dict:
        """id(array) -> cotangent for ``wanted`` (a float32 array's already
        narrowed: :func:`narrowed`)."""
        token = _tracing.set((tape, seeds, wanted, arrays))
        try:
            outs = iter(self.compiled(*[as64(a) for a in arrays]))
        finally:
            _tracing.reset(token)
        return {id(a): next(outs) if kind == 1 else narrowed(next(outs), a, next(outs))
                for a, kind in zip(wanted, self.outputs) if kind}


def _replayed(tape: Tape, seeds: list, wanted: list) -> dict | None:
    """The cotangents of ``wanted`` by the compiled float64 pass of ``tape``'s
    structure, or None (the pass runs op by op: seen fewer than COMPILE_AT times,
    untraceable)."""
    try:
        key, arrays = _structure(tape, seeds, wanted)
        hit = _passes.get(key)
    except (_Untraceable, TypeError):  # (TypeError: an unhashable VJP rule or value)
        return None
    if hit is False:
        if not _passes.sighted(key, COMPILE_AT):
            return None
        hit = _Pass()
        _passes.put(key, hit)
    elif hit is None:
        return None
    with carry.suspended(), mx.stream(mx.cpu):
        try:
            return hit(tape, seeds, wanted, arrays)
        except Exception:  # noqa: BLE001  (traced once: the pass runs op by op)
            if hit.outputs is not None:
                raise
            _passes.put(key, None)
            return None


# ---- the flow's pass replayed (metal) ----------------------------------------------------
# On the metal backend the pass runs the VJP rules with the flow on, in double-word:
# the same tape at every step of a training loop builds the same graph of launches.
# It is traced once per structure by mx.compile (as the float64 pass above and as a
# rule's graph, extended.recipes): the key adds what the block recorded of each
# array's words (recipes.described); the trace notes that on its inputs in a scope
# of its own and runs the rules on them, with a report of its own (a trace whose
# rules drop a value to float32, or run MLX's op on an operand they do not extend,
# is not kept: the pass runs op by op and reports it); the cotangents and what they
# carry are the replay's outputs, and each replay adds the trace's counts of
# extended ops to the block's report. Not inside an enclosing gradient (its tape
# records the pass's ops).


class _FlowValues(_Float64Values):
    """The arrays of a flow pass being traced: each one's input of the compiled
    function (any other array would be a constant of the trace); the entries'
    report the trace's own (a rule that takes a gradient of its own reports there)."""

    def __init__(self, seen: dict, report):
        self.seen, self.report = seen, report

    def array(self, v: mx.array):
        hit = self.seen.get(id(v))
        if hit is None or hit[0] is not v:
            raise _Untraceable("an array outside the tape")
        return hit[1]

    def entry(self, e: Entry) -> Entry:
        outs = None if e.outs is None else [self(o) for o in e.outs]
        return Entry(e.name, e.vjp, e.original, self(e.args),
                     self(e.kwargs) if e.kwargs else e.kwargs, self(e.out), outs, self.report)


class _FlowPass:
    """One structure's flow pass, compiled (see above)."""

    def __init__(self):
        self.compiled = plain.compile(self._trace)
        self.results = self.counts = None  # set by the trace

    def _trace(self, *values):
        tape, seeds, wanted, arrays, state, report = _tracing.get()
        own = Report(False)
        with fusion.private_scope():
            recipes.note_described(state, values, own)
            value = _FlowValues({id(a): (a, v) for a, v in zip(arrays, values)}, own)
            cot: dict = {}
            with carry.reporting(own):
                _reverse(tape, seeds, cot, value, False, strict=True)
            if own.float32 or own.plain:
                raise _Untraceable("a value left double-word")
            self.results, outs = recipes.results([cot.get(id(a)) for a in wanted])
        self.counts = own.extended
        return outs

    def __call__(self, tape, seeds, wanted, arrays, state, report) -> dict:
        token = _tracing.set((tape, seeds, wanted, arrays, state, report))
        try:
            with carry.suspended():
                outs = recipes.COMPILED_CALL(self.compiled, *arrays)
        finally:
            _tracing.reset(token)
        report.extended.update(self.counts)
        got = recipes.noted_results(self.results, outs)
        return {id(a): g for a, g in zip(wanted, got) if g is not None}



def _replayed_flow(tape: Tape, seeds: list, wanted: list, report) -> dict | None:
    """The cotangents of ``wanted`` by the compiled flow pass of ``tape``'s
    structure, or None (the pass runs op by op: seen fewer than
    :data:`~.recipes.REPLAY_AT` times, untraceable)."""
    try:
        key, arrays = _structure(tape, seeds, wanted)
        state_key, inputs, state = recipes.described(arrays, report)
        key = ("flow", key, state_key)
        hit = _passes.get(key)
    except (_Untraceable, recipes.Unkeyed, TypeError):
        return None
    if hit is False:
        if not _passes.sighted(key):
            return None
        hit = _FlowPass()
        _passes.put(key, hit)
    elif hit is None:
        return None
    try:
        return hit(tape, seeds, wanted, inputs, state, report)
    except Exception:  # noqa: BLE001  (traced once: the pass runs op by op)
        if hit.results is not None:
            raise
        _passes.put(key, None)
        return None


def narrowed(g, like: mx.array, hi: mx.array | None = None):
    """A cotangent from :func:`backward` as the gradient of ``like``: a float64
    cotangent of a float32 array becomes float32 high words carrying the float64
    value (as the cpu engine's results do; ``hi``: those words when computed
    already). Runs with the flow off."""
    if g.dtype != _F64 or like.dtype != _F32:
        return g
    if hi is None:
        with mx.stream(mx.cpu):
            hi = from64(g).hi
    return carry.attach(hi, None, (g, None))


# ---- the transforms --------------------------------------------------------------


def _flatten(tree, out):
    """Leaves of a tree of arrays (dicts, lists, tuples) in order."""
    if isinstance(tree, ARRAY):
        out.append(tree)
    elif isinstance(tree, dict):
        for v in tree.values():
            _flatten(v, out)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            _flatten(v, out)
    return out


def _rebuild(tree, values):
    if isinstance(tree, ARRAY):
        return next(values)
    if isinstance(tree, dict):
        return {k: _rebuild(v, values) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_rebuild(v, values) for v in tree)
    return tree


def _run(fun, args, kwargs, argnums, argnames, report):
    """Run ``fun`` with a tape watching the leaves of the differentiated
    arguments; returns (output, tape, leaves per argument).

    As MLX's tracers, the differentiated leaves are new arrays (aliases of the
    values, with their low words): the same array reached another way (a closure,
    a global) stays a constant."""
    tape = Tape()
    args, kwargs = list(args), dict(kwargs)
    diff, named = {}, {}
    for i in argnums:
        diff[i] = leaves = snapshots(_flatten(args[i], []))
        args[i] = _rebuild(args[i], iter(leaves))
    for k in argnames:
        named[k] = leaves = snapshots(_flatten(kwargs[k], []))
        kwargs[k] = _rebuild(kwargs[k], iter(leaves))
    for leaves in (*diff.values(), *named.values()):
        for leaf in leaves:
            tape.watch(leaf)
    token = _tapes.set((*_tapes.get(), tape))
    try:
        with carry.reporting(report):
            out = fun(*args, **kwargs)
    finally:
        _tapes.reset(token)
    return out, tape, args, kwargs, diff, named


def _gradients(tape, seeds, args, kwargs, diff, named, report):
    cot = backward(tape, seeds, report, [a for leaves in (*diff.values(), *named.values())
                                         for a in leaves])

    def grads_of(tree, leaves):
        gs = []
        with carry.suspended():  # (the casts of narrowed are the package's, not the user's)
            for a in leaves:
                g = cot.get(id(a))
                if g is None:
                    with carry.reporting(report):
                        g = mx.zeros_like(a)
                gs.append(narrowed(g, a))
        return _rebuild(tree, iter(gs))

    pos = tuple(grads_of(args[i], leaves) for i, leaves in diff.items())
    kw = {k: grads_of(kwargs[k], leaves) for k, leaves in named.items()}
    return pos, kw


def _argnums(argnums, argnames, nargs):
    if argnums is None:
        argnums = () if argnames else 0
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)
    for i in nums:
        if not -nargs <= i < nargs:
            raise ValueError(f"[grad] Invalid argument number {i} for a function of "
                             f"{nargs} positional arguments")
    return tuple(i % nargs for i in nums), single


def value_and_grad(fun, argnums=None, argnames=(), *, report):
    """``mx.value_and_grad`` in double-word (see the module docstring)."""
    argnames = (argnames,) if isinstance(argnames, str) else tuple(argnames)

    def wrapped(*args, **kwargs):
        nums, single = _argnums(argnums, argnames, len(args))
        out, tape, args, kwargs, diff, named = _run(fun, args, kwargs, nums, argnames, report)
        value = out[0] if isinstance(out, (list, tuple)) else out
        if not isinstance(value, ARRAY) or value.size != 1:
            raise ValueError("[value_and_grad] The return value of the function whose "
                             "gradient we want to compute should be either a scalar array "
                             "or a list with the first element being a scalar array.")
        with carry.reporting(report):
            seed = mx.ones_like(value)
        pos, kw = _gradients(tape, [(value, seed)], args, kwargs, diff, named, report)
        g = pos[0] if single else pos
        return out, ((g, kw) if argnames else g)

    return wrapped


def grad(fun, argnums=None, argnames=(), *, report):
    vg = value_and_grad(fun, argnums, argnames, report=report)

    def wrapped(*args, **kwargs):
        return vg(*args, **kwargs)[1]

    return wrapped


def vjp(fun, primals, cotangents, *, report):
    """``mx.vjp``: (outputs, VJPs) of ``fun`` at ``primals`` (lists of arrays)."""
    primals = list(primals)
    out, tape, primals, _, diff, _ = _run(fun, primals, {}, tuple(range(len(primals))), (),
                                          report)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    pos, _ = _gradients(tape, list(zip(outs, cotangents)), primals, {}, diff, {}, report)
    return outs, list(pos)


def jvp(fun, primals, tangents, *, report):
    """``mx.jvp`` as the transpose of the VJP: ``u -> vjp(fun)(primals, u)`` is
    linear in ``u``; its own VJP at ``tangents`` is ``J t`` (two reverse passes,
    the first one recorded)."""
    primals = list(primals)
    outs0 = None

    def pullback(*us):
        nonlocal outs0
        outs, vjps = vjp(fun, primals, list(us), report=report)
        outs0 = outs
        return vjps

    with carry.reporting(report):
        probe = fun(*primals)
        probe = list(probe) if isinstance(probe, (list, tuple)) else [probe]
        us = [mx.zeros_like(o) for o in probe]
    _, jvps = vjp(pullback, us, list(tangents), report=report)
    return outs0, jvps
