"""``metal_kernel``: a drop-in for ``mx.fast.metal_kernel`` that runs on the CPU.

The call generates the source MLX would generate (:mod:`.signature`), compiles it as
C++ against the shim headers (:mod:`.compiler`), and runs the grid with the
launcher of ``shim/runtime.h``. Results come back as ``mx.array``\\ s. Unlike MLX the
emulator computes eagerly, when the kernel is called.

Differences from a real Apple GPU that a kernel author should know:

* Outputs without ``init_value`` start as all-ones bytes (NaN for floats, -1 for
  integers) so that an output element the kernel never writes is visible.
* Every input and output lives between inaccessible guard regions (:mod:`.memory`):
  a write past a buffer becomes a Python exception naming the kernel, the buffer,
  the element and the thread instead of a crash; a read past it returns poison (all
  bits set) with one :class:`OutOfBoundsReadWarning` per kernel and buffer, or
  raises like a write under ``checked=True``. ``checked=True`` (the default
  under ``MLX_PRECISE_EMULATOR_CHECKED=1``, as in the test suite) also reports
  writes into the alignment slack and barriers that not every thread of a group
  reaches.
* Float ``simd_sum``/``simd_product`` combine lanes in a fixed tree order; the
  hardware's order is not documented, so last-bit agreement of float reductions is
  not guaranteed (integer and exact reductions agree).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import os
import re
import signal
import threading
import warnings
from collections import OrderedDict
from pathlib import Path

import mlx.core as mx
import numpy as np

from . import compiler, memory, signature

SHIM_DIR = Path(__file__).resolve().parent / "shim"
MAX_THREADS_PER_THREADGROUP = 1024

# Threadgroup-memory declarations (signature.THREADGROUP_DECL_RE) become storage
# shared by the fibers of one group (`threadgroup` in pointer types is dropped).
# Arrays live in memory of their own that ends at a guard page (shim/runtime.h,
# tg_alloc), so indexing past one faults and is reported.
_NEEDS_FIBERS_RE = re.compile(
    r"\b(?:threadgroup_barrier|simdgroup_\w+|simd_\w+|quad_\w+)\s*\("
)
_MATH_MODES = ("safe", "relaxed", "fast")
_TRACING = "function transformations"  # MLX's message when a tracer is evaluated

_NP_DTYPES = {
    mx.float32: np.float32,
    mx.float16: np.float16,
    mx.bfloat16: np.uint16,  # raw bits; numpy has no bfloat16
    mx.complex64: np.complex64,
    mx.bool_: np.bool_,
    mx.int8: np.int8,
    mx.int16: np.int16,
    mx.int32: np.int32,
    mx.int64: np.int64,
    mx.uint8: np.uint8,
    mx.uint16: np.uint16,
    mx.uint32: np.uint32,
    mx.uint64: np.uint64,
}

_libs: dict[str, ctypes.CDLL] = {}
_libs_lock = threading.Lock()
# One launch at a time in the process: each launch installs its library's fault
# handler for SIGSEGV/SIGBUS/SIGFPE and restores the previous one afterwards, which
# only nests correctly when launches do not overlap.
_launch_lock = threading.Lock()


def _check_dtype(dtype: mx.Dtype) -> None:
    if dtype not in _NP_DTYPES:
        raise TypeError(
            f"dtype {dtype} cannot be passed to a Metal kernel (Metal has no float64: "
            "pass float64 data as raw bits with x.view(mx.uint32))"
        )


def _to_numpy(x: mx.array) -> np.ndarray:
    """A row-contiguous numpy copy (bfloat16 as its uint16 bits)."""
    _check_dtype(x.dtype)
    if x.dtype == mx.bfloat16:
        x = x.view(mx.uint16)
    return np.ascontiguousarray(np.array(x, copy=True))


def _layout(v: memoryview, contiguous: bool) -> tuple[list[int], int, int]:
    """``(element strides, first element, bytes)`` of an input as the kernel sees it:
    row-contiguous, or (``contiguous=False``) the array's own strided view of its
    memory, as MLX passes it. ``first`` is the lowest element offset the view reaches
    (< 0 with negative strides), ``bytes`` the span from it to the highest."""
    size = math.prod(v.shape)
    if contiguous:
        return _row_strides(v.shape), 0, size * v.itemsize
    strides = [s // v.itemsize for s in v.strides]
    if not size:
        return strides, 0, 0
    first = sum(min(0, (n - 1) * s) for n, s in zip(v.shape, strides))
    last = sum(max(0, (n - 1) * s) for n, s in zip(v.shape, strides))
    return strides, first, (last - first + 1) * v.itemsize


class TransformNotEmulatedError(ValueError):
    """An emulated kernel called inside ``mx.compile``, ``mx.vmap`` or
    ``mx.export_function`` on traced inputs: the emulator computes eagerly on the
    CPU and MLX has no Python-defined primitives, so such a call cannot be traced."""


class OutOfBoundsReadWarning(RuntimeWarning):
    """A kernel read past the end of a buffer (outside checked mode): the read
    returned poison, as a GPU would return some value there."""


def _slack(checked: bool) -> int:
    """The byte that fills a buffer's alignment slack: checked mode's canary (a
    write there is found), else the poison that reads past the end return."""
    return memory.CANARY if checked else memory.POISON


def _stage_input(buf: memory.Guarded, v: memoryview, contiguous: bool) -> None:
    """Copy input ``v`` into its fenced buffer (laid out by :func:`_layout`)."""
    if not buf.nbytes:
        return
    if v.c_contiguous:  # (then first == 0 and the span is the whole memory)
        buf.data[:] = v.cast("B")
        return
    a = np.asarray(v)
    if contiguous:  # one copy, straight into the buffer, in row order
        np.copyto(buf.array.view(a.dtype).reshape(a.shape), a)
    else:
        src = a.__array_interface__["data"][0] + buf.first * buf.itemsize
        ctypes.memmove(buf.ptr, src, buf.nbytes)


def _from_numpy(a: np.ndarray, dtype: mx.Dtype) -> mx.array:
    out = mx.array(a)
    return out.view(mx.bfloat16) if dtype == mx.bfloat16 else out


def _dims(value, what: str) -> tuple[int, int, int]:
    try:
        dims = tuple(int(v) for v in value)
    except TypeError:
        raise TypeError(f"{what} must be a tuple of 3 ints, got {value!r}") from None
    if len(dims) != 3 or any(d < 1 for d in dims):
        raise ValueError(f"{what} must be 3 positive ints, got {value!r}")
    return dims


# What precedes MLX's text in the C++ unit (the runtime names source lines of
# the unit; `_name_lines` subtracts this).
_PRELUDE = '#include "runtime.h"\n#define threadgroup\n'
# Metal's compiler defines __FAST_MATH__ when fast math is on (MLX sets
# MTLCompileOptions.fastMathEnabled for math_mode="fast"), and kernels test it with
# `#if`; the emulator defines it the same way (arithmetic stays IEEE, see
# _warn_math_mode).
_PRELUDE_FAST = '#include "runtime.h"\n#define threadgroup\n#define __FAST_MATH__ 1\n'


def _threadgroup_decl(m: re.Match) -> str:
    t, name, dims = m.group(1), m.group(2), m.group(3).strip()
    if not dims:
        return f"static {t} {name};"
    return (f"static {t} (&{name}){dims} = *reinterpret_cast<{t} (*){dims}>("
            f'mpemu::tg_alloc(sizeof({t}{dims}), sizeof({t}), "{name}"));')


# Address spaces are empty macros in C++, so partial specializations that differ
# only in them (MLX's steel `pointer_element<device T*>`, `<thread T*>`, ...) would
# be redefinitions: the first one of each such set stays, the others are blanked
# (they are identical once the address space is gone). Groups: name, arguments.
_SPECIALIZATION_RE = re.compile(
    r"template\s*<[^<>{};]*>\s*struct\s+(\w+)\s*<([^<>{};]*(?:<[^<>{};]*>[^<>{};]*)*)>\s*\{")
_ADDRESS_SPACE_RE = re.compile(r"\b(?:device|constant|thread|threadgroup)\b")
# `[[threadgroup(0)]]` on a parameter of a kernel in a header (steel's): with the
# `threadgroup` macro empty it would read `[[(0)]]`.
_THREADGROUP_ATTR_RE = re.compile(r"\[\[\s*threadgroup\s*\(\s*\d+\s*\)\s*\]\]")


def _erase_address_space_twins(text: str) -> str:
    seen: set[tuple[str, str]] = set()
    out, pos = [], 0
    for m in _SPECIALIZATION_RE.finditer(text):
        if m.start() < pos:
            continue
        args = m.group(2)
        key = (m.group(1), " ".join(_ADDRESS_SPACE_RE.sub(" ", args).split()))
        if not _ADDRESS_SPACE_RE.search(args):
            continue
        if key not in seen:
            seen.add(key)
            continue
        depth, end = 0, m.end() - 1
        for end in range(m.end() - 1, len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                break
        end = text.find(";", end) + 1 or end + 1
        out.append(text[pos:m.start()])
        out.append(re.sub(r"[^\n]", " ", text[m.start():end]))
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _cpp_source(kname: str, text: str, template, params, prelude: str = _PRELUDE) -> str:
    """The C++ translation unit: shim, MLX's text, and the per-thread trampoline."""
    text = signature.for_emulator(kname, signature.blank_comments(text))
    text = _erase_address_space_twins(_THREADGROUP_ATTR_RE.sub("", text))
    text = signature.THREADGROUP_DECL_RE.sub(_threadgroup_decl, text)
    args = []
    for p in params:
        if p.kind == "input":
            args.append(f"*(const {p.ctype}*)b[{p.index}]" if p.ref else f"(const {p.ctype}*)b[{p.index}]")
        elif p.kind == "shape":
            args.append(f"(const int*)b[{p.index}]")
        elif p.kind == "strides":
            args.append(f"(const int64_t*)b[{p.index}]")
        elif p.kind == "ndim":
            args.append(f"*(const int*)b[{p.index}]")
        elif p.kind == "output":
            args.append(f"({p.ctype}*)b[{p.index}]")
        else:
            args.append(f"a.{p.name}")
    targs = signature.template_def(template) if template else ""
    call = ",\n      ".join(args)
    return (
        prelude +
        f"{text}\n"
        "static void mpemu_thread(void** b) {\n"
        "  const mpemu::Attrs& a = mpemu::attrs();\n"
        "  (void)a;\n"
        f"  {kname}{targs}(\n      {call});\n"
        "}\n"
        'extern "C" void mpemu_poison(const uint64_t* ranges, int n, uint64_t* hits) {\n'
        "  mpemu::g_poison_count = 0;\n"
        "  for (int i = 0; i < n && i < mpemu::kMaxPoison; ++i)\n"
        "    mpemu::g_poison[mpemu::g_poison_count++] = {ranges[2 * i], ranges[2 * i + 1]};\n"
        "  mpemu::g_poison_hits = hits;\n"
        "}\n"
        'extern "C" int mpemu_tg_describe(uint64_t addr, char* out, int n) {\n'
        "  return mpemu::tg_describe(addr, out, n);\n"
        "}\n"
        'extern "C" int mpemu_launch(void** b, const uint32_t* dims, int fibers, int checked,\n'
        "                            char* err, int n, uint64_t* fault) {\n"
        "  return mpemu::launch(mpemu_thread, b, dims, fibers, checked, err, n, fault);\n"
        "}\n"
    )


