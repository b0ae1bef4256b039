"""The kernel registry: every Metal kernel is declared once and run by an executor.

A :class:`Kernel` names its body file (``metal/kernels/*.metal``), the headers it
needs (``metal/include/*.h``, inlined into MLX's ``header`` string because
``mx.fast.metal_kernel`` has no include path), its input and output names, its
template parameters and optionally its grid rule. Calling it runs the kernel on the
``metal`` executor (``mx.fast.metal_kernel``) or the ``emulate`` executor
(:func:`mlx_precise.emulator.metal_kernel`, same arguments), built lazily and cached.

Kernels that compute in double-word arithmetic (``extended=True``) first run the
device self-test once per executor: if TwoSum or the fma residual is not exact there,
they raise :class:`DeviceCheckError` instead of returning wrong numbers.
"""

from __future__ import annotations

import functools
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import mlx.core as mx
import numpy as np

from . import backends
from .plain import plain
from ..emulator.signature import blank_comments, input_form

_ARRAY = mx.array  # the class (inside a block the name is a stand-in)


class DeviceCheckError(RuntimeError):
    """The device (or its compiler) does not compute error-free transforms exactly."""


class KernelInputError(ValueError):
    """Inputs of a kernel launch do not match its declaration."""


def _find_metal_dir() -> Path:
    """``metal/`` ships inside the wheel as ``mlx_precise/metal``; in a source
    checkout (or an editable install) it is the top-level ``metal/`` beside it."""
    env = os.environ.get("MLX_PRECISE_METAL_DIR")
    pkg = Path(__file__).resolve().parent.parent  # mlx_precise/ (this file: core/kernels.py)
    candidates = ([Path(env)] if env else []) + [pkg / "metal", pkg.parent / "metal"]
    for c in candidates:
        if (c / "kernels").is_dir() and (c / "include").is_dir():
            return c
    raise FileNotFoundError(
        "mlx_precise cannot find its Metal sources (looked in "
        + ", ".join(str(c) for c in candidates)
        + "); reinstall the package or set MLX_PRECISE_METAL_DIR"
    )


METAL_DIR = _find_metal_dir()
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.M)
_PRAGMA_ONCE_RE = re.compile(r"^\s*#\s*pragma\s+once\s*$", re.M)


@functools.lru_cache(maxsize=None)
def _read(path: Path) -> str:
    """The Metal file at ``path`` as kernels get it: each line without its
    comments (:func:`~mlx_precise.emulator.signature.blank_comments`) and its
    indentation (lines kept, so diagnostics' line numbers hold). MLX copies a
    kernel's whole source (headers included) into every launch and hashes it at
    every evaluation (``mlx/backend/common/metal_kernel.cpp``,
    ``mlx/backend/metal/custom_kernel.cpp``): the comments are two thirds of it."""
    return "\n".join(line.strip() for line in blank_comments(path.read_text()).split("\n"))


def resolve_headers(names: Sequence[str], markers: bool = False) -> str:
    """Concatenate headers from ``metal/include``, inlining quoted ``#include``\\ s
    of other headers there once each (``#pragma once`` semantics).

    With ``markers``, ``#line`` directives keep each line attributed to its file
    (``metal/include/<name>``), for diagnostics of the strict check."""
    seen: set[str] = set()
    return "".join(_expand(n, seen, markers) for n in names)


def _expand(name: str, seen: set, markers: bool) -> str:
    """One header of :func:`resolve_headers`, those it includes inlined (a module
    function: a recursive closure would be a reference cycle)."""
    if name in seen:
        return ""
    seen.add(name)
    path = METAL_DIR / "include" / name
    if not path.is_file():
        raise FileNotFoundError(f"Metal header {name!r} not found in {path.parent}")
    text = _PRAGMA_ONCE_RE.sub("", _read(path))
    if not markers:
        return _INCLUDE_RE.sub(lambda m: _expand(m.group(1), seen, markers), text)
    label = f"metal/include/{name}"
    out = [f'#line 1 "{label}"\n']
    for no, line in enumerate(text.splitlines(keepends=True), 1):
        m = _INCLUDE_RE.match(line)
        if m:
            out.append(_expand(m.group(1), seen, markers) + f'\n#line {no + 1} "{label}"\n')
        else:
            out.append(line)
    return "".join(out)


