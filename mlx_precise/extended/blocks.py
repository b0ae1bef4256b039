"""A block's ops replayed on the metal backend.

An uncompiled forward pass inside a block runs, op by op, each op's rule: its
Python (operands read, programs composed, launches built: 10-30 us an op) dwarfs
MLX's own op (about 1 us). The rule replays (:mod:`.recipes`) trace one op's
graph; a model's forward is the same sequence of ops at every call, on the same
parameters. So a block opened again at the same place in the code (the ``with``
statement's code and offset, or the decorated function) replays what the last
one ran:

* **Learning** (the second block at a place). A block records its ops: each op's
  stand-in, its arguments with every array as a place (the arrays it read first
  from outside the block, and the results of the ops before it) and other values
  as they are, and its results' places. The arrays from outside are held by weak
  reference, with their dtype and shape (nothing is kept alive). ``x op= y``
  and ``x[i] = y`` of a result are ops of the record (the array's new value a new
  place). A rule's decomposition runs its ops with the record set aside.
  Recording stops (what was recorded so far stays) at an op that cannot be
  replayed: an in-place update of an array from outside the block, a random or
  distributed op (they read or change state besides their arguments), an exit
  (``item()``), an argument other than arrays, numbers, strings, None, ``...``,
  dtypes, slices and tuples / lists of them, a result that is not an array or a
  tuple / list of new arrays, an op that makes a value leave double-word (a
  ``float32`` event), a gradient being recorded, another backend, a nested block,
  a transformed or custom function, a public op of the package, an optimizer's
  update.
* **Segments.** The record runs as compiled functions (``mx.compile``, the rules'
  own replays off inside: one trace) of runs of its ops, *segments*, each called at
  its first op on the arrays it reads from before it (and what the block recorded
  of their words: one trace per description). A segment starts at the first op
  and at each op that first reads an array made anew at each call: the first op's
  arrays, an array the last block read that is gone, one that differed where it
  was first read. A segment's results that later segments read are its outputs
  with what they carry (expression, packed words: a fused chain continues).
* **Following** (from the third block). Each op of the block is checked against
  the record before its result is returned: the same stand-in, the same other
  arguments (floats with their sign and NaN), and as its arrays the very objects
  the record names (outside arrays, or results returned before). The result is
  the segment's output for that op, its low word attached, and the report counts
  what the op counted in the trace. The first op that differs ends the replay: it
  and every op after it run their rules as usual (on the replay's results, which
  carry their words), and the record is dropped (relearned at the next block). A
  block ending early, or going on past the record, runs the rest as usual too.

A result returned by the replay is computed from the same arrays by the same ops'
rules as the op would compute it: the same launches of the same programs, so the
same bits (as for :mod:`.recipes`, whose condition this shares: the metal backend,
replays on, the kernel folder private, not inside a function MLX traces). A trace
with an op that made a value leave double-word (a ``float32`` event) is not
replayed. The replay's outputs are held only until their last use in the record.
A place whose records were dropped :data:`MISSES` times learns again only every
:data:`RETRY` blocks.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import weakref

import mlx.core as mx

from ..core import backends
from ..core.plain import plain
from ..doubleword import fusion
from . import carry, recipes
from .autodiff import recording as _recording
from .constructor import ARRAY
from .recipes import Slot, filled, negative_zero  # (an array's place in a record's arguments)
from .report import Report

ENABLED = True
"""False: blocks run their ops' rules at every call (for comparisons)."""

MIN_OPS = 2
"""Records shorter than this are not replayed."""

MAX_OPS = 4096
"""A block records at most this many ops (a loop inside one block: the rest runs as
usual)."""

TRACES = 16
"""Records kept per place in the code (a function that opens a block around any
model it is given holds one per model)."""

MISSES = 4
"""A place in the code whose records were dropped this many times (an op that
differed, a trace that declined) learns again only every :data:`RETRY` blocks."""

RETRY = 64

stats: collections.Counter = collections.Counter()
"""Blocks that ``"learned"`` a record, ``"followed"`` one to its end, ``"missed"``
(a record dropped: an op or an outside array that differed, a trace that
declined)."""

_VALUES = (int, bool, str, type(None), type(Ellipsis), mx.Dtype)
_SETITEM = ARRAY.__setitem__  # (MLX's, captured before any block: a stand-in inside them)
_RETURNS, _ASSIGNS = 1, 2  # in-place records: x op= y (returns x), x[i] = y (returns None)