def _load(source: str, kname: str, label: str) -> ctypes.CDLL:
    _preload_libm()
    with _libs_lock:
        lib = _libs.get(source)
        if lib is None:
            path = compiler.build(source, kname, [SHIM_DIR], label, precompile="runtime.h")
            lib = ctypes.CDLL(str(path))
            lib.mpemu_tg_describe.restype = ctypes.c_int
            lib.mpemu_poison.restype = None
            lib.mpemu_poison.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_int,
                                         ctypes.POINTER(ctypes.c_uint64)]
            lib.mpemu_tg_describe.argtypes = [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_int]
            lib.mpemu_launch.restype = ctypes.c_int
            lib.mpemu_launch.argtypes = [
                ctypes.POINTER(ctypes.c_void_p),
                ctypes.POINTER(ctypes.c_uint32),
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_char_p,
                ctypes.c_int,
                ctypes.POINTER(ctypes.c_uint64),
            ]
            _libs[source] = lib
    return lib


@functools.lru_cache(maxsize=None)
def _preload_libm() -> None:
    """Kernel libraries link nothing (see compiler.link_flags); make sure libm's
    symbols are global in this process (the python binary usually has it already)."""
    name = ctypes.util.find_library("m")
    if name:
        ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)


def _instance_key(inputs, output_dtypes, template) -> tuple:
    """What the generated source of a kernel depends on besides the kernel itself:
    per input its dtype and how MLX passes it (signature.input_form: a 0-d input is
    ``const constant T&``, fewer than 8 elements ``const constant T*``, else
    ``const device T*``; ``<name>_shape`` / ``_strides`` / ``_ndim`` parameters
    exist for the last two, whatever the rank), the output dtypes and the template
    (names, values and their kinds: ``True`` and ``1`` print alike but declare
    ``bool`` and ``int`` parameters)."""
    return (tuple((x.dtype, signature.input_form(x.shape)) for x in inputs),
            tuple(output_dtypes),
            tuple((n, type(v), v) for n, v in template))


