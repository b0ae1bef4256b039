"""The strict Metal check against what Apple's compiler does: constructs that shipped
kernels use and Metal accepts must pass (no false alarms), and errors Apple's
compiler reports must be caught. Every kernel here is written for this test."""

import mlx.core as mx
import pytest

from mlx_precise.emulator import MetalCheckError, check_source

F32, BF16 = mx.float32, mx.bfloat16
BIG = (64,)
I = "uint i = thread_position_in_grid.x;\n"


def run(source, header="", inputs=((F32, BIG),), outputs=(F32,), names=("x",),
        metal_version="3.1"):
    check_source("fidelity", list(names), ["y"], source, inputs=list(inputs),
                 output_dtypes=list(outputs), header=header, metal_version=metal_version)


# ---- accepted by Metal: must pass ----------------------------------------------------

PASS = {
    # OpenCL reserves these words; Metal does not.
    "OpenCL keywords as names": I + "float local = x[i]; int global = 1; bool kernel = true;\n"
    "y[i] = kernel ? local * global : 0.0f;",
    "metal::vec": I + "metal::vec<float, 4> v = metal::vec<float, 4>(x[i]);\n"
    "vec<int, 2> w = vec<int, 2>(1, 2); y[i] = v.y + float(w.x);",
    "INFINITY and math constants": I + "y[i] = x[i] > 0.0f ? INFINITY : M_PI_F * -HUGE_VALF;",
    "sincos": I + "float c; float s = sincos(x[i], c);\n"
    "float c2; float s2 = metal::precise::sincos(x[i], c2); y[i] = s * c + s2 * c2;",
    "atomic typedefs under using namespace metal":
    "threadgroup atomic_uint hits; threadgroup metal::atomic_float total;\n" + I +
    "atomic_store_explicit(&hits, 0u, memory_order_relaxed);\n"
    "atomic_fetch_add_explicit(&total, x[i], memory_order_relaxed);\n"
    "y[i] = float(atomic_load_explicit(&hits, memory_order_relaxed));",
    "simdgroup_matrix": "threadgroup float tile[64];\n" + I +
    "simdgroup_float8x8 a, b; simdgroup_matrix<float, 8, 8> c = "
    "make_filled_simdgroup_matrix<float, 8, 8>(0.0f);\n"
    "simdgroup_load(a, x, 8); simdgroup_load(b, tile, 8);\n"
    "simdgroup_multiply_accumulate(c, a, b, c); simdgroup_store(c, y, 8);\n"
    "y[i] += c.thread_elements()[0];",
    "type traits of MLX's steel headers": I +
    "constexpr bool t = metal::bool_constant<true>::value && metal::is_same_v<float, float>"
    " && metal::is_integral<int>::value;\n"
    "metal::enable_if_t<t, int> k = 2; metal::remove_addrspace_t<const device float> v = x[i];\n"
    "y[i] = v * k;",
}
# (MLX's steel pointer_element and void_t: test_emulator_fidelity.py, both tools)


@pytest.mark.parametrize("case", sorted(PASS))
def test_metal_accepts(case):
    run(PASS[case])


def test_select_between_device_and_thread_bfloat():
    # `c ? <device bfloat lvalue> : <thread bfloat>`: one class type in two address
    # spaces, which C++ for OpenCL rejects and Metal accepts.
    run(I + "bfloat16_t zero = bfloat16_t(0.0f);\ny[i] = (i % 2) ? x[i] : zero;",
        inputs=[(BF16, BIG)], outputs=[BF16])


def test_struct_copied_out_of_constant_memory():
    header = "struct Scale { float mul; int shift; };\n"
    src = (I + "constant Scale* s = (constant Scale*)(p);\n"
           "Scale local_copy = *s; Scale other = s[0]; other = *s;\n"
           "y[i] = x[i] * local_copy.mul + float(other.shift);")
    run(src, header, inputs=[(F32, BIG), (mx.int32, (2,))], names=("x", "p"))