class _Unrecordable(Exception):
    """An argument or result a record cannot hold."""


class _Site:
    """What one place in the code learned: records by first op (a few), misses."""

    __slots__ = ("traces", "misses", "seen", "backend")

    def __init__(self, backend):
        self.traces: list = []
        self.misses = 0
        self.seen = 0
        self.backend = backend  # (an op on another backend: the rest as usual)


_sites: dict = {}
_SITES_MAX = 256
# the frame of a function decorated with extended_precision() (contextlib's wrapper,
# shared by all of them: the place is the decorated function)
_DECORATED = contextlib.ContextDecorator()(lambda: None).__code__


class _Learning:
    """One block's ops being recorded (:meth:`__call__` stands for each op)."""

    __slots__ = ("site", "places", "outside", "outer", "first", "records", "refs", "count")

    def __init__(self, site):
        self.site = site
        self.places: dict = {}  # id -> place (results: removed when they are freed)
        self.outside: list = []  # (place, weak reference, guard): read from outside the block
        self.outer: set = set()  # their places
        self.first: set = set()  # the places the first op read
        self.records: list = []  # (stand-in, args template, kwargs template, results)
        self.refs: list = []  # weak references to the results (their callbacks)
        self.count = 0  # places made

    def __call__(self, standin, run, report, args, kwargs, in_place: int = 0):
        if _recording() or backends.backend() is not self.site.backend:
            return _stop(report, run, args, kwargs)
        first = not self.records
        try:
            t_args = self._template(args, first, report)
            t_kw = {k: self._template(v, first, report) for k, v in kwargs.items()}
        except _Unrecordable:
            return _stop(report, run, args, kwargs)
        report._tape = None  # (a rule's decomposition runs its ops through the flow)
        dropped = sum(report.float32.values())
        try:
            out = run(report, args, kwargs)
        except BaseException:
            report._tape = self
            stop(report)
            raise
        report._tape = self
        if sum(report.float32.values()) != dropped:  # (a value left double-word: a
            stop(report)  # trace with it would not be kept; the record ends before it)
            return out
        try:
            if in_place:  # (the array now stands for the op's result: a new place)
                if out is not (args[0] if in_place == _RETURNS else None):
                    raise _Unrecordable
                out = args[0]
                del self.places[id(out)]
            t_out = self._results(out)
            if in_place == _ASSIGNS:
                out = None
        except _Unrecordable:
            stop(report)
            return out
        self.records.append((standin, t_args, t_kw, t_out, in_place))
        if len(self.records) >= MAX_OPS:
            stop(report)
        return out

    def in_place(self, standin, run, report, args, kwargs, returns: bool):
        """``x op= y`` (MLX's in-place operators, which return ``x``: ``returns``)
        and ``x[i] = y``: recorded where ``x`` is a result of the block's ops (the
        update is then one of them, its result a new place of that array); an
        array from outside the block stops the record."""
        x = args[0] if args else None
        p = self.places.get(id(x)) if isinstance(x, ARRAY) else None
        if p is None or p in self.outer:
            return _stop(report, run, args, kwargs)
        return self(standin, run, report, args, kwargs, _RETURNS if returns else _ASSIGNS)

    def _template(self, v, first: bool, report):
        if isinstance(v, ARRAY):
            p = self.places.get(id(v))
            if p is None:
                p = self._outside(v, first, report)
            return Slot(p)
        t = type(v)
        if t is tuple or t is list:
            return t([self._template(x, first, report) for x in v])
        if t in _VALUES or t is float or t is complex:
            return v
        if t is slice and all(type(x) in _VALUES for x in (v.start, v.stop, v.step)):
            return v
        if recipes.held(v):
            return v
        raise _Unrecordable

    def _outside(self, a, first: bool, report) -> int:
        """The place of ``a``, read from outside the block (its words must be its
        own: nothing else recorded of them in this block)."""
        lo = carry.low_word(a)
        if a.dtype in (mx.float32, mx.complex64):
            if any(s is not None for s in fusion.state_of(a, lo)[:4]) or any(
                    read(a, report) is not None for read, _ in recipes.views):
                raise _Unrecordable
        p = self._placed(a)
        self.outer.add(p)
        self.outside.append((p, self.refs[-1], (a.dtype, a.shape)))
        if first:
            self.first.add(p)
        return p

    def _results(self, out):
        if isinstance(out, ARRAY):
            return self._result(out)
        t = type(out)
        if (t is tuple or t is list) and out and all(isinstance(a, ARRAY) for a in out):
            return t([self._result(a) for a in out])
        raise _Unrecordable

    def _result(self, a) -> int:
        if id(a) in self.places:
            raise _Unrecordable  # (an operand or an earlier result returned again)
        return self._placed(a)

    def _placed(self, a) -> int:
        """A new place for ``a``, held by weak reference (its id forgotten when it
        is freed: a later array may get that id)."""
        key = id(a)
        p = self.count
        self.count += 1
        places = self.places

        def freed(_ref, key=key, p=p):
            if places.get(key) == p:
                del places[key]

        self.refs.append(weakref.ref(a, freed))
        places[key] = p
        return p

    def trace(self):
        """The record as a :class:`_Trace`, or None."""
        if len(self.records) < MIN_OPS:
            return None
        return _Trace(self)