class _Instance:
    """One instantiation of a kernel: MLX's kernel name, parameters and text, the
    C++ unit, and (once built) its library."""

    __slots__ = ("kname", "params", "text", "cpp", "lib")

    def __init__(self, kname, params, text, cpp):
        self.kname, self.params, self.text, self.cpp = kname, params, text, cpp
        self.lib = None

    def load(self, label: str) -> ctypes.CDLL:
        self.lib = _load(self.cpp, self.kname, label)
        return self.lib


class MetalKernel:
    """A custom Metal kernel run by the emulator; see :func:`metal_kernel`."""

    def __init__(self, name, input_names, output_names, source, header="",
                 ensure_row_contiguous=True, atomic_outputs=False, compile_options=None,
                 strict=None, checked=None):
        if not output_names:
            raise ValueError("[metal_kernel] Must specify at least one output.")
        _check_compile_options(compile_options)
        self._prelude = (_PRELUDE_FAST if dict(compile_options or {}).get("math_mode") == "fast"
                         else _PRELUDE)
        self._line0 = self._prelude.count("\n")  # (see _name_lines)
        self._warned_reads: set[str] = set()  # buffers warned about (reads past them)
        self.name = name
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        self.source = source
        self.header = header
        self.ensure_row_contiguous = ensure_row_contiguous
        self.atomic_outputs = atomic_outputs
        self.checked = (os.environ.get("MLX_PRECISE_EMULATOR_CHECKED", "0") not in ("", "0")
                        if checked is None else bool(checked))
        self._shape_infos = signature.shape_infos(source, self.input_names)
        self._fibers = bool(_NEEDS_FIBERS_RE.search(header + "\n" + source))
        # The strict Metal front-end check (strict.py) of each new instantiation.
        self.strict = (os.environ.get("MLX_PRECISE_STRICT", "0") not in ("", "0")
                       if strict is None else bool(strict))
        self._strict_passed: set[str] = set()
        # Instantiations seen so far (see _instance_key): generating and scanning the
        # source costs far more than a launch of a small grid.
        self._instances: dict[tuple, _Instance] = {}

    def generate(self, inputs, output_dtypes, template=None):
        """Return ``(kernel_name, params, text)`` for these inputs: ``text`` is what
        MLX prints with ``verbose=True``."""
        infos = [
            signature.InputInfo(n, x.dtype, x.ndim, x.size, *si)
            for n, x, si in zip(self.input_names, inputs, self._shape_infos)
        ]
        return signature.generate(
            self.name, self.header, self.source, infos, self.output_names,
            list(output_dtypes), list(template or []), self.atomic_outputs,
        )

    def __call__(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup,
                 template=None, init_value=None, verbose=False, stream=None):
        for got, want, what in (
            (len(inputs), len(self.input_names), "inputs"),
            (len(output_shapes), len(self.output_names), "output_shapes"),
            (len(output_dtypes), len(self.output_names), "output_dtypes"),
        ):
            if got != want:
                raise ValueError(
                    f"[metal_kernel] Expected `{what}` to have size {want} but got size {got}."
                )
        inputs = [x if isinstance(x, mx.array) else mx.array(x) for x in inputs]
        try:
            mx.eval(*inputs)
        except ValueError as e:
            if _TRACING not in str(e):
                raise
            # Keeps MLX's phrase "function transformations", which callers match.
            raise TransformNotEmulatedError(
                f"[metal_kernel] the emulated kernel {self.name!r} cannot be traced by "
                "function transformations (mx.compile, mx.vmap, mx.export_function): the "
                "Metal emulator runs kernels eagerly on the CPU when they are called. Call "
                "it outside the transformation (or use mx.fast.metal_kernel on a Mac)."
            ) from None
        grid = _dims(grid, "grid")
        threadgroup = _dims(threadgroup, "threadgroup")
        tg_size = threadgroup[0] * threadgroup[1] * threadgroup[2]
        if tg_size > MAX_THREADS_PER_THREADGROUP:
            raise ValueError(
                f"Thread group size ({tg_size}) is greater than  the maximum allowed "
                f"threads per threadgroup ({MAX_THREADS_PER_THREADGROUP})."
            )
        template = list(template or [])

        def launch(*arrays):
            return self._launch(list(arrays), output_shapes, output_dtypes, template, grid,
                                threadgroup, init_value, verbose)

        # Outputs depend on the inputs through a function whose derivatives raise
        # as MLX's CustomKernel does (an mx.custom_function around the kernel
        # supplies its own VJP and never reaches these).
        fn = mx.custom_function(launch)
        fn.vjp(_no_derivative("vjp"))
        fn.jvp(_no_derivative("jvp"))
        return fn(*inputs)

    def _instance(self, inputs, output_dtypes, template, verbose=False) -> "_Instance":
        """The instantiation for these inputs (generated, printed when ``verbose``,
        strictly checked when ``strict``, and built on first use)."""
        key = _instance_key(inputs, output_dtypes, template)
        inst = self._instances.get(key)
        if inst is None:
            inst = self._instances.setdefault(key, self._instantiate(inputs, output_dtypes, template))
        if verbose:  # (before the checks and the build, whose errors it helps to read)
            self._print_source(inst)
        if self.strict and inst.kname not in self._strict_passed:
            from . import strict

            strict.check_source(
                self.name, self.input_names, self.output_names, self.source,
                inputs=inputs, output_dtypes=output_dtypes, header=self.header,
                template=template, atomic_outputs=self.atomic_outputs)
            self._strict_passed.add(inst.kname)
        if inst.lib is None:
            inst.load(f"{self.name} ({inst.kname})")
        return inst

    def _print_source(self, inst: "_Instance") -> None:
        print(f"Generated source code for `{self.name}`:\n```\n{inst.text}\n```")

    def _instantiate(self, inputs, output_dtypes, template) -> "_Instance":
        """The generated text and C++ unit of one instantiation (not compiled yet:
        the strict check, when on, runs first)."""
        kname, params, text = self.generate(inputs, output_dtypes, template)
        compile_text = signature.write_signature(kname, self.header, self.source, template, params)
        cpp = _cpp_source(kname, compile_text, template, params, self._prelude)
        return _Instance(kname, params, text, cpp)

    def _launch(self, inputs, output_shapes, output_dtypes, template, grid, threadgroup,
                init_value, verbose):
        contiguous = self.ensure_row_contiguous
        # What the buffers and arguments of a launch depend on (_Plan): the
        # instantiation (input dtypes and forms, output dtypes, template) and the
        # input layouts and output shapes.
        views, layouts = [], []
        for x in inputs:
            dtype = x.dtype
            # (bfloat16 as its uint16 bits: memoryviews have no bfloat16)
            v = memoryview(x.view(mx.uint16) if dtype == mx.bfloat16 else x)
            views.append(v)
            layouts.append((dtype, v.shape) if contiguous else (dtype, v.shape, v.strides))
        key = (self, tuple(layouts), tuple(tuple(s) for s in output_shapes),
               tuple(output_dtypes), tuple((n, type(v), v) for n, v in template))
        plan = _take_plan(key)
        if plan is None:
            inst = self._instance(inputs, output_dtypes, template, verbose)
            plan = _Plan(inst, views, inputs, output_shapes, output_dtypes, contiguous,
                         self.checked)
        elif verbose:
            self._print_source(plan.inst)
        reusable = False
        try:
            outs = self._run(plan, views, grid, threadgroup, init_value)
            # (a poisoned read opened guard pages: see memory.Guarded.tainted)
            reusable = not any(b.tainted for b in plan.fenced)
            return outs
        finally:
            if reusable:
                _keep_plan(key, plan)
            else:  # (tainted mappings are unmapped, the others pooled)
                plan.free()

    def _run(self, plan, views, grid, threadgroup, init_value) -> list[mx.array]:
        """One launch with ``plan``'s buffers; raises on any fault, and leaves a
        buffer ``tainted`` where a read opened its guard pages."""
        for buf, owner in plan.staged:
            _stage_input(buf, views[owner], self.ensure_row_contiguous)
        for buf, dtype in plan.outs:
            _fill_output(buf, dtype, init_value)
        if not self.checked:  # (checked mode finds any write there after the launch)
            for b in plan.fenced:
                b.refill_slack()
        lib = plan.inst.lib
        # MLX clamps the threadgroup to the grid in each dimension.
        dims = (ctypes.c_uint32 * 6)(*grid, *(min(t, g) for t, g in zip(threadgroup, grid)))
        err, fault, hits, poison = plan.err, plan.fault, plan.hits, plan.poison
        # A poisoned read opens guard pages: such a mapping is not reused
        # (memory.Guarded.tainted), nor is any whose launch did not finish.
        try:
            with _launch_lock:
                lib.mpemu_poison(plan.ranges, len(poison), hits)
                try:
                    status = lib.mpemu_launch(plan.buffers, dims, int(self._fibers),
                                              int(self.checked), err, len(err), fault)
                finally:
                    lib.mpemu_poison(plan.ranges, 0, hits)
        except BaseException:
            for b in poison:
                b.tainted = True
            raise
        if any(hits[0:5 * len(poison):5]):  # (read counts, one per buffer)
            for k, b in enumerate(poison):
                b.tainted = bool(hits[5 * k])
            self._warn_poison_reads(poison, hits)
        if status == 1:
            raise RuntimeError(f"kernel {self.name!r}: {_name_lines(err.value.decode(), self._line0)}")
        if status == 2:
            raise RuntimeError(_fault_message(self.name, lib, plan.fenced, fault))
        if self.checked:
            for b in plan.fenced:
                off = b.slack_write()
                if off is not None:
                    raise RuntimeError(
                        f"kernel {self.name!r}: out-of-bounds write of {b.kind} {b.name!r} "
                        f"at byte {off} (element {b.first + off // b.itemsize}; valid: "
                        f"{b.first}..{b.last}); the thread is unknown (the write missed "
                        "the guard pages)")
        # mx.array copies the data out of the guarded memory (reused or freed).
        return [_from_numpy(a, d) for a, d in plan.results]

    def _warn_poison_reads(self, buffers, hits) -> None:
        """One warning per kernel and buffer whose guard pages a read reached."""
        for k, b in enumerate(buffers):
            count, addr, x, y, z = hits[5 * k: 5 * k + 5]
            if not count or b.name in self._warned_reads:
                continue
            self._warned_reads.add(b.name)
            warnings.warn(
                f"kernel {self.name!r}: read past the end of {b.kind} {b.name!r} at element "
                f"{b.element(addr)} (valid: {b.first}..{b.last}) by thread ({x},{y},{z}) of "
                "the grid; the read returned poison (all bits set: NaN for floats, -1 for "
                "integers), a GPU returns whatever memory holds there. checked=True raises "
                "instead (this warning is given once per kernel and buffer)",
                OutOfBoundsReadWarning, stacklevel=4)

