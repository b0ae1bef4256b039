"""A block's ops replayed on the metal backend.

An uncompiled forward pass inside a block runs, op by op, each op's rule: its
Python (operands read, programs composed, launches built: 10-30 us an op) dwarfs
MLX's own op (about 1 us). The rule replays (:mod:`.recipes`) trace one op's
graph; a model's forward is the same sequence of ops at every call, on the same
parameters. So a block opened again at the same place in the code (the ``with``
statement or the decorated function: its code and offset) replays what the last
one ran:

* **Learning.** A block records its ops: each op's stand-in, its arguments with
  every array as a place (the arrays it read first from outside the block, and
  the results of the ops before it) and other values as they are, and its
  results' places. The arrays from outside are held by weak reference, with their
  dtype, shape and whether they carry a low word. Recording stops (what was
  recorded so far stays) at an op that cannot be replayed: an in-place update, a
  random or distributed op (they read or change state besides their arguments),
  an argument other than arrays, numbers, strings, None, ``...``, dtypes, slices
  and tuples / lists of them, a result that is not an array or a tuple / list of
  new arrays, a gradient being recorded, a nested block, a transformed or custom
  function, a public op of the package, an optimizer's update.
* **Tracing.** At the next block at that place whose first op reads what the
  recorded first op read (its arrays' dtypes, shapes and low words; its other
  arguments), the recorded ops are run through their stand-ins inside one
  ``mx.compile`` trace (with the rules' own replays off: one trace), on the
  arrays the first op reads and the other outside arrays the last block read: its
  results are the high and low words of every op's result.
* **Following.** That compiled function is called at the first op, and each op of
  the block is checked against the record before its result is returned: the same
  stand-in, the same other arguments (floats with their sign and NaN), and as its
  arrays the very objects the record names (the outside arrays, held by weak
  reference, or results returned before), each outside array with the dtype,
  shape and low word it had at the trace. The result is the compiled function's
  output for that op, its low word attached, and the report counts what the op
  counted in the trace. The first op that differs ends the replay: it and every
  op after it run their rules as usual (on the replay's results, which carry their
  words), and the record is dropped (relearned at the next block). A block ending
  early, or going on past the record, runs the rest as usual too.

A result returned by the replay is computed from the same arrays by the same ops'
rules as the op would compute it: the same launches of the same programs, so the
same bits (as for :mod:`.recipes`, whose condition this shares: the metal backend,
replays on, the kernel folder private, not inside a function MLX traces). A trace
with an op that made a value leave double-word (a ``float32`` event) is not
replayed. The replay's outputs are held only until their last use in the record.
"""

from __future__ import annotations

import collections
import math
import sys
import weakref

import mlx.core as mx

from ..core import backends
from ..core.plain import plain
from ..doubleword import fusion
from . import carry, recipes
from .autodiff import recording as _recording
from .constructor import ARRAY
from .report import Report

ENABLED = True
"""False: blocks run their ops' rules at every call (for comparisons)."""

MIN_OPS = 2
"""Records shorter than this are not replayed."""

MAX_OPS = 4096
"""A block records at most this many ops (a loop inside one block: the rest runs as
usual)."""

MISSES = 4
"""A place in the code whose replays ended early this many times is no longer
recorded."""

stats: collections.Counter = collections.Counter()
"""Blocks that ``"learned"`` a record, ``"followed"`` one to its end, ``"missed"``
(a record dropped: an op or an outside array that differed, a trace that
declined)."""

_VALUES = (int, bool, str, type(None), type(Ellipsis), mx.Dtype)


class _Unrecordable(Exception):
    """An argument or result a record cannot hold."""


class _Slot:
    """An array's place in a record's arguments (a place: learning; an index of the
    replay's arrays: following)."""

    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i


class _Site:
    """What one place in the code learned: records by first op (a few), misses."""

    __slots__ = ("traces", "misses", "seen")

    def __init__(self):
        self.traces: list = []
        self.misses = 0
        self.seen = 0


_sites: dict = {}
_SITES_MAX = 256


