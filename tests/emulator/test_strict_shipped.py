"""The strict check on constructs of shipped, Apple-compiled kernels that it used to
reject (bfloat vectors and templates, selects across address spaces, literals, Metal 4
tensor code), each beside a nearby kernel Apple's compiler rejects, which must still
fail. Every kernel here is written for this test, in the style of MLX extension
packages' kernels."""

import mlx.core as mx
import pytest

from mlx_precise.emulator import MetalCheckError, check_source

F32, F16, BF16, I32 = mx.float32, mx.float16, mx.bfloat16, mx.int32
BIG = (64,)
I = "uint i = thread_position_in_grid.x;\n"


def run(source, header="", dtype=BF16, metal_version="3.1", template=None):
    """One instantiation: x (dtype, device), n (int32 0-d, constant), w (float32,
    4 elements, constant) -> y (dtype)."""
    check_source("shipped", ["x", "n", "w"], ["y"], source,
                 inputs=[(dtype, BIG), (I32, ()), (F32, (4,))], output_dtypes=[dtype],
                 header=header, template=template, metal_version=metal_version)


# (accepted by Metal, a nearby kernel Metal rejects, what the check must say for it)
CASES = {
    "bfloat vectors": (
        I + "vec<bfloat, 4> v = vec<bfloat, 4>(x[i]); bfloat2 p = bfloat2(x[i], x[i + 1]);\n"
        "metal::vec<bfloat16_t, 4> acc[2] = {}; acc[0] += v * p.y; acc[1][2] = v.w;\n"
        "float4 f = float4(acc[0]); y[i] = acc[1][2] + bfloat(f.x) + p[0];",
        I + "float4 f = float4(x[i]); bfloat4 v = f; y[i] = v.x;",
        r"<source>:2:36: error: no viable conversion from 'thread float4' .* to 'thread bfloat4'"),
    "bfloat select across address spaces": (
        I + "bfloat fallback = bfloat(w[0]); thread bfloat16_t& alias = fallback;\n"
        "y[i] = (i % 2) ? x[i] : fallback; y[i] = (i % 3) ? alias : x[i];\n"
        "y[i] = x[i] > 0.0f ? x[i] : bfloat(0);",
        # a float branch makes the select a float, which Metal does not store into bfloat
        I + "y[i] = (i % 2) ? x[i] : w[0];",
        r"no viable overloaded '='"),
    "bfloat loop variable and comparisons": (
        I + "bfloat16_t acc = 0;\nfor (bfloat16_t k = 0; k < x[i]; k += 1) { acc += k; }\n"
        "y[i] = acc >= 2 && acc != x[i] ? acc : x[i];",
        I + "bfloat16_t acc = 0;\nfor (bfloat16_t k = 0; k < x[i]; k += 0.5f) { acc += k; }\ny[i] = acc;",
        r"<source>:3:36: error: no viable overloaded '\+='"),
    "bfloat from literals": (
        # integers convert, `bf` is Metal's bfloat suffix (MSL 3.1), floats are converted
        I + "bfloat a = 0; bfloat16_t b = 0.5bf; bfloat c = bfloat(0.25f); bfloat d = -1.5e-2BF;\n"
        "y[i] = x[i] * a + b * c + d;",
        # MSL spec: neither float nor half converts implicitly to bfloat (Apple: "cannot
        # initialize a variable of type 'bfloat' with an rvalue of type 'float'")
        I + "bfloat a = 0.0f; y[i] = x[i] + a;",
        r"<source>:2:8: error: no viable conversion from 'float' to 'thread bfloat'"),
    "bfloat math from MLX's preamble": (
        I + "y[i] = metal::max(x[i], bfloat(0)) + exp(x[i]) + metal::precise::sqrt(x[i]) + "
        "fma(x[i], x[i], x[i]);",
        # Metal's own overloads take no bfloat: a float result is not stored implicitly
        I + "y[i] = metal::max(x[i], 0.0f);",
        r"no viable overloaded '='"),
    "unsuffixed literals inside math arguments": (
        I + "float v = float(x[i]);\n"
        "y[i] = bfloat(exp(v * 0.5) + metal::exp(-0.5 * v * v) + log(1.0 + v) + pow(v, 2.0));",
        # a bare double literal is ambiguous between Metal's float and half overloads
        I + "float v = float(x[i]);\ny[i] = bfloat(v * exp(-2.5));",
        r"<source>:3:19: error: call to 'exp' is ambiguous"),
    "const thread reference to a constant or device value": (
        I + "const thread int& count = n; const thread float& scale = w[1];\n"
        "const thread bfloat16_t& here = x[i]; y[i] = here * count + bfloat(scale);",
        # no thread temporary can stand in for a non-const reference
        I + "thread int& count = n; y[i] = x[i] * count;",
        r"<source>:2:13: error: binding reference of type 'thread int' to value of type "
        r"'const constant int32_t'"),
    "a reference in the wrong address space": (
        I + "const constant float& s = w[1]; y[i] = x[i] * bfloat(s);",
        I + "const device float& s = w[1]; y[i] = x[i] * bfloat(s);",
        r"binding reference of type 'const device float' to value of type 'const constant float'"
        r" changes address space"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_shipped_construct_passes_and_its_neighbour_fails(case):
    accepted, rejected, message = CASES[case]
    run(accepted)
    with pytest.raises(MetalCheckError, match=message):
        run(rejected)


# MLX steel's fragment style (BlockMMA / MMAFrag): simdgroup matrices of T, their
# thread elements as vec<T, 2>, instantiated with bfloat.
STEEL_STYLE = """
template <typename T, int N>
struct TileFrag {
  typedef metal::simdgroup_matrix<T, 8, 8> mat_type;
  typedef metal::vec<T, 2> frag_type;
  frag_type frags[N] = {};
  METAL_FUNC void mma(thread TileFrag& a, thread TileFrag& b) {
    for (short k = 0; k < N; ++k) {
      mat_type ma, mb, mc;
      ma.thread_elements() = a.frags[k];
      mb.thread_elements() = b.frags[k];
      mc.thread_elements() = frags[k];
      metal::simdgroup_multiply_accumulate(mc, ma, mb, mc);
      frags[k] = mc.thread_elements();
    }
  }
  METAL_FUNC void load(const device T* src, int ld) {
    for (short k = 0; k < N; ++k) {
      frags[k][0] = src[k * ld];
      frags[k][1] = src[k * ld + 1];
    }
  }
  METAL_FUNC T first() const { return frags[0].x; }
  STORE
};
"""
STORE_OK = ("METAL_FUNC void store(device T* dst) const { "
            "for (short k = 0; k < N; ++k) { dst[2 * k] = frags[k].x; dst[2 * k + 1] = frags[k][1]; } }")
# an accumulator kept in float and stored without a conversion
STORE_BAD = ("METAL_FUNC void store(device T* dst) const { "
             "for (short k = 0; k < N; ++k) { float s = frags[k].x; dst[2 * k] = s * 2.0f; } }")
STEEL_BODY = (I + "TileFrag<T, 2> a, b, c; a.load(x, 8); b.load(x + 16, 8);\n"
              "c.mma(a, b); c.store(y); y[i] += c.first();")


def test_steel_style_fragments_instantiated_with_bfloat():
    run(STEEL_BODY, STEEL_STYLE.replace("STORE", STORE_OK), template=[("T", BF16)])
    run(STEEL_BODY, STEEL_STYLE.replace("STORE", STORE_BAD), dtype=F32, template=[("T", F32)])
    with pytest.raises(MetalCheckError, match=r"<header>:\d+:\d+: error: no viable overloaded '='"):
        run(STEEL_BODY, STEEL_STYLE.replace("STORE", STORE_BAD), template=[("T", BF16)])


def test_bfloat_vectors_need_metal_3_1():
    with pytest.raises(MetalCheckError, match=r"'bfloat' \(a type from Metal 3.1 on"):
        run(I + "bfloat4 v = bfloat4(x[i]); y[i] = v.x;", metal_version="3.0")


# ---- Metal 4 tensor code (MSL 4.0, M5 GPUs) ---------------------------------------

TENSOR_HEADER = """#include <metal_stdlib>
#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
using namespace metal;
using namespace mpp::tensor_ops;
"""
TENSOR_BODY = """uint2 tg = threadgroup_position_in_grid.xy;
auto A = tensor<device half, dextents<int32_t, 2>, tensor_inline>((device half*)a, dextents<int32_t, 2>(64, 64));
auto B = tensor<device half, dextents<int32_t, 2>, tensor_inline>((device half*)b, dextents<int32_t, 2>(64, 64));
auto C = tensor<device float, dextents<int32_t, 2>, tensor_inline>(c, dextents<int32_t, 2>(64, 64));
constexpr auto desc = matmul2d_descriptor(32, 32, dynamic_length_v<int>, false, false, false,
                                          matmul2d_descriptor::mode::multiply);
matmul2d<desc, execution_simdgroups<4>> op;
auto mA = A.slice(0, tg.y * 32);
auto mB = B.slice(tg.x * 32, 0);
auto mC = C.slice(tg.x * 32, tg.y * 32);
auto acc = op.get_destination_cooperative_tensor<decltype(op), decltype(mA), decltype(mB), float>();
op.run(mA, mB, acc);
for (int k = 0; k < acc.get_capacity(); ++k) { acc[k] = SCALE; }
acc.store(mC);
"""


def run_tensor(header, body, metal_version):
    check_source("m5_gemm", ["a", "b"], ["c"], body, inputs=[(F16, (4096,)), (F16, (4096,))],
                 output_dtypes=[F32], header=header, metal_version=metal_version)


def test_metal4_tensor_code_follows_the_language_version():
    body = TENSOR_BODY.replace("SCALE", "max(acc[k], 0.0f) * 2.0f")
    run_tensor(TENSOR_HEADER, body, "4.0")
    run_tensor(TENSOR_HEADER, body, "4.1")
    # before 4.0 <metal_tensor> does not exist, and MetalPerformancePrimitives
    # declares nothing (Apple at -std=metal3.2: "use of undeclared identifier 'mpp'")
    with pytest.raises(MetalCheckError, match=r"(?s)<header>:2:10: fatal error: 'metal_tensor' "
                       r"file not found.*metal_version=\"4.0\""):
        run_tensor(TENSOR_HEADER, body, "3.1")
    with pytest.raises(MetalCheckError, match=r"(?s)<header>:5:17: error: use of undeclared "
                       r"identifier 'mpp'.*exist from Metal 4.0 on"):
        run_tensor(TENSOR_HEADER.replace("#include <metal_tensor>\n", "\n"), body, "3.2")
    # the include alone, in a kernel that uses nothing of it
    with pytest.raises(MetalCheckError, match="'metal_tensor' file not found"):
        run_tensor("#include <metal_tensor>\n", "uint i = thread_position_in_grid.x; "
                   "c[i] = float(a[i]);", "3.2")


def test_errors_around_metal4_tensor_code_are_still_caught():
    bad = TENSOR_BODY.replace("SCALE", "max(acc[k], 0)")  # max(float, int): ambiguous
    with pytest.raises(MetalCheckError, match=r"<source>:13:\d+: error: call to 'max' is ambiguous"):
        run_tensor(TENSOR_HEADER, bad, "4.0")
    unqualified = TENSOR_HEADER.replace("using namespace mpp::tensor_ops;\n", "\n")
    with pytest.raises(MetalCheckError, match="undeclared identifier 'matmul2d_descriptor'"):
        run_tensor(unqualified, TENSOR_BODY.replace("SCALE", "0.0f"), "4.0")