def _new_output(name, shape, dtype, checked=True) -> memory.Guarded:
    """A fenced output buffer (filled by :func:`_fill_output` before each launch)."""
    if dtype not in _NP_DTYPES:
        raise TypeError(f"unsupported output dtype for a Metal kernel: {dtype}")
    size = math.prod(int(s) for s in shape)
    itemsize = np.dtype(_NP_DTYPES[dtype]).itemsize
    return memory.Guarded(name, "output", size * itemsize, itemsize, slack=_slack(checked))


def _fill_output(buf: memory.Guarded, dtype: mx.Dtype, init_value) -> None:
    """``init_value`` everywhere, else all-ones bytes."""
    if init_value is None:
        buf.fill(0xFF)
        return
    # (astype: mx.full of a real value with a complex dtype gives float32)
    value = _to_numpy(mx.full((1,), init_value, dtype=dtype).astype(dtype))
    buf.array.view(value.dtype)[:] = value[0]


class _Plan:
    """The fenced buffers and ctypes arguments of the launches of one instantiation
    with the same input layouts and output shapes. Building them (mapping or pooling
    a guarded buffer per argument, its views, the shape and stride arrays) costs
    several times a launch of a small grid; a kept plan is reused by the next such
    launch, which only copies the inputs in and refills the outputs and the slack
    (so each launch sees its buffers as new ones would be; the guard pages are
    never opened in a kept plan: see memory.Guarded.tainted)."""

    __slots__ = ("inst", "fenced", "staged", "outs", "results", "keep", "buffers", "poison",
                 "ranges", "hits", "err", "fault", "nbytes")

    def __init__(self, inst, views, inputs, output_shapes, output_dtypes, contiguous, checked):
        self.inst = inst
        self.fenced: list[memory.Guarded] = []
        self.staged: list[tuple[memory.Guarded, int]] = []  # (buffer, input index)
        self.outs: list[tuple[memory.Guarded, mx.Dtype]] = []
        self.keep = []  # owners of the memory behind the pointers
        ptrs, strides = [], {}
        try:
            for p in inst.params:
                if p.kind == "attribute":
                    continue
                if p.kind == "input":
                    _check_dtype(inputs[p.owner].dtype)
                    v = views[p.owner]
                    strides[p.owner], first, span = _layout(v, contiguous)
                    buf = memory.Guarded(p.name, "input", span, v.itemsize, first,
                                         slack=_slack(checked))
                    self.staged.append((buf, p.owner))
                elif p.kind == "output":
                    dtype = output_dtypes[p.owner]
                    buf = _new_output(p.name, output_shapes[p.owner], dtype, checked)
                    self.outs.append((buf, dtype))
                else:
                    if p.kind == "shape":
                        arr = np.array(views[p.owner].shape, dtype=np.int32)
                    elif p.kind == "strides":
                        arr = np.array(strides[p.owner], dtype=np.int64)
                    else:  # ndim
                        arr = np.array([views[p.owner].ndim], dtype=np.int32)
                    self.keep.append(arr)
                    ptrs.append(arr.ctypes.data if arr.size else 0)
                    continue
                self.fenced.append(buf)
                ptrs.append(buf.origin)
        except BaseException:
            self.free()
            raise
        self.results = [
            (b.array.view(_NP_DTYPES[d]).reshape(tuple(int(n) for n in s)), d)
            for (b, d), s in zip(self.outs, output_shapes)
        ]
        self.nbytes = sum(b.data_pages for b in self.fenced)
        self.buffers = (ctypes.c_void_p * max(len(ptrs), 1))(*ptrs)
        self.err = ctypes.create_string_buffer(512)
        self.fault = (ctypes.c_uint64 * 8)()
        # Outside checked mode a read in a buffer's guard pages returns poison
        # (shim/runtime.h, poison_read); checked mode keeps it an error.
        self.poison = [] if checked else self.fenced
        self.ranges = (ctypes.c_uint64 * max(2 * len(self.poison), 1))(
            *(v for b in self.poison for v in (b.base, b.base + b.size)))
        self.hits = (ctypes.c_uint64 * max(5 * len(self.poison), 1))()

    def free(self) -> None:
        for b in self.fenced:
            b.free()


