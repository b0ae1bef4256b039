"""The kernel source MLX generates around a custom kernel body.

This mirrors ``write_signature``, ``write_template`` and the kernel-name rule of MLX's
``mlx/backend/common/metal_kernel.cpp`` (MLX 0.32) so that the emulator compiles the
very text MLX hands to the Metal compiler (minus MLX's preamble, which the emulator's
shim provides). ``tests/emulator/test_emulator_parity.py`` checks the text against the
installed MLX.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import mlx.core as mx

# A threadgroup-memory declaration: `threadgroup T name;` or `threadgroup T name[..]..;`
# (groups: type, name, array dimensions). The emulator and the strict check both
# rewrite these (threadgroup pointer types do not match: no name follows the type).
THREADGROUP_DECL_RE = re.compile(
    r"\bthreadgroup\s+((?:const\s+)?[A-Za-z_][\w:]*(?:\s*<[^;{}()]*?>)?)\s+([A-Za-z_]\w*)"
    r"\s*((?:\[[^\[\];]+\]\s*)*);"
)

# A comment, or a string literal (matched so that a "//" inside one is left alone)
_COMMENT_RE = re.compile(r'"(?:\\.|[^"\\\n])*"|//[^\n]*|/\*.*?\*/', re.S)


def _blank(m: re.Match) -> str:
    text = m.group(0)
    return text if text.startswith('"') else re.sub(r"[^\n]", " ", text)


def blank_comments(text: str) -> str:
    """Comments become spaces (newlines kept, so line numbers hold; string literals
    kept): rewrites of kernel text (THREADGROUP_DECL_RE, ...) must not act on words
    in comments (`// offsets within threadgroup` followed by `short sm;` is no
    declaration)."""
    return _COMMENT_RE.sub(_blank, text)


# Inputs with fewer elements than this are passed in the constant address space.
MAX_CONSTANT_ARRAY_SIZE = 8

# (attribute, type) in MLX's order; an attribute is passed when its name appears
# anywhere in the body.
ATTRIBUTES = (
    ("dispatch_quadgroups_per_threadgroup", "uint"),
    ("dispatch_simdgroups_per_threadgroup", "uint"),
    ("dispatch_threads_per_threadgroup", "uint3"),
    ("grid_origin", "uint3"),
    ("grid_size", "uint3"),
    ("quadgroup_index_in_threadgroup", "uint"),
    ("quadgroups_per_threadgroup", "uint"),
    ("simdgroup_index_in_threadgroup", "uint"),
    ("simdgroups_per_threadgroup", "uint"),
    ("thread_execution_width", "uint"),
    ("thread_index_in_quadgroup", "uint"),
    ("thread_index_in_simdgroup", "uint"),
    ("thread_index_in_threadgroup", "uint"),
    ("thread_position_in_grid", "uint3"),
    ("thread_position_in_threadgroup", "uint3"),
    ("threadgroup_position_in_grid", "uint3"),
    ("threadgroups_per_grid", "uint3"),
    ("threads_per_grid", "uint3"),
    ("threads_per_simdgroup", "uint"),
    ("threads_per_threadgroup", "uint3"),
)

_TYPE_STRINGS = {
    mx.float32: "float",
    mx.float16: "float16_t",
    mx.bfloat16: "bfloat16_t",
    mx.float64: "double",
    mx.complex64: "complex64_t",
    mx.bool_: "bool",
    mx.int8: "int8_t",
    mx.int16: "int16_t",
    mx.int32: "int32_t",
    mx.int64: "int64_t",
    mx.uint8: "uint8_t",
    mx.uint16: "uint16_t",
    mx.uint32: "uint32_t",
    mx.uint64: "uint64_t",
}


def type_string(dtype: mx.Dtype) -> str:
    """MLX's ``get_type_string``: the Metal type name of an MLX dtype."""
    try:
        return _TYPE_STRINGS[dtype]
    except KeyError:
        raise TypeError(f"unsupported dtype for a Metal kernel: {dtype}") from None


def input_form(shape) -> str:
    """How MLX passes an input of this shape: ``"scalar"`` (0-d: ``const constant
    T&``), ``"constant"`` (fewer than 8 elements: ``const constant T*``) or
    ``"device"`` (``const device T*``)."""
    size = 1
    for s in shape:
        size *= int(s)
    if len(shape) == 0:
        return "scalar"
    return "constant" if size < MAX_CONSTANT_ARRAY_SIZE else "device"


@dataclass(frozen=True)
class InputInfo:
    """What the signature needs to know about one input array."""

    name: str
    dtype: mx.Dtype
    ndim: int
    size: int
    shape: bool  # body mentions <name>_shape
    strides: bool  # body mentions <name>_strides
    ndim_param: bool  # body mentions <name>_ndim

    @property
    def is_constant(self) -> bool:
        return self.size < MAX_CONSTANT_ARRAY_SIZE

    @property
    def is_scalar(self) -> bool:
        return self.ndim == 0