def elementwise_grid(n: int, threads: int = 256):
    """Grid rule for one thread per element: ``((n, 1, 1), (threads, 1, 1))``."""
    n = max(int(n), 1)
    return (n, 1, 1), (min(threads, n), 1, 1)


def per_element_of_first_input(inputs, template) -> tuple:
    """Grid rule: one thread per element of the first input (elementwise kernels)."""
    return elementwise_grid(inputs[0].size)


def same_shape(ndim: int | None = None) -> Callable:
    """Shape rule: every input has the same shape (and ``ndim`` dimensions if given)."""

    def check(arrays: Mapping[str, mx.array]) -> None:
        shapes = [a.shape for a in arrays.values()]
        first = shapes[0] if shapes else ()
        if any(s != first for s in shapes):
            shapes = {n: tuple(a.shape) for n, a in arrays.items()}
            raise KernelInputError(f"inputs must all have one shape, got {shapes}")
        if ndim is not None and len(first) != ndim:
            raise KernelInputError(f"inputs must be {ndim}-D, got shape {first}")

    return check


# ---- codes and parameter layouts shared with the Metal sources ------------------------

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Codes:
    """Integer codes shared by Python and Metal, defined once, by name.

    ``names[i]`` has code ``i``; the Metal side sees ``constant constexpr int
    <PREFIX>_<NAME> = i;`` for each, and ``<PREFIX>_COUNT``, from :meth:`source`,
    which a generated block of a header holds (:func:`generated_block`; a test
    compares the header with it). Kernels compare with the names and Python looks
    codes up by name (``codes["exp"]``), so inserting a name renumbers both sides
    together."""

    prefix: str
    names: tuple[str, ...]

    def __post_init__(self):
        bad = [n for n in self.names if not _NAME_RE.match(n) or n == "count"]
        if bad or len(set(self.names)) != len(self.names):
            raise ValueError(f"{self.prefix}: names must be distinct lower-case identifiers "
                             f"other than 'count', got {self.names}")

    def __getitem__(self, name: str) -> int:
        code = self._codes.get(name)
        if code is None:
            raise KeyError(f"{self.prefix}: unknown name {name!r}; expected one of "
                           + ", ".join(self.names))
        return code

    @functools.cached_property
    def _codes(self) -> dict:
        """name -> code (a lookup per launch: wrappers pass names)."""
        return {n: i for i, n in enumerate(self.names)}

    def __contains__(self, name) -> bool:
        return name in self.names

    @property
    def values(self) -> tuple[int, ...]:
        return tuple(range(len(self.names)))

    def items(self):
        return ((n, i) for i, n in enumerate(self.names))

    def metal_name(self, name: str) -> str:
        """The Metal constant of ``name`` (``DW_OP_ADD`` for ``add``)."""
        self[name]
        return f"{self.prefix}_{name.upper()}"

    def source(self) -> str:
        lines = [f"constant constexpr int {self.metal_name(n)} = {i};\n" for n, i in self.items()]
        return "".join(lines) + f"constant constexpr int {self.prefix}_COUNT = {len(self.names)};\n"


_PACKED_MAX = 1024  # parameter buffers kept per layout