# Idle plans, least recently used first, keyed by kernel and launch signature
# (MetalKernel._launch). A plan in use is out of the cache, so concurrent launches
# of one signature each get their own.
_PLANS_MAX = 64
_PLANS_MAX_BYTES = 32 << 20  # of data pages in all
_plans: "OrderedDict[tuple, _Plan]" = OrderedDict()
_plans_bytes = 0
_plans_lock = threading.Lock()


def _take_plan(key) -> _Plan | None:
    global _plans_bytes
    with _plans_lock:
        plan = _plans.pop(key, None)
        if plan is not None:
            _plans_bytes -= plan.nbytes
        return plan


def _keep_plan(key, plan: _Plan) -> None:
    global _plans_bytes
    evicted = []
    with _plans_lock:
        if key in _plans or plan.nbytes > _PLANS_MAX_BYTES:
            evicted.append(plan)
        else:
            _plans[key] = plan
            _plans_bytes += plan.nbytes
        while len(_plans) > _PLANS_MAX or _plans_bytes > _PLANS_MAX_BYTES:
            _, old = _plans.popitem(last=False)
            _plans_bytes -= old.nbytes
            evicted.append(old)
    for old in evicted:
        old.free()


def release_plans() -> None:
    """Free the buffers of every idle plan (back to memory's pool)."""
    global _plans_bytes
    with _plans_lock:
        idle = list(_plans.values())
        _plans.clear()
        _plans_bytes = 0
    for plan in idle:
        plan.free()


