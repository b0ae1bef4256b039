"""Every callable of MLX's array API, classified once.

The flow (:mod:`.dispatch`) stands in for each callable of ``mx``, ``mx.fast``,
``mx.fft``, ``mx.linalg``, ``mx.random``, ``mx.distributed`` and each attribute of
``mx.array`` while a block is open. What it does with one is decided here, in one table:

* a **rule** (:mod:`.rules`, declared next to its op, by family): the op runs in
  double-word;
* an **alias** of a canonical op (``asin`` of ``arcsin``, ``pow`` of ``power``): the
  canonical op's rule; an ``mx.array`` method of the same name as a function
  (``a.sum()``, ``a.exp()``) and the operators (``a + b``, ``b.__radd__(a)``,
  ``a += b``) are derived from the function's rule, never declared twice;
* **value-free**: the result is decided exactly by the high word (``isnan``,
  ``sign``, ``zeros_like``, ``any``: ``hi = RN(hi + lo)`` has the value's sign,
  zero-ness and finiteness), or the op refuses floating operands (the bitwise ops):
  MLX runs it, nothing is reported (its stand-in only lets a replay's trace watch
  it: :class:`.dispatch.Watch`);
* **without a rule**, with the reason: MLX runs it in float32, and a call that
  consumes a carried value is reported (``strict=True`` raises);
* the class ``mx.array``: ``mx.array(x)`` copies a carried value with its words
  (:mod:`.constructor`);
* **not an op** (transforms, streams, memory, files, constructors from shapes) or an
  **exit** (``item``, ``tolist``, ``np.array(x)``, printing): not wrapped; a value
  leaving there is the float32 rounding of the double-word value, rounded once.

``stream=`` is handled once, by the dispatcher, for every rule. A test holds this
table against every callable of the installed MLX (tests/extended/test_registry.py).
"""

from __future__ import annotations

import types

import mlx.core as mx

from . import constructor, rules

_ARRAY = constructor.ARRAY  # the class (mx.array is a stand-in while blocks are open)

MODULES = {"": mx, "fast.": mx.fast, "fft.": mx.fft, "linalg.": mx.linalg,
           "random.": mx.random, "distributed.": mx.distributed}
"""Prefix of the qualified op name -> the MLX module it names a callable of."""

ALIASES = {"asin": "arcsin", "acos": "arccos", "atan": "arctan", "asinh": "arcsinh",
           "acosh": "arccosh", "atanh": "arctanh", "atan2": "arctan2", "pow": "power",
           "cumulative_sum": "cumsum", "cumulative_prod": "cumprod", "concat": "concatenate",
           "conj": "conjugate"}
"""Alias -> canonical op (MLX binds both names to one operation)."""

OPERATORS = {
    "__add__": "add", "__sub__": "subtract", "__mul__": "multiply", "__truediv__": "divide",
    "__div__": "divide", "__floordiv__": "floor_divide", "__mod__": "remainder",
    "__divmod__": "divmod", "__pow__": "power", "__matmul__": "matmul",
    "__neg__": "negative", "__pos__": "positive", "__abs__": "abs",
    "__lt__": "less", "__le__": "less_equal", "__gt__": "greater", "__ge__": "greater_equal",
    "__eq__": "equal", "__ne__": "not_equal", "__and__": "bitwise_and",
    "__or__": "bitwise_or", "__xor__": "bitwise_xor", "__invert__": "bitwise_invert",
    "__lshift__": "left_shift", "__rshift__": "right_shift",
}
"""``mx.array`` operator -> the op it computes; ``__r<op>__`` is the reflected form
and ``__i<op>__`` the in-place one of the same op (derived)."""

VALUE_FREE = frozenset({
    # decided by the high word: hi = RN(hi + lo) has the value's sign, zero-ness,
    # finiteness (and hi = 0 only when lo = 0)
    "isnan", "isinf", "isfinite", "isposinf", "isneginf", "sign", "all", "any",
    "count_nonzero", "logical_and", "logical_or", "logical_not", "logical_xor",
    # read only the shape and dtype
    "zeros_like", "ones_like", "empty_like",
    # constructors from shapes and scalars (float32 scalars are exact there)
    "zeros", "ones", "eye", "identity", "tri", "empty", "bartlett", "blackman",
    "hamming", "hanning",
    # refuse floating operands (MLX raises): no carried value reaches them
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_invert", "left_shift",
    "right_shift", "bitwise_left_shift", "bitwise_right_shift",
    # random keys and seeds are integers; gumbel reads a shape and a key
    "random.key", "random.seed", "random.split", "random.gumbel",
    # reads the shape and dtype of its template
    "distributed.recv_like",
})

_LOW_PRECISION = "a low-precision format (float32 or narrower by design)"