@dataclass(frozen=True)
class ParamLayout(Codes):
    """The layout of an integer parameter buffer shared by Python and Metal: field
    ``names[i]`` is ``params[i]``, named ``<PREFIX>_<NAME>`` in Metal
    (:meth:`source`); :meth:`pack` builds the buffer by name. The buffer has
    ``size`` elements (at least 8, so MLX passes it as a ``device`` buffer) of
    ``dtype`` (int32, or int64 for strides of large arrays)."""

    size: int = 16
    dtype: type = np.int32

    def __post_init__(self):
        super().__post_init__()
        if self.size < max(8, len(self.names)):
            raise ValueError(f"{self.prefix}: size {self.size} < max(8, {len(self.names)})")

    def index(self, name: str) -> int:
        """The position of field ``name`` in the buffer."""
        return self[name]

    def source(self) -> str:
        return "".join(f"constant constexpr int {self.metal_name(n)} = {i};\n"
                       for n, i in self.items())

    def pack(self, tail: Sequence[int] = (), /, **values: int) -> mx.array:
        """The ``dtype`` buffer with every field given by name (bools as 0 / 1, ints
        as their value or bit pattern; unused slots of the ``size`` are 0), followed
        by ``tail`` (records of a variable count, e.g. one per batch dimension).

        Raises:
            KeyError: a field is missing or unknown.
            ValueError: a value does not fit in ``dtype``."""
        if len(values) != len(self.names) or any(n not in values for n in self.names):
            missing = [n for n in self.names if n not in values]
            extra = [n for n in values if n not in self.names]
            raise KeyError(f"{self.prefix}: missing fields {missing}, unknown {extra}")
        vals = [int(values[n]) for n in self.names]
        vals += [0] * (self.size - len(vals)) + [int(v) for v in tail]
        key = tuple(vals)
        packed = self._packed.get(key)
        if packed is not None:  # (a constant: the kernels only read it)
            return packed
        lo, hi, dtype = self._range
        if min(vals) < lo or max(vals) > hi:
            raise ValueError(f"{self.prefix}: parameters must fit in {np.dtype(self.dtype)}, "
                             f"got {dict(zip(self.names, vals))}, tail {list(tail)}")
        packed = self._packed[key] = _ARRAY(vals, dtype=dtype)
        if len(self._packed) > _PACKED_MAX:
            self._packed.pop(next(iter(self._packed)), None)
        return packed

    @functools.cached_property
    def _packed(self) -> dict:
        """The buffers made, by their values: a repeated layer's launch reuses its
        buffer (no array built from a list per launch)."""
        return {}

    @functools.cached_property
    def _range(self):
        """(min, max, MLX dtype) of ``dtype`` (cached: :meth:`pack` runs per launch)."""
        info = np.iinfo(self.dtype)
        return int(info.min), int(info.max), getattr(mx, info.dtype.name)


@dataclass(frozen=True)
class Constants:
    """Named integer constants shared by Python and Metal (sizes and limits a
    kernel and its wrapper agree on): ``values`` maps each lower-case name to its
    value; Metal sees ``constant constexpr int <PREFIX>_<NAME> = value;``
    (:meth:`source`, for :func:`generated_block`) and Python reads ``c.name``."""

    prefix: str
    values: Mapping[str, int]

    def __post_init__(self):
        bad = [n for n in self.values if not _NAME_RE.match(n)]
        if bad:
            raise ValueError(f"{self.prefix}: names must be lower-case identifiers, got {bad}")

    def __getattr__(self, name: str) -> int:
        if name in ("prefix", "values") or name.startswith("__"):
            raise AttributeError(name)  # not set yet (copy, pickle)
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(f"{self.prefix} has no constant {name!r}") from None

    def source(self) -> str:
        return "".join(f"constant constexpr int {self.prefix}_{n.upper()} = {int(v)};\n"
                       for n, v in self.values.items())


def generated_block(origin: str, *parts) -> str:
    """The generated block of a header holding the constants of ``parts``
    (:class:`Codes`, :class:`ParamLayout`, :class:`Constants`), headed by ``origin``, the Python function
    that returns it (a test checks that the header holds exactly this text)."""
    return (f"// ---- generated by {origin}; do not edit ----\n"
            + "".join(p.source() for p in parts)
            + "// ---- end of generated codes ----\n")