def _check_compile_options(options) -> None:
    """MLX's validation of ``compile_options``; relaxed/fast math run as safe."""
    if options is None:
        return
    for key, value in dict(options).items():
        if key != "math_mode":
            raise ValueError(f"[metal_kernel] Unknown compile option `{key}`.")
        if value not in _MATH_MODES:
            raise ValueError("[metal_kernel] Expected math_mode to be 'safe', 'relaxed', or 'fast'.")
        if value != "safe":
            _warn_math_mode(value)


@functools.lru_cache(maxsize=None)
def _warn_math_mode(mode: str) -> None:
    warnings.warn(
        f"the Metal emulator runs math_mode={mode!r} kernels with 'safe' (IEEE) semantics; "
        "on a GPU the compiler may reassociate, contract and use approximate functions, "
        "so results there can differ",
        RuntimeWarning,
        stacklevel=4,
    )


def _no_derivative(kind: str):
    def raise_(*args):
        raise ValueError(f"[Primitive::{kind}] Not implemented for CustomKernel.")
    return raise_


def _name_lines(message: str, line0: int) -> str:
    """Runtime messages name source lines of the C++ unit as ``@line N``; say them as
    lines of the generated source that ``verbose=True`` prints."""
    return re.sub(r"@line (\d+)", lambda m: f"line {int(m.group(1)) - line0} of the generated "
                  "source (verbose=True prints it)", message)


