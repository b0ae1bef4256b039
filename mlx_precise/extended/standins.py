"""The stand-ins a block installs in place of MLX's functions, and how it installs
them: per owner (``mx``, ``mx.fast``, ``mx.fft``, ``mx.linalg``, ``mx.random``,
``mx.array`` and MLX's transformed / custom functions) the originals and their
replacements (:class:`Plan`, built once from the wrappers :mod:`.dispatch` makes),
swapped in and out in a few pointer writes and dictionary updates, and the gauges
that tell in microseconds whether anything changed since the last block (reference
counts, dictionary version tags)."""

from __future__ import annotations

import ctypes
import functools
import gc
import operator
import sys
import types

import numpy as np


class _Gauge:
    """One machine word read at ``offset`` in each of ``objects``, all in one numpy
    gather over the process's memory: CPython's reference count (offset 0), or a
    dict's version tag (offset 24 on CPython 3.11-3.13: PyDictObject's
    ``ma_version_tag``, set anew by every change of the dict). :func:`_gauge` checks
    the reading against the interpreter before one is used."""

    def __init__(self, objects, offset: int):
        self.objects = list(objects)  # (kept alive: the addresses stay theirs)
        addresses = np.array([id(o) + offset for o in self.objects], dtype=np.int64)
        base = int(addresses.min())
        if np.any((addresses - base) % 8):
            raise ValueError("unaligned")
        words = (ctypes.c_int64 * ((int(addresses.max()) - base) // 8 + 1)).from_address(
            base)
        self._memory, self._at = np.frombuffer(words, dtype=np.int64), (addresses - base) // 8

    def read(self) -> np.ndarray:
        return self._memory[self._at]


def _gauge(objects, offset: int, probe) -> "_Gauge | None":
    """A :class:`_Gauge`, or None where it does not read what ``probe`` (a function of
    a gauge and its objects: True when the reading follows the interpreter) expects
    (another interpreter, another layout)."""
    if sys.implementation.name != "cpython" or sys.version_info >= (3, 14) or not objects:
        return None
    try:
        g = _Gauge(objects, offset)
        return g if probe(g) else None
    except (ValueError, TypeError, OverflowError):
        return None


def _counts_follow(g: _Gauge) -> bool:
    before = g.read()
    extra = list(g.objects)
    grown = g.read() - before
    del extra
    return bool(np.all(grown == 1)) and bool(np.all(g.read() == before))


def _tags_follow(g: _Gauge) -> bool:
    probe = {}
    t = _Gauge([probe], 24)
    a, b = t.read(), t.read()
    probe["changed"] = True
    return bool(a[0] == b[0] != t.read()[0])


def class_namespace(cls: type):
    """The dictionary a class's attributes live in (``cls.__dict__`` is a read-only
    view of it), or None where the interpreter does not expose it. Writing to it
    and then calling ``PyType_Modified`` (which drops the type's attribute caches)
    changes the class as ``setattr`` would, but for the special methods: their C
    slots must already dispatch through the dictionary, which one ``setattr``
    round trip leaves them doing (CPython installs the generic slot function for a
    method that is not one of its own slot wrappers, as MLX's nanobind methods
    are not)."""
    refs = gc.get_referents(cls.__dict__)
    return refs[0] if len(refs) == 1 and type(refs[0]) is dict and (
        refs[0].items() == cls.__dict__.items()) else None


try:
    _type_modified = ctypes.pythonapi.PyType_Modified
    _type_modified.argtypes, _type_modified.restype = [ctypes.py_object], None
except (ImportError, AttributeError):  # pragma: no cover - not CPython
    _type_modified = None


class Kept(tuple):
    """A tuple the package keeps beside an MLX original (its stand-in, a rebinding
    to undo): a heap scan (:func:`.holders._scan_heap`) skips it."""


def _set_each(owner, values: dict) -> None:
    for name, value in values.items():
        setattr(owner, name, value)


# A module's attributes are looked up in the dictionary its object points to
# (``PyModuleObject.md_dict``, the first field after the object header on CPython).
# A block points MLX's modules at a second dictionary, the same names with the
# stand-ins in place, and points them back when it closes: two pointer writes
# where updating ~170 names of ``mlx.core`` twice costs about 5 us. Only where the
# interpreter caches nothing of a module's dictionary behind its pointer: up to
# CPython 3.12 (3.13's tier-2 optimizer may fold a module attribute into a
# constant guarded by a watcher on that dictionary, which a pointer write would
# not notify); elsewhere, and for a module whose pointer does not read back as its
# dictionary, the names are updated in place.
_POINTS = sys.implementation.name == "cpython" and sys.version_info < (3, 13)


class _Pointed:
    """A module pointed at either of two dictionaries: ``original`` (its own) or
    ``block`` (the same names, the stand-ins in place)."""

    __slots__ = ("original", "block", "replace", "_slot", "_addresses")

    def __init__(self, module, replace: dict):
        self.original, self.replace = vars(module), replace
        self._slot = ctypes.c_void_p.from_address(id(module) + object.__basicsize__)
        if self._slot.value != id(self.original):
            raise ValueError("not a module's dictionary pointer")
        self.block = {**self.original, **replace}
        # (the module owns a reference to the dictionary it points to: one for the
        # block dictionary too, never given back, so that whichever it points to
        # when the module is freed has a reference to drop)
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(self.block))
        self._addresses = (id(self.original), id(self.block))

    def point(self, block: bool) -> None:
        self._slot.value = self._addresses[block]

    def sync(self) -> None:
        """The block dictionary anew from the module's own (changed since)."""
        self.block.clear()
        self.block.update(self.original)
        self.block.update(self.replace)

    def written_back(self) -> None:
        """What code inside a block wrote to the module (names set or deleted:
        they went to the block dictionary) written to its own dictionary."""
        block, original, replace = self.block, self.original, self.replace
        for name in original.keys() - block.keys():
            del original[name]
        for name, value in block.items():
            if replace.get(name) is not value and original.get(name) is not value:
                original[name] = value


