"""A rule's graph replayed by ``mx.compile`` on the metal backend.

The kernel forms of the composite rules (``layer_norm``, ``rms_norm``, ``softmax``,
``logsumexp``, ``scaled_dot_product_attention``, ``rope``), the GEMM and ``addmm``,
``einsum``, the FFTs, the depthwise convolution and complex words' arithmetic,
``exp`` and movements run dozens of Python steps per call (programs composed,
launches planned, words recorded) to build a graph of a few launches and views:
30-200 us of host time against 1-10 us for MLX's own op. That graph depends only
on the call's structure: the shapes and dtypes of its arrays, its other arguments,
and what the block recorded of each operand's words (its low word, the expression
that made it, its packed words, a single value's copies, complex words' parts,
the array a transpose views: :func:`fusion.state_of
<mlx_precise.doubleword.fusion.state_of>`, :data:`views`). So from the second call
of a structure on, the form runs as a function traced once by MLX's compiler
(``mx.compile``, as JAX's ``jit`` caches a trace per abstract signature): the call
replays the traced graph on the new arrays, the same launches of the same programs
on the same operands, so the same bits, without the form's Python. The trace runs
in a scope of its own (nothing it records reaches the block), with each operand's
recorded state noted again on its traced stand-in; what the result carries (its
low word, expression, packed words, ...) is an output of the replay, recorded in
the block as the form records it, so the next op composes the result as it would
the form's.

Only on the metal backend (emulate's and cpu's kernels run on the host and cannot
be traced), outside gradient recording and MLX's autodiff (the callers' condition,
``rules.base.kernel_form``), with no ``stream`` argument, and not inside a function
MLX traces (:func:`tracing`); a structure whose arguments cannot be keyed (a value
other than an array, a number, a string, None, ``...``, a slice or tuple of them or
an object marked :func:`static`; a -0.0 argument), or whose trace fails or
declines, runs the form at each call.
"""

from __future__ import annotations

import contextvars
import functools
import math

import mlx.core as mx

from ..core import context, jit
from ..core.plain import plain
from ..doubleword import fusion
from . import carry
from .constructor import ARRAY
from .standins import Kept

ENABLED = True
"""False: the forms run at every call (for comparisons)."""

REPLAY_AT = 2
"""Sightings of a structure at which it is traced (a trace costs about two calls of
the form; a structure seen once, in a script or a test, is never traced)."""


# id -> (an object keyed by its identity,): kept, so its id is not reused; in a Kept,
# which a block's heap scan skips (MLX's functions are among them: a structure or a
# template holds their ids, never them)
_statics: dict = {}


def held(obj) -> bool:
    """Whether ``obj`` is marked :func:`static`."""
    kept = _statics.get(id(obj))
    return kept is not None and kept[0] is obj


def static(obj):
    """Mark ``obj`` (a function that lives as long as the process: MLX's, a rule's
    plan) as an argument a structure holds by its identity. Returns ``obj``."""
    _statics[id(obj)] = Kept((obj,))
    return obj


views: list = []
"""What a rule records of an array beside its words, as ``(read, note)`` pairs:
``read(x, report)``, the words ``(hi, lo)`` of which ``x`` is a recorded view in the
block of ``report``, or None; ``note(x, words, report)`` records that again on a
trace's stand-ins (``rules.linear``'s noted transposes, which its GEMM reads with
swapped strides)."""

_F32, _C64 = mx.float32, mx.complex64
_STATIC = (int, bool, str, type(None), type(Ellipsis))
COMPILED_CALL = type(plain.compile(lambda x: x)).__call__
"""MLX's call of a compiled function (captured at import: while a block is open the
flow stands in for it, :mod:`.dispatch`)."""
_calling: contextvars.ContextVar = contextvars.ContextVar("mlx_precise_recipe", default=None)


class _Unkeyed(Exception):
    """An argument the structure cannot hold."""


class _Declined(Exception):
    """The form declined, or returned other than one real array, in its trace."""


class _Slot:
    """An array argument's place among the replay's inputs (in an argument template)."""

    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i