WITHOUT_RULE = {
    **dict.fromkeys(("qqmm", "gather_qqmm", "to_fp8", "from_fp8"), _LOW_PRECISION),
    # the fused kernels of mx.fast run in float32 (their inputs are reported)
    **dict.fromkeys(("fast.metal_kernel", "fast.cuda_kernel",
                     "fast.precompiled_cuda_kernel"),
                    "a custom kernel computes in the types it declares"),
    "import_function": "an imported function runs the graph it was exported with, in "
                       "the types it was traced with",
    "distributed.send": "it sends the float32 value (the receiver's recv takes no low "
                        "word)",
}
"""Op -> why it has no double-word rule (reported when it consumes a carried value;
``strict=True`` raises)."""

FACTORIES = frozenset({"fast.metal_kernel", "fast.cuda_kernel",
                       "fast.precompiled_cuda_kernel", "import_function"})
"""Ops whose result is a callable MLX made (a custom kernel, an imported function):
its calls are reported, not the factory's (:func:`.dispatch.factory`; installed at
import too, :mod:`.intercept`, so that what is made outside blocks reports inside
them)."""

NOT_OPS = frozenset({
    "eval", "async_eval", "grad", "value_and_grad", "vjp", "jvp", "vmap", "compile",
    "custom_function", "checkpoint", "stream", "new_stream", "default_stream",
    "default_device", "set_default_device", "set_default_stream", "disable_compile",
    "enable_compile", "export_function", "export_to_dot", "exporter",
    "load", "synchronize", "clear_cache", "clear_streams", "get_active_memory",
    "get_cache_memory", "get_peak_memory", "reset_peak_memory", "get_memory_limit",
    "set_memory_limit", "set_cache_limit", "set_wired_limit", "get_array_buffer_size",
    "device_count", "device_info", "is_available", "printoptions", "get_printoptions",
    "set_printoptions", "new_thread_local_stream", "new_thread_unsafe_stream", "issubdtype",
    "isdtype", "can_cast", "result_type", "broadcast_shapes", "finfo", "iinfo",
    "from_dlpack", "einsum_path", "distributed.init", "distributed.is_available",
    "distributed.recv",  # an array from another process (its float32 value)
    # exits: a value leaves here as the float32 rounding of its double-word value
    "save", "savez", "savez_compressed", "save_gguf", "save_safetensors", "view",
    "quantize",  # into a low-precision format (codes of 2-8 bits)
})
"""Callables of the modules that are not ops on array values, or exits."""

GRADIENTS = ("grad", "value_and_grad", "vjp", "jvp")

ARRAY_EXITS = frozenset({
    "item", "tolist", "view", "__array__", "__float__", "__index__",
    "__complex__", "__bool__", "__repr__", "__str__", "__format__", "__bytes__",
    "__dlpack__", "__dlpack_device__", "__getstate__", "__setstate__", "__reduce__",
    "__reduce_ex__", "__array_namespace__", "__len__", "__hash__",
    "__buffer__", "__release_buffer__",  # (the buffer protocol, Python 3.12+)
})
"""``mx.array`` attributes where a value leaves (rounded once: the high word) or
whose answer is decided by the high word (``bool(x)``)."""

ARRAY_NOT_OPS = frozenset({
    "__class__", "__delattr__", "__dir__", "__doc__", "__getattribute__", "__init__",
    "__init_subclass__", "__module__", "__new__", "__setattr__", "__sizeof__",
    "__subclasshook__", "__weakref__", "__nb_signature__", "__annotations__",
    # properties read from the shape and dtype
    "shape", "dtype", "ndim", "size", "itemsize", "nbytes",
})


def callables(module) -> list[str]:
    """The public callables of an MLX module (functions, not classes)."""
    return sorted(n for n in dir(module) if not n.startswith("_")
                  and callable(getattr(module, n)) and not isinstance(getattr(module, n), type))


def canonical(name: str) -> str:
    return ALIASES.get(name, name)


def kind(name: str) -> str:
    """``"rule"``, ``"value-free"``, ``"without rule"`` or ``"not an op"`` for a
    qualified op name (aliases resolved); KeyError for a callable nobody classified."""
    name = canonical(name)
    if name in rules.TABLE:
        return "rule"
    if name in VALUE_FREE:
        return "value-free"
    if name in WITHOUT_RULE:
        return "without rule"
    if name in NOT_OPS:
        return "not an op"
    raise KeyError(name)