class _Trace:
    """A block's record, to follow in segments: each a compiled function of a run
    of its ops (traced at its first call), called at the segment's first op on the
    arrays it reads from before it. A segment starts at the first op and at each op
    that first reads an array made anew at each call (:attr:`per_call`: the
    arrays the first op reads, an array the last block read that is gone, or one
    that differed where it was first read)."""

    __slots__ = ("records", "outside", "per_call", "first_use", "last", "bounds",
                 "segments", "standin0", "count", "declined")

    def __init__(self, learned: _Learning):
        # per record: [stand-in, args and kwargs templates (arrays as places), results'
        # places, places released after it (read last there), counts (set by a trace),
        # its arguments' checks (_checks), whether it updates its first argument]
        records = [[standin, t_args, t_kw, t_out, (), None, _checks(t_args, t_kw), in_place]
                   for standin, t_args, t_kw, t_out, in_place in learned.records]
        first_use, last = {}, {}
        for k, record in enumerate(records):
            for p in _read((record[1], record[2])):
                first_use.setdefault(p, k)
                last[p] = k
        for k, record in enumerate(records):  # (a result no op reads: released at once)
            record[4] = tuple(p for p in _results_of(record[3]) if p not in last)
        for p, k in last.items():
            records[k][4] += (p,)
        self.records, self.count, self.last = records, learned.count, last
        # (new references: the record's carry callbacks for the learning block's ids)
        self.outside = {p: (_referred(ref()), guard) for p, ref, guard in learned.outside}
        self.per_call = set(learned.first)
        self.first_use = first_use
        self.bounds = [0]
        self.segments: dict = {}
        self.standin0 = records[0][0]
        self.declined = False  # (a segment's trace failed: the record is dropped)

    def known(self, args, kwargs) -> int:
        """How many of the arrays the first op reads (``args``, ``kwargs``) are
        those the last block's first op read."""
        table = [None] * self.count
        if not _fits(_bound, *self.records[0][1:3], args, kwargs, table):
            return 0
        return sum(1 for p in self.per_call if p in self.outside
                   and self.first_use.get(p) == 0 and self.outside[p][0]() is table[p])

    def end(self, k: int) -> int:
        """Where the segment starting at ``k`` ends."""
        for b in self.bounds:
            if b > k:
                return b
        return len(self.records)

    def split(self, k: int) -> None:
        """A segment starts at ``k`` from now on."""
        if k not in self.bounds:
            self.bounds = sorted(self.bounds + [k])
            for a, seg in list(self.segments.items()):
                if a < k < seg.end:
                    self.segments.pop(a, None)

    def segment(self, k: int) -> _Segment:
        seg = self.segments.get(k)
        if seg is None:
            seg = self.segments[k] = _Segment(self, k, self.end(k))
        return seg


def _referred(a):
    """A weak reference to ``a``, or a callable returning None where ``a`` is gone."""
    return _gone if a is None else weakref.ref(a)


def _gone():
    return None


def _read(t, out=None) -> list:
    """The places a template reads, in order (repeats kept)."""
    out = [] if out is None else out
    if type(t) is Slot:
        out.append(t.i)
    elif type(t) is tuple or type(t) is list:
        for x in t:
            _read(x, out)
    elif type(t) is dict:
        for x in t.values():
            _read(x, out)
    return out


def _results_of(t_out) -> tuple:
    return (t_out,) if type(t_out) is int else tuple(t_out)


