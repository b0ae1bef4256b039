"""An optimizer's update of one parameter, replayed on the metal backend.

A training step inside a block ends with the optimizer's update: MLX's
``Optimizer.apply_gradients`` calls ``apply_single(gradient, parameter, state)``
once per parameter, a dozen elementwise ops each (Adam's: 13), each op a rule's
Python and a launch built on the host. What one call builds depends only on its
structure, as a rule's graph does (:mod:`.recipes`): the optimizer's class and
``apply_single``, its hyperparameters, the names of the parameter's state entries
and of the optimizer's own state arrays (the step, the learning rate, scheduled
values; its other state entries and attributes by value), and the shape, dtype and
recorded words (:func:`recipes.described <mlx_precise.extended.recipes.described>`)
of each of those arrays. So on the
metal backend, while a block is open, ``apply_gradients`` calls a stand-in for
``apply_single`` that, from the :data:`~.recipes.REPLAY_AT`-th call of a structure
on, replays a function ``mx.compile`` traced once: the same launches of the same
programs on the new arrays, without the ops' Python. The new parameter is
returned and the state's entries set, carrying what the traced ops' results
carried; the block's report counts the traced ops at each replay (those on operands the
flow does not extend, such as an integer step, as plain ops).

The trace runs ``apply_single`` on the trace's inputs, the optimizer's state arrays
replaced by theirs while it runs (and restored), its ops watched
(:class:`~.dispatch.Watch`). A trace is not kept, and that structure's updates run
op by op (reported at every call), where the code reads an array from anywhere
but its inputs (a replay would hold its value at the trace), updates an input in
place, changes an attribute of the optimizer or the names of its state, makes a
value leave double-word, or returns anything but arrays. An ``apply_single``
defined outside MLX's optimizers (:data:`REPLAYED`), an optimizer attribute that is
not a number, string, None or a tuple / list of them (other than its state and
schedules), a parameter's state entry that is not an array, and a call inside a
gradient's recording, MLX's autodiff or a function MLX traces run op by op too.
"""

from __future__ import annotations

import contextvars
import functools
import sys

from ..core import backends
from ..core.plain import plain
from ..doubleword import fusion
from ..doubleword.fusion import differentiating
from . import autodiff, blocks, carry, dispatch, recipes
from .constructor import ARRAY
from .report import Report

# attributes of an optimizer the key leaves out: its state (read through the arrays
# passed in), the flag and schedules apply_gradients reads before the updates, and
# the stand-in itself
_NOT_KEYED = ("_state", "_initialized", "_schedulers", "apply_single")

REPLAYED = ("mlx.optimizers",)
"""The modules whose ``apply_single`` replays (``str.startswith``): MLX's own
optimizers, which compute from their arguments, attributes and state alone. An
update defined elsewhere runs op by op: Python state it read other than those (a
global, a closure's variable) would be held by a replay at its traced value."""

_made = recipes.Sightings(seen_max=1024, made_max=256)  # structure -> _Update or None
_tracing: contextvars.ContextVar = contextvars.ContextVar("mlx_precise_update", default=None)


class _Update:
    """One structure's update, compiled: called with the structure's arrays, returns
    the new parameter and the state's entries, carrying what they carried."""

    __slots__ = ("compiled", "result", "counts", "names")

    def __init__(self):
        self.compiled = plain.compile(self._trace)
        self.result = self.counts = self.names = None  # set by the trace

    def _trace(self, *values):
        opt, single, names, top_names, state, report = _tracing.get()
        top = opt.state
        saved = [top[n] for n in top_names]
        held = dict(vars(opt))
        before = _attributes(opt), tuple(top)
        own = Report(False)
        with fusion.private_scope(), recipes.tracing():
            recipes.note_described(state, values, report)
            g, p, *rest = values[:2 + len(names) + len(top_names)]
            entries = dict(zip(names, rest[:len(names)]))
            watch = dispatch.Watch(values)
            try:
                for n, v in zip(top_names, rest[len(names):]):
                    top[n] = v
                with carry.reporting(own), watch.watching():
                    new = single(g, p, entries)
            finally:
                changed = (_attributes(opt), tuple(top)) != before
                for n, v in zip(top_names, saved):
                    top[n] = v
                if changed:  # (what the trace set is undone: the update runs again)
                    for n in [n for n in top if n not in before[1]]:
                        del top[n]
                    vars(opt).clear()
                    vars(opt).update(held)
            outs = [new, *entries.values()]
            if (watch.foreign or own.float32 or changed
                    or not all(isinstance(a, ARRAY) for a in outs)):
                raise recipes.Declined
            self.counts, self.names = (own.extended, own.plain), tuple(entries)
            self.result, outs = recipes.results(outs)
        return outs

    def __call__(self, context: tuple, inputs: list, state: dict, report):
        token = _tracing.set(context)
        try:
            outs = recipes.COMPILED_CALL(self.compiled, *inputs)
        finally:
            _tracing.reset(token)
        report.extended.update(self.counts[0])
        report.plain.update(self.counts[1])  # (ops on integers: MLX's, as they are)
        new, *entries = recipes.noted_results(self.result, outs)
        for n in [n for n in state if n not in self.names]:
            del state[n]
        state.update(zip(self.names, entries))
        return new