def test_a_real_address_space_mismatch_in_a_select_still_fails():
    with pytest.raises(MetalCheckError, match="incompatible operand types"):
        run(I + "const device float* a = x; const constant float* b = w;\n"
                "y[i] = *((i % 2) ? a : b);",
            inputs=[(F32, BIG), (F32, (2,))], names=("x", "w"))


# ---- rejected by Apple's compiler: must fail -----------------------------------------

FAIL = {
    "union": (I + "union { float f; uint u; } bits; bits.f = x[i]; y[i] = float(bits.u);", "",
              r"<source>:2:1: error: 'union' is not supported in Metal"),
    "goto": (I + "if (i == 0) goto skip;\ny[i] = x[i];\nskip: ;", "",
             r"<source>:2:13: error: 'goto' is not supported in Metal"),
    "attribute after a parameter list": (
        I + "y[i] = x[i];",
        "[[kernel]] void side(device float* a [[buffer(0)]])"
        " [[max_total_threads_per_threadgroup(64)]] { a[0] = 0.0f; }\n",
        r"<header>:1:\d+: error: attribute 'max_total_threads_per_threadgroup' cannot be placed"),
    "math function on an unsuffixed literal": (
        I + "y[i] = x[i] * exp(-2.5);", "", r"<source>:2:15: error: call to 'exp' is ambiguous"),
    "pointer parameter without an address space": (
        I + "y[i] = head(x);", "inline float head(const float* p) { return p[0]; }\n",
        r"<header>:1:32: error: pointer type must have explicit address space qualifier"),
    "pointer local and cast without an address space": (
        I + "float v = x[i]; float* q = &v;\ny[i] = *q + ((const float*)x)[1];", "",
        r"<source>:2:24: error: pointer type must have explicit address space qualifier\n"
        r"(?s:.*)<source>:3:14: error: pointer type must have explicit"),
    "header without a trailing newline": (
        I + "y[i] = x[i] * SCALE;", "#define SCALE 3.0f",
        r"the header does not end with a newline"),
}


@pytest.mark.parametrize("case", sorted(FAIL))
def test_apple_rejects(case):
    source, header, message = FAIL[case]
    with pytest.raises(MetalCheckError, match=message):
        run(source, header)


def test_function_attributes_before_the_declaration_pass():
    run(I + "y[i] = x[i];",
        "[[kernel, max_total_threads_per_threadgroup(64)]] void side(device float* a "
        "[[buffer(0)]]) { a[0] = 0.0f; }\n"
        "[[max_total_threads_per_threadgroup(32)]] kernel void other(device float* a "
        "[[buffer(0)]], uint t [[thread_position_in_grid]]) { a[t] = 0.0f; }\n")


def test_pointers_with_address_spaces_pass():
    run(I + "float v = x[i]; thread float* q = &v; auto z = x;\n"
            "y[i] = *q + z[0] + ((const device float*)x)[1] + head(x);",
        "inline float head(const device float* p) { return p[0]; }\n")


def test_suffixed_literals_and_arithmetic_with_unsuffixed_ones_pass():
    run(I + "y[i] = exp(-2.5f) * x[i] * 0.5 + max(x[i], 1.0f);")


def test_the_same_header_with_a_newline_passes():
    run(I + "y[i] = x[i] * SCALE;", "#define SCALE 3.0f\n")


def test_metal_version():
    src = I + "bfloat b = bfloat(x[i]); y[i] = float(b);"
    run(src)  # default: MSL 3.1, the oldest version current MLX compiles with
    with pytest.raises(MetalCheckError, match=r"'bfloat' \(a type from Metal 3.1 on"):
        run(src, metal_version="3.0")
    run(I + "bfloat16_t b = bfloat16_t(x[i]); y[i] = float(b);", metal_version="3.0")
    with pytest.raises(ValueError, match="metal_version"):
        run(src, metal_version="3")
