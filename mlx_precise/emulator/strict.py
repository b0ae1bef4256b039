"""A strict Metal front-end check that runs on Linux.

The emulator compiles Metal as permissive C++ (address spaces are empty macros,
``half`` is a typedef), so a kernel can pass every emulated test and still fail to
compile on a Mac. This module closes most of that gap without Apple's compiler: it
takes the exact text MLX would hand to Metal (:mod:`.signature`: header, template
line, signature with ``device``/``constant`` inputs, body, explicit instantiation),
rewrites the few Metal-only spellings, and parses it with clang's *C++ for OpenCL*
front end, whose address spaces, ``half`` type and restrictions (no ``double``, no
function pointers, no static locals outside ``constant``, no variable-length arrays,
no ``__int128``) are real, through the prelude ``shim/strict_metal.h``.

The rewriting is minimal and keeps ``#line`` markers, so errors point at the lines
of the kernel's own files:

* attributes (``[[kernel]]``, ``[[buffer(0)]]``, ``[[thread_position_in_grid]]``,
  ``[[host_name(...)]]``) are dropped: the kernel is parsed as an ordinary function
  template and its explicit instantiation forces the body through semantic analysis;
* vector constructors ``float4(a, b)`` become OpenCL vector literals
  ``(float4)(a, b)``;
* kernel-scope ``threadgroup`` arrays become references to ``__local`` storage (OpenCL
  allows ``__local`` variables only in ``__kernel`` functions, which cannot be
  templates), followed by a ``static_assert`` that the kernel's threadgroup memory
  stays within Metal's 32 KiB.

It is a front-end approximation, not Apple's compiler: see docs/emulator.md for what
it catches and what it cannot.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx

from . import signature

SHIM_DIR = Path(__file__).resolve().parent / "shim"
PRELUDE = "strict_metal.h"
THREADGROUP_MEMORY_LIMIT = 32768  # bytes per threadgroup on Apple GPUs

# fp64 on only so that an unsuffixed literal (`0.5`) is a `double`, as in Metal: Apple's
# compiler then finds `exp(-3.05)` ambiguous between its float and half overloads; the
# `double` keyword itself is poisoned in the prelude (Metal has no double type). fp16
# on, generic pointers for the atomics' declarations, and no program-scope variables
# outside `constant` (as in Metal). The AST dump of the kernel's own namespaces
# (parsing only, as -fsyntax-only) shows pointers without an address space
# (`_generic_pointers`). Unknown attributes are errors: the only ones left
# after `translate` mark a Metal attribute in a place Metal does not allow.
_FRONTEND_FLAGS = [
    "-cc1", "-x", "clcpp", "-cl-std=clc++2021", "-triple", "spir64-unknown-unknown",
    "-ast-dump", "-ast-dump-filter=mps_instance_", "-ferror-limit", "50",
    "-cl-ext=+cl_khr_fp64,+__opencl_c_fp64,+cl_khr_fp16,+__opencl_c_generic_address_space,"
    "-__opencl_c_program_scope_global_variables,-__opencl_c_device_enqueue,-__opencl_c_pipes",
    "-Wno-double-promotion", "-Wno-unused-value", "-Werror=unknown-attributes",
    # `short2(BM, k)` with int arguments is a constructor call in Metal; as the OpenCL
    # vector literal it becomes here, clang would call it narrowing.
    "-Wno-c++11-narrowing",
]

# The Metal language version MLX compiles with: 3.1 on macOS 14, later versions on
# later systems (mlx/backend/metal/device.cpp, get_metal_version). 3.1 is the
# oldest, so code that passes at 3.1 compiles wherever current MLX runs.
DEFAULT_METAL_VERSION = "3.1"
_METAL_VERSIONS = ("2.4", "3.0", "3.1", "3.2", "4.0", "4.1")


def _version_number(metal_version: str) -> int:
    """``__METAL_VERSION__`` of an MSL version: "3.1" -> 310."""
    if metal_version not in _METAL_VERSIONS:
        raise ValueError(f"metal_version must be one of {_METAL_VERSIONS}, got {metal_version!r}")
    major, minor = metal_version.split(".")
    return int(major) * 100 + int(minor) * 10


def _version_macro(metal_version: str) -> str:
    return f"-D__METAL_VERSION__={_version_number(metal_version)}"


class MetalCheckError(ValueError):
    """Kernel source that Metal's front end would reject (per the strict check)."""