class _Segment:
    """The ops ``records[start:end]`` of a trace as a compiled function of the
    arrays they read from before ``start`` and what the block recorded of their
    words (an outside array's low word; an earlier segment's result's low word,
    expression, packed words, ...: one trace per such description), returning
    their results' words and, for the results later segments read, what the
    segment recorded of them (so a chain continues across segments as op by op:
    :func:`recipes.results <mlx_precise.extended.recipes.results>`)."""

    __slots__ = ("trace", "start", "end", "inputs", "produced", "cross", "traced")

    def __init__(self, trace: _Trace, start: int, end: int):
        self.trace, self.start, self.end = trace, start, end
        produced, inputs = [], []
        made, seen = set(), set()
        for record in trace.records[start:end]:
            for p in _read((record[1], record[2])):
                if p not in made and p not in seen:
                    seen.add(p)
                    inputs.append(p)
            for p in _results_of(record[3]):
                made.add(p)
                produced.append(p)
        self.inputs, self.produced = inputs, produced
        self.cross = [p for p in produced if trace.last.get(p, -1) >= end]
        self.traced: dict = {}  # the inputs' descriptions -> _Traced

    def call(self, table: list, los: dict, carried: dict) -> bool:
        """Call the segment on the arrays ``table`` holds at its inputs (traced at
        the first call with their descriptions), ``carried``: what earlier
        segments' results carry; its results' high words into ``table``, low words
        into ``los``, and what the results later segments read carry into
        ``carried``. False where an outside input's dtype or shape differs from the
        record's, or the trace declines."""
        values, index, descs = [], {}, []
        outside = self.trace.outside
        for p in self.inputs:
            a = table[p]
            if a is None:
                return False
            o = outside.get(p)
            state = None if o is not None else carried.get(p)
            if state is not None:  # (an earlier segment's result)
                descs.append(_localized(state[0], state[1], values, index))
                continue
            if id(a) in index or o is not None and (a.dtype != o[1][0] or a.shape != o[1][1]):
                return False
            index[id(a)] = len(values)
            values.append(a)
            lo = carry.low_word(a)
            if lo is not None:
                index[id(lo)] = len(values)
                values.append(lo)
            descs.append((index[id(a)], None if lo is None else len(values) - 1, None, None,
                          None, None, None))
        descs = tuple(descs)
        traced = self.traced.get(descs)
        if traced is None:
            if len(self.traced) >= 4:
                self.traced.clear()
            traced = self.traced[descs] = _Traced(self, descs)
        try:
            outs = recipes.COMPILED_CALL(traced.compiled, *values)
        except (recipes.Declined, ValueError, TypeError, RuntimeError, IndexError):
            self.traced.pop(descs, None)
            self.trace.declined = True  # (dropped by the block that tried it)
            return False
        for p, hi, j in zip(self.produced, outs, traced.lo_at):
            table[p] = hi
            if j is not None:
                los[p] = outs[j]
        if self.cross:
            state = outs[traced.state_at:]
            for p, desc in zip(self.cross, traced.cross_descs):
                carried[p] = (desc, state)
        return True


class _Traced:
    """A segment compiled for one description of its inputs."""

    __slots__ = ("segment", "signature", "compiled", "lo_at", "state_at", "cross_descs")

    def __init__(self, segment: _Segment, signature: tuple):
        self.segment, self.signature = segment, signature
        self.compiled = plain.compile(self._trace)
        self.lo_at = self.state_at = self.cross_descs = None  # (set by the trace)

    def _trace(self, *values):
        seg = self.segment
        own = Report(False)  # (one for the segment, as a block's: what its ops note)
        with fusion.private_scope(), recipes.tracing():
            recipes.note_described((self.signature, ()), values, own)
            table = {p: values[d[0]] for p, d in zip(seg.inputs, self.signature)}
            for record in seg.trace.records[seg.start:seg.end]:
                standin, t_args, t_kw, t_out = record[:4]
                extended, plain_ = dict(own.extended), dict(own.plain)
                args = filled(t_args, table)
                with carry.reporting(own):
                    out = standin(*args, **{name: filled(v, table) for name, v in t_kw.items()})
                if record[7]:  # (an in-place update: its result is the updated array)
                    out = args[0]
                if own.float32:
                    raise recipes.Declined
                _place(t_out, out, table)
                record[5] = _added(own.extended, extended), _added(own.plain, plain_)
            his = [table[p] for p in seg.produced]
            los = [carry.low_word(h) for h in his]
            self.cross_descs, state = recipes.results([table[p] for p in seg.cross])
        lo_at, j = [], len(his)
        for lo in los:
            lo_at.append(None if lo is None else j)
            j += lo is not None
        self.lo_at, self.state_at = lo_at, j
        return his + [lo for lo in los if lo is not None] + state