class Entry(types.SimpleNamespace):
    """One stand-in to install: ``owner.attr`` is ``original``; ``op`` is the
    qualified op name the report counts; ``rule`` its rule or None; ``vjp`` its VJP
    rule or None; ``kind`` as :func:`kind` (``"property"`` for properties,
    ``"in-place"`` for ``__i<op>__`` (``functional``: MLX's ``__<op>__``), ``"at"``
    for ``mx.array.at``, ``"factory"``); ``fast`` the op's fast path or None
    (:data:`.rules.FAST`)."""

    def __init__(self, **kw):
        super().__init__(**{"vjp": None, "functional": None, "fast": None, **kw})


def _reflected(rule):
    """The rule of ``y.__r<op>__(x)`` (= ``x op y``) from the rule of ``op``."""

    def reflected(ctx, original, y, x, *rest, **kw):
        return rule(ctx, lambda a, b, *r, **k: original(b, a, *r, **k), x, y, *rest, **kw)

    return reflected


def _reflected_fast(fast):
    """The fast path of ``y.__r<op>__(x)`` (= ``x op y``)."""
    return lambda y, x: fast(x, y)


def _reflected_vjp(vjp):
    """The VJP of ``y.__r<op>__(x)`` (recorded with arguments (y, x)) from the VJP
    of ``x op y``."""
    if vjp is None:
        return None

    def reflected(e, g):
        view = types.SimpleNamespace(**{**vars(e), "args": (e.args[1], e.args[0], *e.args[2:])})
        out = vjp(view, g)
        if out is NotImplemented or out is None:
            return out
        out = list(out) + [None] * (2 - len(out))
        return (out[1], out[0], *out[2:])

    return reflected


def _array_entry(attr: str, value) -> Entry | None:
    """What stands in for ``mx.array.<attr>`` (None: not wrapped)."""
    if attr in ARRAY_EXITS or attr in ARRAY_NOT_OPS:
        return None
    if isinstance(value, property):
        if attr == "at":
            return Entry(owner=_ARRAY, attr=attr, original=value, op="array.at", rule=None,
                         kind="at")
        return Entry(owner=_ARRAY, attr=attr, original=value, op=f"array.{attr}",
                     rule=rules.TABLE[f"array.{attr}"], kind="property",
                     vjp=rules.VJPS.get(f"array.{attr}"))
    own = rules.TABLE.get(f"array.{attr}")
    if own is not None:
        return Entry(owner=_ARRAY, attr=attr, original=value, op=attr, rule=own, kind="rule",
                     vjp=rules.VJPS.get(f"array.{attr}"), fast=rules.FAST.get(f"array.{attr}"))
    op, how = attr, "method"
    if attr.startswith("__"):
        base = attr[2:-2]
        if f"__{base}__" in OPERATORS:
            op = OPERATORS[f"__{base}__"]
        elif base.startswith("r") and f"__{base[1:]}__" in OPERATORS:
            op, how = OPERATORS[f"__{base[1:]}__"], "reflected"
        elif base.startswith("i") and f"__{base[1:]}__" in OPERATORS:
            op, how = OPERATORS[f"__{base[1:]}__"], "in-place"
        else:
            raise KeyError(f"array.{attr}")
    op = canonical(op)
    k = kind(op)
    rule, vjp, functional, fast = rules.TABLE.get(op), rules.VJPS.get(op), None, rules.FAST.get(op)
    if rule is not None and how == "reflected":
        rule, vjp = _reflected(rule), _reflected_vjp(vjp)
        fast = None if fast is None else _reflected_fast(fast)
    if how == "in-place":
        functional = getattr(_ARRAY, f"__{attr[3:-2]}__")
        rule = None if rule is None else rules.inplace(rule, functional)
        k, fast = "in-place", None if fast is None else rules.inplace_fast(fast)
    return Entry(owner=_ARRAY, attr=attr, original=value, op=attr, rule=rule, kind=k,
                 vjp=vjp, functional=functional, fast=fast)


def entries() -> list[Entry]:
    """Every stand-in the flow installs, from the modules as they are now; the
    class ``mx.array`` itself too (kind ``"constructor"``: ``mx.array(x)``)."""
    out = [Entry(owner=mx, attr="array", original=constructor.ARRAY, op="array",
                 rule=rules.TABLE["array"], kind="constructor", vjp=rules.VJPS["array"])]
    for prefix, module in MODULES.items():
        for name in callables(module):
            op = prefix + name
            k = kind(op)
            if k == "not an op":
                continue
            if op in FACTORIES:
                k = "factory"
            out.append(Entry(owner=module, attr=name, original=getattr(module, name), op=op,
                             rule=rules.TABLE.get(canonical(op)), kind=k,
                             vjp=rules.VJPS.get(canonical(op)),
                             fast=rules.FAST.get(canonical(op))))
    for attr in dir(_ARRAY):
        entry = _array_entry(attr, getattr(_ARRAY, attr))
        if entry is not None:
            out.append(entry)
    return out
