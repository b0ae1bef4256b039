"""Fused chains of elementwise double-word operations on the kernel backends (metal,
emulate): one ``dw_fused`` launch per result a graph consumes.

MLX evaluates lazily: an array is computed only when an evaluated graph needs it.
Inside an ``extended_precision()`` block the result of an elementwise double-word
operation keeps, beside its words, its *expression*: the operations that made it
from leaf arrays (inputs, results of other kernels, anything without an expression)
and constants. The next elementwise operation composes the expressions of its
operands and launches one kernel for the whole chain, reading the leaves; so
``x * 0.5 * (1 + erf(x / sqrt(2)))`` is one launch that reads ``x``, and the
intermediate results are computed only if something else reads them (then by their
own launch). Broadcast operands are read through their strides (never expanded),
float32 operands enter without a low word (none is made), Python constants are part
of the program. (Outside blocks each operation is one launch over its operands.)

The kernel interprets its program (``metal/kernels/dw_fused.metal``; the program is
an int32 buffer): every chain runs on one of six kernels (4, 8 or 12 word array
slots, the fewest that hold its leaves; with or without the elementary functions of
``dw_math.h``), so chains cost no Metal compilation of their own and the emulator
compiles six kernels for all of them. Each operation of a
program is the one the single-operation kernels run (``dw_add``, ``dw_mul``,
``dw_div``, ``dwm_apply``), in the same order, so a fused result has exactly the bits
of the unfused chain.

Bounds: an expression has at most ``DWF_MAX_INSTRUCTIONS`` instructions (loads,
constants, operations), ``DWF_SLOTS`` word arrays and ``DWF_REGISTERS`` values live at
once, over at most ``DWF_MAX_NDIM`` axes; an operand whose expression would exceed
them enters as a leaf (its own launch). A value read by several consumers is
recomputed by each (at most that many instructions), never stored in between.

Gradients (MLX's own autodiff, when a function that opens a block is differentiated
from outside every block): a fused result is a custom function of its leaves whose
VJP replays the chain one operation at a time, each with the float32 derivative of
the high words that the unfused operation has, so the gradient is the unfused
chain's. (Inside a block gradients are the flow's own, made of fused operations.)
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import weakref
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..core import backends
from ..core.autodiff import guarded as _guarded, as_tuple
from ..core.context import flow_suspended, register_block_hook, restore, setting
from ..core.kernels import (Codes, Constants, Kernel, elementwise_grid, generated_block,
                            per_element_of_first_input)
from ..core.plain import plain as _mlx
from .types import DoubleWord

F32, _C64 = mx.float32, mx.complex64

OP = Codes("DWF_OP", ("load", "const", "neg", "add", "sub", "mul", "div", "fn", "abs", "max",
                      "min", "part"))
"""Operation codes of a ``dw_fused`` program (``metal/include/dw_fused.h``)."""

LIMITS = Constants("DWF", {"slots": 12, "registers": 8, "max_ndim": 8,
                           "max_instructions": 32, "header": 60, "instr": 5,
                           "prog_count": 0, "prog_out": 1, "prog_n": 2, "prog_reduce": 3,
                           "prog_nd": 4, "prog_ndim": 5, "prog_plane": 6, "prog_extents": 8,
                           "prog_perm": 16, "prog_slots": 24, "prog_planes": 48,
                           "exact": -1, "packed": -2,
                           "reduce_max": 2048, "reduce_threads": 256})
"""The program layout and the bounds of an expression, shared with the kernels: word
array slots, registers, axes, instructions; the header's length and its fields
(instruction count, result register; for ``dw_reduce`` the row length and the
operation; the iteration's axes, the array's axes, the output's plane (its low
words follow its high words: packed words), the iteration's extents, the array
axis each iteration axis walks, each slot's axes and broadcast mask, each slot's
plane: see :func:`program`), the words per instruction (op, dst, x, y, fn); a
load's ``y`` for no low word (``exact``) and for a packed slot (``packed``: the
low words a plane of rows past the high ones); ``dw_reduce``'s threadgroup memory (values
of the tree's first level, so rows of up to twice as many elements) and threads
per row."""


def codes_source() -> str:
    """The generated block of ``metal/include/dw_fused.h`` (a test checks that the
    header holds exactly this text)."""
    return generated_block("mlx_precise.doubleword.fusion.codes_source()", OP, LIMITS)


_SLOTS, _REGISTERS, _MAX_NDIM, _MAX_INSTRUCTIONS = (
    LIMITS.slots, LIMITS.registers, LIMITS.max_ndim, LIMITS.max_instructions)
_REDUCE_MAX, _REDUCE_THREADS = LIMITS.reduce_max, LIMITS.reduce_threads
_SLOT_NAMES = tuple(f"a{k}" for k in range(_SLOTS))

# What the kernels of programs share: the word array slots and the program; every
# slot is a view of 8 elements at least and the program has its header, so all are
# device buffers (one signature for every chain); views are read through their
# strides (no copy of a broadcast, transposed or sliced operand). Each comes with 4,
# 8 and 12 slots (a launch's host cost grows with its inputs: the replay of a
# compiled graph copies each per output, Metal binds each with its strides; most
# chains read at most four arrays) and with and without the elementary functions
# (dw_math.h is most of the kernel source that MLX copies and hashes at every
# launch).
_SLOT_COUNTS = (4, 8, _SLOTS)


def _slots_declaration(slots: int) -> str:
    """The body's line 1 (:attr:`Kernel.prelude`): ``dwf_slots s`` over the slots
    ``a0 .. a<slots - 1>``, the ``DWF_SLOTS - slots`` others repeating ``a0`` (no
    program of the kernel reads them)."""
    names = [f"a{k}" for k in range(slots)] + ["a0"] * (_SLOTS - slots)
    return ("const dwf_slots s = {{" + ", ".join(names) + "}, {"
            + ", ".join(f"{n}_strides" for n in names) + "}};")


def _program_kernel(name: str, slots: int, math_: bool, **kw) -> Kernel:
    """The kernel of ``metal/kernels/<name>.metal`` with ``slots`` slots, with the
    elementary functions (``math_``: MATH is True) or without them (dw_math.h left
    out), named ``<name>[<slots>][_math]`` (no count for ``DWF_SLOTS`` slots)."""
    names = _SLOT_NAMES[:slots]
    return Kernel(
        name=name + ("" if slots == _SLOTS else str(slots)) + ("_math" if math_ else ""),
        body=f"{name}.metal",
        headers=("dw_fused.h", "dw_fused_math.h") if math_ else ("dw_fused.h",),
        inputs=names + ("prog",),
        outputs=("z",),
        template=("MATH",),
        input_dtypes={**{s: (F32,) for s in names}, "prog": (mx.int32,)},
        input_forms={n: ("device",) for n in names + ("prog",)},
        ensure_row_contiguous=False,
        variants={"MATH": (math_,), "z": (F32,)},
        prelude=_slots_declaration(slots),
        **kw)


def _fused(slots: int, math_: bool) -> Kernel:
    return _program_kernel("dw_fused", slots, math_, grid=per_element_of_first_input)


DW_FUSED = _fused(_SLOTS, False)
"""A double-word expression over up to ``DWF_SLOTS`` float32 word arrays ``a0 ..
a11`` (views of the output's shape, read through their strides), by the program
``prog`` (int32, see :func:`program`); output ``z`` (float32, :func:`packed_shape`
of the output's shape): the result's high words, then its low words. ``MATH``:
False (the program calls no elementary function). Its siblings (:data:`PROGRAM_KERNELS`): ``dw_fused4``, ``dw_fused8``
(slots ``a0 .. a3``, ``a0 .. a7``) and each with the elementary functions
(``_math``, MATH True)."""
DW_FUSED_MATH, DW_FUSED4, DW_FUSED4_MATH, DW_FUSED8, DW_FUSED8_MATH = (
    _fused(slots, math_)
    for slots, math_ in ((_SLOTS, True), (4, False), (4, True), (8, False), (8, True)))

DW_REDUCE = _program_kernel("dw_reduce", _SLOTS, False)
"""The sums (or products) of the rows of a double-word expression by the pairwise
tree of :func:`mlx_precise.extended.arith.reduce_sum`: slots as :data:`DW_FUSED`'s,
views of shape ``[kept axes..., reduced axes...]``; ``prog`` with the row length and
the operation in its header; output ``z`` (float32, one high word per row, then
one low word per row). Grid: one threadgroup per row (:func:`reduce`). Siblings as dw_fused's."""
DW_REDUCE_MATH, DW_REDUCE4, DW_REDUCE4_MATH, DW_REDUCE8, DW_REDUCE8_MATH = (
    _program_kernel("dw_reduce", slots, math_)
    for slots, math_ in ((_SLOTS, True), (4, False), (4, True), (8, False), (8, True)))

PROGRAM_KERNELS = {
    (Path(k.body).stem, len(k.inputs) - 1, k.variants["MATH"][0]): k
    for k in (DW_FUSED, DW_FUSED_MATH, DW_FUSED4, DW_FUSED4_MATH, DW_FUSED8, DW_FUSED8_MATH,
              DW_REDUCE, DW_REDUCE_MATH, DW_REDUCE4, DW_REDUCE4_MATH, DW_REDUCE8,
              DW_REDUCE8_MATH)}
"""``(kind, slots, math) -> Kernel``: the program kernels (module names, so that the
strict Metal check finds each)."""


def _program_kernel_for(kind: str, leaves: int, math_: bool) -> Kernel:
    """The ``kind`` kernel with the fewest slots that hold ``leaves`` arrays."""
    slots = next(n for n in _SLOT_COUNTS if n >= leaves)
    return PROGRAM_KERNELS[(kind, slots, math_)]


_LOAD, _CONST, _NEG, _SUB, _FN, _PART = (OP["load"], OP["const"], OP["neg"], OP["sub"],
                                         OP["fn"], OP["part"])
_BINARY = {name: OP[name] for name in ("add", "sub", "mul", "div")}
# Operations exact on the words (|x|, max, min), which MLX differentiates through the
# flow's word ops; a chain replayed for MLX's autodiff never holds them (apply).
_EXACT_WORDS = {OP["abs"], OP["max"], OP["min"]}


# ---- expressions ------------------------------------------------------------------------

class Program:
    """The instructions of an expression, interned: one object per distinct ``(code,
    root)`` (:attr:`key`), so that the caches of compositions and launches key on
    the object (hashing a program's instructions at every operation would cost
    more than the lookup saves). ``code[k] = (op, x, y, fn)``: a load (``x``,
    ``y``: leaf slots of the high and low words, ``y = -1`` for a float32 operand),
    a constant (``x``, ``y``: the int32 bits of its float32 words) or an operation
    of earlier instructions ``x``, ``y`` (``y = -1`` for one operand; ``fn``: the
    ``DWM_FN`` code of a function); ``root``: the instruction of the value;
    ``exact_words``: it holds abs / max / min (no replay: see :func:`apply`)."""

    __slots__ = ("key", "code", "root", "exact_words", "_index", "_fits")

    def __init__(self, code: tuple, root: int, exact_words: bool):
        self.key, self.code, self.root = (code, root), code, root
        self.exact_words = exact_words
        self._index = self._fits = None

    @property
    def index(self) -> dict:
        """Instruction -> its position (equal instructions are stored once)."""
        if self._index is None:
            self._index = {ins: k for k, ins in enumerate(self.code)}
        return self._index

    @property
    def fits(self) -> bool:
        """Within the kernels' instruction count and register file."""
        if self._fits is None:
            self._fits = (len(self.code) <= _MAX_INSTRUCTIONS
                          and _instructions(self.key) is not None)
        return self._fits


_INTERNED: dict = {}  # key -> Program (bounded: see _intern)
_CONSTANTS: dict = {}  # (hi, lo, their signs) -> the Program of the constant


def _intern(code: tuple, root: int, exact_words: bool) -> Program:
    """The one :class:`Program` of ``(code, root)``."""
    prog = _INTERNED.get((code, root))
    if prog is None:
        prog = Program(code, root, exact_words)
        _cache(_INTERNED, prog.key, prog)
    return prog


class Expr:
    """An elementwise double-word expression in SSA form over leaf word arrays: the
    :class:`Program` ``prog`` over ``leaves`` (aliases of word arrays, one per
    slot), of broadcast ``shape``."""

    __slots__ = ("leaves", "prog", "shape")

    def __init__(self, leaves: tuple, prog: Program, shape: tuple):
        self.leaves, self.prog, self.shape = leaves, prog, shape

    @property
    def code(self) -> tuple:
        return self.prog.code

    @property
    def key(self) -> tuple:
        """What the program depends on (the arrays are not part of it)."""
        return self.prog.key

    @property
    def exact_words(self) -> bool:
        return self.prog.exact_words

    @classmethod
    def leaf(cls, hi: mx.array, lo: mx.array | None) -> "Expr":
        """``hi`` (and ``lo``) as a leaf, read through aliases of the arrays as they
        are now: a later in-place update of ``hi`` (MLX's ``x[i] = v``, ``x += v``)
        replaces its data, not the alias's, so every expression reads the words it
        was made from. (Two captures of one array therefore take two slots: nothing
        tells whether it was updated in between.) Words a kernel wrote packed in
        this block (:func:`note_packed`): their packed array, one slot (no one
        outside the package holds it, so nothing updates it in place)."""
        if lo is not None:
            z = packed(hi, lo)
            if z is not None:
                return cls.packed_leaf(z, tuple(hi.shape))
            z = _copied(hi, lo)
            if z is not None:  # (a single value: element 0 of each word's 8 copies)
                return cls((z,), _COPIES_LOAD, tuple(hi.shape))
        if lo is None:
            return cls((_ASTYPE(hi, F32),), _EXACT_LOAD, tuple(hi.shape))
        return cls((_ASTYPE(hi, F32), _ASTYPE(lo, F32)), _DW_LOAD, tuple(hi.shape))

    @classmethod
    def packed_leaf(cls, z: mx.array, shape: tuple) -> "Expr":
        """Packed words ``z`` (or a view of them that keeps their first axis) of
        words of ``shape`` as a leaf: one slot, read packed."""
        return cls((z,), _PACKED_LOAD, shape)

    @classmethod
    def constant(cls, hi: float, lo: float) -> "Expr":
        key = (hi, lo, math.copysign(1.0, hi), math.copysign(1.0, lo))  # -0.0 == 0.0
        prog = _CONSTANTS.get(key)
        if prog is None:
            bits = np.array([hi, lo], np.float32).view(np.int32)
            prog = _intern(((_CONST, int(bits[0]), int(bits[1]), 0),), 0, False)
            _cache(_CONSTANTS, key, prog)
        return cls((), prog, ())

    def fits(self) -> bool:
        """Within the kernels' bounds: slots, instructions, axes (fewer than 8
        outputs add an axis: see _run) and registers."""
        return len(self.leaves) <= _SLOTS and len(self.shape) < _MAX_NDIM and self.prog.fits


_ASTYPE = mx.array.astype  # MLX's own (to the same dtype: an alias, no graph node)
# MLX's own array methods and functions (captured at import, before any block installs
# the flow's stand-ins): the engine calls them on words, where a stand-in would only
# check that no block report is open and call these (the same nodes, host time).
_RESHAPE, _VIEW, _INDEX = mx.array.reshape, mx.array.view, mx.array.__getitem__
_TRANSPOSE, _PAD = mx.array.transpose, mx.pad
_BROADCAST_TO = mx.broadcast_to


def _cache(table: dict, key, value) -> None:
    """``table[key] = value``, the oldest entry dropped beyond ``_CACHE_SIZE``."""
    table[key] = value
    if len(table) > _CACHE_SIZE:
        table.pop(next(iter(table)), None)  # (another thread may have taken it)


_CACHE_SIZE = 4096
# The programs of a leaf, shared.
_EXACT, _PACKED = LIMITS.exact, LIMITS.packed
_DW_LOAD = _intern(((_LOAD, 0, 1, 0),), 0, False)
_EXACT_LOAD = _intern(((_LOAD, 0, _EXACT, 0),), 0, False)
_PACKED_LOAD = _intern(((_LOAD, 0, _PACKED, 0),), 0, False)
_COPIES = 1  # a load's fn: the slot holds the 8 copies of a single value's words
_COPIES_LOAD = _intern(((_LOAD, 0, _PACKED, _COPIES),), 0, False)


def _broadcast(shapes) -> tuple | None:
    """numpy's broadcast shape, or None when the shapes do not broadcast (cached
    for shapes that differ)."""
    first = shapes[0]
    if all(s == first for s in shapes):
        return first
    key = tuple(shapes)
    out = _BROADCASTS.get(key, False)
    if out is False:
        out = _broadcast_shape(key)
        _cache(_BROADCASTS, key, out)
    return out


_BROADCASTS: dict = {}


def _broadcast_shape(shapes: tuple) -> tuple | None:
    n = max(len(s) for s in shapes)
    out = []
    for d in range(n):
        size = 1
        for s in shapes:
            k = d - (n - len(s))
            if k >= 0 and s[k] != 1:
                if size not in (1, s[k]):
                    return None
                size = s[k]
        out.append(size)
    return tuple(out)


def _compose(op: int, fn: int, operands: list[Expr]) -> Expr | None:
    """``op`` (a code of :data:`OP`; ``fn``: a function's code) of the operands'
    expressions, leaves and equal instructions shared. The program depends only on
    the operands' programs and on which leaves they share, so a repeated layer finds
    it in :data:`_COMPOSED` (one lookup)."""
    first = operands[0]
    shape, leaves = first.shape, first.leaves
    slots = []
    for e in operands[1:]:  # (an op has one or two operands: a short loop, kept cheap)
        if e.shape != shape:
            shape = _broadcast((shape, e.shape))
            if shape is None:
                return None
        if not e.leaves:
            slots.append(())
            continue
        # an alias read twice: one slot (a scan by identity: a dozen leaves at most)
        taken = []
        for a in e.leaves:
            for k, b in enumerate(leaves):
                if b is a:
                    break
            else:
                k = len(leaves)
                leaves += (a,)
            taken.append(k)
        slots.append(tuple(taken))
    key = (op, fn, tuple([e.prog for e in operands]), tuple(slots))
    prog = _COMPOSED.get(key)
    if prog is None:
        prog = _composed_program(op, fn, key[2], slots)
        _cache(_COMPOSED, key, prog)
    return Expr(leaves, prog, shape)


_COMPOSED: dict = {}  # (op, fn, operand programs, leaf slots) -> Program


def _composed_program(op: int, fn: int, progs: tuple, slots: list) -> Program:
    """The program of ``op`` on operands of programs ``progs``, the leaves of the
    operands after the first taking ``slots[k]`` (the first's keep theirs), equal
    instructions stored once."""
    first = progs[0]
    code, index = list(first.code), dict(first.index)
    roots = [first.root]
    for p, taken in zip(progs[1:], slots):
        where = []
        for o, x, y, f in p.code:
            if o == _LOAD:
                ins = (o, taken[x], y if y < 0 else taken[y], f)
            elif o == _CONST:
                ins = (o, x, y, f)
            else:
                ins = (o, where[x], -1 if y < 0 else where[y], f)
            pos = index.get(ins)
            if pos is None:
                pos = index[ins] = len(code)
                code.append(ins)
            where.append(pos)
        roots.append(where[p.root])
    ins = (op, roots[0], roots[1] if len(roots) > 1 else -1, fn)
    root = index.get(ins)
    if root is None:
        root = len(code)
        code.append(ins)
    return _intern(tuple(code), root, op in _EXACT_WORDS or any(p.exact_words for p in progs))


# ---- the expressions of arrays ----------------------------------------------------------
# id(hi) -> (weak reference to hi, its low word, Expr, scope, parts, layout). An entry holds while hi is
# alive, the words read with hi still include that very low word (inside a block every
# in-place update runs through the flow, which attaches another low word, or none:
# then hi is a leaf again), and within the block that made it (scope): a block's entries
# go when it closes, so an expression never keeps its leaves alive past the block, nor
# makes a later block recompute a value that has been evaluated since (MLX cannot
# tell). Outside blocks nothing would see an in-place update of a result (DoubleWord's
# words are the caller's): no entry is made there, each operation is one launch.
# parts: for complex words made by a program over the parts axis, that program's
# float32 words (hi and lo are views of them), which a later program reads as they
# are; else None. Complex words another kernel wrote (note_parts) have parts and no
# Expr (None): they are leaves. layout: None where the parts are in hi's row-major
# order, else (shape, axes): they are the complex array of that shape whose axes are
# hi's axes in that order (a transform's rows), read through a transpose.
_table: dict[int, tuple] = {}
_scope: contextvars.ContextVar = contextvars.ContextVar("mlx_precise_fusion_scope",
                                                        default=None)


class _Scope(list):
    """The table keys a block's expressions have (and in ``packed``, those of its
    packed words); ``open`` turns False when the block ends, also where the context
    variable still names it (a generator suspended inside its block, closed from
    another thread or task)."""

    open = True
    memo = None

    def __init__(self):
        super().__init__()
        self.packed = []


def _open_scope() -> _Scope | None:
    scope = _scope.get()
    return scope if scope is not None and scope.open else None


def block_memo() -> dict | None:
    """A dict that lives as long as the open block (None outside blocks): for the
    words a rule computes from shapes and options alone (rope's angles), shared
    by its calls in the block and never kept past it (they are nodes of the
    block's graph, of a trace when the block opens inside one)."""
    scope = _open_scope()
    if scope is None:
        return None
    if scope.memo is None:
        scope.memo = {}
    return scope.memo


def _remember(hi: mx.array, lo: mx.array | None, e: Expr | None, parts: tuple | None = None,
              layout: tuple | None = None) -> None:
    scope = _open_scope()
    if scope is not None:  # outside blocks nothing sees an in-place update of hi: no entry
        _note(scope, hi, lo, e, parts, layout)


def _note(scope: _Scope, hi: mx.array, lo: mx.array | None, e: Expr | None,
          parts: tuple | None = None, layout: tuple | None = None) -> None:
    """:func:`_remember` in the open block's ``scope``."""
    _record(_table, scope, hi, lo, e, scope, parts, layout)


def _note_launched(scope: _Scope, hi: mx.array, lo: mx.array | None, e: Expr | None,
                   z: mx.array | None, parts: tuple | None = None,
                   layout: tuple | None = None) -> None:
    """:func:`_note` of a launch's result and, where ``z`` is not None,
    :func:`note_packed` (outside MLX's autodiff), at once: one weak reference to
    ``hi`` whose callback drops both entries."""
    key = id(hi)
    packs = z is not None and hi.ndim != 0 and hi.size >= 8

    def drop(_ref, key=key):
        _table.pop(key, None)
        if packs:
            _packed.pop(key, None)

    ref = weakref.ref(hi, drop)
    _table[key] = (ref, lo, e, scope, parts, layout)
    scope.append(key)
    if packs:
        _packed[key] = (ref, lo, z, scope)
        scope.packed.append(key)


def _record(table: dict, keys: list, hi: mx.array, *entry) -> None:
    """``table[id(hi)] = (weak reference to hi, *entry)`` (``entry[2]``: the block's
    scope), dropped when hi is freed, its key in ``keys`` (a list of that scope's)
    for the block's close (:func:`_forget`)."""
    key = id(hi)

    def drop(_ref, key=key):
        table.pop(key, None)

    table[key] = (weakref.ref(hi, drop), *entry)
    keys.append(key)


def _forget(table: dict, keys: list, scope: _Scope) -> None:
    """Drop the entries of the closed block ``scope`` (``keys``) from ``table``."""
    for key in keys:
        entry = table.get(key)
        if entry is not None and entry[3] is scope:
            table.pop(key, None)  # (freeing an entry's words may free another's)


@contextlib.contextmanager
def _block_scope(on: bool, strict: bool):
    """Entered by every ``extended_precision()`` block (a block hook of
    :mod:`mlx_precise.core.context`): the block's expressions are dropped when it
    closes. Yields no report."""
    scope = _Scope()
    token = _scope.set(scope)
    try:
        yield None
    finally:
        scope.open = False
        restore(_scope, token)
        _forget(_table, scope, scope)
        _forget(_packed, scope.packed, scope)
        _forget(_copies, scope.packed, scope)


register_block_hook(_block_scope)  # before the flow's hook, whose report the block yields


def private_scope():
    """A scope of its own for the code inside (as a block's: what it records is
    dropped at the end, its :func:`block_memo` is its own): for a trace of a rule
    (``extended.recipes``), whose arrays must not reach the block's tables."""
    return _block_scope(True, False)


def state_of(hi: mx.array, lo: mx.array | None) -> tuple:
    """What the open block recorded of the words ``hi``, ``lo`` that a program or a
    kernel reads: ``(expression, packed words, copies, parts, layout)``, each None
    where absent (the packed words made now where they are made when read:
    :func:`note_moved`; parts and layout: :func:`note_parts`)."""
    key = id(hi)  # (a call's key reads every operand's: the lookups inlined)
    entry = _table.get(key)
    e = parts = layout = None
    if entry is not None and entry[0]() is hi and entry[1] is lo and entry[3].open and (
            entry[3] is _scope.get()):
        e, parts, layout = entry[2], entry[4], entry[5]
    return (e, packed(hi, lo) if key in _packed else None,
            _copied(hi, lo) if lo is not None and key in _copies else None, parts, layout)


def note_state(hi: mx.array, lo: mx.array | None, e: Expr | None, z: mx.array | None,
               copies: mx.array | None, parts: tuple | None = None,
               layout: tuple | None = None) -> None:
    """Record :func:`state_of`'s ``e``, ``z``, ``copies``, ``parts``, ``layout``
    (their arrays replaced: a trace's inputs or outputs) as the state of ``hi``,
    ``lo`` in the open block."""
    if e is not None or parts is not None:
        scope = _open_scope()
        if scope is not None:  # (both recorded at once; packed words not while traced)
            _note_launched(scope, hi, lo, e, None if _traced.get() else z, parts, layout)
    elif z is not None:
        note_packed(hi, lo, z)
    if copies is not None:
        note_copies(hi, lo, copies)


# ---- packed words ------------------------------------------------------------------
# A kernel writes its result's words as one array z, the high words then the low
# words along the first axis (:func:`packed_shape`): one output, one graph node with
# one output (MLX replays a node of several outputs at several times the cost), and
# a kernel that reads the words reads z as one input. hi and lo are the two halves
# of z (one slice each). id(hi) -> (weak reference to hi, lo, z, scope): as _table,
# an entry holds while hi is alive, is read with that very low word, and within the
# block that made it (an in-place update of hi inside a block attaches another low
# word; outside blocks nothing records).
_packed: dict[int, tuple] = {}


def packed_shape(shape: tuple) -> tuple:
    """The shape of the packed words of an array of ``shape``: both words along the
    first axis (``(2,)`` for a 0-d array)."""
    return (2 * shape[0],) + tuple(shape[1:]) if shape else (2,)


def planes(z: mx.array, shape: tuple) -> tuple[mx.array, mx.array]:
    """The high and the low words of shape ``shape`` that the packed words ``z``
    (:func:`packed_shape`) hold: one slice each (and a reshape for a 0-d array)."""
    if shape:
        s0 = shape[0]
        return _INDEX(z, slice(0, s0)), _INDEX(z, slice(s0, 2 * s0))
    return _RESHAPE(_INDEX(z, slice(0, 1)), ()), _RESHAPE(_INDEX(z, slice(1, 2)), ())


def unpacked(z: mx.array, shape: tuple) -> tuple[mx.array, mx.array]:
    """The words of ``shape`` packed in ``z`` (of :func:`packed_shape`: a kernel's
    output, or a view of one that keeps its first axis): its :func:`planes`,
    recorded as such (:func:`note_packed`)."""
    hi, lo = planes(z, shape)
    note_packed(hi, lo, z)
    return hi, lo


def note_packed(hi: mx.array, lo: mx.array, z: mx.array) -> None:
    """Record that ``hi``, ``lo`` are :func:`planes` of the packed words ``z`` (a
    kernel's output, or a view of one that keeps its first axis: a program reads
    it in place, the GEMM and the FFT through MLX's row-contiguous copy, whose
    halves are the planes too) so that a kernel reads ``z`` as one input
    (:func:`packed`). Inside a block, outside MLX's autodiff (whose programs read
    the words); arrays of 8 elements at least (the slots' smallest)."""
    scope = _scope.get()
    if scope is None or not scope.open or _traced.get() or hi.ndim == 0 or hi.size < 8:
        return
    _record(_packed, scope.packed, hi, lo, z, scope)


class _Moved:
    """Packed words made when a kernel first reads them (:func:`packed`): ``move``
    (an MLX view op) of the packed words of the words ``src`` (hi, lo)."""

    __slots__ = ("src", "move")

    def __init__(self, src: tuple, move):
        self.src, self.move = src, move

    def make(self) -> mx.array | None:
        z = packed(*self.src)
        return None if z is None else self.move(z)


def note_moved(hi: mx.array, lo: mx.array, x_hi: mx.array, x_lo: mx.array | None,
               move) -> None:
    """Record that ``hi``, ``lo`` are the words ``x_hi``, ``x_lo`` moved by an op that,
    applied to their packed words, gives the packed words of the result (``move(z)``:
    a reshape keeping the row-major order, a transpose, basic index, split or zero
    pad that leaves the first axis whole) where x's words are packed
    (:func:`has_packed`): so are these, that op of x's packed array, made only when
    a kernel reads it (no graph node otherwise)."""
    note_packed(hi, lo, _Moved((x_hi, x_lo), move))


# A single value's words (one element: a 0-d result, a sum of everything) are written
# 8 times each (every input a device buffer: see _run), z of 16 elements: the high
# word's copies, then the low word's. id(hi) -> (weak reference to hi, lo, z, scope),
# as _packed (and forgotten with it), read by a program as element 0 of z (its
# low word 8 elements further): no slice, reshape or broadcast of the words.
_copies: dict[int, tuple] = {}


def note_copies(hi: mx.array, lo: mx.array, z: mx.array) -> None:
    """Record that the single-value words ``hi``, ``lo`` are element 0 and element 8
    of ``z`` (16 float32: each word's 8 copies), for a program to read as one slot.
    Inside a block, outside MLX's autodiff."""
    scope = _scope.get()
    if scope is None or not scope.open or _traced.get():
        return
    _record(_copies, scope.packed, hi, lo, z, scope)


def _copied(hi: mx.array, lo: mx.array) -> mx.array | None:
    """The copies ``z`` of the words ``hi``, ``lo`` (:func:`note_copies`), or None."""
    entry = _copies.get(id(hi))
    if (entry is None or entry[0]() is not hi or entry[1] is not lo
            or entry[3] is not _scope.get() or not entry[3].open or _traced.get()):
        return None
    return entry[2]


def has_packed(hi: mx.array, lo: mx.array | None) -> bool:
    """Whether ``hi`` and ``lo`` are recorded as packed words (:func:`packed`), without
    making them where they are made when read (:func:`note_moved`)."""
    return _packed_entry(hi, lo) is not None


def _packed_entry(hi: mx.array, lo: mx.array | None) -> tuple | None:
    entry = _packed.get(id(hi))
    if (entry is None or entry[0]() is not hi or entry[1] is not lo
            or entry[3] is not _scope.get() or not entry[3].open or _traced.get()):
        return None
    return entry


def packed(hi: mx.array, lo: mx.array | None) -> mx.array | None:
    """The packed words ``z`` whose halves are ``hi`` and ``lo`` (:func:`note_packed`),
    or None."""
    entry = _packed_entry(hi, lo)
    if entry is None:
        return None
    z = entry[2]
    if type(z) is _Moved:  # (note_moved) made once
        z = z.make()
        if z is None:
            return None
        _packed[id(hi)] = (*entry[:2], z, *entry[3:])
    return z


def note_parts(hi: mx.array, lo: mx.array, words: tuple, layout: tuple | None = None) -> None:
    """Record that the complex64 words ``hi``, ``lo`` are views of the float32
    ``words`` a kernel wrote (hi's, lo's: the (re, im) pairs in hi's row-major order,
    in any shape of that size), so that a program over the parts axis reads those
    (one reshape, none where they have the shape) instead of views of the complex
    words (a reshape and a view each). ``layout``: ``(shape, axes)``, the words
    hold the complex array of ``shape`` whose axes are hi's ``axes`` in that order
    (hi is a transpose of it): a program reads them through one transpose (as
    (..., 2) parts), a transform through :func:`rows_of`, the flat readers
    (:func:`words_of`) not at all. Inside a block, outside MLX's autodiff (whose
    programs read no parts)."""
    if not _traced.get():
        _remember(hi, lo, None, tuple(words), layout)


def words_of(w: DoubleWord) -> tuple | None:
    """The float32 words (hi's, lo's) that the complex words of ``w`` view, as a
    kernel wrote them (a program over the parts axis, :func:`note_parts`): the
    (re, im) pairs in w's row-major order, in any shape of that size; None where
    none are known. A kernel that reads complex words flat reads these as they are
    (the same floats) instead of a float32 view of a reshape of the complex view."""
    entry = _entry(w) if w.is_complex else None
    return None if entry is None or entry[5] is not None else entry[4]


def part(w: DoubleWord, k: int) -> DoubleWord | None:
    """Part ``k`` (0 real, 1 imaginary) of the complex words ``w`` as a view of the
    floats a kernel wrote (:func:`note_parts`): one view of their packed array where
    it is known (recorded as packed, so a kernel reads it in place), else one of
    each word; None where no kernel's floats are known."""
    entry = _entry(w) if w.is_complex and w._lo is not None else None
    if entry is None or entry[4] is None:
        return None
    z = packed(*entry[4]) if entry[5] is None and w.ndim else None
    if z is not None and tuple(z.shape) == packed_shape(tuple(w.shape[:-1]) + (2 * w.shape[-1],)):
        # the pairs along the last axis as written: the part is every other float
        return DoubleWord(*unpacked(_INDEX(z, (..., slice(k, None, 2))), tuple(w.shape)))
    p, index = _part_words(w, False), (..., k)
    if type(p) is _PackedLeaf:
        return DoubleWord(*unpacked(_INDEX(p.expr.leaves[0], index), tuple(w.shape)))
    return DoubleWord(_INDEX(p.hi, index), _INDEX(p.lo, index))


def packed_words(w: DoubleWord) -> mx.array | None:
    """The packed array of the floats a kernel wrote for the complex words of ``w``
    (:func:`words_of` and :func:`packed`: the (re, im) pairs in w's row-major order,
    the high words' then the low words'), or None."""
    words = words_of(w)
    return None if words is None else packed(*words)


def rows_of(w: DoubleWord) -> tuple | None:
    """``(words hi, words lo, shape, axes)``: the float32 words a kernel wrote that
    the complex words of ``w`` view, holding the complex array of ``shape`` whose
    axes are w's ``axes`` in that order (w's own order where :func:`words_of` knows
    them); None where none are known."""
    entry = _entry(w) if w.is_complex else None
    if entry is None or entry[4] is None:
        return None
    shape, axes = entry[5] or (tuple(w.shape), tuple(range(w.ndim)))
    return (*entry[4], shape, axes)


def constant(hi: float, lo: float) -> Expr:
    """The expression of the constant ``hi + lo`` (host floats, the words of a
    scalar), an operand :func:`apply` takes beside DoubleWords: a fused program
    holds it, so no array is made for it."""
    return Expr.constant(hi, lo)


def note_constant(w: DoubleWord, hi: float, lo: float) -> DoubleWord:
    """Record that the 0-d words of ``w`` are the constant ``hi + lo`` (host floats),
    so that fused programs hold it instead of reading arrays. Returns ``w``."""
    _remember(w.hi, w._lo, Expr.constant(hi, lo))
    return w


def _entry(w: DoubleWord) -> tuple | None:
    """The table's entry of ``w`` where it holds (see :data:`_table`), else None."""
    entry = _table.get(id(w.hi))
    if (entry is not None and entry[0]() is w.hi and entry[1] is w._lo
            and entry[3] is _open_scope()):
        return entry
    return None


def expression(w: DoubleWord) -> Expr | None:
    """The expression of ``w``: the one recorded with its words, else ``w`` as a leaf
    (float32 words only; None for complex words)."""
    if type(w) in _EXPR_WORDS:
        return w.expr
    hi = w.hi
    if hi.dtype != F32:
        return None
    entry = _entry(w)
    if entry is not None and not (entry[2].exact_words and _traced.get()):
        return entry[2]
    lo = w._lo
    if lo is None and w.wide is not None:
        lo = w.lo
    return Expr.leaf(hi, lo)


def _fuse(op: int, fn: int, operands: list) -> Expr | None:
    """The expression of ``op`` on the operands (DoubleWords, or constants'
    expressions: :func:`constant`) within the bounds (the largest composite operand
    made a leaf while it does not fit), or None: complex words, shapes that do not
    broadcast, too many axes."""
    exprs = []
    for k, w in enumerate(operands):
        for j in range(k):
            if operands[j] is w:  # one operand twice (x * x): one expression
                e = exprs[j]
                break
        else:
            e = w if type(w) is Expr else expression(w)
            if e is None:
                return None
        exprs.append(e)
    while True:
        e = _compose(op, fn, exprs)
        if e is None:
            return None
        if e.fits():
            return e
        composite = [k for k, x in enumerate(exprs) if len(x.code) > 1]
        if not composite:
            return None
        k = max(composite, key=lambda k: len(exprs[k].code))
        w = operands[k]
        exprs[k] = Expr.leaf(w.hi, w.lo)


# ---- programs and launches --------------------------------------------------------------

_PROGRAMS: dict = {}


def _instructions(key: tuple) -> tuple[tuple, int, bool] | None:
    """``(words, out, math)`` for an expression's :attr:`Expr.key`: its instructions
    with registers assigned (each freed after its last read, reused at once), the
    register of the result, and whether it calls an elementary function; None when
    it needs more than ``DWF_REGISTERS`` registers. Cached."""
    hit = _INSTRUCTIONS.get(key, False)
    if hit is not False:
        return hit
    code, root = key
    last = {}
    for k, (o, x, y, f) in enumerate(code):
        if o not in (_LOAD, _CONST):
            last[x] = k
            if y >= 0:
                last[y] = k
    free = list(range(_REGISTERS - 1, -1, -1))  # pop() gives the lowest
    reg = [0] * len(code)
    words = []
    math_ = False
    hit = None
    for k, (o, sx, sy, f) in enumerate(code):
        x, y = sx, sy
        if o not in (_LOAD, _CONST):
            # one operand: y names x's register too (dwm_apply reads both)
            x, y = reg[sx], reg[sy if sy >= 0 else sx]
            # operands read for the last time free their registers before the result
            # takes one (the kernel reads both operands first)
            for r, src in ((x, sx), (y, sy if sy >= 0 else sx)):
                if last[src] == k and r not in free:
                    free.append(r)
            free.sort(reverse=True)
            math_ = math_ or o == _FN
        if not free:
            break
        reg[k] = free.pop()
        words += [o, reg[k], x, y, f]
    else:
        hit = (tuple(words), reg[root], math_)
    _cache(_INSTRUCTIONS, key, hit)
    return hit


def program(key: tuple, layout: tuple) -> tuple[mx.array, bool]:
    """``(prog, math)``: the int32 program of ``dw_fused`` / ``dw_reduce`` for an
    expression that fits (:attr:`Program.fits`), launched over ``layout = (reduce,
    extents, perm, ndim, slots, plane, planes)``: ``reduce`` ``(n, op)`` for rows of
    ``n`` elements or ``()``; the iteration's extents, and for each iteration axis
    the array axis it walks (-1: none, the copies of a short output); the array's
    ``ndim``; per slot ``(ndim, mask)``, its axes aligned with the array's last
    ones, the bits of ``mask`` the axes it broadcasts; the output's plane (the
    elements of its high words: the low words follow); per slot its plane (a packed
    slot's: the rows of its first axis that hold the high words, the low words as
    many rows further, :func:`_slots`; 0 for others). ``math``: it calls an
    elementary function. Cached (the oldest entry first out)."""
    hit = _PROGRAMS.get((key, layout))
    if hit is not None:
        return hit
    ins, out, math_ = _instructions(key)
    reduce, extents, perm, ndim, slots, plane, planes_ = layout
    header = [0] * LIMITS.header
    header[LIMITS.prog_count], header[LIMITS.prog_out] = len(key[0]), out
    if reduce:
        header[LIMITS.prog_n], header[LIMITS.prog_reduce] = reduce
    header[LIMITS.prog_nd], header[LIMITS.prog_ndim] = len(extents), ndim
    header[LIMITS.prog_plane] = plane
    header[LIMITS.prog_extents:LIMITS.prog_extents + len(extents)] = extents
    header[LIMITS.prog_perm:LIMITS.prog_perm + len(perm)] = perm
    for k, (sn, mask) in enumerate(slots):
        header[LIMITS.prog_slots + 2 * k:LIMITS.prog_slots + 2 * k + 2] = (sn, mask)
    header[LIMITS.prog_planes:LIMITS.prog_planes + len(planes_)] = planes_
    hit = (mx.array(np.array(header + list(ins), np.int32)), math_)
    _cache(_PROGRAMS, (key, layout), hit)
    return hit


_INSTRUCTIONS: dict = {}


def _slot_arrays(leaves, small: tuple, shape: tuple, slots: int) -> list:
    """The ``slots`` slot arrays of a launch over an array of ``shape`` (8 elements
    at least): the leaves as they are (any view: the kernel reads their strides and
    broadcasts them by their masks), but those ``small`` (fewer than 8 elements:
    :func:`_slot_plan`) broadcast views of the shape it gives (a single value's: 8
    elements, read at element 0; the others': ``shape``), so that every input is a
    device buffer (one signature); the unused slots repeat the first; a lone
    constant-only program reads a zero (:data:`_ZERO_LEAVES`)."""
    if small is not None:
        arrays = [a if to is None else _BROADCAST_TO(a, to) for a, to in zip(leaves, small)]
    else:
        arrays = list(leaves)
    if len(arrays) < slots:
        arrays += [arrays[0]] * (slots - len(arrays))
    return arrays


_EIGHT = (8,)  # a single value's slot: 8 copies of it (the same view for every launch)


def _slots(prog: Program, shapes: tuple, shape: tuple) -> tuple[tuple, tuple, tuple]:
    """``(small, specs, planes)`` of the leaves of ``shapes`` of the program
    ``prog`` read over ``shape`` (:func:`_slot_plan` of the shapes of the words they
    hold), and each slot's plane: a packed slot's leaf (:func:`note_packed`, or a
    view of packed words that keeps their first axis) holds words of half its
    first axis, its plane that half (the low words are as many rows further: the
    kernel steps by the slot's stride along it, so views of any strides are read
    in place); others hold their own shape, plane 0."""
    packed_slots = {x: f for o, x, y, f in prog.code if o == _LOAD and y == _PACKED}
    if not packed_slots:
        return (*_slot_plan(shapes, shape), (0,) * len(shapes))
    words = tuple(s if k not in packed_slots else () if packed_slots[k] == _COPIES
                  else (s[0] // 2,) + tuple(s[1:]) for k, s in enumerate(shapes))
    copies = tuple(k for k, f in packed_slots.items() if f == _COPIES)
    return (*_slot_plan(words, shape, copies),
            tuple(0 if k not in packed_slots else 8 if packed_slots[k] == _COPIES else w[0]
                  for k, w in enumerate(words)))


def _slot_plan(shapes: tuple, shape: tuple, copies: tuple = ()) -> tuple[tuple, tuple]:
    """For leaves holding words of ``shapes`` read over ``shape``: the shape each
    leaf of fewer than 8 elements is broadcast to (None: none; a single value: 8
    copies, :data:`_EIGHT` and its own axes; the others: ``shape``), but the slots
    ``copies`` (a single value's 8 copies, 16 elements as written), and each slot's
    ``(ndim, mask)`` (a single value's: no axis, element 0). Cached."""
    plan = _SLOT_PLANS.get((shapes, shape, copies))
    if plan is None:
        small = tuple(None if k in copies or math.prod(s) >= 8 else
                      _EIGHT + s if math.prod(s) == 1 else shape for k, s in enumerate(shapes))
        specs = []
        for s_, to in zip(shapes, small):
            if math.prod(s_) == 1:  # a single value (copies or a view): element 0
                specs.append((0, 0))
                continue
            s_ = shape if to is not None else s_
            lead = len(shape) - len(s_)
            mask = sum(1 << d for d, n in enumerate(s_) if n == 1 and shape[lead + d] != 1)
            specs.append((len(s_), mask))
        plan = (small if any(t is not None for t in small) else None, tuple(specs))
        _cache(_SLOT_PLANS, (shapes, shape, copies), plan)
    return plan


_SLOT_PLANS: dict = {}
_BACKEND = backends.Backend
_ZERO_LEAVES = (mx.array(0.0, F32),)


def _run(prog: Program, leaves, shape: tuple, backend, stream,
         parts: bool = False) -> tuple[mx.array, mx.array]:
    """The words of the expression ``prog`` over ``leaves`` (no autodiff): one
    ``dw_fused`` launch. What the launch derives from the program and the shapes
    (slot masks, the int32 program, grid) is cached per ``(prog, leaf shapes,
    shape, parts)``: a repeated layer pays a lookup and MLX's launch.

    ``parts``: ``shape`` ends with the parts axis (..., n, 2) of complex words;
    the words are then returned with the last two axes as one, (..., 2 n), the
    float32 view of complex64 (..., n) words (no reshape to see them so), where
    the launch writes ``shape`` itself (8 elements at least)."""
    hi, lo, z = _launched(prog, leaves, shape, backend, stream, parts)
    if z is not None:
        note_packed(hi, lo, z)
    return hi, lo


def _launched(prog: Program, leaves, shape: tuple, backend, stream,
              parts: bool = False) -> tuple:
    """:func:`_run`'s words ``(hi, lo, z)``, z the packed words they are the planes
    of (None: a short result's copies, recorded by :func:`_short`, or no launch),
    not yet recorded as such."""
    leaves = leaves or _ZERO_LEAVES
    shapes = tuple([a.shape for a in leaves])
    plan = _LAUNCHES.get((prog, shapes, shape, parts))
    if plan is None:
        plan = _launch_plan(prog, shapes, shape, parts)
        _cache(_LAUNCHES, (prog, shapes, shape, parts), plan)
    if plan is _EMPTY:
        return mx.zeros(shape, F32), mx.zeros(shape, F32), None
    small, kshape, kernel, prog_array, launch, slots, oshape = plan
    arrays = _slot_arrays(leaves, small, kshape, slots)
    arrays.append(prog_array)
    fn = kernel.launcher(backend if type(backend) is _BACKEND else backends.of(backend))
    if stream is None:
        (z,) = fn(inputs=arrays, **launch)
    else:
        (z,) = fn(inputs=arrays, stream=stream, **launch)
    if oshape is None:  # the 8 copies of a short result: the first of each word's
        return (*_short(z, shape, 1), None)
    return (*planes(z, oshape), z)


def _short(z: mx.array, shape: tuple, m: int) -> tuple[mx.array, mx.array]:
    """The words of ``shape`` of a short result written 8 times (``z``: the high
    words' 8 copies, ``m`` rows each along its first axis, then the low words'): the
    first copy of each, a single value recorded as read from ``z``
    (:func:`note_copies`)."""
    hi, lo = (_RESHAPE(_INDEX(z, slice(k, k + m)), shape) for k in (0, 8 * m))
    if m == 1 and math.prod(shape) == 1:
        note_copies(hi, lo, z)
    return hi, lo


_LAUNCHES: dict = {}
_EMPTY = object()  # the plan of an empty result (no launch)


def _launch_plan(prog: Program, shapes: tuple, shape: tuple, parts: bool):
    """What :func:`_run` launches for the expression ``prog`` over leaves of
    ``shapes``: ``(small, kshape, kernel, prog, launch, slots)``, the leaves
    broadcast to ``kshape`` (those of fewer than 8 elements, :func:`_slot_arrays`), the
    dw_fused kernel (the fewest slots that hold the leaves; with the elementary
    functions where the program calls one), the int32 program, the launch's
    keyword arguments and the kernel's slot count; :data:`_EMPTY` for an empty
    result."""
    n = math.prod(shape)
    if n == 0:
        return _EMPTY
    # fewer than 8 outputs: 8 copies, so that every input is a device buffer
    kshape = shape if n >= 8 else (8,) + shape
    small, specs, planes_ = _slots(prog, shapes, kshape)
    size = math.prod(kshape)
    prog_array, math_ = program(prog.key, ((), kshape, tuple(range(len(kshape))),
                                           len(kshape), specs, size, planes_))
    grid, threadgroup = elementwise_grid(size)
    # every input is float32 / int32 with 8 elements at least: the declared forms
    # the output row-contiguous in the iteration's order, so declared in any shape of
    # its size: the parts axis joined to the one before (see _run); both words
    # packed along its first axis
    oshape = kshape[:-2] + (2 * kshape[-2],) if parts and kshape == shape else kshape
    launch = dict(template=[("MATH", math_)], grid=grid, threadgroup=threadgroup,
                  output_shapes=[packed_shape(oshape)], output_dtypes=[F32])
    kernel = _program_kernel_for("dw_fused", len(shapes), math_)
    return (small, kshape, kernel, prog_array, launch, len(kernel.inputs) - 1,
            oshape if kshape == shape else None)


def reduce(op: str, x: DoubleWord, axes: tuple, keepdims: bool, backend,
           stream=None) -> DoubleWord | None:
    """The sum (``op="add"``) or product (``"mul"``) of real ``x`` over ``axes``
    (normalised, distinct) in one ``dw_reduce`` launch, with the pairwise tree of
    :func:`mlx_precise.extended.arith.reduce_sum` (its bits), reading ``x``'s
    expression (``x`` itself is not computed). None where that does not apply:
    complex words, rows longer than twice ``DWF_REDUCE_MAX``, empty rows, and
    inside :func:`mlx_gradients` (the tree of differentiable operations)."""
    if not _fusing.get() or _traced.get():
        return None
    e = expression(x)
    if e is None:
        return None
    if len(e.code) > 1 and not e.fits():
        e = Expr.leaf(x.hi, x.lo)
    shape = tuple(x.shape)
    leaves = e.leaves or _ZERO_LEAVES
    key = (e.prog, tuple([a.shape for a in leaves]), shape, tuple(axes), keepdims, op)
    plan = _REDUCTIONS.get(key, False)
    if plan is False:
        plan = _reduce_plan(*key)
        _cache(_REDUCTIONS, key, plan)
    if plan is None:
        return None
    if len(plan) == 1:  # an empty result
        return DoubleWord(mx.zeros(plan[0], F32), mx.zeros(plan[0], F32))
    small, ashape, kernel, prog, launch, m, out_shape = plan
    arrays = _slot_arrays(leaves, small, ashape, len(kernel.inputs) - 1)
    arrays.append(prog)
    (z,) = kernel.unchecked(inputs=arrays, backend=backends.of(backend), stream=stream,
                            **launch)
    if m is not None:  # the 8 copies of a short result (planes of 8 m rows)
        zh, zl = _short(z, out_shape, m)
    else:
        zh, zl = unpacked(z, out_shape)
    return DoubleWord.of_words(zh, zl)


_REDUCTIONS: dict = {}


def _reduce_plan(prog: Program, shapes: tuple, shape: tuple, axes: tuple, keepdims: bool,
                 op: str):
    """What :func:`reduce` launches for the expression ``prog`` over leaves of
    ``shapes``, reduced over ``axes`` of ``shape``: ``(small, ashape, kernel, int32
    program, launch keywords, m or None, out_shape)`` (``m``: the rows of a short
    result, launched 8 times over), ``(out_shape,)`` for an empty result, or None
    (the caller's tree instead). Cached by :func:`reduce`."""
    if len(shape) >= _MAX_NDIM:
        return None
    keep = [d for d in range(len(shape)) if d not in axes]
    m = math.prod(shape[d] for d in keep)
    n = math.prod(shape[d] for d in axes)
    if n == 0 or n > 2 * _REDUCE_MAX:
        return None
    out_shape = tuple(1 if d in axes else shape[d] for d in range(len(shape))) if keepdims \
        else tuple(shape[d] for d in keep)
    if m == 0:
        return (out_shape,)
    # rows: the kept axes, then the reduced ones (row r, element j: flat r n + j)
    order = keep + list(axes)
    extents, perm, ashape = tuple(shape[d] for d in order), tuple(order), shape
    # 8 copies where the leaves hold fewer than 8 elements (every input a device
    # buffer), and of a single row's sum: a program reads its words at element 0
    # (note_copies), where one copy would be sliced, reshaped and broadcast
    copies = 1 if m * n >= 8 and m > 1 else 8
    if copies > 1:
        extents, perm, ashape = (8,) + extents, (0,) + tuple(d + 1 for d in order), (8,) + shape
    small, specs, planes_ = _slots(prog, shapes, ashape)
    rows = m * copies
    prog_array, math_ = program(prog.key, ((n, OP[op]), extents, perm, len(ashape), specs,
                                           rows, planes_))
    kernel = _program_kernel_for("dw_reduce", len(shapes), math_)
    threads = min(_REDUCE_THREADS, 1 << max(0, ((n + 1) // 2 - 1).bit_length()))
    # one value per row, row r at flat position r: the result's own shape (no reshape
    # node) unless there are 8 copies of it
    zshape = out_shape if copies == 1 else (rows,)
    launch = dict(template=[("MATH", math_)], grid=(rows * threads, 1, 1),
                  threadgroup=(threads, 1, 1), output_shapes=[packed_shape(zshape)],
                  output_dtypes=[F32])
    return small, ashape, kernel, prog_array, launch, (m if copies > 1 else None), out_shape


# The custom functions of fused expressions (MLX autodiff), by (program, backend, stream).
_DIFFERENTIABLE: dict = {}


def _differentiable(prog: Program, backend, stream):
    """The words of the expression ``prog`` as a custom function of its leaves whose
    VJP is the unfused chain's (:func:`_replay`)."""
    cache_key = (prog, backend, stream)
    f = _DIFFERENTIABLE.get(cache_key)
    if f is not None:
        return f

    @mx.custom_function
    def f(*leaves):
        shape = _broadcast([tuple(a.shape) for a in leaves])
        return _run(prog, leaves, shape, backend, stream)

    @f.vjp
    def f_vjp(primals, cotangents, outputs):
        with flow_suspended():
            _, grads = _mlx.vjp(_replay(prog.key, backend, stream), list(as_tuple(primals)),
                                list(cotangents))
        return tuple(grads)

    _cache(_DIFFERENTIABLE, cache_key, f)
    return f


_fusing: contextvars.ContextVar[bool] = contextvars.ContextVar("mlx_precise_fusing",
                                                               default=True)


def _unfused():
    """The engines run their single-operation kernels inside (tests compare the
    bits of fused and unfused chains)."""
    return setting(_fusing, False)


# True while MLX's own autodiff may differentiate the graph being built (a function
# that opens a block, differentiated from outside every block: extended.intercept
# sets it around MLX's transforms). Only then do kernel results need custom
# functions (a kernel has no derivative of its own; MLX raises for one, never
# returns a wrong gradient); elsewhere they would only cost host time and graph nodes.
_traced: contextvars.ContextVar[bool] = contextvars.ContextVar("mlx_precise_mlx_autodiff",
                                                               default=False)


def mlx_gradients():
    """Kernel results made inside are differentiable by MLX's autodiff: custom
    functions of their leaves (fused results: with the unfused chain's VJP,
    :func:`_replay`; other kernels: with their op's float32 VJP, :func:`words_op`)."""
    return setting(_traced, True)


def differentiating() -> bool:
    """True inside :func:`mlx_gradients` (MLX's autodiff traces the caller)."""
    return _traced.get()


def guarded(fn, arrays: list, what: str, backend):
    """``fn(*arrays)``, a function of DoubleWord words that has no gradient, through
    :func:`~mlx_precise.core.autodiff.guarded` (a VJP raising NotDifferentiableError
    naming ``what``) where MLX's autodiff may differentiate it: inside
    :func:`mlx_gradients`, and always on the cpu engine (MLX would differentiate its
    float64 ops). Elsewhere on a kernel backend it runs bare: nothing differentiates
    it, and a transform made outside the package would stop at its first kernel (MLX's
    CustomKernel and the emulator's launches raise for a derivative); the custom
    function would only add a graph node that every call of a compiled function
    replays."""
    if _traced.get() or not backends.of(backend).has_kernels:
        return _guarded(fn, arrays, what)
    return fn(*arrays)


def apply(op: str, operands: list[DoubleWord], backend, stream=None,
          fn: tuple[str, int] | None = None) -> DoubleWord | None:
    """``op`` ("add", "sub", "mul", "div", "neg", "abs", "max", "min", or "fn" with the
    function ``fn = (name, code)``: the name of MLX's function and its code of
    :data:`~.functions.FN`) of real DoubleWords (or constants: :func:`constant`; broadcasting;
    abs, max and min as ``extended.arith`` defines them on words), fused with the
    expressions of the operands: one ``dw_fused`` launch, the result's expression
    recorded. Inside :func:`mlx_gradients` MLX differentiates the result as the
    unfused chain. None when the operands cannot be fused (or inside the unfused
    replay of a chain)
    (complex words, too many axes): the caller runs the single-operation kernels."""
    if not _fusing.get():
        return None  # the unfused replay of a chain
    for w in operands:
        if type(w) not in _NOT_WORDS and w.hi.dtype == _C64:
            return _apply_partwise(op, operands, backend, stream) if fn is None else None
    code = _FN if op == "fn" else OP[op]
    if code in _EXACT_WORDS and _traced.get():
        return None  # MLX differentiates the caller's word ops instead
    if fn is not None:
        _FN_NAMES[fn[1]] = fn[0]  # for the replay (MLX's VJP of the function)
    e = _fuse(code, 0 if fn is None else fn[1], operands)
    if e is None:
        return None
    if _traced.get() and e.leaves:
        hi, lo = _differentiable(e.prog, backend, stream)(*e.leaves)
    elif _deferring.get():
        return _Deferred(e, backend, stream)
    else:
        hi, lo = _run(e.prog, e.leaves, e.shape, backend, stream)
    _remember(hi, lo, e)
    return DoubleWord.of_words(hi, lo)


def apply_pairs(op: str, operands: list, backend, fn: tuple[str, int] | None = None
                ) -> tuple[mx.array, mx.array] | None:
    """:func:`apply` of real operands given as ``(hi, lo or None)`` pairs of float32
    arrays (the same pair twice: one operand) or constants' expressions
    (:func:`constant`), on the default stream, as the result's words ``(hi, lo)``:
    the frequent case of a user's op inside a block (the dispatcher's fast path),
    without DoubleWords. None where :func:`apply` would take another way: outside a
    chain's fusion, inside MLX's autodiff or a deferred chain, shapes that do not
    broadcast, an expression that does not fit the kernel (the caller's rule then
    runs :func:`apply`)."""
    if _traced.get() or _deferring.get() or not _fusing.get():
        return None
    scope = _scope.get()
    if scope is not None and not scope.open:
        scope = None
    exprs = []
    for k, p in enumerate(operands):
        if type(p) is Expr:
            exprs.append(p)
        elif k and p is operands[0]:
            exprs.append(exprs[0])
        else:
            hi, lo = p
            entry = _table.get(id(hi))
            if entry is not None and entry[0]() is hi and entry[1] is lo and entry[3] is scope:
                exprs.append(entry[2])  # (the check of :func:`_entry`)
            else:
                exprs.append(Expr.leaf(hi, lo))
    e = _compose(_FN if op == "fn" else OP[op], 0 if fn is None else fn[1], exprs)
    if e is None or not e.fits():
        return None
    if fn is not None:
        _FN_NAMES[fn[1]] = fn[0]  # for the replay (MLX's VJP of the function)
    hi, lo, z = _launched(e.prog, e.leaves, e.shape, backend, None)
    if scope is not None:  # (outside blocks: no entry, see _remember)
        _note_launched(scope, hi, lo, e, z)
    return hi, lo


# ---- deferred launches ---------------------------------------------------------------
# A rule that chains engine steps on words (a layer norm: nine steps, three of which
# are read: the two sums and the result) launches each step's program although a
# lazy graph runs only those that are read: inside deferred(), a fused step's words
# are launched only when something reads them (a reduction's leaf, the rule's
# result); a later step composes its expression as it would the launched step's.
# The same programs run: the same bits, with fewer launches built on the host.
_deferring: contextvars.ContextVar[bool] = contextvars.ContextVar("mlx_precise_deferring",
                                                                  default=False)


def deferred():
    """Fused results made inside are :class:`_Deferred` (launched when read),
    outside MLX's autodiff. For a rule's own chain of engine steps: nothing inside
    may keep a result past the block but by its words."""
    return setting(_deferring, True)


class _ExprWords(DoubleWord):
    """Real words of the expression ``expr`` whose arrays are made when ``hi`` or a
    low word is first read (:meth:`_made`); shape and dtype known without them."""

    __slots__ = ("expr", "_words")

    def _make(self) -> tuple:
        raise NotImplementedError

    def _made(self) -> tuple:
        if self._words is None:
            self._words = self._make()
        return self._words

    hi = property(lambda self: self._made()[0])
    _lo = property(lambda self: self._made()[1])
    shape = property(lambda self: self.expr.shape)
    ndim = property(lambda self: len(self.expr.shape))
    size = property(lambda self: math.prod(self.expr.shape))
    dtype = property(lambda self: F32)
    is_complex = property(lambda self: False)


class _Deferred(_ExprWords):
    """The real words of the expression ``expr`` (:func:`deferred`), launched on
    ``at = (backend, stream)`` when ``hi`` or a low word is first read."""

    __slots__ = ("_at",)

    def __init__(self, expr: Expr, backend, stream):
        self.expr, self._at, self._words, self.wide = expr, (backend, stream), None, None

    def _make(self) -> tuple:
        e = self.expr
        hi, lo = _run(e.prog, e.leaves, e.shape, *self._at)
        _remember(hi, lo, e)
        return hi, lo


class _PackedLeaf(_ExprWords):
    """Real words of ``shape`` that are the halves of the packed words ``z``
    (:func:`packed_shape` of ``shape``), as a leaf read packed (its expression: one
    slot); the halves themselves are sliced only where something reads them."""

    __slots__ = ()

    def __init__(self, z: mx.array, shape: tuple):
        self.expr, self._words, self.wide = Expr.packed_leaf(z, shape), None, None

    def _make(self) -> tuple:
        return planes(self.expr.leaves[0], self.expr.shape)


# ---- complex words: their parts as a trailing axis ------------------------------------
# The complex operations that act on the real and the imaginary part alike (x + y,
# x - y, -x, and a product or quotient by a real factor) run as real programs over
# the float32 view of the words, (..., 2) (re, im): each part gets the operation the
# cdw_ops / dw_ops kernels apply to it (cdw_add is dw_add per part, a complex times a
# real factor dw_mul per part, ...), so the bits are theirs, with no split of the
# words into parts, no join of the results, and chains of such operations fused.
# A product of complex words is one program too (:func:`_complex_product`).
_PARTWISE = ("add", "sub", "neg")
_AXIS = (..., None)  # a new trailing axis


def _parts(a: mx.array | None) -> mx.array | None:
    """float32 (..., 2) view of complex64 (...) words (MLX copies only an array
    whose last axis is strided)."""
    return None if a is None else _VIEW(_RESHAPE(a, tuple(a.shape) + (1,)), F32)


def _from_parts(a: mx.array) -> mx.array:
    """complex64 (...) words of their float32 (..., 2) parts (a view)."""
    return _RESHAPE(_VIEW(a, _C64), tuple(a.shape[:-1]))


def _low(w: DoubleWord) -> mx.array | None:
    """The low word to read (None: ``w`` is exact, no zero word is made)."""
    return w.lo if w._lo is None and w.wide is not None else w._lo


def _part_words(w: DoubleWord, factor: bool) -> DoubleWord:
    """``w`` as real words over the parts axis: a complex operand's (its recorded
    expression goes with them), a real one as the complex ``w + 0i`` (``factor``
    False) or broadcast over both parts (``factor``: the real factor of a product or
    quotient; a recorded expression of shape () is kept, e.g. a constant)."""
    hi, lo = w.hi, _low(w)
    z = None if w.is_complex or lo is None else packed(hi, lo)
    if not w.is_complex and factor:
        e = expression(w)
        if e is not None and e.shape == ():
            return w
        if z is not None:  # the packed words with the parts axis: one view of both
            return _PackedLeaf(_INDEX(z, _AXIS), tuple(hi.shape) + (1,))
        return DoubleWord.exact(_INDEX(hi, _AXIS)) if lo is None else DoubleWord(
            _INDEX(hi, _AXIS), _INDEX(lo, _AXIS))
    if not w.is_complex:  # (x, +0): the parts of x + 0i, as astype(complex64) makes them
        parts = _constant_parts(w)
        if parts is not None:
            return parts
        if z is not None:  # both words padded at once (their packed array)
            return _PackedLeaf(_PAD(_INDEX(z, _AXIS), [(0, 0)] * z.ndim + [(0, 1)]),
                               tuple(hi.shape) + (2,))
        hi_p, lo_p = (None if a is None else
                      _PAD(_INDEX(a, _AXIS), [(0, 0)] * a.ndim + [(0, 1)]) for a in (hi, lo))
        return DoubleWord.exact(hi_p) if lo_p is None else DoubleWord(hi_p, lo_p)
    entry = _entry(w)
    if entry is not None and entry[2] is not None and _held(entry[2]) is not None:
        return _ConstParts(entry[2], lambda: entry[4])  # (note_complex_constant)
    if entry is not None and entry[4] is not None and entry[5] is not None:
        # a kernel's words in another layout (a transform's rows): one transpose of
        # them as (..., 2) parts (where the complex view needed a move and a copy)
        shape, axes = entry[5]
        perm = [axes.index(d) for d in range(hi.ndim)] + [hi.ndim]
        z = packed(*entry[4]) if entry[2] is None and perm[0] == 0 else None
        if z is not None:  # the packed words so (their first axis stays first)
            return _PackedLeaf(_TRANSPOSE(_RESHAPE(z, packed_shape(tuple(shape) + (2,))),
                                          perm), tuple(hi.shape) + (2,))
        return DoubleWord.of_words(*(_TRANSPOSE(_RESHAPE(a, tuple(shape) + (2,)), perm)
                                     for a in entry[4]))
    if entry is not None and entry[4] is not None:  # a kernel's words
        words, shape = entry[4], tuple(hi.shape) + (2,)
        z = packed(*words)
        if z is not None and entry[2] is None:  # read as a leaf: one reshape of them
            return _PackedLeaf(_RESHAPE(z, packed_shape(shape)), shape)
        if tuple(words[0].shape) != shape:  # (..., 2 n) as written: the parts axis
            words = (unpacked(_RESHAPE(z, packed_shape(shape)), shape) if z is not None
                     else tuple(_RESHAPE(a, shape) for a in words))
            if entry[2] is not None:  # a program's words: its chain goes with them
                _remember(*words, entry[2])
        return DoubleWord.of_words(*words)
    hi_p, lo_p = _parts(hi), _parts(lo)
    if entry is not None and entry[2] is not None:
        _remember(hi_p, lo_p, entry[2])  # the views read as the chain they show
    return DoubleWord.exact(hi_p) if lo_p is None else DoubleWord(hi_p, lo_p)


def _constant_parts(w: DoubleWord) -> "_ConstParts | None":
    """The parts (c, +0) of a real constant ``w`` (:func:`note_constant`: 0-d words
    c = hi + lo) held by the program (:func:`lanes`: no array is read, where the
    pad of its words makes two graph nodes per word); None for other ``w``."""
    e = expression(w)
    if e is None or e.leaves or len(e.code) != 1 or e.code[0][0] != _CONST:
        return None
    key = e.code[0][1:3]

    def data():  # the parts as float32 (2,) words, made once per constant
        parts = _CONSTANT_PARTS.get(key)
        if parts is None:
            hi, lo = np.array(key, np.int32).view(np.float32)
            parts = tuple(mx.array(np.array([v, 0.0], np.float32)) for v in (hi, lo))
            _cache(_CONSTANT_PARTS, key, parts)
        return parts

    return _ConstParts(lanes(e, Expr.constant(0.0, 0.0)), data)


_CONSTANT_PARTS: dict = {}  # the int32 bits of a constant's words -> its parts' words


def lanes(re: Expr, im: Expr) -> Expr:
    """The expression over the parts axis (the last) whose real part is ``re`` and
    imaginary part ``im`` (expressions broadcast over it; two constants: a complex
    constant held by the program): one exact select (:data:`OP` part)."""
    e = _compose(_PART, 0, [re, im])
    return Expr(e.leaves, e.prog, _broadcast((e.shape, (2,))))


def note_complex_constant(hi: mx.array, lo: mx.array, parts: tuple, re: tuple,
                          im: tuple) -> None:
    """Record that the 0-d complex64 words ``hi``, ``lo`` are the constant whose real
    and imaginary parts have the words ``re``, ``im`` (host floats), its parts the
    float32 (2,) words ``parts`` (:func:`note_parts`): a program holds the constant
    (:func:`lanes`) instead of reading its parts."""
    if not _traced.get():
        _remember(hi, lo, lanes(Expr.constant(*re), Expr.constant(*im)), tuple(parts))


def _held(e: Expr) -> tuple[Expr, Expr] | None:
    """The real and the imaginary part, as constants, where ``e`` is :func:`lanes`
    of two constants; else None."""
    code = e.code
    o, x, y, _ = code[e.prog.root]
    if o != _PART or code[x][0] != _CONST or code[y][0] != _CONST:
        return None
    return tuple(Expr((), _intern((code[k],), 0, False), ()) for k in (x, y))


class _ConstParts(_ExprWords):
    """The parts (2,) of a constant, held by the program (``expr``: :func:`lanes` of
    two constants); the float32 words ``data()`` made only where something reads
    them."""

    __slots__ = ("_data",)

    def __init__(self, expr: Expr, data):
        self.expr, self._data, self._words, self.wide = expr, data, None, None

    def _make(self) -> tuple:
        return self._data()

    def halves(self) -> tuple[Expr, Expr]:
        """The real and the imaginary part, as constants."""
        return _held(self.expr)


_EXPR_WORDS = (_Deferred, _PackedLeaf, _ConstParts)  # words known by their expression
_NOT_WORDS = (Expr, *_EXPR_WORDS)  # apply's operands that are not launched words


def _cut(w: DoubleWord, index) -> Expr:
    """A view of the words of ``w`` (parts), as a leaf."""
    lo = w._lo
    return Expr.leaf(_INDEX(w.hi, index), None if lo is None else _INDEX(lo, index))


def _halves(w: DoubleWord) -> tuple[Expr, Expr]:
    """The real and the imaginary part of the parts words of ``w``, (..., 1) each,
    as leaves: a slice each (two nodes of one output cost MLX's replay of a
    compiled graph less than one split of two outputs); of packed words
    (:class:`_PackedLeaf`), a slice of their packed array each, read packed."""
    if type(w) is _ConstParts:
        return w.halves()
    lo = w._lo
    z = (w.expr.leaves[0] if type(w) is _PackedLeaf
         else None if lo is None else packed(w.hi, lo))
    if z is not None:
        shape = tuple(w.shape[:-1]) + (1,)
        return tuple(Expr.packed_leaf(_INDEX(z, part), shape) for part in _PARTS)
    return tuple(Expr.leaf(_INDEX(w.hi, part), None if lo is None else _INDEX(lo, part))
                 for part in _PARTS)


_PARTS = ((..., slice(0, 1)), (..., slice(1, 2)))  # the real and the imaginary part


_SWAP = (..., slice(None, None, -1))


def _swapped(y: DoubleWord, vp: DoubleWord) -> Expr:
    """The parts (..., 2) of complex ``y`` reversed, (y_im, y_re), as a leaf: a view
    of the packed array its parts' words ``vp`` (:func:`_part_words`) read, else of
    the packed floats a kernel wrote for y (:func:`packed_words`) where they are
    known, else of each word of ``vp``."""
    if type(vp) is _PackedLeaf:
        z = vp.expr.leaves[0]
    else:
        z = None if y._lo is None else packed_words(y)
        if z is not None:
            z = _RESHAPE(z, packed_shape(tuple(vp.shape)))
    if z is not None:  # (packed parts hold 8 floats or more: the parts axis is not the first)
        return Expr.packed_leaf(_INDEX(z, _SWAP), tuple(vp.shape))
    return _cut(vp, _SWAP)


def _complex_product(x: DoubleWord, y: DoubleWord) -> Expr | None:
    """The expression of the complex product x y as cdw_mul computes it, over the
    parts axis: part p is ``dw_mul(x_re, y_p) + dw_mul(x_im, c_p)`` with c = i y =
    (-y_im, y_re), y's parts reversed (a view) and the real part negated (exact, the
    words of conj(y) reversed): ``x_re y_re - x_im y_im`` (dw_sub of the two
    products; dw_mul(a, -b) is -dw_mul(a, b) exactly, RN being symmetric) and
    ``x_re y_im + x_im y_re`` (dw_add). None where the shapes do not broadcast."""
    xp, vp = _part_words(x, False), _part_words(y, False)
    x_re, x_im = _halves(xp)
    if type(vp) is _ConstParts:
        y_re, y_im = vp.halves()
        c = lanes(_compose(_NEG, 0, [y_im]), y_re)
    else:
        r = _swapped(y, vp)
        c = lanes(_compose(_NEG, 0, [r]), r)
    terms = [_compose(OP["mul"], 0, [x_re, expression(vp)]),
             _compose(OP["mul"], 0, [x_im, c])]
    return None if None in terms else _compose(OP["add"], 0, terms)


def _apply_partwise(op: str, operands: list[DoubleWord], backend, stream):
    """:func:`apply` of an operation on complex words that acts on each part alike
    (above), or None (any other: the caller's cdw_ops / dw_ops kernels)."""
    kinds = tuple(w.is_complex for w in operands)
    factor = kinds == (True, False) and op in ("mul", "div") or (
        kinds == (False, True) and op == "mul")
    if _traced.get():
        return None
    if op == "mul" and kinds == (True, True):
        e = _complex_product(*operands)
        e = e if e is not None and e.fits() else None
    elif op in _PARTWISE or factor:
        if factor and kinds == (False, True):  # the complex factor first, as the kernels
            operands, kinds = operands[::-1], kinds[::-1]  # run it (dw_mul's bits)
        e = _fuse(OP[op], 0, [_part_words(w, factor and not c)
                              for w, c in zip(operands, kinds)])
    else:
        return None
    if e is None:
        return None
    zh, zl = _run(e.prog, e.leaves, e.shape, backend, stream, parts=True)
    if zh.shape == e.shape:  # (a short result's copy)
        hi, lo = _from_parts(zh), _from_parts(zl)
        _remember(zh, zl, e)
        _remember(hi, lo, e, (zh, zl))
    else:  # (..., 2 n): the complex words are its view (one graph node each)
        hi, lo = _VIEW(zh, _C64), _VIEW(zl, _C64)
        _remember(hi, lo, e, (zh, zl))
    return DoubleWord.of_words(hi, lo)


def binary(op: str, x: DoubleWord, y: DoubleWord, backend, stream, unfused) -> DoubleWord:
    """``x op y`` ("add", "sub", "mul", "div") on a kernel backend, differentiable by
    MLX inside :func:`mlx_gradients` (the float32 derivative of the high words):
    fused with the operands' expressions where they are real, else
    ``unfused(op, x, y)``, the single-operation engine (complex words)."""
    z = apply(op, [x, y], backend, stream)
    if z is not None:
        return z
    if not _traced.get():
        return unfused(op, x, y)
    if op == "sub":
        op, y = "add", -y  # exact negation
    f = single(op, backend, stream, lambda a, b: unfused(op, a, b))
    return DoubleWord(*f(x.hi, x.lo, y.hi, y.lo))


def words_op(forward, plain, operands: list[mx.array], lows: list) -> tuple[mx.array, mx.array]:
    """The kernel-backend form of a double-word op on arrays: ``forward(*DoubleWord)
    -> DoubleWord`` on the operands (``lows``: their low words, None for float32
    values: no zero word is made). Inside :func:`mlx_gradients` the result is
    differentiable by MLX with ``plain``'s VJP of the high words (a fused result,
    an elementary function, already is, as its chain; any other is wrapped in a
    custom function of the operands). Returns the result's words."""
    words = [DoubleWord.exact(a) if lo is None else DoubleWord(a, lo)
             for a, lo in zip(operands, lows)]
    z = forward(*words)
    if not _traced.get():
        return z.hi, z.lo
    if _entry(z) is not None:  # fused just now
        return z.hi, z.lo
    n = len(operands)
    given = [lo for lo in lows if lo is not None]

    @mx.custom_function
    def f(*_):
        return z.hi, z.lo

    @f.vjp
    def f_vjp(primals, cotangents, outputs):
        primals = as_tuple(primals)
        with flow_suspended():
            _, grads = _mlx.vjp(plain, list(primals[:n]), [cotangents[0]])
        return (*grads, *(mx.zeros_like(lo) for lo in primals[n:]))

    return f(*operands, *given)


# ---- the unfused chain: one operation at a time, each with its own VJP --------------------

def _sum_to(g: mx.array, like: mx.array) -> mx.array:
    """A cotangent summed over the axes broadcasting added to ``like``, real where
    ``like`` is real (MLX's convention for a real operand of a complex op)."""
    lead = g.ndim - like.ndim
    axes = list(range(lead)) + [lead + i for i, n in enumerate(like.shape)
                                if n == 1 and g.shape[lead + i] != 1]
    if axes:
        g = mx.sum(g, axis=axes, keepdims=True)
    g = g.reshape(like.shape)
    return mx.real(g) if like.dtype != mx.complex64 and g.dtype == mx.complex64 else (
        g.astype(like.dtype))


def _one(op: int, fn: int, arity: int, backend, stream):
    """One operation of a program on words ``(xh, xl[, yh, yl])``, unfused (no
    autodiff): the one-instruction program of ``dw_fused``."""
    loads = tuple((_LOAD, 2 * k, 2 * k + 1, 0) for k in range(arity))
    prog = _intern(loads + ((op, 0, 1 if arity == 2 else -1, fn),), arity,
                   op in _EXACT_WORDS)

    def run(*w):
        shape = _broadcast([tuple(a.shape) for a in w])
        return DoubleWord(*_run(prog, w, shape, backend, stream))

    return run


def single(op: str, backend, stream, forward=None):
    """``x op y`` ("add", "mul", "div") of words ``(xh, xl, yh, yl) -> (zh, zl)`` by
    ``forward(x, y)`` (DoubleWords; default: one ``dw_fused`` operation, real
    words), with the float32 derivative of the high words as its VJP (MLX's
    conventions for complex values: d(x y) = g conj(y); the low words are
    constants of size u |x|)."""
    if forward is None:
        one = _one(OP[op], 0, 2, backend, stream)
        forward = (lambda x, y: one(x.hi, x.lo, y.hi, y.lo))

    @mx.custom_function
    def f(xh, xl, yh, yl):
        z = forward(DoubleWord(xh, xl), DoubleWord(yh, yl))
        return z.hi, z.lo

    @f.vjp
    def f_vjp(primals, cotangents, outputs):
        xh, xl, yh, yl = primals
        g = cotangents[0]
        with flow_suspended():
            if op == "add":
                gx, gy = g, g
            elif op == "mul":
                gx, gy = g * mx.conj(yh), g * mx.conj(xh)
            else:
                gx = g / mx.conj(yh)
                gy = -gx * mx.conj(outputs[0])  # d(x/y)/dy = -z/y: -g conj(z / y)
            return (_sum_to(gx, xh), mx.zeros_like(xl), _sum_to(gy, yh), mx.zeros_like(yl))

    return f


def _single_fn(name: str, code: int, arity: int, backend, stream):
    """The function ``name`` (its ``DWM_FN`` code) of words ``(xh, xl[, yh, yl])`` by
    one ``dw_fused`` operation, with MLX's float32 derivative of the function of
    the high words as its VJP."""
    plain_fn = getattr(mx, name)
    one = _one(_FN, code, arity, backend, stream)

    @mx.custom_function
    def f(*w):
        z = one(*w)
        return z.hi, z.lo

    @f.vjp
    def f_vjp(primals, cotangents, outputs):
        his = list(primals[::2])
        with flow_suspended():
            _, grads = _mlx.vjp(plain_fn, his, [cotangents[0]])
            out = []
            for grad, lo in zip(grads, primals[1::2]):
                out += [grad, mx.zeros_like(lo)]
            return tuple(out)

    return f


_FN_NAMES: dict[int, str] = {}  # DWM_FN code -> MLX's function (apply records them)
_REAL_LANE = mx.array([True, False])  # the real part's lane of the parts axis
_OP_NAMES = {code: name for name, code in _BINARY.items()}


def _replay(key: tuple, backend, stream):
    """The expression ``key`` as a function of its leaves made of single-operation
    custom functions (:func:`single`, :func:`_single_fn`): the graph of the unfused
    chain, whose VJP MLX composes as it did before fusion."""
    code, root = key

    def run(*leaves):
        vals = []
        for o, x, y, f in code:
            if o == _LOAD:
                hi = leaves[x]
                v = DoubleWord(hi, leaves[y] if y >= 0 else mx.zeros_like(hi))
            elif o == _CONST:
                hi, lo = np.array([x, y], np.int32).view(np.float32)
                v = DoubleWord(mx.array(hi), mx.array(lo))
            elif o == _NEG:
                v = -vals[x]
            elif o == _PART:  # (an exact select over the parts axis, the last)
                a, b = vals[x], vals[y]
                v = DoubleWord(*(mx.where(_REAL_LANE, p, q) for p, q in ((a.hi, b.hi),
                                                                         (a.lo, b.lo))))
            elif o == _FN:
                args = [vals[x]] + ([vals[y]] if y >= 0 else [])
                v = DoubleWord(*_single_fn(_FN_NAMES[f], f, len(args), backend, stream)(
                    *(w for a in args for w in (a.hi, a.lo))))
            else:
                a, b = vals[x], vals[y]
                if o == _SUB:  # x - y = x + (-y), the negation exact
                    b = -b
                name = "add" if o == _SUB else _OP_NAMES[o]
                v = DoubleWord(*single(name, backend, stream)(a.hi, a.lo, b.hi, b.lo))
            vals.append(v)
        return vals[root].hi, vals[root].lo

    return run
