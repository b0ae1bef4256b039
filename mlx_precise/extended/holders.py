"""The places that hold MLX's functions outside its modules, rebound to the
stand-ins (:mod:`.standins`) while blocks are open: what a scan of the heap finds
(module globals, attributes, containers, closure cells, default arguments, bound
methods of arrays), the locals of the frames that open a block, and (Python 3.12+)
the calls the rebinding did not reach, reported."""

from __future__ import annotations

import ctypes
import dis
import functools
import gc
import inspect
import re
import sys
import types
import warnings
import weakref

import mlx.core as mx

from ..core import kernels
from . import carry, constructor, standins
from .report import PrecisionDropError, dropped

_report = carry.report

# MLX functions held anywhere before the block: a module global (``from mlx.core
# import exp``, ``f = mx.exp`` at module level), an object's attribute (``self.act =
# mx.exp``, mlx.nn's pooling layers), a slot, a class attribute, a ``staticmethod`` or
# ``classmethod``, a dict or list (``ACTS = {"exp": mx.exp}``), a closure cell of a
# function defined elsewhere, a default argument (``def f(x, act=mx.exp)``), a
# ``functools.partial``, a bound method of one array (``f = x.exp``). Python 3.11 has
# no hook on calls of MLX's (nanobind) functions, so these are found where they sit:
# by a scan of the objects the garbage collector tracks (MLX's functions are tracked
# objects, so is every container holding one). Each place found is a :class:`_Place`,
# set to the stand-in at every installation and back to MLX's function when the last
# block closes; a bound method's holders get the stand-in bound to the same array.
# What cannot be rebound in place (a tuple, frozenset or set, an object implemented in
# C such as a ``functools.lru_cache`` wrapper, a suspended generator, a bound method
# held by a local of a function that is not the block's) is named: strict=True
# raises, otherwise a warning (once per holder).
#
# The scan costs about 1 us per tracked object (46-60 ms for 55k objects on a busy
# 2-core machine). It runs at every strict=True block that installs the stand-ins,
# and in the default mode at the first block and then only when a new reference to
# one of MLX's functions appeared since the last block closed: a place stores the
# function, so its reference count grows. The counts of the ~300 functions are read
# in one numpy gather (:class:`.standins._Gauge`, under a microsecond) when the
# stand-ins are installed, against their values when the last block closed (the same
# state: the stand-ins in place, the places found rebound, no frame's locals rebound).
_CELL = types.CellType
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python
_MANAGED_DICT = 1 << 4  # Py_TPFLAGS_MANAGED_DICT (3.11+): attributes stored in the object
_CONTAINERS = (dict, list, tuple, set, frozenset, _CELL, types.FunctionType, property,
               staticmethod, classmethod, types.MethodType, functools.partial)
_BOUND = type(mx.array.__mul__.__get__(mx.array(0)))  # MLX's bound methods
_METHODS = (_BOUND, types.MethodType)
# objects implemented in C that hold no user callable (a scan does not read their
# references): the interpreter's descriptors and builtins, classes, modules, frames
# (locals: :func:`rebind_locals`), weak references, MLX's own functions
_OPAQUE_SKIP = frozenset((
    types.ModuleType, types.FrameType, types.MappingProxyType, types.GenericAlias,
    types.UnionType, types.BuiltinFunctionType, types.WrapperDescriptorType,
    types.MethodDescriptorType, types.ClassMethodDescriptorType,
    types.GetSetDescriptorType, types.MemberDescriptorType, types.MethodWrapperType,
    types.CodeType, weakref.ref, weakref.ProxyType, weakref.CallableProxyType,
    type(re.compile("")), type(mx.exp), type(mx.array.__mul__), property))


def _own_type(t: type) -> bool:
    return str(getattr(t, "__module__", "")).startswith("mlx_precise")


def _holds_attributes(t: type) -> bool:
    """Instances of ``t`` may hold an MLX function themselves (a scan reads their
    references): a user class whose attributes live in the object (3.11+, else its
    ``__dict__`` is a dict of its own, scanned as one) or in slots, or a dict or list
    subclass (``mlx.nn.Module``)."""
    if not t.__flags__ & _HEAPTYPE or issubclass(t, type) or _own_type(t):
        return False
    return bool(t.__flags__ & _MANAGED_DICT) or issubclass(t, (dict, list)) or any(
        "__slots__" in vars(c) for c in t.__mro__ if c.__flags__ & _HEAPTYPE)


