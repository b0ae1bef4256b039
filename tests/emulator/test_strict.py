"""The strict Metal front-end check: its calibration (what must fail, what must pass),
the gate over every kernel of the package, and the emulator's ``strict=`` option."""

import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest

from mlx_precise.tools import kernel_check
from mlx_precise.emulator import MetalCheckError, check_source, metal_kernel
from mlx_precise.emulator.strict import frontend
from mlx_precise.core.kernels import METAL_DIR, Kernel, KernelInputError

F32, F16, BF16 = mx.float32, mx.float16, mx.bfloat16
BIG, SMALL = (64,), (4,)  # device and constant inputs

# name: (source, header, inputs as (dtype, shape), output dtypes, template, what the
# diagnostics must say)
MUST_FAIL = {
    "double": (
        "uint i = thread_position_in_grid.x; double d = x[i]; y[i] = float(d);",
        "", [(F32, BIG)], [F32], None, r"double"),
    "half as a name": (
        "uint i = thread_position_in_grid.x; int half = 2; y[i] = x[i] * half;",
        "", [(F32, BIG)], [F32], None, r"declaration specifier"),
    "half as a name in a header": (
        "uint i = thread_position_in_grid.x; y[i] = twice(x[i]);",
        "inline float twice(float v) { bool half = v > 0.0f; return half ? 2.0f * v : v; }",
        [(F32, BIG)], [F32], None, r"<header>:1:"),
    "constant pointer into a device one": (
        "uint i = thread_position_in_grid.x; const device float* p = w; y[i] = x[i] * p[0];",
        "", [(F32, BIG), (F32, SMALL)], [F32], None, r"constant float"),
    "constant pointer to a device parameter": (
        "uint i = thread_position_in_grid.x; y[i] = first(w);",
        "inline float first(const device float* p) { return p[0]; }",
        [(F32, BIG), (F32, SMALL)], [F32], None, r"no matching function"),
    "implicit float to bfloat store": (
        "uint i = thread_position_in_grid.x; y[i] = float(x[i]) * 2.0f;",
        "", [(BF16, BIG)], [BF16], None, r"bfloat"),
    "implicit float to bfloat initialisation": (
        "uint i = thread_position_in_grid.x; bfloat16_t b = 0.5f; y[i] = x[i] * float(b);",
        "", [(F32, BIG)], [F32], None, r"bfloat"),
    "__int128": (
        "uint i = thread_position_in_grid.x; __int128 a = 1; y[i] = float(a);",
        "", [(F32, BIG)], [F32], None, r"__int128"),
    "static local": (
        "uint i = thread_position_in_grid.x; static int calls = 0; y[i] = x[i] + calls;",
        "", [(F32, BIG)], [F32], None, r"static local"),
    "function pointer": (
        "uint i = thread_position_in_grid.x; float (*f)(float) = neg; y[i] = f(x[i]);",
        "inline float neg(float v) { return -v; }", [(F32, BIG)], [F32], None,
        r"pointers to functions"),
    "threadgroup array over 32 KiB": (
        "threadgroup float buf[8193]; uint i = thread_position_in_grid.x;"
        " buf[i] = x[i]; threadgroup_barrier(mem_flags::mem_threadgroup); y[i] = buf[0];",
        "", [(F32, BIG)], [F32], None, r"32 KiB"),
    "threadgroup arrays over 32 KiB together": (
        "threadgroup float a[4096]; threadgroup float b[4097]; uint i = thread_position_in_grid.x;"
        " a[i] = x[i]; b[i] = x[i]; threadgroup_barrier(mem_flags::mem_threadgroup);"
        " y[i] = a[0] + b[1];",
        "", [(F32, BIG)], [F32], None, r"32 KiB"),
    "templated threadgroup array over 32 KiB": (
        "threadgroup T buf[N]; uint i = thread_position_in_grid.x; buf[i] = x[i];"
        " threadgroup_barrier(mem_flags::mem_threadgroup); y[i] = buf[0];",
        "", [(F32, BIG)], [F32], [("T", F32), ("N", 8200)], r"32 KiB"),
    "variable-length array": (
        "uint i = thread_position_in_grid.x; float v[i + 1]; v[0] = x[i]; y[i] = v[0];",
        "", [(F32, BIG)], [F32], None, r"constant expression"),
    "ambiguous overload": (
        "uint i = thread_position_in_grid.x; y[i] = max(x[i], 0);",
        "", [(F32, BIG)], [F32], None, r"ambiguous"),
    "write to a constant input": (
        "uint i = thread_position_in_grid.x; y[i] = x[i]; ((constant float*)w)[0] = 1.0f;",
        "", [(F32, BIG), (F32, SMALL)], [F32], None, r"error"),
    "program-scope variable outside constant": (
        "uint i = thread_position_in_grid.x; y[i] = x[i] * scale;",
        "float scale = 2.0f;", [(F32, BIG)], [F32], None, r"constant address space"),
}