@dataclass(frozen=True)
class Kernel:
    """Declaration of one Metal kernel.

    Args:
        name: unique kernel name (MLX's ``name``).
        body: file under ``metal/kernels`` holding the kernel body (or an
            absolute path, for kernels kept elsewhere, e.g. tests).
        inputs, outputs: parameter names, in buffer order.
        headers: files under ``metal/include`` inlined before the kernel.
        template: names of the template parameters; values are given per call.
        input_dtypes: optional ``{input name: allowed dtypes}`` checked per call.
        input_shapes: optional rule ``input_shapes(arrays_by_name)`` that raises
            :class:`KernelInputError` when the input shapes do not fit the kernel
            (see :func:`same_shape`).
        grid: optional rule ``grid(inputs, template) -> (grid, threadgroup)`` used
            when a call gives no grid.
        extended: computes in double-word; requires the device self-test.
        atomic_outputs, ensure_row_contiguous: as in ``mx.fast.metal_kernel``.
        variants: the values the wrappers can give each template parameter and
            the dtypes of each output (a template parameter's name: that dtype),
            ``{name: (value, ...)}``. With ``input_dtypes`` they span the
            instantiations that ``python -m mlx_precise check-kernels`` checks.
        input_forms: per input, how MLX may pass it (``"device"``: 8 or more
            elements, ``"constant"``: fewer, ``"scalar"``: 0-d); default device and
            constant. Narrow it only where the wrapper guarantees the size (pads).
        codes: ``{template parameter: Codes}`` for parameters that select by code
            (:class:`Codes`): a call may give the name (``template={"OP": "add"}``),
            and the parameter's ``variants`` default to every code.
        prelude: one line of code made in Python that takes the body's line 1 (a
            comment line there), e.g. a declaration over the inputs, so that one
            body serves kernels whose inputs differ (line numbers unchanged).
    """

    name: str
    body: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    headers: tuple[str, ...] = ()
    template: tuple[str, ...] = ()
    input_dtypes: Mapping[str, tuple] = field(default_factory=dict)
    input_shapes: Callable | None = None
    grid: Callable | None = None
    extended: bool = True
    atomic_outputs: bool = False
    ensure_row_contiguous: bool = True
    variants: Mapping[str, tuple] = field(default_factory=dict)
    input_forms: Mapping[str, tuple] = field(default_factory=dict)
    codes: Mapping[str, "Codes"] = field(default_factory=dict)
    prelude: str = ""

    def __post_init__(self):
        if self.codes:  # every code of a coded parameter is an instantiation
            variants = {t: c.values for t, c in self.codes.items()}
            object.__setattr__(self, "variants", {**variants, **self.variants})

    def source_path(self) -> Path:
        path = Path(self.body)
        if not path.is_absolute():  # absolute paths serve kernels kept outside metal/
            path = METAL_DIR / "kernels" / self.body
        return path

    def source(self) -> str:
        path = self.source_path()
        if not path.is_file():
            raise FileNotFoundError(f"kernel body {self.body!r} not found in {path.parent}")
        text = _read(path)
        if not self.prelude:
            return text
        first, _, rest = text.partition("\n")
        if first or "\n" in self.prelude:
            raise ValueError(f"kernel {self.name!r}: the prelude takes line 1 of {self.body}, "
                             "which must be a comment, and is one line")
        return f"{self.prelude}\n{rest}"

    def header(self, markers: bool = False) -> str:
        return resolve_headers(self.headers, markers)

    def coverage_gaps(self) -> list[str]:
        """What the strict Metal check lacks to enumerate this kernel's
        instantiations (empty when every template parameter and output has a
        domain in ``variants`` and every input a dtype in ``input_dtypes``)."""
        gaps = [f"template parameter {t!r} has no values in variants"
                for t in self.template if not self.variants.get(t)]
        gaps += [f"output {o!r} has no dtypes in variants"
                 for o in self.outputs if not self.variants.get(o)]
        gaps += [f"input {i!r} has no dtypes in input_dtypes"
                 for i in self.inputs if not self.input_dtypes.get(i)]
        gaps += [f"input_forms of {i!r} must be a subset of device, constant, scalar"
                 for i, f in self.input_forms.items()
                 if i not in self.inputs or not f or set(f) - {"device", "constant", "scalar"}]
        return gaps

    def _template_args(self, template) -> list:
        template = dict(template or {})
        if len(template) != len(self.template) or not all(t in template for t in self.template):
            missing = [t for t in self.template if t not in template]
            extra = [t for t in template if t not in self.template]
            raise KernelInputError(
                f"kernel {self.name!r} takes template parameters {list(self.template)}; "
                f"missing {missing}, unexpected {extra}"
            )
        out = []
        for t in self.template:
            v, codes = template[t], self.codes.get(t)
            if codes is not None:
                if isinstance(v, str):
                    if v not in codes:
                        raise KernelInputError(f"kernel {self.name!r}: {t} = {v!r} is not a "
                                               "name of " + codes.prefix + ": "
                                               + ", ".join(codes.names))
                    v = codes[v]
                elif v not in codes.values:
                    raise KernelInputError(f"kernel {self.name!r}: {t} = {v!r} is not a code "
                                           f"of {codes.prefix} (0..{len(codes.names) - 1})")
            out.append((t, v))
        return out

    def _check_inputs(self, inputs) -> list:
        if len(inputs) != len(self.inputs):
            raise KernelInputError(
                f"kernel {self.name!r} takes {len(self.inputs)} inputs "
                f"{list(self.inputs)}, got {len(inputs)}"
            )
        arrays = [x if isinstance(x, _ARRAY) else _ARRAY(x) for x in inputs]
        for name, x in zip(self.inputs, arrays):
            allowed = self.input_dtypes.get(name)
            if allowed and x.dtype not in allowed:
                raise KernelInputError(
                    f"kernel {self.name!r}: input {name!r} has dtype {x.dtype}, "
                    f"expected one of {', '.join(map(str, allowed))}"
                )
            # The strict Metal check covers the declared forms only: hold the
            # wrappers to them (a padded input must really be padded).
            forms = self.input_forms.get(name)
            if forms and (form := input_form(x.shape)) not in forms:
                raise KernelInputError(
                    f"kernel {self.name!r}: input {name!r} ({x.size} elements, "
                    f"{x.ndim}-D) would be a {form} input; declared forms: {', '.join(forms)}"
                )
        if self.input_shapes is not None:
            try:
                self.input_shapes(dict(zip(self.inputs, arrays)))
            except KernelInputError as e:
                raise KernelInputError(f"kernel {self.name!r}: {e}") from None
        return arrays

    def __call__(
        self,
        *,
        inputs: Sequence,
        output_shapes: Sequence[Sequence[int]],
        output_dtypes: Sequence[mx.Dtype],
        template: Mapping | None = None,
        grid: tuple[int, int, int] | None = None,
        threadgroup: tuple[int, int, int] | None = None,
        init_value: float | None = None,
        backend: str | None = None,
        stream=None,
    ) -> list[mx.array]:
        """Launch the kernel; arguments as ``mx.fast.metal_kernel``'s call.

        ``backend`` is ``"metal"``, ``"emulate"`` or None (the active backend,
        which must then not be ``"cpu"``)."""
        name = backends.resolve(backend)
        if not name.has_kernels:
            raise backends.BackendUnavailableError(
                f"kernel {self.name!r} is a Metal kernel: run it with backend "
                "'metal' or 'emulate' (the cpu backend has native float64 code instead)"
            )
        arrays = self._check_inputs(inputs)
        targs = self._template_args(template)
        if grid is None:
            if self.grid is None:
                raise KernelInputError(f"kernel {self.name!r} has no grid rule: pass grid=")
            grid, rule_tg = self.grid(arrays, dict(targs))
            threadgroup = threadgroup or rule_tg
        if threadgroup is None:
            raise KernelInputError(f"kernel {self.name!r}: pass threadgroup=")
        return self.unchecked(
            inputs=arrays, template=targs or None, grid=tuple(grid),
            threadgroup=tuple(threadgroup), output_shapes=[tuple(s) for s in output_shapes],
            output_dtypes=list(output_dtypes), backend=name, stream=stream,
            init_value=init_value)

    def launcher(self, backend: str) -> Callable:
        """MLX's launch function of this kernel on a resolved ``backend`` (with
        kernels; the device self-test run once), which takes MLX's keyword arguments
        (``inputs``, ``template``, ``grid``, ...): for a wrapper that launches one
        kernel often with arguments it prepared once (the fused programs' launch
        plans); :meth:`unchecked` calls it."""
        if self.extended:
            _device_check(backend)
        return _build(self, backend)

    def unchecked(self, *, inputs: list, template: list, grid: tuple, threadgroup: tuple,
                  output_shapes: list, output_dtypes: list, backend: str, stream=None,
                  init_value: float | None = None) -> list[mx.array]:
        """:meth:`__call__` without its per-call checks, for a wrapper whose inputs
        meet the declaration by construction (arrays of the declared dtypes and
        forms: the strict Metal check covers those only), on a resolved ``backend``
        (a :class:`~mlx_precise.core.backends.Backend` with kernels); ``template``
        as MLX takes it, ``[(name, value), ...]`` in declaration order, codes as
        numbers. The host cost of a launch is then MLX's (a fused chain launches
        once per consumed result: :mod:`mlx_precise.doubleword.fusion`)."""
        fn = self.launcher(backend)
        if stream is None and init_value is None:
            return fn(inputs=inputs, template=template, grid=grid, threadgroup=threadgroup,
                      output_shapes=output_shapes, output_dtypes=output_dtypes)
        extra = {} if stream is None else {"stream": stream}
        return fn(inputs=inputs, template=template, grid=grid, threadgroup=threadgroup,
                  output_shapes=output_shapes, output_dtypes=output_dtypes,
                  init_value=init_value, **extra)