def _opaque(t: type) -> bool:
    """Instances of ``t`` are objects implemented in C that may keep a callable where
    no Python code can replace it (``functools.lru_cache``, ``operator.methodcaller``,
    a ``collections.deque``, ...), or suspended generators."""
    return t not in _OPAQUE_SKIP and not issubclass(t, type) and not _own_type(t) and (
        not t.__flags__ & _HEAPTYPE or t.__module__ in ("functools", "operator"))


# Reading and writing one place: get(holder, key) (None when gone), set(holder, key, v)
def _get_item(h, key):
    try:
        return (dict if isinstance(h, dict) else list).__getitem__(h, key)
    except (KeyError, IndexError):
        return None


def _set_item(h, key, v):
    (dict if isinstance(h, dict) else list).__setitem__(h, key, v)


def _get_cell(h, key):
    try:
        return h.cell_contents
    except ValueError:  # emptied
        return None


def _get_default(h, key):
    d = h.__defaults__ or ()
    return d[key] if key < len(d) else None


def _set_default(h, key, v):
    d = h.__defaults__
    h.__defaults__ = (*d[:key], v, *d[key + 1:])


def _get_partial(h, key):
    return h.func if key is None else h.args[key]


def _set_partial(h, key, v):
    state = list(h.__reduce__()[2])  # (func, args, keywords, dict)
    if key is None:
        state[0] = v
    else:
        state[1] = (*state[1][:key], v, *state[1][key + 1:])
    h.__setstate__(tuple(state))


def _get_class_attr(h, key):
    v = vars(h).get(key[0])
    return v.__func__ if isinstance(v, staticmethod) else v


def _set_class_attr(h, key, v):
    # (MLX's functions do not bind as methods, its array methods do: a stand-in, a
    # Python function, is wrapped in staticmethod where the original did not bind)
    name, binds = key
    setattr(h, name, staticmethod(v) if isinstance(v, types.FunctionType) and not binds
            else v)


def _get_dict_attr(h, key):
    return object.__getattribute__(h, "__dict__").get(key)


def _set_dict_attr(h, key, v):
    object.__getattribute__(h, "__dict__")[key] = v


_ITEM, _CELL_CONTENTS = (_get_item, _set_item), (_get_cell, lambda h, k, v: setattr(
    h, "cell_contents", v))
_DEFAULT, _PARTIAL = (_get_default, _set_default), (_get_partial, _set_partial)
_CLASS_ATTR, _DICT_ATTR = (_get_class_attr, _set_class_attr), (_get_dict_attr,
                                                              _set_dict_attr)
_SLOT = (lambda h, k: getattr(h, k, None), object.__setattr__)
# staticmethod / classmethod: their __init__ sets the function they wrap
_WRAPPED = (lambda h, k: h.__func__, lambda h, k, v: type(h).__init__(h, v))


class _Place:
    """One place outside the package that holds one of MLX's functions (or a bound
    method of one): the holder (weakly where it can be, so that the place does not
    keep a model alive), how to read and write it, and the function and its stand-in."""

    __slots__ = ("_holder", "_weak", "access", "key", "original", "standin")

    def __init__(self, holder, access, key, original, standin):
        try:
            self._holder, self._weak = weakref.ref(holder), True
        except TypeError:  # (dicts, lists, cells)
            self._holder, self._weak = holder, False
        self.access, self.key, self.original, self.standin = access, key, original, standin

    def holder(self):
        """The holder, or None once nothing but this place holds it."""
        if self._weak:
            return self._holder()
        h = self._holder
        return h if sys.getrefcount(h) > 3 else None  # (this slot, h, the argument)

    def get(self, h):
        return self.access[0](h, self.key)

    def set(self, h, value) -> None:
        self.access[1](h, self.key, value)