class _Learning:
    """One block's ops being recorded (:meth:`__call__` stands for each op)."""

    __slots__ = ("site", "places", "outside", "first", "records", "refs", "count")

    def __init__(self, site):
        self.site = site
        self.places: dict = {}  # id -> place (results: removed when they are freed)
        self.outside: list = []  # (place, array, its guard): read from outside the block
        self.first: set = set()  # the places the first op read
        self.records: list = []  # (stand-in, args template, kwargs template, results)
        self.refs: list = []  # weak references to the results (their callbacks)
        self.count = 0  # places made

    def __call__(self, standin, run, report, args, kwargs):
        if _recording():
            return _stop(report, run, args, kwargs)
        first = not self.records
        try:
            t_args = self._template(args, first)
            t_kw = {k: self._template(v, first) for k, v in kwargs.items()}
        except _Unrecordable:
            return _stop(report, run, args, kwargs)
        try:
            out = run(report, args, kwargs)
        except BaseException:
            stop(report)
            raise
        try:
            t_out = self._results(out)
        except _Unrecordable:
            stop(report)
            return out
        self.records.append((standin, t_args, t_kw, t_out))
        if len(self.records) >= MAX_OPS:
            stop(report)
        return out

    def _template(self, v, first: bool):
        if isinstance(v, ARRAY):
            p = self.places.get(id(v))
            if p is None:
                p = self._outside(v, first)
            return _Slot(p)
        t = type(v)
        if t is tuple or t is list:
            return t([self._template(x, first) for x in v])
        if t in _VALUES or t is float or t is complex:
            return v
        if t is slice and all(type(x) in _VALUES for x in (v.start, v.stop, v.step)):
            return v
        if recipes.held(v):
            return v
        raise _Unrecordable

    def _outside(self, a, first: bool) -> int:
        """The place of ``a``, read from outside the block (its words must be its
        own: nothing else recorded of them in this block)."""
        lo = carry.low_word(a)
        if a.dtype in (mx.float32, mx.complex64):
            if any(s is not None for s in fusion.state_of(a, lo)[:4]) or any(
                    read(a, None) is not None for read, _ in recipes.views):
                raise _Unrecordable
        p = self.count
        self.count += 1
        self.places[id(a)] = p
        self.outside.append((p, a, (a.dtype, a.shape, lo is not None)))
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
        key = id(a)
        if key in self.places:
            raise _Unrecordable  # (an operand or an earlier result returned again)
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
    """A block's record, to follow: the compiled function of its ops (traced at
    the first call), what each op is checked against and returns."""

    __slots__ = ("records", "inputs", "first", "n_in", "results", "compiled", "outs",
                 "standin0")

    def __init__(self, learned: _Learning):
        # replay's arrays: the outside arrays, their low words, then the outputs (the
        # results' high words, then the low words the trace finds)
        order = {}
        inputs = []  # (weak reference or None: bound by the first op, guard)
        for p, a, guard in learned.outside:
            order[p] = len(inputs)
            inputs.append((None if p in learned.first else weakref.ref(a), guard))
        n_lo = sum(1 for _, g in inputs if g[2])
        self.n_in = len(inputs) + n_lo
        results = [p for p in range(learned.count) if p not in order]
        for j, p in enumerate(results):
            order[p] = self.n_in + j
        self.inputs, self.first = inputs, len(learned.first)
        self.results = len(results)
        last = {}  # index -> the last record that reads it
        records = []
        for k, (standin, t_args, t_kw, t_out) in enumerate(learned.records):
            t_args, t_kw, t_out = (_indexed(t_args, order, last, k),
                                   {n: _indexed(v, order, last, k) for n, v in t_kw.items()},
                                   _output_indices(t_out, order))
            records.append([standin, t_args, t_kw, t_out, None, None, None])
        for i, k in last.items():
            if i >= self.n_in:  # (outputs: released after their last reader)
                records[k][5] = (records[k][5] or ()) + (i,)
        self.records = records
        self.standin0 = records[0][0]
        self.compiled = None  # traced at the first call
        self.outs = None  # per output high word: the index of its low word, or None

    def _trace(self, *values):
        """The compiled function: the recorded ops on ``values`` (the outside arrays,
        then their low words); returns their results' words."""
        inputs, n_out = self.inputs, len(self.inputs)
        table = list(values) + [None] * self.results
        k = n_out
        with fusion.private_scope(), recipes.tracing():
            for i, (_, guard) in enumerate(inputs):
                if guard[2]:
                    carry.attach(table[i], table[k])
                    k += 1
            for record in self.records:
                standin, t_args, t_kw, t_out = record[:4]
                own = Report(False)
                with carry.reporting(own):
                    out = standin(*_filled(t_args, table),
                                  **{n: _filled(v, table) for n, v in t_kw.items()})
                if own.float32:
                    raise recipes.Declined
                _place(t_out, out, table)
                record[4] = tuple(own.extended.items()), tuple(own.plain.items())
            his = table[self.n_in:]
            los = [carry.low_word(h) for h in his]
        base = self.n_in + len(his)
        self.outs, k = [], 0
        for lo in los:
            self.outs.append(None if lo is None else base + k)
            k += lo is not None
        return his + [lo for lo in los if lo is not None]

    def start(self, args, kwargs):
        """The replay's arrays when the first op's ``args``, ``kwargs`` are the
        record's; None where they are not, False where an outside array is gone or
        changed."""
        table = [None] * self.n_in
        t_args, t_kw = self.records[0][1], self.records[0][2]
        if kwargs.keys() != t_kw.keys() or not _bound(t_args, args, table) or not all(
                _bound(t, kwargs[n], table) for n, t in t_kw.items()):
            return None
        inputs, n = self.inputs, len(self.inputs)
        seen = set()
        los = []
        for i in range(n):
            ref, guard = inputs[i]
            a = table[i] if ref is None else ref()
            if a is None or id(a) in seen:
                return False
            seen.add(id(a))
            lo = carry.low_word(a)
            if a.dtype != guard[0] or a.shape != guard[1] or (lo is not None) != guard[2]:
                return False
            table[i] = a
            if lo is not None:
                los.append(lo)
        table[n:] = los
        return table


