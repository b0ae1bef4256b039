"""What importing :mod:`mlx_precise` changes in MLX, once per process (outside
blocks MLX computes as before, bit for bit):

* ``mx.compile``: a function compiled after the import runs its Python function
  while a double-word block is open in the calling thread / task (the flow sees
  its ops, and its inputs keep their low words), and the compiled graph
  everywhere else, through which the low words of its state and results pass when
  it opens a block inside (:class:`_CarriedWords`); functions compiled before the
  import get the first treatment from the flow (:mod:`.dispatch`).
* ``mx.grad``, ``mx.value_and_grad``, ``mx.vjp``, ``mx.jvp``, ``mx.checkpoint``: a
  gradient computed while a double-word block is open in the calling thread / task
  is the flow's own, in double-word (:mod:`.autodiff`), whenever the transformed
  function was made (``nn.value_and_grad`` before the training loop included);
  everywhere else MLX's transform, made when MLX would make it.
* ``mx.fast.metal_kernel`` & co. and ``mx.import_function``: the kernels and
  functions they make are callables that report a call reading a carried value
  while a double-word block is open (they compute in the types they were made
  for), wherever they were made; everywhere else MLX's, called as they are.
* ``mx.array``'s in-place operators (``x[i] = v``, ``x += v``, ...): after MLX's
  own update they drop the low word the array carried, so no low word outlives a
  change of its value made outside a block.

Everything else the flow replaces only while a block is open (:mod:`.dispatch`).
Set ``MLX_PRECISE_INTERCEPT=0`` before the import to install nothing.
"""

from __future__ import annotations

import functools
import os
import threading

import mlx.core as mx

from .. import extended as flow
# The original MLX functions, captured before anything is replaced: the package's
# own plain paths call these, never the dispatchers.
from ..core import backends
from ..core.plain import plain
from ..doubleword.types import DoubleWord
from ..doubleword.engine64 import to64
from ..doubleword import fusion
from . import autodiff, carry, dispatch, recipes, registry, updates  # noqa: F401 (its stand-in)
from .constructor import ARRAY  # the class (mx.array is a stand-in inside blocks)

ENV_VAR = "MLX_PRECISE_INTERCEPT"

_lock = threading.Lock()
_installed = False


def _gradient_dispatcher(name: str):
    original = getattr(plain, name)

    @functools.wraps(original)
    def transform(fun, *a, **k):
        made = original(fun, *a, **k)  # MLX's own (and its argument checks), eagerly

        def call(*args, **kwargs):
            report = flow.active()
            if report is None:  # MLX differentiates: kernel results need custom VJPs
                if name == "checkpoint":  # (no gradient of its own: an outer one's, if any)
                    return made(*args, **kwargs)
                with fusion.mlx_gradients():
                    return made(*args, **kwargs)
            if name == "checkpoint":  # recomputation is MLX's memory trade: same values
                return fun(*args, **kwargs)
            argnums = a[0] if a else k.get("argnums")
            argnames = a[1] if len(a) > 1 else k.get("argnames", ())
            ours = autodiff.grad if name == "grad" else autodiff.value_and_grad
            return ours(fun, argnums, argnames, report=report)(*args, **kwargs)

        return functools.update_wrapper(call, fun, updated=())

    return transform


def _transform_now(name: str):
    original = getattr(plain, name)

    @functools.wraps(original)
    def transform(fun, primals, tangents_or_cotangents):
        report = flow.active()
        if report is None:
            with fusion.mlx_gradients():
                return original(fun, primals, tangents_or_cotangents)
        return getattr(autodiff, name)(fun, primals, tangents_or_cotangents, report=report)

    return transform


def _compile_dispatcher():
    original = plain.compile

    @functools.wraps(original)
    def compile(fun, inputs=None, outputs=None, shapeless=False):
        graph = original(fun, inputs, outputs, shapeless)
        carried = _CarriedWords(fun, inputs, outputs, shapeless, original)

        def compiled(*args, **kwargs):
            if flow.active() is not None:  # the double-word flow runs the Python ops
                return fun(*args, **kwargs)
            if carried.plain:
                return graph(*args, **kwargs)
            return carried(*args, **kwargs)

        return functools.update_wrapper(compiled, fun, updated=())

    return compile


def _word_leaves(tree, out: list | None = None) -> list:
    """The float32 / complex64 arrays of a tree (dicts, lists, tuples), in order
    (appended to ``out``: one list for the whole walk, read at every call of a
    compiled training step)."""
    out = [] if out is None else out
    if isinstance(tree, ARRAY):
        if tree.dtype == _F32 or tree.dtype == _C64:
            out.append(tree)
        return out
    if isinstance(tree, dict):
        tree = tree.values()
    elif not isinstance(tree, (list, tuple)):
        return out
    for v in tree:  # (an array leaf read here, without a call)
        if type(v) is ARRAY:
            if v.dtype == _F32 or v.dtype == _C64:
                out.append(v)
        else:
            _word_leaves(v, out)
    return out


_F32, _C64 = mx.float32, mx.complex64