_lock = threading.Lock()
_built: dict[tuple[str, str], Callable] = {}
# Threads that reach their first extended kernel together wait for one self-test
# (its own kernel is not extended, so it never comes back here).
_check_lock = threading.Lock()
_checked: dict[str, BaseException | None] = {}


def _factory(backend: str) -> Callable:
    if backends.of(backend).gpu:
        return _metal_kernel_safe
    from ..emulator import metal_kernel

    return metal_kernel


def _metal_kernel_safe(**kwargs):
    """``mx.fast.metal_kernel`` in safe math mode where the installed MLX has
    ``compile_options`` (relaxed math would break TwoSum: docs/design.md). MLX's own
    factory (the import wraps ``mx.fast.metal_kernel``: the kernels it makes report
    a carried operand); the kernel is kept in :data:`OWN`."""
    try:
        fn = plain.metal_kernel(**kwargs, compile_options={"math_mode": "safe"})
    except TypeError:
        fn = plain.metal_kernel(**kwargs)
    OWN[id(fn)] = fn
    return fn


OWN: dict = {}
"""id -> the package's own Metal kernels (kept for the process, as :data:`_built`
keeps them): a block's heap scan, which rebinds the places of custom kernels made
before the package's import, leaves these alone (they read the words they are
given)."""