def _indexed(t, order: dict, last: dict | None, k: int):
    """A template with its places as the replay's indices (noting the last record
    reading each)."""
    if type(t) is _Slot:
        i = order[t.i]
        if last is not None:
            last[i] = k
        return _Slot(i)
    if type(t) is tuple or type(t) is list:
        return type(t)(_indexed(x, order, last, k) for x in t)
    return t


def _output_indices(t_out, order: dict):
    """A record's results (a place, or a tuple / list of places) as indices."""
    if type(t_out) is int:
        return order[t_out]
    return type(t_out)(order[p] for p in t_out)


def _filled(t, table):
    if type(t) is _Slot:
        return table[t.i]
    if type(t) is tuple or type(t) is list:
        return type(t)(_filled(x, table) for x in t)
    return t


def _place(t_out, out, table) -> None:
    """Put the trace's results ``out`` at the record's result indices."""
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
    """The first op's argument ``v`` matches the template ``t``; its arrays are
    bound to their indices in ``table``."""
    if type(t) is _Slot:
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
        return v == t and math.copysign(1.0, v) == math.copysign(1.0, t) or (
            v != v and t != t)
    if tt is complex:
        return _same(t.real, v.real) and _same(t.imag, v.imag)
    if tt is slice:
        return _same(t.start, v.start) and _same(t.stop, v.stop) and _same(t.step, v.step)
    if recipes.held(t):
        return v is t
    return v == t


def _matches(t, v, table) -> bool:
    """An argument ``v`` of a followed op matches the template ``t``."""
    if type(t) is _Slot:
        return table[t.i] is v
    if type(t) is tuple or type(t) is list:
        return type(v) is type(t) and len(v) == len(t) and all(
            _matches(a, b, table) for a, b in zip(t, v))
    return _same(t, v)


class _Following:
    """One block following a :class:`_Trace` (:meth:`__call__` stands for each op)."""

    __slots__ = ("trace", "table", "k", "site")

    def __init__(self, trace: _Trace, table: list, site):
        self.trace, self.table, self.k, self.site = trace, table, 0, site

    def __call__(self, standin, run, report, args, kwargs):
        records = self.trace.records
        k = self.k
        if k >= len(records) or _recording():  # (the record ran out: the rest as usual)
            report.tape = None
            if k >= len(records):
                stats["followed"] += 1
            return run(report, args, kwargs)
        record = records[k]
        table = self.table
        if record[0] is not standin or not _matches(record[1], args, table) or (
                kwargs.keys() != record[2].keys()) or not all(
                _matches(t, kwargs[n], table) for n, t in record[2].items()):
            return self._missed(report, run, args, kwargs)
        self.k = k + 1
        out = _served(record[3], table, self.trace.outs, self.trace.n_in)
        extended, plain_ = record[4]
        for name, n in extended:
            report.extended[name] += n
        for name, n in plain_:
            report.plain[name] += n
        if record[5] is not None:
            for i in record[5]:
                table[i] = None
        return out

    def _missed(self, report, run, args, kwargs):
        report.tape = None
        _drop(self.trace, self.site)
        return run(report, args, kwargs)