def shape_infos(source: str, input_names) -> list[tuple[bool, bool, bool]]:
    return [
        (n + "_shape" in source, n + "_strides" in source, n + "_ndim" in source)
        for n in input_names
    ]


def attributes(source: str) -> list[tuple[str, str]]:
    return [(a, t) for a, t in ATTRIBUTES if a in source]


def template_value(value) -> str:
    """How MLX prints a template argument (bools print as 1/0)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, mx.Dtype):
        return type_string(value)
    raise TypeError(
        f"template argument {value!r} must be an int, a bool or an mlx dtype"
    )


def template_def(template) -> str:
    return "<" + ", ".join(template_value(v) for _, v in template) + ">"


def _template_hash(tdef: str) -> str:
    # MLX 0.32.4 also maps the sign of negative ints to "_" (keeps a valid identifier).
    out = tdef.replace("<", "_").replace(">", "_").replace(", ", "_").replace("-", "_")
    return out[:-1]


def kernel_name(name: str, template, inputs: list[InputInfo], output_dtypes) -> str:
    """MLX's kernel name: name, template hash, then one suffix per input and output dtype."""
    kname = "custom_kernel_" + name
    if template:
        kname += "_" + _template_hash(template_def(template))
    for x in inputs:
        kname += "_" + type_string(x.dtype)
        if x.is_scalar:
            kname += "s"
        elif x.is_constant:
            kname += "c"
    for d in output_dtypes:
        kname += "_" + type_string(d)
    return kname


@dataclass(frozen=True)
class Param:
    """One parameter of the generated signature and how the launcher fills it."""

    kind: str  # "input" | "shape" | "strides" | "ndim" | "output" | "attribute"
    ctype: str  # C type as written in the signature (without address space)
    name: str
    index: int  # buffer index (-1 for attributes)
    ref: bool = False  # passed by reference (0-d inputs, ndim)
    owner: int = -1  # input/output position
    space: str = ""  # address space of an input: "device" or "constant"


def parameters(inputs: list[InputInfo], output_names, output_dtypes, atomic_outputs, attrs):
    params: list[Param] = []
    index = 0
    for pos, x in enumerate(inputs):
        space = "constant" if x.is_constant else "device"
        params.append(Param("input", type_string(x.dtype), x.name, index, x.is_scalar, pos, space))
        index += 1
        if x.ndim > 0:
            for flag, kind, ctype in (
                (x.shape, "shape", "int"),
                (x.strides, "strides", "int64_t"),
                (x.ndim_param, "ndim", "int"),
            ):
                if flag:
                    params.append(Param(kind, ctype, f"{x.name}_{kind}", index, kind == "ndim", pos))
                    index += 1
    for pos, (name, d) in enumerate(zip(output_names, output_dtypes)):
        t = type_string(d)
        params.append(Param("output", f"atomic<{t}>" if atomic_outputs else t, name, index, False, pos))
        index += 1
    for a, t in attrs:
        params.append(Param("attribute", t, a, -1))
    return params


def write_signature(kname: str, header: str, source: str, template, params: list[Param]) -> str:
    """MLX's ``write_signature``: header, template line, signature, body."""
    out = [header]
    if template:
        kinds = []
        for n, v in template:
            kind = "bool" if isinstance(v, bool) else "int" if isinstance(v, int) else "typename"
            kinds.append(f"{kind} {n}")
        out.append("template <" + ", ".join(kinds) + ">\n")
    out.append(f"[[kernel]] void {kname}(\n")
    n_in = sum(p.kind == "input" for p in params)
    n_out = sum(p.kind == "output" for p in params)
    n_attr = sum(p.kind == "attribute" for p in params)
    for p in params:
        if p.kind == "input":
            out.append(f"  const {p.space} {p.ctype}{'&' if p.ref else '*'} {p.name} [[buffer({p.index})]],\n")
        elif p.kind in ("shape", "strides"):
            out.append(f"  const constant {p.ctype}* {p.name} [[buffer({p.index})]],\n")
        elif p.kind == "ndim":
            out.append(f"  const constant int& {p.name} [[buffer({p.index})]],\n")
        elif p.kind == "output":
            # MLX compares the buffer index with the count of inputs and outputs
            # (not buffers), so a kernel with shape parameters and no attribute
            # gets a malformed signature there; reproduced on purpose.
            last = not (p.index < n_in + n_out - 1 or n_attr > 0)
            out.append(f"  device {p.ctype}* {p.name} [[buffer({p.index})]]")
            out.append(") {\n" if last else ",\n")
    attrs = [p for p in params if p.kind == "attribute"]
    for i, p in enumerate(attrs):
        out.append(f"  {p.ctype} {p.name} [[{p.name}]]")
        out.append(") {\n" if i == len(attrs) - 1 else ",\n")
    out.append(source)
    out.append("\n}\n")
    return "".join(out)