def _places(holder, hit: dict) -> list:
    """The :class:`_Place` s in ``holder`` (a container or an instance) that hold one
    of ``hit``'s originals (id -> (original, stand-in))."""
    def found(v):
        h = hit.get(id(v))
        return h is not None and h[0] is v

    def place(access, key, v):
        return _Place(holder, access, key, v, hit[id(v)][1])

    t = type(holder)
    if t is _CELL:
        return [place(_CELL_CONTENTS, None, holder.cell_contents)]
    if t is types.FunctionType:
        return [place(_DEFAULT, i, v) for i, v in enumerate(holder.__defaults__ or ())
                if found(v)]
    if t is staticmethod or t is classmethod:
        return [place(_WRAPPED, None, holder.__func__)]
    if t is functools.partial:
        return ([place(_PARTIAL, None, holder.func)] if found(holder.func) else []) + [
            place(_PARTIAL, i, v) for i, v in enumerate(holder.args) if found(v)]
    if isinstance(holder, type):
        return [place(_CLASS_ATTR, (k, hasattr(type(v), "__get__")), v)
                for k, v in vars(holder).items() if found(v)]
    out = []
    if isinstance(holder, (dict, list)):
        keys = holder.items() if isinstance(holder, dict) else enumerate(holder)
        out += [place(_ITEM, k, v) for k, v in list(keys) if found(v)]
    if t is not dict and t is not list:
        try:
            attrs = object.__getattribute__(holder, "__dict__")
        except AttributeError:
            attrs = {}
        out += [place(_DICT_ATTR, k, v) for k, v in list(attrs.items()) if found(v)]
        for cls in t.__mro__:
            slots = vars(cls).get("__slots__", ())
            for k in (slots,) if isinstance(slots, str) else slots:
                v = getattr(holder, k, None)
                if found(v):
                    out.append(place(_SLOT, k, v))
    return out


def _scan_heap(hit: dict, own: dict) -> tuple[list, list, list]:
    """(mutable, frozen, bound): the holders among the tracked objects of the
    originals in ``hit`` (:attr:`.standins.Plan.scanned`), and the bound methods of arrays
    that hold one, but for the package's own (``own``: ids); a class's namespace and
    a function's defaults are reported as the class and the function."""
    keys = hit.keys()
    mutable, frozen, bound, namespaces, defaults, inspected = [], [], [], [], set(), {}
    for o in gc.get_objects():
        t = type(o)
        if t is dict:
            if not keys.isdisjoint(map(id, o.values())):
                (namespaces if "__module__" in o else mutable).append(o)
        elif t is list or t is tuple:
            # (their items read through the collector, which skips empty slots: a
            # tuple that tuple() is filling from a generator running this block, or
            # a list C code is filling, has some, and iterating it would crash; one
            # with empty slots is no holder yet)
            items = gc.get_referents(o)
            if not keys.isdisjoint(map(id, items)) and len(items) == len(o):
                (mutable if t is list else frozen).append(o)
        elif t is _CELL:
            try:
                if id(o.cell_contents) in keys:
                    mutable.append(o)
            except ValueError:  # an empty cell
                pass
        elif t is frozenset or t is set:
            if not keys.isdisjoint(map(id, o)):
                frozen.append(o)
        elif t is types.FunctionType:
            if o.__defaults__ and not keys.isdisjoint(map(id, o.__defaults__)):
                mutable.append(o)
                defaults.add(id(o.__defaults__))
        elif t is functools.partial:
            if not keys.isdisjoint(map(id, (o.func, *o.args))):
                mutable.append(o)
                defaults.add(id(o.args))
        elif t is staticmethod or t is classmethod:
            if id(o.__func__) in keys:
                mutable.append(o)
        elif t in _METHODS:
            if id(o.__func__) in keys and isinstance(o.__self__, constructor.ARRAY):
                bound.append(o)
        else:
            inspect = inspected.get(t)
            if inspect is None:
                inspect = inspected[t] = (
                    "attributes" if _holds_attributes(t) else
                    "items" if issubclass(t, (dict, list)) else
                    "opaque" if _opaque(t) else "")
            if inspect and not keys.isdisjoint(map(id, gc.get_referents(o))):
                (frozen if inspect == "opaque" else mutable).append(o)

    def ours(h):
        return id(h) in own

    namespaces = [d for d in namespaces if not ours(d)]
    if namespaces:  # a class's namespace (a dict with "__module__") or a plain dict
        classes = {id(standins.class_namespace(c)): c for c in gc.get_referrers(*namespaces)
                   if isinstance(c, type)}
        mutable += [classes.get(id(d), d) for d in namespaces]
    return ([h for h in mutable if not ours(h)],
            [h for h in frozen if id(h) not in defaults and not ours(h)],
            [b for b in bound if not ours(b)])