class CheckerNotFoundError(RuntimeError):
    """No clang with the C++ for OpenCL front end was found."""


@functools.lru_cache(maxsize=None)
def frontend() -> tuple[str, ...]:
    """The clang command of the check: ``$MLX_PRECISE_CLANG``, else the ``ziglang``
    package's clang (a known version, so results do not depend on the machine),
    else ``clang`` on PATH."""
    env = os.environ.get("MLX_PRECISE_CLANG")
    if env:
        return tuple(env.split())
    try:
        import ziglang  # noqa: F401

        return (sys.executable, "-m", "ziglang", "clang")
    except ImportError:
        pass
    clang = shutil.which("clang")
    if clang:
        return (clang,)
    raise CheckerNotFoundError(
        "the strict Metal check needs clang (>= 14): pip install ziglang (its clang; the "
        "`emulate` extra of a checkout), or clang on PATH, or set MLX_PRECISE_CLANG"
    )


# ---- MSL -> C++ for OpenCL -----------------------------------------------------------

# An attribute list `[[a, b(1)]]`, one level of brackets allowed inside.
_ATTRIBUTE_RE = re.compile(r"\[\[(?:[^\[\]]|\[[^\[\]]*\])*\]\]")
# Function attributes go before the function's declaration (MSL spec, "Function
# qualifiers" and `max_total_threads_per_threadgroup`); after a parameter list,
# before its body or `;`, Apple's compiler rejects them.
_FUNCTION_ATTRIBUTES = ("kernel", "host_name", "max_total_threads_per_threadgroup",
                        "visible", "stitchable", "vertex", "fragment")
_TRAILING_ATTRIBUTE_RE = re.compile(
    r"(?<=\))(\s*)((?:\[\[(?:[^\[\]]|\[[^\[\]]*\])*\]\]\s*)+)(?=[{;])")
_MISPLACED = "mps_metal::misplaced_"
# A function constant (`constant bool has_mask [[function_constant(300)]];`, MSL spec,
# "Function constants") gets its value when the pipeline is made; OpenCL needs an initializer.
_FUNCTION_CONSTANT_RE = re.compile(
    r"(\bconstant\s+[\w:]+\s+\w+)\s*\[\[\s*function_constant\s*\([^\]]*\)\s*\]\]\s*;")
# `kernel` as a function qualifier (`kernel void f(...)`); elsewhere it is a name.
_KERNEL_QUALIFIER_RE = re.compile(r"\bkernel(?=\s+void\b)")
_SYSTEM_INCLUDE_RE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*<metal_(?!tensor>)\w+>[ \t]*$", re.M)
# Metal 4's tensor headers (MSL 4.0). From 4.0 on they resolve to the prelude's
# declarations of the tensor API (shim/strict_metal_tensor.h). Before, <metal_tensor>
# does not exist ("'metal_tensor' file not found", so it stays for the front end to
# say so) and the MetalPerformancePrimitives header declares nothing, so `mpp` is an
# undeclared identifier, as Apple's compiler reports at -std=metal3.2.
_TENSOR_INCLUDE_RE = re.compile(
    r"^[ \t]*#[ \t]*include[ \t]*<(metal_tensor|MetalPerformancePrimitives/[\w.]+)>[ \t]*$", re.M)
_TENSOR_PRELUDE = "strict_metal_tensor.h"
_METAL4_NOTE = ("note: Metal 4 tensor operations (<metal_tensor>, MetalPerformancePrimitives, "
                "mpp::tensor_ops) exist from Metal 4.0 on: check with metal_version=\"4.0\"")
_VECTOR_CTOR_RE = re.compile(
    r"(?<![\w.:>])((?:metal::)?(?:(?:u?char|u?short|u?int|u?long|float|half|bool)[234]"
    r"|vec\s*<[^<>;(){}]*>))\s*\("
)


def _spaces(m: re.Match) -> str:
    """Removed text becomes blanks, so that columns in diagnostics stay right."""
    return re.sub(r"[^\n]", " ", m.group(0))


def _mark_misplaced(m: re.Match) -> str:
    """A function attribute after a parameter list becomes an unknown attribute,
    which the front end reports (-Werror=unknown-attributes) at its place."""
    def mark(a: re.Match) -> str:
        names = re.findall(r"([A-Za-z_]\w*)\s*(?:\([^)]*\))?\s*(?:,|\]\])", a.group(0)[2:])
        bad = [n for n in names if n in _FUNCTION_ATTRIBUTES]
        return f"[[{_MISPLACED}{bad[0]}]]" if bad else _spaces(a)
    return m.group(1) + _ATTRIBUTE_RE.sub(mark, m.group(2))