class _Keying:
    """One call's structure being written: its key (a list, :meth:`add`), the
    distinct arrays it reads numbered in order of first use (:meth:`place`), the
    word operands' descriptions and the recorded views'. (A class, not closures:
    a recursive closure is a reference cycle, which would hold the call's arrays,
    the nodes of the block's graph, until the garbage collector ran.)"""

    __slots__ = ("index", "arrays", "key", "add", "operands", "seen_as", "report")

    def __init__(self, report=None):
        self.index: dict = {}
        self.arrays: list = []
        self.key: list = []
        self.add = self.key.append
        self.operands: list = []
        self.seen_as: list = []
        self.report = report

    def place(self, a) -> int:
        i = self.index.setdefault(id(a), len(self.arrays))
        if i == len(self.arrays):
            self.arrays.append(a)
        return i

    def described(self, hi, lo) -> tuple:
        """What the open block recorded of the words ``hi``, ``lo``
        (:func:`fusion.state_of <mlx_precise.doubleword.fusion.state_of>`) with each
        array as its place: ``(hi, lo, (program, shape, leaves) or None, packed,
        copies, the described float words of complex words or None, their
        layout)``, hashable."""
        e, z, copies, parts, layout = fusion.state_of(hi, lo)
        place = self.place
        if lo is None and e is None and z is None and parts is None:
            return (place(hi), None, None, None, None, None, layout)  # (a plain array)
        return (place(hi), None if lo is None else place(lo),
                None if e is None else (e.prog, e.shape, tuple(map(place, e.leaves))),
                None if z is None else place(z), None if copies is None else place(copies),
                None if parts is None else self.described(*parts), layout)

    def operand(self, a, i: int) -> None:
        """For the array ``a`` at place ``i``: where it holds words (float32 /
        complex64), its description (:meth:`described`) and those of the words it
        is a recorded view of (:data:`views`), written to the key and listed in
        ``operands`` and ``seen_as`` (``(its reader's index in views, i,
        description)``); else None written."""
        add = self.add
        dtype = a.dtype
        if dtype != _F32 and dtype != _C64:
            add(None)
            return
        desc = self.described(a, carry.low_word(a))
        add(desc)
        self.operands.append(desc)
        k = 0
        for read, _ in views:
            src = read(a, self.report)
            if src is None:
                add(None)
            else:
                add(k)
                self.seen_as.append((k, i, self.described(*src)))
                add(self.seen_as[-1][2])
            k += 1

    def write(self, v):
        """Write the argument ``v`` to the key; returns it as the template holds it
        (an array as its :class:`_Slot`). Raises :class:`_Unkeyed`."""
        add = self.add
        if isinstance(v, ARRAY):
            i = self.place(v)
            add(i)
            add(v.dtype)
            self.operand(v, i)
            return _Slot(i)
        t = type(v)
        add(t)
        if t in _STATIC:
            add(v)
            return v
        if t is float or t is complex:
            if negative_zero(v):
                raise _Unkeyed  # (-0.0 == 0.0: one key for two values)
            add(repr(v))
            return v
        if t is tuple or t is list:
            add(len(v))
            return t([self.write(x) for x in v])
        if t is slice:
            return slice(self.write(v.start), self.write(v.stop), self.write(v.step))
        if held(v):
            add(id(v))
            return _Held(id(v))
        raise _Unkeyed


def negative_zero(v) -> bool:
    """Whether the float or complex ``v`` has a part -0.0 (which equals 0.0)."""
    if type(v) is float:
        return v == 0 and math.copysign(1.0, v) < 0
    return negative_zero(v.real) or negative_zero(v.imag)


def _noted(desc: tuple, values) -> tuple:
    """Record the state :meth:`_Keying.described` describes on ``values`` (the
    arrays by place) in the open block; returns the words ``(hi, lo)``."""
    i, ilo, e, iz, ic, parts, layout = desc
    hi, lo = values[i], None if ilo is None else values[ilo]
    if e is not None:
        e = fusion.Expr(tuple([values[k] for k in e[2]]), e[0], e[1])
    fusion.note_state(hi, lo, e, None if iz is None else values[iz],
                      None if ic is None else values[ic],
                      None if parts is None else _noted(parts, values), layout)
    return hi, lo