def _tracked_references(objects: tuple, ours=frozenset()) -> tuple[list, dict]:
    """(the objects the collector tracks that refer to ``objects``, but for
    ``objects`` itself and ``ours`` (ids), {id: the references they hold to each})."""
    referrers = [r for r in gc.get_referrers(*objects)
                 if r is not objects and id(r) not in ours]
    held = dict.fromkeys(map(id, objects), 0)
    for r in referrers:
        for v in gc.get_referents(r):
            if id(v) in held:
                held[id(v)] += 1
    return referrers, held


def _bound_places(bound: list, hit: dict) -> tuple[list, list]:
    """(places, frozen) for bound methods of arrays that hold MLX's functions: their
    holders get the stand-in bound to the same array; a holder that cannot be
    rebound (a tuple, a local of a running function, an object implemented in C), or
    a reference no tracked object accounts for (a local of a frame the collector
    does not see), is named."""
    rebound = {id(b): standins.Kept((b, types.MethodType(hit[id(b.__func__)][1], b.__self__)))
               for b in bound}
    ours = {id(bound), *map(id, rebound.values())}
    referrers, seen = _tracked_references(tuple(bound), ours)
    # (the others: the list, its Kept pair, the loop variable, getrefcount's argument)
    frozen = [_Unreached(b) for b in bound if sys.getrefcount(b) - 4 > seen[id(b)]]
    places = []
    for r in referrers:
        t = type(r)
        if _own_type(t) or t is types.FrameType and r.f_globals.get(
                "__name__", "").startswith(_OWN):
            continue  # (a place found before, the package's own frames)
        if isinstance(r, (dict, list, _CELL, types.FunctionType, functools.partial,
                          staticmethod, classmethod, type)) or _holds_attributes(t):
            places += _places(r, rebound)
        else:
            frozen.append(r)
    return places, frozen


class _Unreached:
    """A bound method of an array held where no tracked object shows it."""

    def __init__(self, method):
        self.method = method

    def __str__(self):
        return (f"the bound method {_name(self.method.__func__)} of an array, held by a "
                "local variable of a function other than the block's (or an object the "
                "collector does not track)")


# a scan is due / ran in this installation / sys.modules' size at the last scan /
# every reference to MLX's functions was accounted for at the last strict scan and
# none has changed since (:func:`_accounted`: strict blocks need no scan then)
watch = {"due": True, "scanned": False, "modules": 0, "sealed": False, "unaccounted": None}
_SKIP = ("mlx.core", "mlx_precise")  # modules whose globals are MLX's or the package's
_places_held: list = []  # _Place: rebound to the stand-ins at every installation
_warned: set = set()  # ids of the holders named in a warning already


def apply_places() -> bool:
    """Set the places found so far to their stand-ins; False when one of them holds
    something else since (it was reassigned: a scan is due), or its holder is gone."""
    kept, same = [], True
    for p in _places_held:  # (with restore_places: about 0.6 us a place per block)
        h = p.holder()
        if h is None:
            continue
        get, set_ = p.access
        v = get(h, p.key)
        if v is p.original:
            set_(h, p.key, p.standin)
        elif v is not p.standin:
            same = False
            continue
        kept.append(p)
    _places_held[:] = kept
    return same


def restore_places() -> None:
    for p in _places_held:
        h = p.holder()
        if h is not None:
            get, set_ = p.access
            if get(h, p.key) is p.standin:  # (not reassigned inside the block)
                set_(h, p.key, p.original)


# Custom kernels MLX made before the package's import (``mx.fast.metal_kernel`` &
# co. return nanobind functions without a name; the factory the import installs
# makes reporting ones, :func:`.dispatch.factory`): a scan finds them by their
# signature and rebinds their places to a stand-in that reports a call reading a
# carried value, made by ``raw_kernel_standin[0]`` (the flow's hook).
_NB_FUNC = type(mx.exp)
_KERNEL_SIGNATURE = "__call__(self, *, inputs:"
_RAW_KERNEL = "fast.metal_kernel (a kernel made before mlx_precise was imported)"
raw_kernel_standin: list = []
_raw_kernels: dict = {}  # id -> Kept((kernel, stand-in)), kept (kernels live long)


