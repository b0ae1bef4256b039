"""The dispatcher that carries double-word values through ``extended_precision()``.

While at least one block is open (in any thread), the callables of ``mx``,
``mx.fast``, ``mx.fft``, ``mx.linalg``, ``mx.random`` and ``mx.array``'s operators,
methods and properties are replaced by thin wrappers, one per entry of
:mod:`.registry`; so are the places that held them before the block (found by a scan of the
heap: module globals, attributes, containers, closure cells, default arguments,
``staticmethod``, bound methods of arrays; and the opening frame's locals), and compiled
functions run their Python function on the arrays they are given. When the last
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

import ctypes
import dis
import functools
import gc
import inspect
import operator
import re
import sys
import threading
import types
import warnings
import weakref

import mlx.core as mx
import numpy as np

from ..core import backends, context
from ..core.plain import plain
from ..core.autodiff import TransformUnsupportedError
from . import autodiff, carry, constructor, registry, rules, scatter
from .carry import suspended
from .report import PrecisionDropError, Report, dropped


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


def _traced_on_host(e: Exception, name: str, backend: str):
    """MLX's "[eval] ... during function transformations" from a rule that computes
    on the host (cpu, emulate) under mx.compile / mx.vmap / an export: the named
    error instead."""
    return TransformUnsupportedError(
        f"{name} inside extended_precision() was traced by mx.compile, mx.vmap or an "
        f"export on backend {backend!r}, which computes on the host and cannot be traced: "
        "run it untraced inside the block, or use the 'metal' backend")


def _wrapper(entry):
    """The stand-in for one MLX callable (:class:`~.registry.Entry`)."""
    name, original, rule, kind, fast = (entry.op, entry.original, entry.rule, entry.kind,
                                        entry.fast)
    if kind == "value-free":
        return original
    mutates = kind == "in-place" or name == "__setitem__"

    def call(*args, **kwargs):
        report = _report.get()
        if report is None or not report.open:
            return original(*args, **kwargs)
        if mutates and args:  # a transpose noted for the GEMM no longer holds
            rules.linear.forget(args[0])
        token = _report.set(None)  # the rule and MLX's op below see plain MLX
        try:
            recording = _recording()
            # (one op: a gradient records it, differentiated by its VJP rule; an
            # in-place update while recording takes _mutate's path)
            if fast is not None and not kwargs and (not recording or (
                    entry.vjp is not None and not mutates)):
                out = fast(*args)
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
            if "function transformations" not in str(e):
                raise
            raise _traced_on_host(e, name, backend) from e
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


def _kernel_factory(entry):
    """``mx.fast.metal_kernel`` & co.: the kernels they make report a call that
    receives a carried value (a kernel computes in the types it declares)."""
    make = entry.original

    def factory(*args, **kwargs):
        kernel = make(*args, **kwargs)
        if _report.get() is None:
            return kernel
        name = f"{entry.op} {kwargs.get('name', args[0] if args else '')!r}"

        def launch(*a, **k):
            report = _report.get()
            if report is not None and _carries(k.get("inputs", ()), {}):
                dropped(report, name, "a custom kernel computes in the types it declares")
            out = kernel(*a, **k)
            autodiff.opaque(name, kernel, a, k, out, report)
            return out

        return launch

    return functools.update_wrapper(factory, make)


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


def _leaves(v):
    if isinstance(v, (list, tuple)):
        return [x for item in v for x in _leaves(item)]
    if isinstance(v, dict):
        return [x for item in v.values() for x in _leaves(item)]
    return [v]


def _compiled_function(transformed):
    """The Python function of a compiled function, or None for other transforms."""
    refs = gc.get_referents(transformed)
    if len(refs) != 4 or not callable(refs[3]):
        return None
    for state in refs[1:3]:
        if state is not None and all(x is None or type(x) is int for x in _leaves(state)):
            return None  # vmap's axes
    return refs[3]


def _call_transformed(self, *args, **kwargs):
    report = _report.get()
    if report is None:
        return _transformed_call(self, *args, **kwargs)
    fn = _compiled_function(self)
    if fn is not None:
        return fn(*args, **kwargs)
    return _opaque_call("a transformed function (mx.vmap, or a gradient made before "
                        "mlx_precise was imported)", _transformed_call, self, report, args,
                        kwargs)


_CUSTOM = type(plain.custom_function(lambda x: x))
_custom_call = _CUSTOM.__call__


def _call_custom(self, *args, **kwargs):
    report = _report.get()
    if report is None:
        return _custom_call(self, *args, **kwargs)
    return _opaque_call("mx.custom_function", _custom_call, self, report, args, kwargs)


def _opaque_call(name, call, self, report, args, kwargs):
    """A callable MLX runs on new arrays (its inputs' low words are not read):
    reported when it reads a carried value, and recorded for a gradient being
    taken (MLX's VJP of it). The ops inside still run through the flow (under
    mx.vmap on a host backend they raise TransformUnsupportedError)."""
    if _carries(args, kwargs):
        dropped(report, name, "MLX runs it on new arrays, without their low words")
    with autodiff.unrecorded():
        out = call(self, *args, **kwargs)
    autodiff.opaque(name, lambda *a, **k: call(self, *a, **k), args, kwargs, out, report)
    return out


def _run_opaque(name, fn, args, kwargs):
    report = _report.get()
    if report is None or not autodiff.recording():
        return fn(*args, **kwargs)
    with autodiff.unrecorded():
        out = fn(*args, **kwargs)
    autodiff.opaque(name, fn, args, kwargs, out, report)
    return out


context.opaque_runner.append(_run_opaque)


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
# in one numpy gather (:class:`_Gauge`, under a microsecond) when the stand-ins are
# installed, against their values when the last block closed (the same state: the
# stand-ins in place, the places found rebound, no frame's locals rebound).
_CELL = types.CellType
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python
_MANAGED_DICT = 1 << 4  # Py_TPFLAGS_MANAGED_DICT (3.11+): attributes stored in the object
_CONTAINERS = (dict, list, tuple, set, frozenset, _CELL, types.FunctionType, property,
               staticmethod, classmethod, types.MethodType, functools.partial)
_BOUND = type(mx.array.__mul__.__get__(mx.array(0)))  # MLX's bound methods
_METHODS = (_BOUND, types.MethodType)
# objects implemented in C that hold no user callable (a scan does not read their
# references): the interpreter's descriptors and builtins, classes, modules, frames
# (locals: :func:`_rebind_locals`), weak references, MLX's own functions
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
    originals in ``hit`` (:attr:`_Plan.scanned`), and the bound methods of arrays
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
        classes = {id(_namespace(c)): c for c in gc.get_referrers(*namespaces)
                   if isinstance(c, type)}
        mutable += [classes.get(id(d), d) for d in namespaces]
    return ([h for h in mutable if not ours(h)],
            [h for h in frozen if id(h) not in defaults and not ours(h)],
            [b for b in bound if not ours(b)])


def _bound_places(bound: list, hit: dict) -> tuple[list, list]:
    """(places, frozen) for bound methods of arrays that hold MLX's functions: their
    holders get the stand-in bound to the same array; a holder that cannot be
    rebound (a tuple, a local of a running function, an object implemented in C), or
    a reference no tracked object accounts for (a local of a frame the collector
    does not see), is named."""
    rebound = {id(b): _Kept((b, types.MethodType(hit[id(b.__func__)][1], b.__self__)))
               for b in bound}
    ours = {id(bound), *map(id, rebound.values())}
    referrers = [r for r in gc.get_referrers(*bound) if id(r) not in ours]
    seen = dict.fromkeys(rebound, 0)  # references the referrers account for
    for r in referrers:
        for v in gc.get_referents(r):
            if id(v) in seen:
                seen[id(v)] += 1
    # (the others: the list, its _Kept pair, the loop variable, getrefcount's argument)
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


# a scan is due / ran in this installation / sys.modules' size at the last scan
_watch = {"due": True, "scanned": False, "modules": 0}
_SKIP = ("mlx.core", "mlx_precise")  # modules whose globals are MLX's or the package's
_places_held: list = []  # _Place: rebound to the stand-ins at every installation
_warned: set = set()  # ids of the holders named in a warning already


def _apply() -> bool:
    """Set the places found so far to their stand-ins; False when one of them holds
    something else since (it was reassigned: a scan is due), or its holder is gone."""
    kept, same = [], True
    for p in _places_held:  # (with _restore_places: about 0.6 us a place per block)
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


def _restore_places() -> None:
    for p in _places_held:
        h = p.holder()
        if h is not None:
            get, set_ = p.access
            if get(h, p.key) is p.standin:  # (not reassigned inside the block)
                set_(h, p.key, p.original)


def _name(v) -> str:
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


def _rebind_held(strict: bool) -> None:
    """Scan the heap (:func:`_scan_heap`), rebind what holds MLX's originals to the
    stand-ins at this and every later installation, name what cannot be rebound."""
    plan = _plans[0]
    hit = plan.scanned
    mutable, frozen, bound = _scan_heap(hit, plan.own or {})
    if plan.own is None:  # the first scan with this plan: tell the package's own
        reached = _reached(plan)
        plan.own = {id(h): h for h in (*mutable, *frozen, *bound) if id(h) in reached}
        mutable = [h for h in mutable if id(h) not in plan.own]
        frozen = [h for h in frozen if id(h) not in plan.own]
        bound = [b for b in bound if id(b) not in plan.own]
    _watch.update(due=False, scanned=True, modules=len(sys.modules))
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


def _monitor(on: bool) -> None:
    if _MONITORING is None:
        return
    if on:
        if _MONITORING.get_tool(_TOOL) is None:
            _MONITORING.use_tool_id(_TOOL, "mlx_precise")
            _MONITORING.register_callback(_TOOL, _MONITORING.events.CALL, _on_call)
        elif _MONITORING.get_tool(_TOOL) != "mlx_precise":
            return  # another tool holds the id
        _monitored[:] = [_plans[0].scanned]
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


_lock = threading.Lock()
_open = 0  # blocks open in all threads


def _namespace(cls: type):
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


class _Kept(tuple):
    """A tuple the package keeps beside an MLX original (its stand-in, a rebinding
    to undo): a heap scan (:func:`_scan_heap`) skips it."""


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


class _Plan:
    """The stand-ins, built once (wrappers for ~350 callables cost milliseconds):
    per owner (a module or a class) the originals and their replacements, so that a
    block installs and removes them in a few pointer writes (:class:`_Pointed`) and
    dictionary updates (``setattr`` on ``mx.array`` costs 0.2 us per name, updating
    its ~90 names and telling the class 1.5 us)."""

    def __init__(self, previous: "_Plan | None" = None):
        # (owner, namespace or None (a class without one: setattr), {name: stand-in},
        # {name: original})
        self.swaps: list = []
        by_owner: dict = {}
        for e in registry.entries():
            if e.kind == "at":
                replacement = _at(e)
            elif e.kind == "kernel factory":
                replacement = _kernel_factory(e)
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
        for owner, items in by_owner.items():
            replace = {n: r for n, (_, r) in items.items()}
            restore = {n: o for n, (o, _) in items.items()}
            if not isinstance(owner, type):
                self.swaps.append((owner, vars(owner), replace, restore))
                continue
            for name, value in (*replace.items(), *restore.items()):
                setattr(owner, name, value)  # the slots now read the class dictionary
            self.swaps.append((owner, _namespace(owner), replace, restore))
        self.held: list = []  # (namespace, a getter of the names, their originals)
        for owner, namespace, _, restore in self.swaps:
            namespace = vars(owner) if namespace is None else namespace
            get = operator.itemgetter(*restore)
            self.held.append((namespace, get, get(namespace)))
        # original function -> (original, stand-in), for names bound elsewhere (those
        # of an earlier plan kept: a module may still hold an original replaced since)
        self.functions = {**(previous.functions if previous is not None else {}),
                          **{id(restore[n]): _Kept((restore[n], r))
                             for owner, _, replace, restore in self.swaps
                             if not isinstance(owner, type) for n, r in replace.items()}}
        # what a heap scan (:func:`_scan_heap`) looks for: MLX's functions and the
        # ``mx.array`` methods (unbound, ``mx.array.__mul__``), not classes (the class
        # ``mx.array`` is in every annotation and isinstance tuple) nor Python functions
        # (a replacement someone installed is their code)
        self.scanned = {key: (o, r) for key, (o, r) in self.functions.items()
                        if not isinstance(o, (type, types.FunctionType))}
        self.scanned.update({id(restore[n]): _Kept((restore[n], r)) for owner, _, replace,
                             restore in self.swaps if isinstance(owner, type)
                             and owner not in (_TRANSFORMED, _CUSTOM)
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
        # what a frame's locals are rebound from (:func:`_rebind_locals`)
        self.bindable = {**self.scanned, **self.functions}
        self.own = None  # id -> the package's own holders, found at the first scan
        # the reference counts of the scanned functions (None: read one by one)
        self.counts = _gauge([o for o, _ in self.scanned.values()], 0, _counts_follow)
        self.counted = self.tagged = None  # their readings when the last block closed
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
        for step, value, cls in self.steps[install]:
            step(value)
            if cls is not None:
                _type_modified(cls)
        if self.tags is not None:
            if install:
                self.installed = self.tags.read().tobytes()
            else:
                self.tagged = self.tags.read().tobytes()

    def _written_back(self) -> None:
        """Swap back after code in the block wrote to an owner's namespace (or where
        that cannot be told): what it set, replaced or deleted stays so."""
        for owner, namespace, replace, restore in self.swaps:
            pointed = self.pointed.get(id(owner))
            if pointed is not None:
                pointed.point(False)
                pointed.written_back()
                continue
            held = vars(owner)
            back = {n: o for n, o in restore.items() if held.get(n) is replace[n]}
            step, value, cls = self._step(owner, namespace, back, False)
            step(value)
            if cls is not None:
                _type_modified(cls)
        self.tagged = None  # (compared name by name at the next block)


# the current plan first; the earlier ones are kept (their stand-ins may still be bound
# somewhere: a heap scan must know what they hold as the package's own)
_plans: list = []


def _install() -> bool:
    """Install the stand-ins and rebind the places found so far; True when a heap
    scan is due (the first block of a plan, a place reassigned, a new reference to
    one of MLX's functions since the last block closed)."""
    # The plan is rebuilt when an owner no longer holds the original it was built
    # for (someone else replaced an MLX function since).
    plan = _plans[0] if _plans else None
    if plan is None or not plan.current():
        plan = _Plan(plan)
        _plans.insert(0, plan)
        _watch["due"] = True
    plan.swap(True)
    constructor.install()
    _monitor(True)
    if not _apply():
        _watch["due"] = True
    return _watch["due"]


def _held_anew() -> bool:
    """A new reference to one of MLX's functions since the last block closed
    (compared in the same state: the stand-ins installed, the places and the
    outermost block's locals rebound)."""
    plan = _plans[0]
    return plan.referenced() != plan.counted or len(sys.modules) != _watch["modules"]


def _uninstall() -> None:
    _monitor(False)
    constructor.uninstall()
    _restore_places()
    _watch["scanned"] = False
    _plans[0].swap(False)


def active() -> Report | None:
    """The report of the open block in this thread / task (None: the flow is off)."""
    report = _report.get()
    return report if report is not None and report.open else None


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


def _rebind_locals(every: bool):
    """[(frame, {name: (original, stand-in)})] for the locals bound to MLX functions
    of the frame that opens the block, through context-manager wrappers, and
    (``every``) of all calling frames, rebound to the stand-ins; None when there
    are none."""
    plan = _plans[0]
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


def _restore_locals(rebound) -> None:
    for frame, hits in rebound:
        namespace = frame.f_locals
        back = {name: original for name, (original, standin) in hits.items()
                if namespace.get(name) is standin}
        if back:
            _set_locals(frame, back)


class _FlowBlock:
    """The flow's part of one block (:func:`block`)."""

    __slots__ = ("on", "strict", "report", "token", "rebound")

    def __init__(self, on: bool, strict: bool):
        self.on, self.strict, self.report, self.token = on, strict, None, None
        self.rebound = None

    def __enter__(self):
        global _open
        if self.on:
            with _lock:
                if _open == 0:
                    due = _install() or self.strict
                else:  # (a strict block in a default one that did not scan)
                    due = self.strict and not _watch["scanned"]
                _open += 1
                try:
                    self.rebound = _rebind_locals(self.strict)
                    if not due and _open == 1:
                        due = _held_anew()
                    if due:
                        _rebind_held(self.strict)
                except BaseException:
                    self._close()
                    raise
            self.report = Report(self.strict)
        self.token = _report.set(self.report)  # None: the flow is off inside
        return self.report

    def __exit__(self, *exc):
        global _open
        if self.report is None:
            context.restore(_report, self.token)
            return False
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
            _plans[0].counted = _plans[0].referenced()
        if self.rebound is not None:
            _restore_locals(self.rebound)
            self.rebound = None
        _open -= 1
        if _open == 0:
            _uninstall()


def block(on: bool = True, strict: bool = False) -> _FlowBlock:
    """A context manager that opens a double-word block (``on``) and yields its
    :class:`Report`, or switches the flow off for a nested block (yields None)."""
    return _FlowBlock(on, strict)