def _structure(args: tuple, kw: dict, report):
    """``(key, arrays, template, operands, seen_as)``: the call's structure
    (hashable), the distinct arrays it reads in order of first use (operands, their
    low words, what the block recorded of them: :meth:`_Keying.described`; the
    words they are views of), ``(args, kw)`` with each array a :class:`_Slot`, per
    word operand its description, and per recorded view ``(its reader's index in
    views, the array's place, the viewed words' description)``. Raises
    :class:`_Unkeyed`."""
    k = _Keying(report)
    write, add = k.write, k.add
    template = (tuple([write(a) for a in args]),
                {name: (add(name), write(v))[1] for name, v in kw.items()})
    # (their shapes; the dtypes of the operands are written above, the arrays of
    # their states are float32 words, or the operand's dtype: its low word)
    add(tuple([a.shape for a in k.arrays]))
    return tuple(k.key), k.arrays, template, k.operands, k.seen_as


class _Held(_Slot):
    """A :func:`static` argument's id (in an argument template)."""

    __slots__ = ()


def _filled(v, values):
    if type(v) is _Slot:
        return values[v.i]
    if type(v) is _Held:
        return _statics[v.i][0]
    if type(v) is tuple or type(v) is list:
        return type(v)(_filled(x, values) for x in v)
    return v


class _Recipe:
    """One structure's form, compiled: called with the structure's arrays, returns
    the form's result carrying what the form's result carries."""

    __slots__ = ("form", "template", "operands", "seen_as", "compiled", "result")

    def __init__(self, form, template, operands, seen_as):
        self.form, self.template = form, template
        self.operands, self.seen_as = operands, seen_as
        self.compiled = plain.compile(self._trace)
        self.result = None  # the result's description by place among the outputs
        # (:func:`results`)

    def _trace(self, *values):
        ctx = _calling.get()
        with fusion.private_scope():
            note_described((self.operands, self.seen_as), values, ctx.report)
            args, kw = self.template
            out = self.form(ctx, *_filled(args, values),
                            **{k: _filled(v, values) for k, v in kw.items()})
            if not isinstance(out, ARRAY) or out.dtype not in (_F32, _C64):
                raise _Declined
            # the result and what it carries, as outputs: its low word, and what the
            # form recorded of its words (a later op composes its expression, reads
            # its packed words, as after the form)
            self.result, outs = results([out])
        return outs

    def __call__(self, ctx, arrays: list):
        token = _calling.set(ctx)
        try:
            outs = COMPILED_CALL(self.compiled, *arrays)
        finally:
            _calling.reset(token)
        return noted_results(self.result, outs)[0]


Unkeyed = _Unkeyed  # (for the passes of ``extended.autodiff`` and ``.updates``)
Declined = _Declined
Slot, filled = _Slot, _filled  # (a template's array places, filled: ``.blocks``' records)


def plain_key(values: list) -> tuple:
    """The key of ``values`` that hold no array (numbers, strings, None, slices,
    tuples and lists of them, :func:`static` objects); raises :class:`Unkeyed`
    for anything else."""
    k = _Keying()
    for v in values:
        k.write(v)
    if k.arrays:
        raise _Unkeyed
    return tuple(k.key)


def in_trace() -> bool:
    """Whether MLX is tracing the calling code (:func:`tracing`, a replay's trace)."""
    return _calling.get() is not None


class Sightings:
    """The structures seen and what was made for each (a replay, or None: runs as
    it is), both bounded: sightings forgotten all at once past ``seen_max``, the
    oldest made entry dropped past ``made_max``."""

    def __init__(self, seen_max: int, made_max: int):
        self.seen, self.made = {}, {}
        self.seen_max, self.made_max = seen_max, made_max

    def get(self, key):
        """What was made for ``key``; False: nothing yet."""
        return self.made.get(key, False)

    def sighted(self, key, at: int | None = None) -> bool:
        """Count a sighting of ``key``: True at the ``at``-th (default
        :data:`REPLAY_AT`; then its count is forgotten and something is to be
        :meth:`put`)."""
        seen = self.seen.get(key, 0) + 1
        if seen < (REPLAY_AT if at is None else at):
            if len(self.seen) >= self.seen_max:
                self.seen.clear()
            self.seen[key] = seen
            return False
        self.seen.pop(key, None)  # (pop: another thread may forget it first)
        return True

    def put(self, key, made) -> None:
        self.made[key] = made
        if len(self.made) > self.made_max:
            self.made.pop(next(iter(self.made)), None)