def _with_raw_kernels(hit: dict) -> dict:
    """``hit`` and the custom kernels in the heap that MLX made before the package's
    import (:data:`_raw_kernels`, found anew at each scan)."""
    for o in gc.get_objects():
        if (type(o) is _NB_FUNC and id(o) not in _raw_kernels and o.__name__ == ""
                and id(o) not in kernels.OWN
                and (o.__doc__ or "").startswith(_KERNEL_SIGNATURE)):
            _raw_kernels[id(o)] = standins.Kept((o, raw_kernel_standin[0](o, _RAW_KERNEL)))
    return {**hit, **_raw_kernels} if _raw_kernels else hit


def _name(v) -> str:
    if id(v) in _raw_kernels:
        return _RAW_KERNEL
    return f"{getattr(v, '__module__', None) or 'mlx.core'}.{getattr(v, '__qualname__', v)}"


def _describe(holder, hit: dict) -> str:
    """``holder`` (a tuple, frozenset or set, an object implemented in C, a
    generator) and where it is (a module global, an attribute), for an error
    message."""
    if isinstance(holder, _Unreached):
        return str(holder)
    where = ""
    for r in gc.get_referrers(holder):
        if type(r) is dict:
            k = next((k for k, v in r.items() if v is holder), None)
            if k is not None:
                where = (f" {r['__name__']}.{k}" if isinstance(r.get("__name__"), str)
                         else f" (the attribute or key {k!r})")
                break
    functions = sorted({_name(v.__func__ if type(v) in _METHODS else v)
                        for v in gc.get_referents(holder) if id(v) in hit or (
                            type(v) in _METHODS and id(v.__func__) in hit)})
    if type(holder) is types.FrameType:
        return (f"a local variable of {holder.f_code.co_qualname} (not the function that "
                f"opens the block) holding {', '.join(functions)}")
    return f"the {type(holder).__name__}{where} holding {', '.join(functions)}"


def rebind_held(strict: bool) -> None:
    """Scan the heap (:func:`_scan_heap`), rebind what holds MLX's originals to the
    stand-ins at this and every later installation, name what cannot be rebound."""
    plan = standins.plans[0]
    hit = _with_raw_kernels(plan.scanned)
    mutable, frozen, bound = _scan_heap(hit, plan.own or {})
    if plan.own is None:  # the first scan with this plan: tell the package's own
        reached = _reached(plan)
        plan.own = {id(h): h for h in (*mutable, *frozen, *bound) if id(h) in reached}
        mutable = [h for h in mutable if id(h) not in plan.own]
        frozen = [h for h in frozen if id(h) not in plan.own]
        bound = [b for b in bound if id(b) not in plan.own]
    watch.update(due=False, scanned=True, modules=len(sys.modules), sealed=False)
    found = [p for holder in mutable for p in _places(holder, hit)]
    # MLX's classes (mx.array: its Constructor) bound in module globals; not scanned
    # for elsewhere (the class is in every annotation and isinstance tuple)
    classes = plan.classes
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if type(namespace) is dict and not name.startswith(_SKIP) and not (
                classes.keys().isdisjoint(map(id, namespace.values()))):
            found += _places(namespace, classes)
    if bound:
        more, unreached = _bound_places(bound, hit)
        found += more
        frozen += unreached
    for p in found:
        p.set(p.holder(), p.standin)
    _places_held.extend(found)
    frozen = [h for h in frozen if strict or id(h) not in _warned]
    if not frozen:
        if strict:
            # (counted again only where a count moved since a count that failed:
            # a reference out of sight that stays keeps costing one scan, not two)
            counts = plan.referenced()
            if counts != watch["unaccounted"]:
                watch["sealed"] = _accounted(plan)
                watch["unaccounted"] = None if watch["sealed"] else counts
        return
    message = ("{} before extended_precision(): it cannot be rebound to the double-word "
               "stand-ins, so a call through it inside the block computes in float32 "
               "(hold MLX functions in a list, dict or attribute, or look them up "
               "through mx. inside the block)").format(
        "; ".join(_describe(h, hit) for h in frozen))
    if strict:
        raise PrecisionDropError(message)
    _warned.update(map(id, frozen))
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def _accounted(plan) -> bool:
    """Every reference to each of MLX's functions is held by an object the collector
    tracks (found by the scan that just ran, the package's own, or rebound), none by
    a frame's local or a temporary that it cannot see. Then, as long as their
    reference counts do not change, no holder can have appeared: a new one would add
    to a count, and no reference outside the tracked objects is left to disappear at
    the same time (the coincidence a count alone cannot tell). ~30 ms for 55k
    objects, once per strict scan, where a strict block scans ~30 ms every time."""
    originals = tuple(o for o, _ in plan.scanned.values())
    _, held = _tracked_references(originals)
    # (uncounted: getrefcount's argument, ``originals``, the generator's ``o``)
    return all(sys.getrefcount(o) - 3 == held[id(o)] for o in originals)