MUST_PASS = {
    "templated elementwise": (
        "uint i = thread_position_in_grid.x; y[i] = static_cast<T>(metal::exp(float(x[i])));",
        "#include <metal_stdlib>\nusing namespace metal;",
        [(F32, BIG)], [F32], [("T", F32)], None),
    "explicit bfloat store": (
        "uint i = thread_position_in_grid.x; y[i] = bfloat16_t(float(x[i]) * 2.0f);",
        "", [(BF16, BIG)], [BF16], None, None),
    "bfloat conditionals": (
        "uint i = thread_position_in_grid.x; T v = x[i];"
        " y[i] = i % 2 ? v : T(0); z[i] = i % 3 ? v : 0;",
        "", [(BF16, BIG)], [BF16, BF16], [("T", BF16)], None),
    "bfloat arithmetic": (
        "uint i = thread_position_in_grid.x; bfloat16_t a = x[i]; bfloat16_t b = a * a + a * 2;"
        " float f = b; y[i] = b; z[i] = a - bfloat16_t(f);",
        "", [(BF16, BIG)], [BF16, BF16], None, None),
    "half converts implicitly": (
        "uint i = thread_position_in_grid.x; half h = x[i] * 2.0f; float f = h; y[i] = f; z[i] = h;",
        "", [(F32, BIG)], [F32, F16], None, None),
    "reading small (constant) inputs": (
        "uint i = thread_position_in_grid.x; y[i] = x[i] * w[0] + w[1] * float(n);",
        "", [(F32, SMALL), (F32, SMALL), (mx.int32, ())], [F32], None, None),
    "constant pointer helper": (
        "uint i = thread_position_in_grid.x; y[i] = first(w) * x[i];",
        "inline float first(const constant float* p) { return p[0]; }",
        [(F32, BIG), (F32, SMALL)], [F32], None, None),
    "threadgroup reduction": (
        "threadgroup float part[32]; uint t = thread_position_in_threadgroup.x;"
        " uint s = simdgroup_index_in_threadgroup; float v = simd_sum(x[thread_position_in_grid.x]);"
        " if (thread_index_in_simdgroup == 0) part[s] = v;"
        " threadgroup_barrier(mem_flags::mem_threadgroup);"
        " if (t == 0) { float acc = 0.0f; for (uint k = 0; k < simdgroups_per_threadgroup; ++k)"
        " acc += part[k]; y[threadgroup_position_in_grid.x] = acc; }",
        "", [(F32, BIG)], [F32], None, None),
    "threadgroup memory of exactly 32 KiB": (
        "threadgroup float a[4096]; threadgroup uint b[4096]; uint i = thread_position_in_grid.x;"
        " a[i] = x[i]; b[i] = i; threadgroup_barrier(mem_flags::mem_threadgroup);"
        " y[i] = a[0] + float(b[1]);",
        "", [(F32, BIG)], [F32], None, None),
    "pointer to threadgroup memory": (
        "threadgroup float buf[64]; uint i = thread_position_in_grid.x; buf[i % 64] = x[i];"
        " threadgroup_barrier(mem_flags::mem_threadgroup); y[i] = sum2(buf);",
        "inline float sum2(threadgroup const float* b) { return b[0] + b[1]; }",
        [(F32, BIG)], [F32], None, None),
    "vectors": (
        "uint i = thread_position_in_grid.x; float4 v = float4(x[i], 1.0f, 2.0f, 3.0f);"
        " float2 w = float2(v.xy) + float2(v.zw); uint3 g = thread_position_in_grid;"
        " y[i] = dot(v, float4(1.0f)) + w.x + float(g.y);",
        "", [(F32, BIG)], [F32], None, None),
    "strided access": (
        "uint i = thread_position_in_grid.x;"
        " auto loc = elem_to_loc(i, x_shape, x_strides, x_ndim); y[i] = x[loc];",
        "", [(F32, (8, 8))], [F32], None, None),
    "bit casts and integer math": (
        "uint i = thread_position_in_grid.x; uint b = as_type<uint>(x[i]);"
        " y[i] = as_type<float>(b & 0x7fffffffu) + float(popcount(b)) + float(max(int(i), 3));",
        "", [(F32, BIG)], [F32], None, None),
    "struct in a conditional": (
        "uint i = thread_position_in_grid.x; P p = {x[i], 1.0f}; P q = i % 2 ? flip(p) : p;"
        " y[i] = q.a;",
        "struct P { float a; float b; };\ninline P flip(P p) { return P{p.b, p.a}; }",
        [(F32, BIG)], [F32], None, None),
    "float literals without suffix": (
        "uint i = thread_position_in_grid.x; y[i] = x[i] * 0.5 + 1.0;",
        "", [(F32, BIG)], [F32], None, None),
    "numeric limits in constant expressions": (
        "constexpr float big = metal::numeric_limits<float>::max();"
        " uint i = thread_position_in_grid.x; y[i] = metal::min(x[i], big);",
        "", [(F32, BIG)], [F32], None, None),
}