def _build(kernel: Kernel, backend: str) -> Callable:
    key = (kernel.name, backend)
    fn = _built.get(key)  # (built: no lock needed to read it)
    if fn is not None:
        return fn
    with _lock:
        fn = _built.get(key)
        if fn is None:
            fn = _factory(backend)(
                name=kernel.name,
                input_names=list(kernel.inputs),
                output_names=list(kernel.outputs),
                source=kernel.source(),
                header=kernel.header(),
                ensure_row_contiguous=kernel.ensure_row_contiguous,
                atomic_outputs=kernel.atomic_outputs,
            )
            _built[key] = fn
    return fn


def _device_check(backend: str) -> None:
    """Run the EFT self-test once per executor; re-raise its failure every time."""
    if backend not in _checked:
        with _check_lock:
            if backend not in _checked:
                try:
                    eft_selftest(backend)
                    _checked[backend] = None
                except DeviceCheckError as e:
                    _checked[backend] = e
    err = _checked[backend]
    if err is not None:
        raise DeviceCheckError(
            f"extended-precision kernels are disabled on backend {backend!r}: {err}"
        )


# ---- the device self-test ------------------------------------------------------

_F32 = (mx.float32,)

EFT_SELFTEST = Kernel(
    name="eft_selftest",
    body="eft_selftest.metal",
    headers=("doubleword.h",),
    inputs=("a",),
    outputs=("r",),
    input_dtypes={"a": _F32},
    extended=False,  # it is the check itself
    variants={"r": _F32},
)
"""The device self-test: input ``a`` float32 ``(4,)``, output ``r`` float32 ``(8,)``."""