def _added(counts, before: dict) -> tuple:
    """What a report's ``counts`` gained since ``before``, as ``(name, n)`` pairs."""
    return tuple((k, n - before.get(k, 0)) for k, n in counts.items() if n != before.get(k, 0))


def _localized(desc: tuple, arrays: list, values: list, index: dict) -> tuple:
    """A description of :func:`recipes.results
    <mlx_precise.extended.recipes.results>` (indices into ``arrays``) with its
    arrays appended to ``values`` (once each: ``index``, id -> index) and the
    indices into ``values``."""
    def at(i):
        if i is None:
            return None
        a = arrays[i]
        j = index.get(id(a))
        if j is None:
            j = index[id(a)] = len(values)
            values.append(a)
        return j

    i, ilo, e, iz, ic, parts, layout = desc
    return (at(i), at(ilo), None if e is None else (e[0], e[1], tuple(map(at, e[2]))),
            at(iz), at(ic), None if parts is None else _localized(parts, arrays, values, index),
            layout)


def _place(t_out, out, table) -> None:
    """Put the trace's results ``out`` at the record's result places."""
    if type(t_out) is int:
        if not isinstance(out, ARRAY):
            raise recipes.Declined
        table[t_out] = out
        return
    if type(out) is not type(t_out) or len(out) != len(t_out):
        raise recipes.Declined
    for i, a in zip(t_out, out):
        _place(i, a, table)


def _bound(t, v, table) -> bool:
    """The argument ``v`` matches the template ``t``, its arrays bound to their
    places in ``table`` where that holds None."""
    if type(t) is Slot:
        if not isinstance(v, ARRAY):
            return False
        held = table[t.i]
        if held is None:
            table[t.i] = v
            return True
        return held is v
    if type(t) is tuple or type(t) is list:
        return type(v) is type(t) and len(v) == len(t) and all(
            _bound(a, b, table) for a, b in zip(t, v))
    return _same(t, v)


def _same(t, v) -> bool:
    """The value ``v`` is the recorded value ``t`` (not an array)."""
    tt = type(t)
    if type(v) is not tt:
        return False
    if tt in _VALUES:
        return v == t
    if tt is float:
        return v == t and negative_zero(v) == negative_zero(t) or (v != v and t != t)
    if tt is complex:
        return _same(t.real, v.real) and _same(t.imag, v.imag)
    if tt is slice:
        return _same(t.start, v.start) and _same(t.stop, v.stop) and _same(t.step, v.step)
    if recipes.held(t):
        return v is t
    return v == t


def _checks(t_args: tuple, t_kw: dict) -> tuple:
    """A record's arguments as checks for :func:`_checked`: ``(number of
    arguments, per argument (position, 0 and its place | 1 and its value | 2 and a
    float | 3 and a nested template))``, or ``(None, the templates)`` with keyword
    arguments."""
    if t_kw:
        return None, (t_args, t_kw)
    checks = []
    for i, t in enumerate(t_args):
        tt = type(t)
        if tt is Slot:
            checks.append((i, 0, t.i))
        elif tt in _VALUES or tt is float and t == t and t != 0:
            checks.append((i, 1, t))  # (a float other than 0 and NaN: equal is the same)
        elif tt is float:
            checks.append((i, 2, t))
        else:
            checks.append((i, 3, t))
    return len(t_args), tuple(checks)


def _fits(fit, t_args, t_kw: dict, args, kwargs: dict, table) -> bool:
    """A call's ``args``, ``kwargs`` fit a record's templates by ``fit``
    (:func:`_bound`: binding the arrays first read there; :func:`_matches`)."""
    return kwargs.keys() == t_kw.keys() and fit(t_args, args, table) and all(
        fit(t, kwargs[name], table) for name, t in t_kw.items())