def _attributes(opt) -> dict:
    """The optimizer's attributes by identity (but the stand-in's own)."""
    return {n: id(v) for n, v in vars(opt).items() if n != "apply_single"}


class _Single:
    """Stands for ``opt.apply_single`` during one ``apply_gradients`` in a block."""

    __slots__ = ("opt", "single", "report")

    def __init__(self, opt, single, report):
        self.opt, self.single, self.report = opt, single, report

    def __call__(self, gradient, parameter, state):
        opt, single, report = self.opt, self.single, self.report
        found = _structure(opt, single, gradient, parameter, state, report)
        if found is None:
            return single(gradient, parameter, state)
        key, inputs, context = found
        update = _made.get(key)
        if update is False:
            if not _made.sighted(key):
                return single(gradient, parameter, state)
            update = _Update()
            try:
                out = update(context, inputs, state, report)
            except (recipes.Declined, ValueError, TypeError, RuntimeError, IndexError):
                update, out = None, None  # (op by op, reported as such)
            _made.put(key, update)
            if out is not None:
                return out
        if update is None:
            return single(gradient, parameter, state)
        return update(context, inputs, state, report)


def _structure(opt, single, gradient, parameter, state, report):
    """``(key, inputs, context)`` of one update (see the module's docstring), or
    None where it runs op by op."""
    function = getattr(single, "__func__", single)
    if not getattr(function, "__module__", "").startswith(REPLAYED) or (
            type(state) is not dict or not all(isinstance(v, ARRAY) for v in state.values())):
        return None
    top = opt.state
    top_names = tuple(n for n, v in top.items() if isinstance(v, ARRAY))
    # (other entries of the optimizer's state than arrays and the parameters' state
    # trees: keyed by value, as the attributes)
    top_other = sorted(n for n, v in top.items() if not isinstance(v, (ARRAY, dict, list, tuple)))
    arrays = [gradient, parameter, *state.values(), *(top[n] for n in top_names)]
    if not all(isinstance(a, ARRAY) for a in arrays[:2]) or (
            len({id(a) for a in arrays}) != len(arrays)):
        return None
    attributes = sorted(n for n in vars(opt) if n not in _NOT_KEYED)
    try:
        hyper = recipes.plain_key([*(getattr(opt, n) for n in attributes),
                                   *(top[n] for n in top_other)])
        key, inputs, described = recipes.described(arrays, report)
    except recipes.Unkeyed:
        return None
    names = tuple(state)
    return (("update", type(opt), function, names, top_names, tuple(attributes),
             tuple(top_other), hyper, key),
            inputs, (opt, single, names, top_names, described, report))


def _standin(original):
    """``Optimizer.apply_gradients`` inside a block: on the metal backend, with
    replays on, each parameter's ``apply_single`` through :class:`_Single`."""

    @functools.wraps(original)
    def apply_gradients(self, gradients, parameters):
        report = dispatch.active()
        held = getattr(self, "__dict__", None)
        if (report is None or held is None or "apply_single" in held
                or not recipes.gpu_replays(backends.backend()) or recipes.in_trace()
                or autodiff.recording() or differentiating()):
            return original(self, gradients, parameters)
        blocks.stop(report)  # (its results are made outside the block's record)
        held["apply_single"] = _Single(self, self.apply_single, report)
        try:
            return original(self, gradients, parameters)
        finally:
            held.pop("apply_single", None)

    return apply_gradients


_standins: dict = {}  # MLX's Optimizer class -> its stand-ins (made once)


def _provide() -> dict:
    """The stand-in of ``Optimizer.apply_gradients`` for the block's plan, once
    ``mlx.optimizers`` is imported (:data:`.dispatch.class_standins`)."""
    module = sys.modules.get("mlx.optimizers")
    cls = getattr(module, "Optimizer", None)
    if not isinstance(cls, type) or "apply_gradients" not in vars(cls):
        return {}
    made = _standins.get(cls)
    if made is None:
        original = vars(cls)["apply_gradients"]
        made = _standins[cls] = {cls: {"apply_gradients": (original, _standin(original))}}
    return made


dispatch.class_standins.append(_provide)