_recipes = Sightings(seen_max=1024, made_max=256)  # structure -> _Recipe, or None (the form)


def described(arrays: list, report) -> tuple:
    """For a trace over ``arrays`` (its inputs, in order): ``(key, inputs, state)``:
    what the block recorded of each float32 / complex64 array's words and of the
    words it is a recorded view of (:meth:`_Keying.described`, :data:`views`:
    hashable, the arrays of the states numbered after ``arrays``), all the trace's
    inputs, and the state for :func:`note_described`."""
    k = _Keying(report)
    for a in arrays:
        k.place(a)
    for i, a in enumerate(arrays):
        k.operand(a, i)
    k.add(tuple([a.shape for a in k.arrays[len(arrays):]]))
    return tuple(k.key), k.arrays, (k.operands, k.seen_as)


def note_described(state: tuple, values, report) -> None:
    """Inside a trace (and a private scope): record :func:`described`'s ``state``
    on ``values``, the trace's inputs (``report``: the block's, for the views)."""
    descs, seen_as = state
    for desc in descs:
        carry.attach(*_noted(desc, values))
    for k, i, desc in seen_as:
        views[k][1](values[i], _noted(desc, values), report)


def results(arrays: list) -> tuple:
    """``(descriptions, outputs)``: what each of ``arrays`` (a trace's results, or
    None) carries, as the outputs of the trace and their description."""
    k = _Keying()
    return [None if a is None else k.described(a, carry.low_word(a))
            for a in arrays], k.arrays


def noted_results(descs: list, outs: list) -> list:
    """The arrays :func:`results` describes, from a replay's outputs, carrying what
    they carried in the trace (recorded in the open block)."""
    out = []
    for desc in descs:
        if desc is None:
            out.append(None)
            continue
        hi, lo = _noted(desc, outs)
        out.append(carry.attach(hi, lo))
    return out


def gpu_replays(backend) -> bool:
    """Whether replays run here: on a GPU backend, replays on, the kernel folder
    private (:func:`_folder_ok`)."""
    return ENABLED and backend.gpu and _folder_ok()


def tracing():
    """Marks code that MLX traces (a compiled function's Python): its forms run as
    they are, traced with it (a replay inside a trace would only nest a second
    trace in the first)."""
    return context.setting(_calling, True)


def _folder_ok() -> bool:
    """MLX compiles the glue of a trace for the default device: on the CPU (the
    lazy Metal stand-in of the tests) into libraries it loads, when a replay is
    evaluated, from a folder that must be private
    (:func:`~mlx_precise.core.jit.folder_is_private`, checked at each call as the
    package's other compiled loops are)."""
    return mx.default_device() != mx.cpu or jit.folder_is_private()


def replayed(form):
    """``form(ctx, *args, **kw)``, a rule's kernel form (an array, or
    NotImplemented), run on the metal backend as a replay of its trace for the
    call's structure once that structure has been seen :data:`REPLAY_AT` times
    (see the module's docstring); elsewhere, and for what cannot be keyed or
    traced, ``form`` itself."""

    @functools.wraps(form)
    def run(ctx, *args, **kw):
        if not (ENABLED and ctx.backend.gpu) or ctx.stream is not None or (
                _calling.get() is not None) or not _folder_ok():
            return form(ctx, *args, **kw)  # (inside a trace: traced with it)
        try:
            key, arrays, template, operands, seen_as = _structure(args, kw, ctx.report)
        except _Unkeyed:
            return form(ctx, *args, **kw)
        key = (form, *key)
        recipe = _recipes.get(key)
        if recipe is False:
            if not _recipes.sighted(key):
                return form(ctx, *args, **kw)
            recipe = _Recipe(form, template, operands, seen_as)
            try:
                out = recipe(ctx, arrays)
            except (_Declined, ValueError, TypeError, RuntimeError, IndexError):
                recipe, out = None, None  # (the form itself decides, or raises)
            _recipes.put(key, recipe)
            if out is not None:
                return out
        if recipe is None:
            return form(ctx, *args, **kw)
        return recipe(ctx, arrays)

    run.form = form
    return run