def _checked(checks: tuple, args: tuple, kwargs: dict, table: list) -> bool:
    """A followed op's arguments are the record's (:func:`_checks`)."""
    n, items = checks
    if n is None:
        return _fits(_matches, *items, args, kwargs, table)
    if kwargs or len(args) != n:
        return False
    for i, kind, t in items:
        v = args[i]
        if kind == 0:
            if table[t] is not v:
                return False
        elif kind == 1:
            if type(v) is not type(t) or v != t:
                return False
        elif not _same(t, v) if kind == 2 else not _matches(t, v, table):
            return False
    return True


def _matches(t, v, table) -> bool:
    """An argument ``v`` of a followed op matches the template ``t``."""
    if type(t) is Slot:
        return table[t.i] is v
    if type(t) is tuple or type(t) is list:
        return type(v) is type(t) and len(v) == len(t) and all(
            _matches(a, b, table) for a, b in zip(t, v))
    return _same(t, v)


class _Following:
    """One block following a :class:`_Trace` (:meth:`__call__` stands for each op)."""

    __slots__ = ("trace", "records", "table", "los", "carried", "k", "end", "site",
                 "backend")

    def __init__(self, trace: _Trace, site):
        self.trace, self.site, self.backend = trace, site, site.backend
        self.records = trace.records
        self.table = [None] * trace.count  # by place: the arrays of this block
        self.los: dict = {}  # place -> low word, until its result is returned
        self.carried: dict = {}  # place -> what a result a later segment reads carries
        self.k = self.end = 0

    def in_place(self, standin, run, report, args, kwargs, returns: bool):
        """``x op= y``, ``x[i] = y``: the record's update of ``x``, its result
        written into ``x``."""
        return self(standin, run, report, args, kwargs, _RETURNS if returns else _ASSIGNS)

    def __call__(self, standin, run, report, args, kwargs, in_place: int = 0):
        records, k = self.records, self.k
        if k >= len(records) or _recording() or backends.backend() is not self.backend:
            # (the record ran out, a gradient records, another backend: the rest as usual)
            return _stop(report, run, args, kwargs)
        record = records[k]
        table = self.table
        if record[0] is not standin or record[7] != in_place:
            return self._missed(report, run, args, kwargs)
        if k == self.end:
            if not self.begin(k, args, kwargs):
                return self._missed(report, run, args, kwargs)
        elif not _checked(record[6], args, kwargs, table) and not self._anew(k, args, kwargs):
            return self._missed(report, run, args, kwargs)
        self.k = k + 1
        t_out = record[3]
        if type(t_out) is int:  # (_served inlined: one result, the frequent case)
            out = table[t_out]
            lo = self.los.pop(t_out, None)
            if lo is not None:
                carry.attach(out, lo)
        else:
            out = self._served(t_out)
        if in_place:  # (MLX's in-place update: the array takes the result's value)
            x = args[0]
            _SETITEM(x, Ellipsis, out)
            carry.copy(out, x)
            table[record[3]] = out = x
            if in_place == _ASSIGNS:
                out = None
        extended, plain_ = record[5]
        for name, n in extended:
            report.extended[name] += n
        for name, n in plain_:
            report.plain[name] += n
        for p in record[4]:
            table[p] = None
        if self.carried:
            for p in record[4]:
                self.carried.pop(p, None)
        return out

    def begin(self, k: int, args, kwargs) -> bool:
        """Start the segment at op ``k`` (its arguments ``args``, ``kwargs``): bind
        the arrays first read there, fetch those the last block read later in it
        (a segment ends before one that is gone), call it."""
        trace, table = self.trace, self.table
        first_use, outside = trace.first_use, trace.outside
        while True:
            seg = trace.segment(k)
            gone = None
            for p in seg.inputs:
                if table[p] is not None or p not in outside:
                    continue
                if first_use[p] == k:  # (bound below, from the op's arguments)
                    continue
                a = None if p in trace.per_call else outside[p][0]()
                if a is None:
                    gone = p
                    break
                table[p] = a
            if gone is None:
                break
            trace.per_call.add(gone)
            trace.split(first_use[gone])
        record = trace.records[k]
        if not _fits(_bound, record[1], record[2], args, kwargs, table):
            return False
        for p in seg.inputs:  # (what differed from the last block's: made anew)
            if first_use.get(p) == k and p in outside and outside[p][0]() is not table[p]:
                trace.per_call.add(p)
        if not seg.call(table, self.los, self.carried):
            return False
        self.end = seg.end
        return True

    def _anew(self, k: int, args, kwargs) -> bool:
        """Op ``k`` differs from the record only in arrays from outside first read
        there (made anew at each call): a segment starts there from now on."""
        trace, table = self.trace, self.table
        fresh = [p for p in set(_read((trace.records[k][1], trace.records[k][2])))
                 if p in trace.outside and trace.first_use[p] == k]
        if not fresh:
            return False
        for p in fresh:
            trace.per_call.add(p)
            table[p] = None
        trace.split(k)
        return self.begin(k, args, kwargs)

    def _served(self, t_out):
        """The followed op's results (their low words attached)."""
        if type(t_out) is int:
            hi = self.table[t_out]
            lo = self.los.pop(t_out, None)
            if lo is not None:
                carry.attach(hi, lo)
            return hi
        return type(t_out)(self._served(p) for p in t_out)

    def _missed(self, report, run, args, kwargs):
        report._tape = None
        _drop(self.trace, self.site)
        return run(report, args, kwargs)