# Each instance is parsed inside a namespace of its own (_run). A header that adds to
# Metal's namespace (`namespace metal { ... }`, as MLX's steel headers do) must add
# to the prelude's ::metal, so its blocks leave the instance namespace and come
# back (_REENTER is replaced by the instance's namespace; same line, so line
# numbers hold). Such units add to one global namespace and are parsed one by one.
_METAL_NAMESPACE_RE = re.compile(r"\bnamespace\s+metal\s*\{")
_REENTER = "MPS_REENTER_INSTANCE"


def _lift_metal_namespace(text: str) -> str:
    out, pos = [], 0
    for m in _METAL_NAMESPACE_RE.finditer(text):
        if m.start() < pos:
            continue
        depth = 0
        for end in range(m.end() - 1, len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                break
        out.append(f"{text[pos:m.start()]}}} {text[m.start():end + 1]} {_REENTER} {{")
        pos = end + 1
    out.append(text[pos:])
    return "".join(out)


def _tensor_include(m: re.Match, metal_version: str) -> str:
    if _version_number(metal_version) >= 400:
        return f'#include "{_TENSOR_PRELUDE}"'
    return m.group(0) if m.group(1) == "metal_tensor" else ""


def translate(text: str, metal_version: str = DEFAULT_METAL_VERSION) -> str:
    """Rewrite MLX's kernel text (Metal) into C++ for OpenCL for the front end."""
    text = signature.blank_comments(text)
    text = _TENSOR_INCLUDE_RE.sub(lambda m: _tensor_include(m, metal_version), text)
    text = _SYSTEM_INCLUDE_RE.sub("", text)
    # `0.5bf` (MSL 3.1) has no OpenCL spelling: an explicit conversion of the float
    # (the `bfloat` name carries the version check); OpenCL takes `h` as Metal does.
    text = signature.metal_literals(text, "{}h", "((bfloat)(float){})")
    text = _FUNCTION_CONSTANT_RE.sub(r"\1 = {};", text)
    text = _TRAILING_ATTRIBUTE_RE.sub(_mark_misplaced, text)
    text = _ATTRIBUTE_RE.sub(lambda m: m.group(0) if _MISPLACED in m.group(0) else _spaces(m), text)
    text = _KERNEL_QUALIFIER_RE.sub(_spaces, text)
    text = _VECTOR_CTOR_RE.sub(lambda m: f"({m.group(1)})(", text)
    text = _lift_metal_namespace(text)
    names: list[str] = []

    def threadgroup_decl(m: re.Match) -> str:
        ctype, name, dims = m.group(1), m.group(2), re.sub(r"\s+", "", m.group(3))
        names.append(name)
        total = " + ".join(f"sizeof({n})" for n in names)
        return (
            f"__local {ctype} (&{name}){dims} = *mps_threadgroup_storage<{ctype}{dims}>(); "
            f"static_assert({total} <= {THREADGROUP_MEMORY_LIMIT}, "
            f'"threadgroup memory exceeds Metal\'s 32 KiB per threadgroup");'
        )

    return signature.THREADGROUP_DECL_RE.sub(threadgroup_decl, text)


# ---- what to check -------------------------------------------------------------------

FORMS = ("device", "constant", "scalar")
"""How MLX passes an input: ``const device T*`` (8 or more elements), ``const constant
T*`` (fewer than 8) or ``const constant T&`` (0-d)."""

_FORM_SHAPES = {"device": (8,), "constant": (1,), "scalar": ()}


@dataclass(frozen=True)
class Instance:
    """One instantiation of a kernel: template values, and per input its dtype and
    form (see :data:`FORMS`), and the output dtypes."""

    template: tuple  # ((name, value), ...)
    inputs: tuple  # ((name, dtype, form), ...)
    output_dtypes: tuple

    def label(self) -> str:
        t = ", ".join(f"{n}={signature.template_value(v)}" for n, v in self.template)
        i = ", ".join(f"{n}: {signature.type_string(d)} {f}" for n, d, f in self.inputs)
        o = ", ".join(signature.type_string(d) for d in self.output_dtypes)
        return (f"<{t}> " if t else "") + f"({i}) -> ({o})"


@dataclass(frozen=True)
class Source:
    """A kernel as ``mx.fast.metal_kernel`` takes it. ``source_file`` and
    ``header_file`` name the code in diagnostics (``#line``); a header assembled from
    several files may carry its own ``#line`` markers."""

    name: str
    input_names: tuple
    output_names: tuple
    source: str
    header: str = ""
    atomic_outputs: bool = False
    source_file: str = "<source>"
    header_file: str = "<header>"

    def mlx_text(self, inst: Instance) -> str:
        """The text MLX generates for this instance, with ``#line`` markers."""
        infos = []
        for (name, dtype, form), si in zip(inst.inputs, signature.shape_infos(self.source, self.input_names)):
            shape = _FORM_SHAPES[form]
            infos.append(signature.InputInfo(name, dtype, len(shape), 1 if not shape else shape[0], *si))
        header = (f'#line 1 "{self.header_file}"\n' if self.header and not self.header.lstrip().startswith("#line") else "") + self.header
        # MLX appends its signature to the header as is: a header whose last line
        # has no newline (`#define N 4`) gets the signature on that line, and Metal
        # sees it so; only a header that ends its last line gets the marker.
        if not self.header or self.header.endswith("\n"):
            header += '#line 1 "<mlx signature>"\n'
        source = f'#line 1 "{self.source_file}"\n{self.source}\n#line 1 "<mlx instantiation>"'
        _, _, text = signature.generate(
            self.name, header, source, infos, list(self.output_names),
            list(inst.output_dtypes), list(inst.template), self.atomic_outputs,
        )
        return text


def _run(units: list[str], metal_version: str = DEFAULT_METAL_VERSION) -> tuple[bool, str]:
    """Parse one translation unit made of ``units`` (each in its own namespace);
    return (ok, diagnostics)."""
    body = "".join(
        f"namespace mps_instance_{k} {{\n{u.replace(_REENTER, f'namespace mps_instance_{k}')}\n}}\n"
        for k, u in enumerate(units)
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.clcpp"
        path.write_text(f'#include "{PRELUDE}"\n{body}')
        proc = subprocess.run(
            [*frontend(), *_FRONTEND_FLAGS, _version_macro(metal_version), f"-I{SHIM_DIR}",
             str(path)],
            capture_output=True, text=True,
        )
    diag = _drop_known_false_errors(proc.stderr.replace(str(path), "<kernel>"))
    diag += "".join(f"{loc}: error: pointer type must have explicit address space qualifier\n"
                    for loc in _generic_pointers(proc.stdout.replace(str(path), "<kernel>")))
    ok = "error:" not in diag
    if not ok and _version_number(metal_version) < 400 and any(
            _TENSOR_INCLUDE_RE.search(u) or signature.METAL4_TENSOR_RE.search(u) for u in units):
        diag += "\n" + _METAL4_NOTE
    return ok, _metal_spelling(diag).strip()


# In C++ for OpenCL a pointer written without an address space points to `__generic`;
# Metal has no such space and rejects the declaration or cast ("pointer type must
# have explicit address space qualifier"). The AST dump names each declaration's and
# cast's type; its source locations are relative (`col:N` keeps the last line and
# file, `line:L:C` the last file).
_GENERIC_NODE_RE = re.compile(
    r"[-`](?:VarDecl|ParmVarDecl|FieldDecl|CStyleCastExpr|CXX\w+CastExpr) [^']*'([^']*)'")
_GENERIC_POINTER_RE = re.compile(r"^(?:const |volatile )*__generic [^()]*\*")
_SLOC_RE = re.compile(r"(?:line:(\d+):(\d+)|col:(\d+)|([^\s<>,']+|<[^\s<>,']+>):(\d+):(\d+))")


def _generic_pointers(ast: str) -> list[str]:
    """``file:line:col`` of each declaration or explicit cast, in the AST dump, whose
    type is a pointer written without an address space."""
    file, line, found = "<kernel>", 0, []
    for text in ast.splitlines():
        head = text.split("'", 1)[0]
        locs = []
        for m in _SLOC_RE.finditer(head):
            if m.group(1):
                line = int(m.group(1))
                locs.append((file, line, int(m.group(2))))
            elif m.group(3):
                locs.append((file, line, int(m.group(3))))
            else:
                file, line = m.group(4), int(m.group(5))
                locs.append((file, line, int(m.group(6))))
        node = _GENERIC_NODE_RE.search(text)
        if node and locs and _GENERIC_POINTER_RE.search(node.group(1)) and "implicit" not in head:
            # a declaration's own location (its name) comes last, a cast's range first
            f, ln, col = locs[-1] if "Decl " in node.group(0) else locs[0]
            loc = f"{f}:{ln}:{col}"
            if loc not in found:
                found.append(loc)
    return found


_SPACES = {"__global": "device", "__constant": "constant", "__local": "threadgroup",
           "__private": "thread"}
_SPACE_RE = re.compile(r"\b(" + "|".join(_SPACES) + r")\b")
# The prelude's stand-ins (strict_metal.h), said back as the kernel wrote them.
_RESPELL = [
    (re.compile(r"unknown attribute '" + re.escape(_MISPLACED) + r"(\w+)' ignored"),
     r"attribute '\1' cannot be placed here (Metal: function attributes precede the declaration)"),
    (re.compile(r"\bmps_kw_(\w+)"), r"\1"),
    (re.compile(r"\bmps_bfvec<(\d)>"), r"bfloat\1"),
    (re.compile(r"'mps_bfloat_needs_msl_3_1'"),
     "'bfloat' (a type from Metal 3.1 on: metal_version=\"3.1\")"),
]


# `union`, `goto` and `double` are poisoned in the prelude; clang's message does not
# name the token, its caret line does (`file:L:C: error: ...` then `  L | code`).
_POISONED_RE = re.compile(r":(\d+): error: attempt to use a poisoned identifier\n( *\d+ \| )([^\n]*)")


def _name_poisoned(m: re.Match) -> str:
    col = int(m.group(1)) - 1
    word = re.match(r"\w*", m.group(3)[col:]).group(0) or "this"
    return (f":{m.group(1)}: error: '{word}' is not supported in Metal\n"
            f"{m.group(2)}{m.group(3)}")


def _metal_spelling(diag: str) -> str:
    """Messages name OpenCL's address spaces and the prelude's stand-ins; say them
    as Metal does."""
    diag = _SPACE_RE.sub(lambda m: _SPACES[m.group(1)], diag)
    diag = _POISONED_RE.sub(_name_poisoned, diag)
    for pattern, repl in _RESPELL:
        diag = pattern.sub(repl, diag)
    return diag


# A diagnostic starts a block: `file:line:col: error|warning|note: ...`.
_DIAG_RE = re.compile(r"^\S[^\n]*?:\d+:\d+: (?:error|warning|note|fatal error): ", re.M)
# Each operand's type, or the type its typedef names (`(aka '...')`).
_OPERANDS_RE = re.compile(r": error: incompatible operand types \((?:'[^']+' \(aka '([^']+)'\)|'([^']+)')"
                          r" and (?:'[^']+' \(aka '([^']+)'\)|'([^']+)')")
_QUALIFIERS_RE = re.compile(r"\b(?:const|volatile|__global|__constant|__local|__private|__generic)\b\s*")
# A note that rejects only the implicit copy/move of a struct out of `constant`
# memory: C++ for OpenCL gives implicit members a `__generic` reference parameter,
# which `__constant` cannot bind; Metal copies such structs (`Params p = *params;`).
_CONSTANT_COPY_NOTE_RE = re.compile(
    r": note: candidate (?:constructor|function) \(the implicit (?:copy|move) "
    r"(?:constructor|assignment operator)\) not viable: cannot bind reference in address "
    r"space '__constant' to object in address space '__generic'")


def _same_object_type(first: str) -> bool:
    """`c ? a : b` whose operands are the same class type in different address
    spaces (an lvalue of `__global S` and a `__private S`, or a prvalue `S`; a
    typedef such as `bfloat16_t` counts as the type it names): clang's C++ for OpenCL
    rejects it, Metal and C++ accept it. Pointer and reference types keep their
    address spaces (those mismatches are real)."""
    m = _OPERANDS_RE.search(first)
    if not m:
        return False
    a, b = m.group(1) or m.group(2), m.group(3) or m.group(4)
    if any(c in a + b for c in "*&"):
        return False
    return _QUALIFIERS_RE.sub("", a).strip() == _QUALIFIERS_RE.sub("", b).strip()


# `const thread T& r = v;` with `v` in another address space (a `constant` uniform, a
# `device` element): Metal binds the const reference to a thread-local copy of the
# value (C++'s temporary for a const reference), C++ for OpenCL refuses. A non-const
# reference, or a reference in any other address space, stays an error (no
# temporary can live there).
# Each side: the type, and the type its typedef names if any.
_CONST_THREAD_REF_RE = re.compile(
    r": error: binding reference of type 'const __private ([^'*&]+)'(?: \(aka '([^']+)'\))? to "
    r"value of type '([^'*&]+)'(?: \(aka '([^']+)'\))? changes address space")


def _const_thread_reference(first: str) -> bool:
    m = _CONST_THREAD_REF_RE.search(first)
    if not m:
        return False
    ref, ref_named, value, value_named = (
        _QUALIFIERS_RE.sub("", re.sub(r"\bmetal::", "", g or "")).strip() for g in m.groups())
    return bool({ref, ref_named} & {value, value_named} - {""})


# An unsuffixed floating literal (`0.5`, `1e-3`, `.5`), not `0.5f`/`0.5h`.
_DOUBLE_LITERAL_RE = re.compile(
    r"(?<![\w.])(?:\d+\.\d*|\.\d+|\d+(?=[eE]))(?:[eE][+-]?\d+)?(?![\w.])")
_AMBIGUOUS_RE = re.compile(r":\d+:(\d+): error: call to '(\w+)' is ambiguous\n *\d+ \| ([^\n]*)")


def _arguments(line: str, col: int) -> list[str] | None:
    """The argument texts of the call whose name starts at ``col`` (1-based) on
    ``line``, or None if its parentheses do not close on the line."""
    start = line.find("(", col - 1)
    if start < 0:
        return None
    depth, args, cur = 0, [], ""
    for ch in line[start:]:
        if ch in "([{":
            depth += 1
            if depth == 1:
                continue
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return args + [cur.strip()]
        elif ch == "," and depth == 1:
            args, cur = args + [cur.strip()], ""
            continue
        cur += ch
    return None


def _literal_in_float_arithmetic(group: list[str]) -> bool:
    """A call to a Metal math function (every candidate in the prelude) reported
    ambiguous only because an unsuffixed literal turned an argument into a double
    (`exp(v * 0.5)`): in Metal, which has no double, the literal takes the type of
    the float operand and the call resolves. A bare literal argument (`exp(-2.5)`),
    which Metal finds ambiguous, stays an error."""
    m = _AMBIGUOUS_RE.search(group[0])
    if not m or not all(PRELUDE in n.split("\n", 1)[0] for n in group[1:]):
        return False
    args = _arguments(m.group(3), int(m.group(1)))
    if not args or not any(_DOUBLE_LITERAL_RE.search(a) for a in args):
        return False
    bare = re.compile(r"[-+]?\s*\(?\s*" + _DOUBLE_LITERAL_RE.pattern + r"\s*\)?")
    return not any(bare.fullmatch(a) or not re.search(r"[A-Za-z_]", a) for a in args)


def _drop_known_false_errors(diag: str) -> str:
    """Remove the front end's errors that Metal does not have (with their notes)."""
    starts = [m.start() for m in _DIAG_RE.finditer(diag)]
    if not starts:
        return diag
    blocks = [diag[a:b] for a, b in zip(starts, starts[1:] + [len(diag)])]
    # group each error with the notes after it
    groups: list[list[str]] = []
    for b in blocks:
        if ": note: " in b.split("\n", 1)[0] and groups:
            groups[-1].append(b)
        else:
            groups.append([b])
    kept = [diag[: starts[0]]]
    for g in groups:
        first = g[0].split("\n", 1)[0]
        notes = [n.split("\n", 1)[0] for n in g[1:]]
        false_alarm = ": error: " in first and (
            _same_object_type(first) or _const_thread_reference(first)
            or _literal_in_float_arithmetic(g)
            or (notes and all(_CONSTANT_COPY_NOTE_RE.search(n) for n in notes)))
        if not false_alarm:
            kept.extend(g)
    out = "".join(kept)
    # clang's summary line counts the dropped errors too; it carries no information
    return re.sub(r"^\d+ errors? generated\.\n?", "", out, flags=re.M)


@dataclass
class Failure:
    kernel: str
    instance: str
    diagnostics: str

    def __str__(self) -> str:
        return f"{self.kernel} {self.instance}:\n{self.diagnostics}"


def check_instances(src: Source, instances: list[Instance],
                    metal_version: str = DEFAULT_METAL_VERSION) -> list[Failure]:
    """Check every instance of one kernel: one clang run for all of them, and one per
    instance only to attribute errors when the batch fails."""
    if not instances:
        return []
    units = [translate(src.mlx_text(i), metal_version) for i in instances]
    # one batch, unless there is one unit or units add to namespace metal
    alone = len(units) == 1 or any(_REENTER in u for u in units)
    if not alone and _run(units, metal_version)[0]:
        return []
    failures = []
    for inst, unit in zip(instances, units):
        ok, diag = _run([unit], metal_version)
        if not ok and src.header and not src.header.endswith("\n"):
            diag += ("\nnote: the header does not end with a newline, so MLX's generated "
                     "signature continues its last line (on a Mac too)")
        if not ok:
            failures.append(Failure(src.name, inst.label(), diag))
    return failures


# ---- public entry points -------------------------------------------------------------


def _input_spec(name: str, x) -> tuple:
    """(dtype, form) of input ``name`` given as an array, a Python scalar (which MLX
    turns into a 0-d array: int -> int32, float -> float32) or ``(dtype, shape)``."""
    if isinstance(x, (bool, int, float)):
        x = mx.array(x)
    if isinstance(x, mx.array):
        return x.dtype, signature.input_form(x.shape)
    if (isinstance(x, (tuple, list)) and len(x) == 2 and isinstance(x[0], mx.Dtype)
            and isinstance(x[1], (tuple, list)) and all(isinstance(d, int) and d >= 0 for d in x[1])):
        return x[0], signature.input_form(tuple(x[1]))
    raise TypeError(f"input {name!r} must be an mx.array or a (dtype, shape) pair, got {x!r}")


def make_instance(input_names, inputs, output_dtypes, template=None) -> Instance:
    """The :class:`Instance` of a call: ``inputs`` as arrays or ``(dtype, shape)``,
    ``template`` a list of ``(name, value)`` or a dict."""
    template = list(template.items()) if isinstance(template, dict) else list(template or [])
    return Instance(
        tuple(template),
        tuple((n, *_input_spec(n, x)) for n, x in zip(input_names, inputs)),
        tuple(output_dtypes),
    )


def check_file(path: str, metal_version: str = DEFAULT_METAL_VERSION) -> str | None:
    """Check a whole ``.metal`` file (its own ``[[kernel]]`` functions and explicit
    instantiations, as Metal compiles a library); returns the diagnostics, or None
    when it passes."""
    text = Path(path).read_text()
    ok, diag = _run([translate(f'#line 1 "{path}"\n{text}', metal_version)], metal_version)
    return None if ok else diag


def check_source(name: str, input_names, output_names, source: str, *, inputs,
                 output_dtypes, header: str = "", template=None,
                 atomic_outputs: bool = False,
                 metal_version: str = DEFAULT_METAL_VERSION) -> None:
    """Check one kernel instantiation with the strict Metal front end.

    Arguments are those of ``mx.fast.metal_kernel`` and its call: ``inputs`` are
    ``mx.array``\\ s or ``(dtype, shape)`` pairs (only dtype and size matter: inputs
    of fewer than 8 elements are ``constant``), ``template`` a list of ``(name,
    value)`` or a dict, ``metal_version`` the Metal language version to check
    against ("3.1", what MLX uses on macOS 14, by default). Raises :class:`MetalCheckError` with clang's diagnostics
    (lines of ``<source>`` / ``<header>``) if Metal would reject the source;
    ValueError / TypeError for arguments that do not describe an instantiation.
    """
    if len(inputs) != len(input_names):
        raise ValueError(f"inputs: expected {len(input_names)} entries, got {len(inputs)}")
    if not output_names:
        raise ValueError("output_names: a kernel needs at least one output")
    if len(output_dtypes) != len(output_names):
        raise ValueError(f"output_dtypes: expected {len(output_names)} entries (one per "
                         f"output), got {len(output_dtypes)}")
    inst = make_instance(input_names, inputs, output_dtypes, template)
    src = Source(name, tuple(input_names), tuple(output_names), source, header, atomic_outputs)
    failures = check_instances(src, [inst], metal_version)
    if failures:
        raise MetalCheckError(
            f"kernel {name!r} would not compile on Metal (strict front-end check):\n"
            + "\n".join(str(f) for f in failures)
        )