def _drop(trace: _Trace, site: _Site) -> None:
    """Forget ``trace`` (it declined, or a block did not follow it): a miss."""
    site.misses += 1
    stats["missed"] += 1
    if trace in site.traces:
        site.traces.remove(trace)


def _served(t_out, table, outs, n_in):
    """The followed op's results (their low words attached)."""
    if type(t_out) is int:
        hi = table[t_out]
        j = outs[t_out - n_in]
        if j is not None:
            carry.attach(hi, table[j])
            table[j] = None
        return hi
    return type(t_out)(_served(i, table, outs, n_in) for i in t_out)


def _stop(report, run, args, kwargs):
    stop(report)
    return run(report, args, kwargs)


def opened(report) -> None:
    """A block opened (its ``report``): on the metal backend, with replays on, it
    learns or follows what the last block at the same place ran."""
    if not ENABLED:
        return
    backend = backends.backend()
    if not recipes.gpu_replays(backend) or recipes.in_trace() or _recording():
        return
    frame = sys._getframe(3)  # (the with statement: -> _Block.__enter__ -> the flow's hook)
    device = mx.default_device()
    key = (frame.f_code, frame.f_lasti, backend, device.type)
    site = _sites.get(key)
    if site is None:
        if len(_sites) >= _SITES_MAX:
            _sites.pop(next(iter(_sites)))
        site = _sites[key] = _Site()
    site.seen += 1
    if site.traces:
        report.tape = _Starting(site)
    elif site.seen > 1 and site.misses < MISSES:
        report.tape = _Learning(site)


class _Starting:
    """A block at a place with records, before its first op: follows the record
    whose first op matches, else learns."""

    __slots__ = ("site",)

    def __init__(self, site):
        self.site = site

    def __call__(self, standin, run, report, args, kwargs):
        site = self.site
        if _recording():
            report.tape = None
            return run(report, args, kwargs)
        for trace in list(site.traces):
            if trace.standin0 is not standin:
                continue
            table = trace.start(args, kwargs)
            if table is None:
                continue
            if table is False:  # (an array it read is gone: made anew at each call)
                _drop(trace, site)
                continue
            follow = _follow(trace, table, site)
            if follow is not None:
                report.tape = follow
                return follow(standin, run, report, args, kwargs)
        if site.misses >= MISSES:
            report.tape = None
            return run(report, args, kwargs)
        learning = report.tape = _Learning(site)
        return learning(standin, run, report, args, kwargs)


def _follow(trace: _Trace, table: list, site) -> _Following | None:
    """Call the trace's compiled function (traced now at its first call) on the
    arrays ``table``; None where the trace declines."""
    if trace.compiled is None:
        trace.compiled = plain.compile(trace._trace)
    try:
        outs = recipes.COMPILED_CALL(trace.compiled, *table)
    except (recipes.Declined, ValueError, TypeError, RuntimeError, IndexError):
        _drop(trace, site)
        return None
    table.extend(outs)
    return _Following(trace, table, site)


def stop(report) -> None:
    """No more ops of ``report``'s block are recorded or followed."""
    tape = report.tape
    if isinstance(tape, _Learning):
        report.learned = tape
    report.tape = None


def closed(report) -> None:
    """The block of ``report`` ended: what it learned is kept for its place."""
    tape = report.tape
    if isinstance(tape, _Learning):
        report.learned = tape
    elif isinstance(tape, _Following) and tape.k == len(tape.trace.records):
        stats["followed"] += 1
    report.tape = None
    learned = report.learned
    if learned is None:
        return
    report.learned = None
    trace = learned.trace()
    if trace is not None:
        stats["learned"] += 1
        traces = learned.site.traces
        traces.insert(0, trace)
        del traces[4:]