def generate(name, header, source, inputs: list[InputInfo], output_names, output_dtypes,
             template, atomic_outputs):
    """Return ``(kernel_name, params, text)``: the text MLX prints with ``verbose=True``."""
    kname = kernel_name(name, template, inputs, output_dtypes)
    params = parameters(inputs, output_names, output_dtypes, atomic_outputs, attributes(source))
    text = write_signature(kname, header, source, template, params)
    if template:
        tdef = kname + template_def(template)
        text += (
            f'\ntemplate [[host_name("{kname}")]] [[kernel]] decltype({tdef}) {tdef};\n'
        )
    return kname, params, text


# ---- Metal spellings C++ lacks (the emulator's and the strict check's rewrites) -------

# A string or character literal (left alone), or a preprocessing number (C++
# [lex.ppnumber]: a digit, or `.` and a digit, then digits, letters, `_`, `.` and
# exponent signs). Matching whole pp-numbers keeps `x2h` (an identifier: the
# look-behind), `0x1h` and `1e5h2` out of the rewrite.
_PP_NUMBER_RE = re.compile(
    r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|(?<![\w.])\.?\d(?:[eEpP][+-]|[\w.])*')
# Metal's floating suffixes C++ has no use for: `h`/`H` (half) and `bf`/`BF`
# (bfloat, MSL 3.1). The number before the suffix: a decimal integer or floating
# literal, or a hexadecimal floating literal (its `p` exponent is mandatory, so
# `0x1h` stays an invalid hexadecimal integer, as in Metal).
_METAL_FLOAT_RE = re.compile(
    r"((?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|0[xX](?:[\da-fA-F]+\.?[\da-fA-F]*|\.[\da-fA-F]+)"
    r"[pP][+-]?\d+)(h|H|bf|BF)")


def metal_literals(text: str, half: str, bfloat: str) -> str:
    """Rewrite Metal's ``half`` and ``bfloat`` literals (``1.5h``, ``2H``, ``0x1p-3h``,
    ``0.5bf``) outside strings: ``half`` and ``bfloat`` are format strings that get
    the literal without its suffix (``"static_cast<half>({})"``). Comments must be
    blanked first (:func:`blank_comments`). Other numbers, identifiers ending in
    digits and ``h`` (``x2h``) and invalid spellings (``0x1h``) are left as they are,
    for the compiler to judge."""
    def one(m: re.Match) -> str:
        token = m.group(0)
        if token[0] in "\"'":
            return token
        lit = _METAL_FLOAT_RE.fullmatch(token)
        if lit is None:
            return token
        number, suffix = lit.groups()
        if "." not in number and not re.search(r"[eEpP]", number) and number[:1] == "0" \
                and len(number) > 1:
            return token  # `017h`: octal digits, no half literal in Metal either
        return (half if suffix in "hH" else bfloat).format(number)
    return _PP_NUMBER_RE.sub(one, text)


class Metal4TensorError(NotImplementedError):
    """Kernel code that uses Metal 4's tensor operations (``<metal_tensor>``,
    ``MetalPerformancePrimitives``, ``mpp::tensor_ops``), which the emulator does
    not emulate."""


# Metal 4's tensor API (MSL 4.0): its headers and the names only it declares.
METAL4_TENSOR_RE = re.compile(
    r"^[ \t]*#[ \t]*include[ \t]*<(?:metal_tensor|MetalPerformancePrimitives/[\w.]+)>"
    r"|\bmpp\s*::\s*tensor_ops\b", re.M)


def refuse_metal4_tensor(kernel: str, text: str) -> None:
    """Raise :class:`Metal4TensorError` (one line, naming the kernel and what it
    uses) when ``text`` (comments blanked) uses Metal 4's tensor operations."""
    m = METAL4_TENSOR_RE.search(text)
    if m:
        what = " ".join(m.group(0).split())
        raise Metal4TensorError(
            f"kernel {kernel!r} uses Metal 4 tensor operations ({what}), which the "
            "emulator does not emulate; check it with the strict check at "
            "metal_version=\"4.0\" and run it on a Mac with an M5-class GPU")


def for_emulator(kname: str, text: str) -> str:
    """MLX's kernel text (comments blanked) as the emulator's C++ compiler takes it:
    Metal's half and bfloat literals become conversions of the double literal
    (rounded once), and Metal 4 tensor code is refused (:class:`Metal4TensorError`)."""
    refuse_metal4_tensor(kname, text)
    return metal_literals(text, "static_cast<half>({})", "bfloat16_t({})")