# The self-test's inputs come from the host so that the compiler cannot fold them.
_SELFTEST_INPUT = np.array([1.0, 2.0**-30, 1 + 2.0**-23, 1 - 2.0**-23], dtype=np.float32)


def _selftest_expectations():
    """(slice of r, what it is, allowed exact results, property named on failure)."""
    a1, a3 = 2.0**-30, 1 - 2.0**-23
    return (
        # 1 + 2^-30 is not a float32: s = 1 and the error term carries 2^-30 exactly.
        (slice(0, 2), "TwoSum(1, 2^-30)", [(1.0, a1)], "TwoSum not exact"),
        # (1 + 2^-23)(1 - 2^-23) = 1 - 2^-46: p = 1, residual -2^-46 only with a true fma.
        (slice(2, 4), "TwoProdFMA(1 + 2^-23, 1 - 2^-23)", [(1.0, -(2.0**-46))],
         "fma residual wrong"),
        # |a| < |b|: TwoSum needs no ordering; 2^-30 - (1 - 2^-23) = -(1 - 2^-23) + 2^-30.
        (slice(4, 6), "TwoSum(2^-30, -(1 - 2^-23))", [(-a3, a1)], "TwoSum not exact"),
        # 2^-130 is subnormal: flushed to zero on Apple GPUs and in the emulator; exact
        # gradual underflow is accepted too (it only helps); anything else is broken.
        (slice(6, 7), "(2^-30)^4 * 2^-10 (subnormal)", [(0.0,), (2.0**-130,)],
         "FTZ behaviour"),
        # 2^-125 is normal and must never be flushed.
        (slice(7, 8), "(2^-30)^4 * 2^-5 (normal)", [(2.0**-125,)], "FTZ behaviour"),
    )


def eft_selftest(backend: str | None = None) -> None:
    """Check on ``backend`` (``"metal"``, ``"emulate"``, None = active) that the
    device computes error-free transforms exactly: TwoSum in both operand orders,
    the fma residual of TwoProdFMA, and flush-to-zero that only touches subnormals.

    Relaxed/fast math, reassociation or a fused-multiply-add emulated by a*b+c all
    break at least one of these. The registry runs this once per backend before the
    first extended-precision kernel.

    Raises:
        DeviceCheckError: naming the failed property and the values seen.
    """
    (r,) = EFT_SELFTEST(
        inputs=[mx.array(_SELFTEST_INPUT)], grid=(1, 1, 1), threadgroup=(1, 1, 1),
        output_shapes=[(8,)], output_dtypes=[mx.float32], backend=backend,
    )
    r = np.array(r, dtype=np.float32).astype(np.float64)
    for where, what, allowed, prop in _selftest_expectations():
        got = tuple(float(v) for v in r[where])
        if got not in [tuple(a) for a in allowed]:
            raise DeviceCheckError(
                f"{prop}: {what} gave {[v.hex() for v in got]}, expected "
                + " or ".join(str([float(v).hex() for v in a]) for a in allowed)
            )