def _pointed(owner, replace: dict) -> "_Pointed | None":
    if not _POINTS or type(owner) is not types.ModuleType:
        return None
    try:
        return _Pointed(owner, replace)
    except (ValueError, AttributeError, OSError):
        return None


class Plan:
    """The stand-ins, built once (wrappers for ~350 callables cost milliseconds):
    per owner (a module or a class) the originals and their replacements, so that a
    block installs and removes them in a few pointer writes (:class:`_Pointed`) and
    dictionary updates (``setattr`` on ``mx.array`` costs 0.2 us per name, updating
    its ~90 names and telling the class 1.5 us)."""

    def __init__(self, by_owner: dict, previous: "Plan | None" = None,
                 calls: tuple = ()):
        """``by_owner``: {owner: {name: (original, stand-in)}}; ``previous``: the
        plan this one replaces; ``calls``: the classes whose ``__call__`` alone is
        replaced (MLX's transformed and custom functions: not scanned for)."""
        # (owner, namespace or None (a class without one: setattr), {name: stand-in},
        # {name: original})
        self.swaps: list = []
        for owner, items in by_owner.items():
            replace = {n: r for n, (_, r) in items.items()}
            restore = {n: o for n, (o, _) in items.items()}
            if not isinstance(owner, type):
                self.swaps.append((owner, vars(owner), replace, restore))
                continue
            for name, value in (*replace.items(), *restore.items()):
                setattr(owner, name, value)  # the slots now read the class dictionary
            self.swaps.append((owner, class_namespace(owner), replace, restore))
        self.held: list = []  # (namespace, a getter of the names, their originals)
        for owner, namespace, _, restore in self.swaps:
            namespace = vars(owner) if namespace is None else namespace
            get = operator.itemgetter(*restore)
            self.held.append((namespace, get, get(namespace)))
        # original function -> (original, stand-in), for names bound elsewhere (those
        # of an earlier plan kept: a module may still hold an original replaced since)
        self.functions = {**(previous.functions if previous is not None else {}),
                          **{id(restore[n]): Kept((restore[n], r))
                             for owner, _, replace, restore in self.swaps
                             if not isinstance(owner, type) for n, r in replace.items()}}
        # what a heap scan (:func:`.holders._scan_heap`) looks for: MLX's functions and the
        # ``mx.array`` methods (unbound, ``mx.array.__mul__``), not classes (the class
        # ``mx.array`` is in every annotation and isinstance tuple) nor Python functions
        # (a replacement someone installed is their code)
        self.scanned = {key: (o, r) for key, (o, r) in self.functions.items()
                        if not isinstance(o, (type, types.FunctionType))}
        self.scanned.update({id(restore[n]): Kept((restore[n], r)) for owner, _, replace,
                             restore in self.swaps if isinstance(owner, type)
                             and owner not in calls
                             for n, r in replace.items()
                             if isinstance(r, types.FunctionType)
                             and not isinstance(restore[n], types.FunctionType)})
        # the version tags of the owners' namespaces (None: compared name by name)
        namespaces = [n for n, _, _ in self.held]
        tags = _gauge(namespaces, 24, _tags_follow) if all(
            type(n) is dict for n in namespaces) else None
        # the modules pointed at their block dictionaries (where their tags can be
        # followed too: what code inside a block writes to a module goes there)
        self.pointed = {id(owner): p for owner, _, replace, _ in self.swaps
                        if tags is not None and (p := _pointed(owner, replace)) is not None}
        self.tags = _gauge([*namespaces, *(p.block for p in self.pointed.values())], 24,
                           _tags_follow) if self.pointed else tags
        if self.tags is None:
            self.pointed, self.tags = {}, tags
        self.steps = {flag: [self._step(owner, namespace, replace if flag else restore,
                                        flag) for owner, namespace, replace, restore
                             in self.swaps] for flag in (True, False)}
        self.classes = {key: hit for key, hit in self.functions.items()
                        if isinstance(hit[0], type)}
        # what a frame's locals are rebound from (:func:`.holders.rebind_locals`)
        self.bindable = {**self.scanned, **self.functions}
        self.own = None  # id -> the package's own holders, found at the first scan
        # the reference counts of the scanned functions (None: read one by one)
        self.counts = _gauge([o for o, _ in self.scanned.values()], 0, _counts_follow)
        self.counted = self.tagged = None  # their readings when the last block closed
        self.opened = None  # the counts when the outermost block opened
        self.installed = None  # the tags' reading when the stand-ins were installed

    def _step(self, owner, namespace, values: dict, install: bool):
        """(a function of one argument, the argument, a class to tell or None): how
        one owner's names are set to ``values`` (a module: its pointer; a class: its
        dictionary updated and its caches dropped (``PyType_Modified``), or
        ``setattr`` where that is cheaper, for one name)."""
        pointed = self.pointed.get(id(owner))
        if pointed is not None:
            return pointed.point, install, None
        if not isinstance(owner, type):
            return namespace.update, values, None
        if namespace is None or _type_modified is None or len(values) == 1:
            return functools.partial(_set_each, owner), values, None
        return namespace.update, values, owner

    def current(self) -> bool:
        """Every owner still holds the originals the plan was built for (nobody
        replaced an MLX function since)."""
        if self.tags is not None and self.tags.read().tobytes() == self.tagged:
            return True  # (no namespace changed since the last block closed)
        try:
            same = all(get(namespace) == originals
                       for namespace, get, originals in self.held)
        except KeyError:  # a name was deleted
            return False
        if same:  # (other names changed: the block dictionaries follow)
            for p in self.pointed.values():
                p.sync()
        return same

    def referenced(self) -> "bytes | tuple":
        """The scanned functions' reference counts."""
        if self.counts is not None:
            return self.counts.read().tobytes()
        return tuple(map(sys.getrefcount, (o for o, _ in self.scanned.values())))

    def swap(self, install: bool) -> None:
        if not install and (self.tags is None or self.tags.read().tobytes() != self.installed):
            self._written_back()
            return
        _take(self.steps[install])
        if self.tags is not None:
            if install:
                self.installed = self.tags.read().tobytes()
            else:
                self.tagged = self.tags.read().tobytes()

    def _written_back(self) -> None:
        """Swap back after code in the block wrote to an owner's namespace (or where
        that cannot be told): what it set, replaced or deleted stays so."""
        steps = []
        for owner, namespace, replace, restore in self.swaps:
            pointed = self.pointed.get(id(owner))
            if pointed is not None:
                pointed.point(False)
                pointed.written_back()
                continue
            held = vars(owner)
            back = {n: o for n, o in restore.items() if held.get(n) is replace[n]}
            steps.append(self._step(owner, namespace, back, False))
        _take(steps)
        self.tagged = None  # (compared name by name at the next block)


def _take(steps) -> None:
    """Run :meth:`Plan._step`'s steps: each update, and tell its class if any."""
    for step, value, cls in steps:
        step(value)
        if cls is not None:
            _type_modified(cls)


# the current plan first; the earlier ones are kept (their stand-ins may still be bound
# somewhere: a heap scan must know what they hold as the package's own)
plans: list = []