class _CarriedWords:
    """What a compiled function's arrays carry, through its compiled graph.

    A function that opens a block inside (``@mx.compile def step(...): with
    extended_precision(): ...``) is traced once; later calls replay the graph, whose
    inputs and outputs are new arrays: the low words of the state it reads and
    updates (``inputs`` / ``outputs``, the model's and optimizer's state as MLX
    documents for ``mx.compile``) and of its results would be lost at every call.
    So the compiled graph takes, beside the function's arguments, the carried value
    of each float32 / complex64 array of ``inputs`` that carries one, attached to
    its tracer before the function runs, and returns the carried value of each such
    array of its result and of ``outputs``, attached to the arrays MLX returns and
    writes back.
    On a float64 engine (cpu) the carried value is the float64 value the flow
    carries (the replay then computes what the uncompiled step computes); elsewhere
    the low word. Which one: the form the block inside made its results in, learned
    at the trace (:attr:`wide`; a block may choose its own backend, as
    ``with use_backend("metal")`` inside a function called where the default is cpu:
    float64 values would then cross the compiled graph, split into words and joined
    again on the CPU). The results leave in that form from the trace that learns it
    on; the inputs of a first call enter in the form of the backend active there.

    The first call decides: a function whose trace leaves no low word on what it
    returns or updates (it opens no block) runs MLX's own compiled graph from then
    on (:attr:`plain`)."""

    def __init__(self, fun, inputs, outputs, shapeless, compile_):
        self.fun, self.inputs, self.outputs = fun, inputs, outputs
        self.plain = False
        self.wide: bool | None = None  # the block's form, once a trace has shown it
        self.graph = compile_(self._traced, inputs, outputs, shapeless)

    def _traced(self, wide, carried_in, values, *args, **kwargs):
        """``wide``: the form of ``values`` (None when there are none)."""
        given = _word_leaves(self.inputs)
        for a, v in zip([a for a, c in zip(given, carried_in) if c], values):
            _attach(a, v, wide)
        with recipes.tracing():
            out = self.fun(*args, **kwargs)
        leaves = _word_leaves(self.outputs, _word_leaves(out))
        self.plain = not any(carry.has_words(a) for a in leaves)
        # the form of what the block made (not of state it handed back unchanged)
        given = {id(a) for a in given}
        forms = {carry.wide_value(a) is not None for a in leaves
                 if id(a) not in given and carry.has_words(a)}
        if len(forms) == 1:
            self.wide = forms.pop()
        # in that form (a list of float64 parts, or the low word), also on the call
        # that learns it: the caller attaches what the graph returns as it is
        form = self.wide if self.wide is not None else backends.backend().float64_engine
        return out, [_carried(a, form) for a in leaves]

    def __call__(self, *args, **kwargs):
        wide = self.wide
        if wide is None:
            wide = backends.backend().float64_engine
        leaves = _word_leaves(self.inputs)
        # which inputs carry a value, and in which form: constants of the trace (a
        # change retraces; the form only where a value enters)
        if wide:
            carried_in = tuple(carry.has_words(a) for a in leaves)
            values = [_carried(a, wide) for a, c in zip(leaves, carried_in) if c]
        else:  # (the low words, read once)
            values = [carry.low_word(a) for a in leaves]
            carried_in = tuple(lo is not None for lo in values)
            values = [lo for lo in values if lo is not None]
        out, carried = self.graph(wide if values else None, carried_in, values, *args,
                                  **kwargs)
        if not self.plain:
            for a, v in zip(_word_leaves(self.outputs, _word_leaves(out)), carried):
                _attach(a, v, isinstance(v, list))
        return out


def _carried(a: mx.array, wide: bool):
    """The value ``a`` carries: its float64 value (``wide``: a list, the real and
    imaginary parts of a complex64 array) or its low word (zeros when exact)."""
    if not wide:
        lo = carry.low_word(a)
        return mx.zeros_like(a) if lo is None else lo
    w = carry.words_of(a)
    with mx.stream(mx.cpu):
        re, im = to64(DoubleWord.exact(a) if w is None else w)
    return [re] if im is None else [re, im]


def _attach(a: mx.array, v, wide: bool) -> None:
    if wide:
        carry.attach_words(a, DoubleWord.from_wide(a, (v[0], v[1] if len(v) > 1 else None)))
    else:
        carry.attach(a, v)


_IN_PLACE = ("__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__",
             "__ifloordiv__", "__imod__", "__ipow__", "__imatmul__", "__iand__", "__ior__",
             "__ixor__", "__ilshift__", "__irshift__")


def _keep_low_words_current() -> None:
    """A low word belongs to its array's value: an in-place update made outside a
    block (``y[0] = 5``, ``w += 10``) must drop it, or the next block would read
    the old value's low word. MLX's in-place operators get a stand-in that does
    that after MLX's own update; while no array carries a low word it costs one
    dictionary test."""
    for name in _IN_PLACE:
        original = getattr(mx.array, name)

        def update(self, *args, _original=original):
            out = _original(self, *args)
            if carry.any_carried():
                carry.attach(self, None)
            return out

        setattr(mx.array, name, functools.update_wrapper(update, original))


def install() -> None:
    """Install the stand-ins (once per process; the package's import does it
    unless ``MLX_PRECISE_INTERCEPT=0``)."""
    global _installed
    with _lock:
        if _installed:
            return
        mx.compile = _compile_dispatcher()
        for name in ("grad", "value_and_grad", "checkpoint"):
            setattr(mx, name, _gradient_dispatcher(name))
        for name in ("vjp", "jvp"):
            setattr(mx, name, _transform_now(name))
        _keep_low_words_current()
        for op in registry.FACTORIES:
            prefix, _, name = op.rpartition(".")
            module = registry.MODULES[prefix + "." if prefix else ""]
            if hasattr(module, name):
                setattr(module, name, dispatch.factory(op, getattr(module, name), always=True))
        _installed = True


def installed() -> bool:
    """True once the dispatchers are in place."""
    return _installed


def install_from_env() -> None:
    """:func:`install` unless the environment variable says 0 / false / off."""
    if os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "off", "no"):
        install()