def _reached(plan) -> set:
    """The ids of what the package itself keeps (its modules' namespaces, the plans,
    the stand-ins' closures, the registry): the containers and the package's objects
    reachable from its modules and the plan without passing through another module
    or class. Holders of MLX's originals among them are the package's own."""
    modules = {id(vars(m)) for m in list(sys.modules.values()) if hasattr(m, "__dict__")}
    roots = [*(vars(m) for n, m in list(sys.modules.items())
               if m is not None and n.split(".")[0] == "mlx_precise"), plan,
             *(vars(owner) if namespace is None else namespace
               for owner, namespace, _, _ in plan.swaps)]
    seen = set(map(id, roots))
    stack = roots
    while stack:
        for r in gc.get_referents(stack.pop()):
            if id(r) in seen:
                continue
            t = type(r)
            if (id(r) not in modules if t is dict else t in _CONTAINERS or (
                    _own_type(r) if isinstance(r, type) else
                    isinstance(r, types.SimpleNamespace) or _own_type(t))):
                seen.add(id(r))
                stack.append(r)
    return seen



def monitor(on: bool) -> None:
    if _MONITORING is None:
        return
    if on:
        if _MONITORING.get_tool(_TOOL) is None:
            _MONITORING.use_tool_id(_TOOL, "mlx_precise")
            _MONITORING.register_callback(_TOOL, _MONITORING.events.CALL, _on_call)
        elif _MONITORING.get_tool(_TOOL) != "mlx_precise":
            return  # another tool holds the id
        _monitored[:] = [standins.plans[0].scanned]
        _MONITORING.set_events(_TOOL, _MONITORING.events.CALL)
    elif _monitored:
        _MONITORING.set_events(_TOOL, _MONITORING.events.NO_EVENTS)
        _monitored.clear()


# Python 3.12+ (PEP 669): ``sys.monitoring`` reports every call made from Python code.
# While blocks are open, a call of one of MLX's originals from inside a block with a
# carried first operand is a call the rebinding did not reach (a tuple of functions,
# a C object, a local of a function that is not the block's): reported as consuming
# a double-word value in float32 (strict=True raises there). Python 3.11 has no such
# hook.
_MONITORING = getattr(sys, "monitoring", None)
_TOOL = 4  # a tool id PEP 669 leaves free (0-2, 5: debugger, coverage, profiler, optimizer)
_monitored: list = []  # the ids -> (original, stand-in) the hook watches, while installed


_PACKAGE = __file__.rsplit("extended", 1)[0]  # mlx_precise/ (its calls are its own)


def _on_call(code, offset, fn, arg0):
    if code.co_filename.startswith(_PACKAGE):
        return _MONITORING.DISABLE  # (for this call site, for good)
    hit = _monitored[0].get(id(fn)) if _monitored else None
    if hit is None and type(fn) is _BOUND:
        fn, arg0 = fn.__func__, fn.__self__
        hit = _monitored[0].get(id(fn)) if _monitored else None
    if hit is None or hit[0] is not fn:
        return
    report = _report.get()  # (None inside the rules: their calls of MLX are theirs)
    if report is not None and report.open and carry.has_words(arg0) and arg0.size:
        dropped(report, _name(fn).removeprefix("mlx.core."),
                "it was called through a name bound before the block that the block "
                "could not rebind")