def _drop(trace: _Trace, site: _Site) -> None:
    """Forget ``trace`` (it declined, or a block did not follow it): a miss."""
    site.misses += 1
    stats["missed"] += 1
    try:
        site.traces.remove(trace)
    except ValueError:  # (gone already: another thread's block dropped it)
        pass


def _stop(report, run, args, kwargs):
    stop(report)
    return run(report, args, kwargs)


def opened(report) -> None:
    """A block opened (its ``report``): on the metal backend, with replays on, it
    learns or follows what the last block at the same place ran."""
    backend = backends.backend()
    if not (ENABLED and backend.gpu) or not recipes.gpu_replays(backend) or (
            recipes.in_trace() or _recording()):
        return
    frame = sys._getframe(3)  # (the with statement: -> _Block.__enter__ -> the flow's hook)
    code = frame.f_code
    where = (code, frame.f_lasti) if code is not _DECORATED else (frame.f_locals.get("func"),)
    key = (*where, backend, mx.default_device().type)
    site = _sites.get(key)
    if site is None:
        if len(_sites) >= _SITES_MAX:
            _sites.pop(next(iter(_sites)))
        site = _sites[key] = _Site(backend)
    site.seen += 1
    if site.traces:
        report._tape = _Starting(site)
    elif site.seen > 1 and (site.misses < MISSES or site.seen % RETRY == 0):
        report._tape = _Learning(site)


class _Starting:
    """A block at a place with records, before its first op: follows the record
    whose first op matches, else learns."""

    __slots__ = ("site",)

    def __init__(self, site):
        self.site = site

    def in_place(self, standin, run, report, args, kwargs, returns: bool):
        return _stop(report, run, args, kwargs)  # (of an array from outside the block)

    def __call__(self, standin, run, report, args, kwargs):
        site = self.site
        if _recording():
            report._tape = None
            return run(report, args, kwargs)
        traces = site.traces
        # (the records whose first op is this one, those that read the same arrays
        # there first: the same model's, where one place opens blocks for several)
        found = [(-trace.known(args, kwargs), i, trace) for i, trace in enumerate(traces)
                 if trace.standin0 is standin]
        for _, _, trace in sorted(found, key=lambda f: f[:2]):
            follow = _Following(trace, site)
            began = follow.begin(0, args, kwargs)
            if trace.declined:
                _drop(trace, site)
                continue
            if began:
                if traces and traces[0] is not trace:  # (the most recent first)
                    try:
                        traces.remove(trace)
                        traces.insert(0, trace)
                    except ValueError:  # (another thread's block dropped it)
                        pass
                report._tape = follow
                return follow(standin, run, report, args, kwargs)
        if site.misses >= MISSES and site.seen % RETRY:
            report._tape = None
            return run(report, args, kwargs)
        learning = report._tape = _Learning(site)
        return learning(standin, run, report, args, kwargs)


def stop(report) -> None:
    """No more ops of ``report``'s block are recorded or followed."""
    tape = report._tape
    if isinstance(tape, _Learning):
        report._learned = tape
    elif isinstance(tape, _Following) and tape.k == len(tape.trace.records):
        stats["followed"] += 1
    report._tape = None


def closed(report) -> None:
    """The block of ``report`` ended: what it learned is kept for its place."""
    if report._tape is None and report._learned is None:
        return
    stop(report)
    learned = report._learned
    if learned is None:
        return
    report._learned = None
    trace = learned.trace()
    if trace is not None:
        stats["learned"] += 1
        traces = learned.site.traces
        traces.insert(0, trace)
        del traces[TRACES:]