_SIGNALS = {int(signal.SIGSEGV): "access", int(signal.SIGBUS): "access"}


def _fault_message(kernel: str, lib, buffers, fault) -> str:
    sig, addr, access = int(fault[0]), int(fault[1]), int(fault[2])
    thread = (f"thread ({fault[3]},{fault[4]},{fault[5]}) of the grid "
              f"(threadgroup ({fault[6]},{fault[7]},..))")
    if sig not in _SIGNALS:
        return (f"kernel {kernel!r}: integer division by zero (or INT_MIN / -1) trapped in "
                f"{thread}; the GPU does not trap and returns an unspecified value")
    what = {1: "write", 2: "read"}.get(access, "access")
    tg = ctypes.create_string_buffer(200)
    if lib.mpemu_tg_describe(addr, tg, len(tg)):
        return f"kernel {kernel!r}: out-of-bounds {what} of {tg.value.decode()} by {thread}"
    return memory.describe(kernel, buffers, what, addr, thread)


def _row_strides(shape) -> list[int]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return strides[::-1]


def metal_kernel(name, input_names, output_names, source, header="",
                 ensure_row_contiguous=True, atomic_outputs=False, compile_options=None,
                 strict=None, checked=None):
    """Drop-in for ``mx.fast.metal_kernel`` that runs the kernel on the CPU.

    Same constructor and call arguments as MLX's; see the module docstring for the
    few differences. ``strict=True`` (default: the ``MLX_PRECISE_STRICT``
    environment variable) first runs each new instantiation through the strict Metal
    front-end check (:func:`mlx_precise.emulator.strict.check_source`) and raises
    :class:`~mlx_precise.emulator.strict.MetalCheckError` where Metal would reject
    the source. ``checked=True`` (default: the ``MLX_PRECISE_EMULATOR_CHECKED``
    environment variable) also reports writes into the alignment slack around
    buffers and barriers that not every thread of a group reaches. Example::

        k = metal_kernel(name="myexp", input_names=["inp"], output_names=["out"],
                         source="uint i = thread_position_in_grid.x;"
                                "out[i] = metal::exp(inp[i]);")
        (y,) = k(inputs=[x], grid=(x.size, 1, 1), threadgroup=(256, 1, 1),
                 output_shapes=[x.shape], output_dtypes=[x.dtype])
    """
    return MetalKernel(name, input_names, output_names, source, header,
                       ensure_row_contiguous, atomic_outputs, compile_options, strict,
                       checked)