# Names bound to MLX's functions (or bound methods of arrays) in the frame that opens
# a block (``f = mx.exp`` in a function, then ``f(x)`` inside ``with
# extended_precision():``), its closure cells included, are rebound to the stand-ins
# for the block and put back when it closes (if still the stand-in); so are those of
# the frame that runs the ``with`` through a context-manager wrapper (a generator
# under contextlib.contextmanager, an ``__enter__`` method), and with strict=True
# those of every calling frame. Locals are a thread's own: each thread's block
# rebinds its own frames. A function's fast locals are written through ``f_locals``
# and, before Python 3.13 (PEP 667 makes ``f_locals`` write through),
# ``PyFrame_LocalsToFast``, as debuggers do. Module-level frames are the module
# globals, rebound as places (above).
_WRITE_THROUGH = sys.version_info >= (3, 13)
_OWN = ("mlx_precise.", "contextlib")
_SUSPENDS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
_ENTERS = ("__enter__", "__aenter__")
# A frame that enters the block by a ``with`` statement is at BEFORE_WITH (SETUP_WITH
# before 3.11); one that calls ``__enter__`` itself (a helper that opens the block
# and returns, ``ExitStack.enter_context``) is at a call, and the block may outlive
# it: then the locals of every calling frame are rebound, as with strict=True.
# (From 3.14 a ``with`` statement calls ``__enter__`` too: not told apart there.)
_WITHS = frozenset(dis.opmap[n] for n in ("BEFORE_WITH", "BEFORE_ASYNC_WITH", "SETUP_WITH",
                                         "SETUP_ASYNC_WITH") if n in dis.opmap)
_CALLS = frozenset(op for n, op in dis.opmap.items()
                   if n.startswith(("CALL", "PRECALL"))) if _WITHS else frozenset()


_CACHE = dis.opmap.get("CACHE", -1)  # (3.11+: inline cache entries after an instruction)


def _doing(frame, ops: frozenset) -> bool:
    """The frame's current instruction is one of ``ops`` (during a call ``f_lasti``
    may point into the call's inline cache: the instruction is the one before)."""
    code, i = frame.f_code.co_code, frame.f_lasti
    while i > 0 and code[i] == _CACHE:
        i -= 2
    return code[i] in ops


def _set_locals(frame, values: dict) -> None:
    namespace = frame.f_locals
    namespace.update(values)
    if not _WRITE_THROUGH:
        ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(frame), ctypes.c_int(0))


def _local_hit(value, plan):
    """(value, its stand-in) for a local holding one of MLX's callables or a bound
    method of an array holding one, else None."""
    hit = plan.bindable.get(id(value))
    if hit is not None:
        # (MLX's own callables only: a Python function that replaced one of them, the
        # caller's own code, keeps its name)
        return hit if hit[0] is value and not isinstance(value, types.FunctionType) else None
    if value.__class__ in _METHODS:
        hit = plan.scanned.get(id(value.__func__))
        if hit is not None and hit[0] is value.__func__:
            return value, types.MethodType(hit[1], value.__self__)
    return None


def rebind_locals(every: bool):
    """[(frame, {name: (original, stand-in)})] for the locals bound to MLX functions
    of the frame that opens the block, through context-manager wrappers, and
    (``every``) of all calling frames, rebound to the stand-ins; None when there
    are none."""
    plan = standins.plans[0]
    bindable, out = plan.bindable, []
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith(_OWN):
            code = frame.f_code
            if not (every or code.co_flags & _SUSPENDS or code.co_name in _ENTERS) and _doing(
                    frame, _WITHS):
                break  # (the package runs the block's body: a decorated function)
            frame = frame.f_back
            continue
        namespace = frame.f_locals
        if namespace is not frame.f_globals:
            hits = {}
            for name, value in namespace.items():
                if id(value) in bindable or value.__class__ in _METHODS:
                    hit = _local_hit(value, plan)
                    if hit is not None:
                        hits[name] = hit
            if hits:
                _set_locals(frame, {name: standin for name, (_, standin) in hits.items()})
                out.append((frame, hits))
        code = frame.f_code
        if not (every or code.co_flags & _SUSPENDS or code.co_name in _ENTERS):
            if not _doing(frame, _CALLS):
                break  # (the frame that runs the block's body)
            every = True  # (entered by hand: any calling frame may run the body)
        frame = frame.f_back
    return out or None


def restore_locals(rebound) -> None:
    for frame, hits in rebound:
        namespace = frame.f_locals
        back = {name: original for name, (original, standin) in hits.items()
                if namespace.get(name) is standin}
        if back:
            _set_locals(frame, back)