def _check(name, table):
    source, header, inputs, out_dtypes, template, _ = table[name]
    names = ["x", "w", "n"][: len(inputs)]
    outs = ["y", "z"][: len(out_dtypes)]
    check_source("calib", names, outs, source, inputs=inputs, output_dtypes=out_dtypes,
                 header=header, template=template)


@pytest.mark.parametrize("name", sorted(MUST_FAIL))
def test_calibration_must_fail(name):
    with pytest.raises(MetalCheckError, match=MUST_FAIL[name][-1]):
        _check(name, MUST_FAIL)


@pytest.mark.parametrize("name", sorted(MUST_PASS))
def test_calibration_must_pass(name):
    _check(name, MUST_PASS)


def test_atomic_outputs_pass():
    src = ("uint i = thread_position_in_grid.x;"
           " atomic_fetch_add_explicit(&y[i % 4], x[i], memory_order_relaxed);")
    check_source("atomics", ["x"], ["y"], src, inputs=[(F32, BIG)], output_dtypes=[F32],
                 atomic_outputs=True)
    with pytest.raises(MetalCheckError, match="no matching function"):
        check_source("atomics", ["x"], ["y"], src.replace("&y[i % 4]", "&x[i]"),
                     inputs=[(F32, BIG)], output_dtypes=[F32], atomic_outputs=True)


def test_diagnostics_use_metal_spelling():
    with pytest.raises(MetalCheckError) as e:
        _check("constant pointer into a device one", MUST_FAIL)
    msg = str(e.value)
    assert "<source>:1:" in msg and "const device float" in msg and "__global" not in msg


def test_check_source_bad_arguments():
    with pytest.raises(ValueError, match="inputs: expected 2"):
        check_source("k", ["x", "w"], ["y"], "", inputs=[(F32, BIG)], output_dtypes=[F32])
    with pytest.raises(ValueError, match="output_dtypes: expected 1"):
        check_source("k", ["x"], ["y"], "", inputs=[(F32, BIG)], output_dtypes=[F32, F32])
    with pytest.raises(ValueError, match="at least one output"):
        check_source("k", ["x"], [], "", inputs=[(F32, BIG)], output_dtypes=[])
    for bad in ((F32, 8), ("float32", BIG), (F32, (-1,)), np.zeros(3)):
        with pytest.raises(TypeError, match="input 'x' must be an mx.array or a \\(dtype, shape\\)"):
            check_source("k", ["x"], ["y"], "", inputs=[bad], output_dtypes=[F32])
    with pytest.raises(TypeError, match="template argument"):
        check_source("k", ["x"], ["y"], "", inputs=[(F32, BIG)], output_dtypes=[F32],
                     template=[("T", 1.5)])


# ---- the gate over this package's kernels ------------------------------------------


def test_every_kernel_is_declared_and_coverable():
    reg = kernel_check.registry()
    bodies = {k.source_path().name for k in reg.values()}
    files = {p.name for p in (METAL_DIR / "kernels").glob("*.metal")}
    assert files - bodies == set(), "kernel files with no declared Kernel"
    gaps = {name: k.coverage_gaps() for name, k in reg.items() if k.coverage_gaps()}
    assert gaps == {}


def test_every_instantiation_passes():
    reports = kernel_check.check_all()
    assert len(reports) == len(kernel_check.registry()) >= 24
    assert sum(r.count for r in reports) >= 250
    failures = [str(f) for r in reports for f in r.failures]
    assert failures == [], "\n\n".join(failures)


def test_instances_span_templates_dtypes_and_forms():
    reg = kernel_check.registry()
    dep = kernel_check.instances(reg["ext_depthwise"])
    # 2 TAPS x 2 HAS_BIAS x 2 ROUND, each with 5 input-form patterns
    assert len(dep) == 40
    forms = {tuple(f for _, _, f in i.inputs) for i in dep}
    assert ("device", "device", "device") in forms and ("constant",) * 3 in forms
    sim = kernel_check.instances(reg["fixedpoint_simulate"])
    assert {(dict(i.template)["T"], i.output_dtypes[0]) for i in sim} == {
        (d, d) for d in (F32, F16, BF16)}


def test_uncoverable_kernel_is_refused():
    k = Kernel(name="no_variants", body="dw_ops.metal", inputs=("x",), outputs=("y",),
               template=("OP",), input_dtypes={"x": (F32,)})
    assert len(k.coverage_gaps()) == 2
    with pytest.raises(ValueError, match="template parameter 'OP' has no values"):
        kernel_check.instances(k)


def test_declared_forms_are_enforced_at_launch():
    """A kernel declared to take only device inputs refuses a small one (the gate
    checked the device form only)."""
    reg = kernel_check.registry()
    with pytest.raises(KernelInputError, match="would be a constant input"):
        reg["int8_gemm_i32"](inputs=[mx.zeros((4,), mx.int8), mx.zeros((8,), mx.int8),
                                     mx.zeros((8,), mx.int32)],
                             output_shapes=[(1,)], output_dtypes=[mx.int32],
                             grid=(1, 1, 1), threadgroup=(1, 1, 1), backend="emulate")


def test_check_kernels_command():
    proc = subprocess.run([sys.executable, "-m", "mlx_precise", "check-kernels", "ozaki_slice",
                           "ext_depthwise"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 kernels, 45 instantiations, 0 failed" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "mlx_precise", "check-kernels", "nope"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown kernels ['nope']" in bad.stderr


def test_frontend_is_found():
    assert frontend()


# ---- the emulator's strict option ----------------------------------------------------


def test_emulator_strict_option():
    src = "uint i = thread_position_in_grid.x; const device float* p = x; y[i] = 2.0f * p[i];"
    x = mx.arange(16, dtype=mx.float32)
    for strict in (False, True):
        k = metal_kernel(name="strict_opt", input_names=["x"], output_names=["y"],
                         source=src, strict=strict)
        (y,) = k(inputs=[x], grid=(16, 1, 1), threadgroup=(16, 1, 1),
                 output_shapes=[(16,)], output_dtypes=[F32])
        np.testing.assert_array_equal(np.array(y), 2.0 * np.arange(16, dtype=np.float32))
        small = dict(inputs=[x[:4]], grid=(4, 1, 1), threadgroup=(4, 1, 1),
                     output_shapes=[(4,)], output_dtypes=[F32])
        if strict:  # the permissive emulator runs it; Metal would not compile it
            with pytest.raises(MetalCheckError, match="constant float"):
                k(**small)
        else:
            np.testing.assert_array_equal(np.array(k(**small)[0]), [0.0, 2.0, 4.0, 6.0])


def test_emulator_strict_from_environment(monkeypatch):
    monkeypatch.setenv("MLX_PRECISE_STRICT", "1")
    k = metal_kernel(name="strict_env", input_names=["x"], output_names=["y"],
                     source="uint i = thread_position_in_grid.x; double d = x[i]; y[i] = d;")
    assert k.strict
    with pytest.raises(MetalCheckError, match="double"):
        k(inputs=[mx.ones((8,))], grid=(8, 1, 1), threadgroup=(8, 1, 1),
          output_shapes=[(8,)], output_dtypes=[F32])
