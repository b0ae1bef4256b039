// Self-check of the emulator's metal_types.h, built and run by
// tests/emulator/test_emulator_shim.py with the emulator's own compiler and flags.
// Every CHECK can fail; the program prints each failure and exits non-zero.
#include <cmath>  // before metal_types.h; also checks coexistence with libm
#include <cstdio>
#include <cstring>

#include "metal_types.h"

static int failures = 0;
#define CHECK(cond)                                                  \
  do {                                                               \
    if (!(cond)) {                                                   \
      std::printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);    \
      ++failures;                                                    \
    }                                                                \
  } while (0)

static uint32_t fbits(float f) { return as_type<uint32_t>(f); }
static bool same_bits(float a, float b) { return fbits(a) == fbits(b); }

// A typical MSL kernel snippet, compiled unchanged.
static float msl_snippet() {
  uint3 g = uint3(1, 2, 3); uint i = g.x + g.y * 4;
  float4 v = float4(1.0f, 2.0f, 3.0f, 4.0f); float2 p = v.xy + v.zw * 2.0f; v.xy = p.yx;
  half h = static_cast<half>(v.x); bfloat16_t b = bfloat16_t(v.y); float s = float(b) + float(h);
  int4 q = int4(v); bool4 m = v > 2.0f; float4 w = select(v, -v, m);
  float r = metal::fma(v.x, v.y, -metal::abs(w.z)) + metal::precise::sqrt(s) + metal::rint(2.5f);
  complex64_t c = complex64_t(1.0f, 2.0f) * complex64_t(3.0f, -1.0f);
  // p = (1,2) + (3,4)*2 = (7,10); v = (10,7,3,4); h = 10; b = 7; s = 17
  CHECK(i == 9);
  CHECK(p.x == 7.0f && p.y == 10.0f);
  CHECK(v.x == 10.0f && v.y == 7.0f && v.z == 3.0f && v.w == 4.0f);
  CHECK(s == 17.0f);
  CHECK(q.x == 10 && q.w == 4);
  CHECK(m.x && m.y && m.z && m.w);
  CHECK(w.z == -3.0f);
  CHECK(r == fmaf(10.0f, 7.0f, -3.0f) + sqrtf(17.0f) + 2.0f);
  CHECK(c.real == 5.0f && c.imag == 5.0f);  // (1+2i)(3-i) = 5+5i
  return r;
}

// Typical kernel-style code with device pointers and qualifiers.
METAL_FUNC void kernel_like(const device float4* in, device float4* out,
                            constant uint& n, uint tid) {
  if (tid >= n) return;
  thread float4 t = in[tid];
  MLX_MTL_PRAGMA_UNROLL
  for (int k = 0; k < 4; ++k) t[k] *= 2.0f;
  out[tid] = t.wzyx;
}

// MLX custom-kernel style: templated over the element type, attributes,
// shape/stride arguments and elem_to_loc.
template <typename T>
[[kernel]] void unary_kernel(const device T* inp [[buffer(0)]],
                             device T* out [[buffer(1)]],
                             const constant int* inp_shape [[buffer(2)]],
                             const constant int64_t* inp_strides [[buffer(3)]],
                             const constant int& inp_ndim [[buffer(4)]],
                             uint3 thread_position_in_grid [[thread_position_in_grid]]) {
  uint elem = thread_position_in_grid.x;
  auto loc = elem_to_loc(elem, inp_shape, inp_strides, inp_ndim);
  T tmp = inp[loc];
  T act = metal::max(tmp, T(0)) + static_cast<T>(metal::exp(float(tmp) * 0.0f));
  vec<T, 2> pair = vec<T, 2>(act, tmp);
  out[elem] = static_cast<T>(metal::precise::sqrt(pair.x * pair.x)) +
              (metal::isnan(tmp) ? T(0) : Limits<T>::finite_min * T(0));
}

template <typename T>
static void run_unary() {
  T in[6] = {T(-1), T(2), T(-3), T(4), T(5), T(-6)};  // 2x3, read transposed
  T out[6];
  const int shape[2] = {3, 2};
  const int64_t strides[2] = {1, 3};
  const int ndim = 2;
  for (uint e = 0; e < 6; ++e) unary_kernel<T>(in, out, shape, strides, ndim, uint3(e, 0, 0));
  // out[e] = max(in[loc], 0) + 1 with loc = (e % 2) * 3 + e / 2
  const float want[6] = {1, 5, 3, 6, 1, 1};
  for (int e = 0; e < 6; ++e) CHECK(float(out[e]) == want[e]);
}

static void test_layout() {
  static_assert(sizeof(float2) == 8 && alignof(float2) == 8, "");
  static_assert(sizeof(float3) == 16 && alignof(float3) == 16, "");
  static_assert(sizeof(float4) == 16 && alignof(float4) == 16, "");
  static_assert(sizeof(half2) == 4 && sizeof(half3) == 8 && sizeof(half4) == 8, "");
  static_assert(sizeof(uchar3) == 4 && sizeof(bool3) == 4, "");
  static_assert(sizeof(long3) == 32 && sizeof(ulong2) == 16, "");
  static_assert(sizeof(bfloat16_t) == 2 && sizeof(bfloat4) == 8, "");
  static_assert(sizeof(complex64_t) == 8, "");
  static_assert(sizeof(atomic<float>) == 4 && sizeof(atomic_ulong) == 8, "");
  static_assert(std::is_same<ulong, uint64_t>::value, "");
  static_assert(std::is_same<float16_t, half>::value, "");
  static_assert(std::is_trivially_copy_constructible<float4>::value, "");
  static_assert(std::is_trivially_default_constructible<float4>::value, "");
  // Arrays of float3 use a 16-byte stride.
  float buf[12] = {0, 1, 2, 99, 3, 4, 5, 99, 6, 7, 8, 99};
  const device float3* v3 = reinterpret_cast<const float3*>(buf);
  CHECK(v3[1].x == 3 && v3[1].y == 4 && v3[1].z == 5 && v3[2].z == 8);
}

static void test_vectors() {
  float2 a2(1.0f, 2.0f);
  float4 a(a2, 3.0f, 4.0f);
  CHECK(a.x == 1 && a.y == 2 && a.z == 3 && a.w == 4);
  float4 b(0.5f, float3(1, 2, 3));
  CHECK(b.x == 0.5f && b.w == 3);
  float3 c3(a2, 1.0f);
  CHECK(c3.z == 1.0f);
  float4 d(a.xy, a.zw);
  CHECK(d.w == 4);
  float4 e(7.0f);
  CHECK(e.x == 7 && e.w == 7);
  float2 f = {5.0f, 6.0f};
  CHECK(f.y == 6);
  uint2 u = {1, 2};
  CHECK(u.y == 2u);
  float4 z = {};
  CHECK(z.x == 0 && z.w == 0);
  CHECK(float4().y == 0);
  CHECK(a.r == 1 && a.g == 2 && a.b == 3 && a.a == 4);

  // explicit element conversion
  int4 iv = int4(float4(1.9f, -1.9f, 2.5f, -0.5f));
  CHECK(iv.x == 1 && iv.y == -1 && iv.z == 2 && iv.w == 0);
  float4 fv = float4(int4(1, 2, 3, 4));
  CHECK(fv.w == 4.0f);
  half4 hv = half4(fv);
  CHECK(float(hv.z) == 3.0f);
  float2 fsw = float2(int4(5, 6, 7, 8).zw);
  CHECK(fsw.x == 7.0f && fsw.y == 8.0f);

  // read swizzles
  float2 yx = a.yx;
  CHECK(yx.x == 2 && yx.y == 1);
  float3 zyx = a.zyx;
  CHECK(zyx.x == 3 && zyx.z == 1);
  float4 xxyy = a.xxyy;
  CHECK(xxyy.x == 1 && xxyy.y == 1 && xxyy.z == 2 && xxyy.w == 2);
  float4 wzyx = a.wzyx;
  CHECK(wzyx.x == 4 && wzyx.w == 1);
  float4 from2 = a2.xyxy;
  CHECK(from2.z == 1 && from2.w == 2);
  float3 x3 = c3.zzx;
  CHECK(x3.x == 1 && x3.z == 1);
  CHECK((a.xy + a.zw).y == 6);
  CHECK(all(a.xyz == float3(1, 2, 3)));

  // write swizzles
  float4 w = a;
  w.xy = float2(9, 8);
  CHECK(w.x == 9 && w.y == 8 && w.z == 3);
  w.zw += float2(1, 1);
  CHECK(w.z == 4 && w.w == 5);
  w.xy = w.yx;  // aliasing source
  CHECK(w.x == 8 && w.y == 9);
  w.wx = 0.0f;
  CHECK(w.w == 0 && w.x == 0);
  float4 w2 = a;
  w2.xy = a.xy;  // same swizzle type: copy assignment
  w2.zw = w2.xy;
  CHECK(w2.z == 1 && w2.w == 2 && w2.x == 1);
  w2.xyz *= 2.0f;
  CHECK(w2.x == 2 && w2.z == 2 && w2.w == 2);
  w2.x += 1;
  CHECK(w2.x == 3);
  w2[3] = 11;
  CHECK(w2.w == 11 && w2[3] == 11);

  // arithmetic
  float4 s = a * 2.0f + 1.0f;
  CHECK(s.x == 3 && s.w == 9);
  float4 t = 10.0f - a;
  CHECK(t.x == 9 && t.w == 6);
  float4 q = a / a;
  CHECK(all(q == 1.0f));
  int4 i4(7, -7, 8, 9);
  CHECK(all(i4 % 4 == int4(3, -3, 0, 1)));
  CHECK(all((i4 & 1) == int4(1, 1, 0, 1)));
  CHECK(all((i4 | 2) == int4(7, -5, 10, 11)));
  CHECK(all((i4 ^ i4) == 0));
  CHECK(all((i4 << 1) == int4(14, -14, 16, 18)));
  CHECK(all((uint4(16) >> uint4(1, 2, 3, 4)) == uint4(8, 4, 2, 1)));
  CHECK(all(~int2(0, -1) == int2(-1, 0)));
  // signed vector arithmetic wraps like the GPU (and is not C++ UB here)
  CHECK(all(int2(2147483647) + 1 == int2(-2147483647 - 1)));
  CHECK(all(-int2(-2147483647 - 1) == int2(-2147483647 - 1)));
  CHECK(all(char2(char(100)) * char(3) == char2(char(44))));
  CHECK(all(-a == float4(-1, -2, -3, -4)));
  uchar4 uc(250, 10, 0, 1);
  uc += uchar4(10);
  CHECK(uc.x == 4 && uc.y == 20);  // wraps in uchar, as MSL
  int4 inc(1);
  inc++;
  ++inc;
  CHECK(inc.x == 3);
  float4 acc(1.0f);
  acc *= a;
  acc -= 1.0f;
  acc /= float4(1, 1, 2, 3);
  CHECK(acc.z == 1.0f && acc.w == 1.0f);
  int4 sh(1);
  sh <<= 3;
  sh |= 1;
  CHECK(sh.y == 9);

  // comparisons and logic
  bool4 gt = a > 2.0f;
  CHECK(!gt.x && !gt.y && gt.z && gt.w);
  bool4 le = a <= float4(1, 1, 3, 3);
  CHECK(le.x && !le.y && le.z && !le.w);
  CHECK(any(gt) && !all(gt));
  CHECK(all(!(a != a)));
  CHECK(all((gt || le) == bool4(true, false, true, true)));
  CHECK(all((gt && le) == bool4(false, false, true, false)));
  CHECK(all((2.0f < a) == bool4(false, false, true, true)));
  CHECK(!any(a.xy >= 3.0f));

  // select
  float4 sel = select(a, -a, gt);
  CHECK(sel.x == 1 && sel.z == -3);
  CHECK(select(1, 2, true) == 2 && select(1.0f, 2.0f, false) == 1.0f);
  int4 isel = select(int4(0), int4(1), a > 1.5f);
  CHECK(isel.x == 0 && isel.y == 1);
  float4 ssel = select(0.0f, 1.0f, gt);
  CHECK(ssel.x == 0 && ssel.w == 1);

  // bfloat and half vectors
  bfloat4 bv(1.0f, 2.0f, 3.0f, 4.0f);
  bfloat4 bw = bv * bfloat16_t(0.5f) + bv.wzyx;
  CHECK(float(bw.x) == 4.5f && float(bw.w) == 3.0f);
  half2 hv2 = half2(1.5f, 2.5f) * half(2);
  CHECK(float(hv2.y) == 5.0f);

  // dot / length / cross
  CHECK(dot(float3(1, 2, 3), float3(4, 5, 6)) == 32.0f);
  CHECK(length(float2(3, 4)) == 5.0f);
  CHECK(distance(float2(0, 0), float2(3, 4)) == 5.0f);
  float3 cr = cross(float3(1, 0, 0), float3(0, 1, 0));
  CHECK(cr.x == 0 && cr.y == 0 && cr.z == 1);
  float2 nz = normalize(float2(3, 4));
  CHECK(fabsf(nz.x - 0.6f) < 1e-6f && fabsf(nz.y - 0.8f) < 1e-6f);

  float4 src[2] = {float4(1, 2, 3, 4), float4(5, 6, 7, 8)};
  float4 dst[2];
  uint n = 2;
  for (uint k = 0; k < 3; ++k) kernel_like(src, dst, n, k);
  CHECK(dst[0].x == 8 && dst[0].w == 2 && dst[1].x == 16);
}

static void test_rounding_math() {
  // rint: ties to even; round: ties away from zero
  CHECK(metal::rint(0.5f) == 0.0f && metal::rint(1.5f) == 2.0f);
  CHECK(metal::rint(2.5f) == 2.0f && metal::rint(-2.5f) == -2.0f);
  CHECK(same_bits(metal::rint(-0.5f), -0.0f));
  CHECK(metal::round(0.5f) == 1.0f && metal::round(2.5f) == 3.0f);
  CHECK(metal::round(-2.5f) == -3.0f);
  CHECK(float(metal::rint(half(2.5f))) == 2.0f);
  CHECK(float(metal::rint(bfloat16_t(2.5f))) == 2.0f);
  CHECK(all(metal::rint(float4(0.5f, 1.5f, 2.5f, 3.5f)) == float4(0, 2, 2, 4)));
  CHECK(metal::floor(-1.5f) == -2.0f && metal::ceil(-1.5f) == -1.0f);
  CHECK(metal::trunc(-1.7f) == -1.0f);
  CHECK(metal::fract(-0.25f) == 0.75f);
  CHECK(metal::fract(-1e-9f) == 0x1.fffffep-1f);  // clamped below 1
  CHECK(float(metal::fract(half(-0x1p-20f))) == 0x1.ffcp-1f);
  CHECK(float(metal::fract(bfloat16_t(-0x1p-20f))) == 0x1.fep-1f);
  CHECK(metal::isnan(metal::fract(NAN)) && metal::fract(2.75f) == 0.75f);

  // fma is fused: (1+2^-23)(1-2^-23) - 1 = -2^-46 exactly
  float p = 1.0f + 0x1p-23f, m = 1.0f - 0x1p-23f;
  CHECK(metal::fma(p, m, -1.0f) == -0x1p-46f);
  volatile float pv = p, mv = m;
  CHECK(pv * mv - 1.0f == 0.0f);  // unfused: product rounds to 1
  CHECK(fma(p, m, -1.0f) == -0x1p-46f);  // unqualified, via using namespace
  float4 f4 = metal::fma(float4(p), float4(m), float4(-1.0f));
  CHECK(f4.y == -0x1p-46f);
  // half fma rounds once: 1+2^-10 squared minus (1+2^-9) = 2^-20
  half h1 = half(1.0f + 0x1p-10f), hc = half(-(1.0f + 0x1p-9f));
  CHECK(float(metal::fma(h1, h1, hc)) == 0x1p-20f);
  // half: 3 * 683 = 2049 is a tie between 2048 and 2050; the tiny addend
  // must tip it up (rounding the sum to float first would lose it).
  CHECK(float(metal::fma(half(3), half(683), half(0x1p-24f))) == 2050.0f);
  CHECK(float(metal::fma(half(3), half(683), half(0))) == 2048.0f);
  // bfloat: 3 * 87 = 261 is a tie between 260 and 262; + 2^-60 is inexact
  // even in double, so this exercises the round-to-odd step.
  CHECK(float(metal::fma(bfloat16_t(3), bfloat16_t(87), bfloat16_t(0x1p-60f))) == 262.0f);
  CHECK(float(metal::fma(bfloat16_t(3), bfloat16_t(87), bfloat16_t(-0x1p-60f))) == 260.0f);
  // bfloat fma: (1+2^-7)^2 - (1+2^-6) = 2^-14, single rounding
  bfloat16_t b1 = bfloat16_t(1.0f + 0x1p-7f), bc = bfloat16_t(-(1.0f + 0x1p-6f));
  CHECK(float(metal::fma(b1, b1, bc)) == 0x1p-14f);

  // sqrt / precise / fast
  CHECK(metal::sqrt(2.0f) == sqrtf(2.0f));
  CHECK(metal::precise::sqrt(16.0f) == 4.0f && metal::fast::sqrt(9.0f) == 3.0f);
  CHECK(metal::precise::divide(1.0f, 3.0f) == 1.0f / 3.0f);
  CHECK(metal::rsqrt(4.0f) == 0.5f);
  CHECK(float(metal::sqrt(half(2.0f))) == float(half(sqrtf(2.0f))));
  CHECK(metal::exp(0.0f) == 1.0f && metal::exp2(3.0f) == 8.0f);
  CHECK(metal::exp10(2.0f) == 100.0f);
  CHECK(metal::log(1.0f) == 0.0f && metal::log2(8.0f) == 3.0f);
  CHECK(metal::log10(1000.0f) == 3.0f);
  CHECK(metal::pow(2.0f, 10.0f) == 1024.0f && metal::powr(4.0f, 0.5f) == 2.0f);
  CHECK(metal::pow(2.0f, 3) == 8.0f);  // int exponent converts
  CHECK(metal::exp(1.0f) == expf(1.0f) && metal::sin(1.0f) == sinf(1.0f));
  CHECK(metal::cos(0.0f) == 1.0f && metal::tan(0.0f) == 0.0f);
  CHECK(metal::asin(1.0f) == asinf(1.0f) && metal::acos(1.0f) == 0.0f);
  CHECK(metal::atan(1.0f) == atanf(1.0f) && metal::atan2(1.0f, 1.0f) == atan2f(1.0f, 1.0f));
  CHECK(metal::sinh(0.0f) == 0.0f && metal::cosh(0.0f) == 1.0f);
  CHECK(metal::tanh(20.0f) == 1.0f);
  CHECK(metal::ldexp(1.5f, 3) == 12.0f);
  int ex = 0;
  CHECK(metal::frexp(12.0f, ex) == 0.75f && ex == 4);
  int4 ex4;
  float4 fr4 = metal::frexp(float4(1, 2, 3, 4), ex4);
  CHECK(fr4.z == 0.75f && ex4.w == 3);
  CHECK(all(metal::ldexp(float2(1, 1), int2(1, 2)) == float2(2, 4)));
  CHECK(metal::fmod(7.5f, 2.0f) == 1.5f && metal::fmod(-7.5f, 2.0f) == -1.5f);
  CHECK(metal::mix(1.0f, 3.0f, 0.5f) == 2.0f);
  CHECK(all(metal::mix(float2(0, 10), float2(10, 20), 0.25f) == float2(2.5f, 12.5f)));
  CHECK(metal::step(1.0f, 1.0f) == 1.0f && metal::step(1.0f, 0.5f) == 0.0f);
  CHECK(metal::smoothstep(0.0f, 1.0f, 0.5f) == 0.5f);
  CHECK(metal::copysign(2.0f, -0.0f) == -2.0f);
  CHECK(metal::sign(-3.0f) == -1.0f && metal::sign(2.0f) == 1.0f);
  CHECK(same_bits(metal::sign(-0.0f), -0.0f) && metal::sign(NAN) == 0.0f);
  CHECK(metal::saturate(1.5f) == 1.0f);

  // classification
  float nan = metal::numeric_limits<float>::quiet_NaN();
  float inf = metal::numeric_limits<float>::infinity();
  CHECK(metal::isnan(nan) && !metal::isnan(1.0f));
  CHECK(metal::isinf(-inf) && !metal::isinf(nan));
  CHECK(metal::isfinite(1.0f) && !metal::isfinite(inf));
  CHECK(metal::signbit(-0.0f) && !metal::signbit(0.0f));
  CHECK(metal::isnan(half(nan)) && metal::isnan(bfloat16_t(nan)));
  bool4 n4 = metal::isnan(float4(nan, 1, inf, nan));
  CHECK(n4.x && !n4.y && !n4.z && n4.w);

  // min / max / clamp / abs
  CHECK(metal::min(1.0f, 2.0f) == 1.0f && metal::max(1.0f, 2.0f) == 2.0f);
  CHECK(metal::fmin(nan, 2.0f) == 2.0f && metal::fmax(1.0f, nan) == 1.0f);
  CHECK(metal::min(3, -4) == -4 && metal::max(3u, 4u) == 4u);
  CHECK(metal::min(2.0f, 1) == 1.0f);
  CHECK(metal::clamp(5, 0, 3) == 3 && metal::clamp(-1.0f, 0.0f, 1.0f) == 0.0f);
  CHECK(metal::clamp(0.5f, 0.0f, 1.0f) == 0.5f);
  CHECK(all(metal::clamp(float4(-1, 0.5f, 2, 1), 0.0f, 1.0f) == float4(0, 0.5f, 1, 1)));
  CHECK(all(metal::max(int2(1, 5), int2(3, 2)) == int2(3, 5)));
  CHECK(all(metal::min(float2(1, 5), 2.0f) == float2(1, 2)));
  CHECK(metal::abs(-2.5f) == 2.5f && metal::fabs(-1.0f) == 1.0f);
  CHECK(metal::abs(-7) == 7 && abs(-7) == 7 && abs(-2.0f) == 2.0f);
  CHECK(metal::abs(int(0x80000000u)) == int(0x80000000u));
  CHECK(all(metal::abs(int3(-1, 2, -3)) == int3(1, 2, 3)));
  CHECK(float(metal::abs(bfloat16_t(-3.0f))) == 3.0f);
  CHECK(float(metal::max(half(1), half(2))) == 2.0f);
  CHECK(min(1.0f, 2.0f) == 1.0f && max(2, 3) == 3);  // unqualified

  // vector math
  float4 sq = metal::sqrt(float4(1, 4, 9, 16));
  CHECK(sq.x == 1 && sq.w == 4);
  float2 sw = metal::sqrt(float4(1, 4, 9, 16).zw);
  CHECK(sw.x == 3 && sw.y == 4);
  CHECK(all(metal::pow(float2(2, 3), 2.0f) == float2(4, 9)));
  CHECK(all(metal::fma(float2(1, 2), 3.0f, float2(1, 1)) == float2(4, 7)));
  CHECK(all(metal::exp(half2(0)) == half2(1)));

  // integer functions
  CHECK(metal::popcount(0xF0F0u) == 8u && metal::popcount(-1) == 32);
  CHECK(metal::clz(1u) == 31u && metal::clz(0u) == 32u && metal::clz(uchar(1)) == 7);
  CHECK(metal::ctz(8u) == 3u && metal::ctz(0u) == 32u && metal::ctz(ushort(0)) == 16);
  CHECK(metal::mulhi(0x80000000u, 4u) == 2u && metal::mulhi(-2, 0x40000000) == -1);
  CHECK(metal::mulhi(uint64_t(1) << 63, uint64_t(4)) == 2u);
  CHECK(all(metal::popcount(uint2(3, 7)) == uint2(2, 3)));
}

static uint16_t bf(float f) { return bfloat16_t(f).bits_; }

static void test_bfloat_half() {
  // round to nearest even on exact ties
  CHECK(bf(1.0f) == 0x3F80);
  CHECK(bf(as_type<float>(0x3F808000u)) == 0x3F80);  // tie, even stays
  CHECK(bf(as_type<float>(0x3F818000u)) == 0x3F82);  // tie, odd rounds up
  CHECK(bf(as_type<float>(0x3F808001u)) == 0x3F81);  // above tie
  CHECK(bf(as_type<float>(0x3F807FFFu)) == 0x3F80);  // below tie
  CHECK(bf(as_type<float>(0xBF818000u)) == 0xBF82);  // negative tie
  CHECK(bf(as_type<float>(0x7F7FFFFFu)) == 0x7F80);  // overflow to inf
  CHECK(bf(INFINITY) == 0x7F80 && bf(-INFINITY) == 0xFF80);
  uint16_t nb = bf(as_type<float>(0x7F800001u));  // signalling NaN
  CHECK((nb & 0x7F80) == 0x7F80 && (nb & 0x0040));  // stays NaN, quiet
  CHECK(float(bfloat16_t::from_bits(0x4049)) == 3.140625f);
  // from double and int: one rounding
  CHECK(bfloat16_t(1.0 + 0x1p-8 + 0x1p-40).bits_ == 0x3F81);
  CHECK(bfloat16_t(257).bits_ == 0x4380);   // 257 -> 256 (tie to even)
  CHECK(bfloat16_t(259).bits_ == 0x4382);   // 259 -> 260
  // arithmetic rounds to bf16 each step
  bfloat16_t a = bfloat16_t(1.0f), b = bfloat16_t::from_bits(0x3B80);  // 2^-8
  CHECK((a + b).bits_ == 0x3F80);  // 1 + 2^-8 ties to 1
  bfloat16_t c = a + b + b;        // per-op rounding: still 1
  CHECK(c.bits_ == 0x3F80);
  float fa = a + 0.5f;  // bf op float -> float
  CHECK(fa == 1.5f);
  static_assert(std::is_same<decltype(a + 0.5f), float>::value, "");
  static_assert(std::is_same<decltype(a * 2), bfloat16_t>::value, "");
  static_assert(std::is_same<decltype(a * a), bfloat16_t>::value, "");
  static_assert(std::is_same<decltype(3 - a), bfloat16_t>::value, "");
  CHECK(float(a * 3) == 3.0f && float(6 / bfloat16_t(2.0f)) == 3.0f);
  CHECK(a < 2 && a == 1.0f && 2.0f > a && a != b && a >= a && b <= a);
  bfloat16_t d = bfloat16_t(2.0f);
  d += 1;
  d *= 2.0f;
  d -= a;
  d /= 5;
  CHECK(float(d) == 1.0f);
  d++;
  CHECK(float(d) == 2.0f && float(-d) == -2.0f);
  int di = int(d);
  CHECK(di == 2 && static_cast<int>(bfloat16_t(-3.7f)) == -3);
  half hh = half(bfloat16_t(1.5f));
  CHECK(float(hh) == 1.5f);
  bfloat16_t fromh = bfloat16_t(half(0.25f));
  CHECK(float(fromh) == 0.25f);
  CHECK(float(metal::numeric_limits<bfloat16_t>::max()) == 0x1.FEp127f);
  CHECK(float(metal::numeric_limits<bfloat16_t>::epsilon()) == 0x1p-7f);
  CHECK(float(metal::numeric_limits<bfloat16_t>::min()) == 0x1p-126f);
  CHECK(float(metal::numeric_limits<bfloat16_t>::lowest()) == -0x1.FEp127f);
  CHECK(metal::isnan(float(metal::numeric_limits<bfloat16_t>::quiet_NaN())));
  CHECK(float(metal::numeric_limits<bfloat16_t>::denorm_min()) == 0x1p-133f);

  // half
  CHECK(float(metal::numeric_limits<half>::max()) == 65504.0f);
  CHECK(float(metal::numeric_limits<half>::min()) == 0x1p-14f);
  CHECK(float(metal::numeric_limits<half>::epsilon()) == 0x1p-10f);
  CHECK(float(metal::numeric_limits<half>::denorm_min()) == 0x1p-24f);
  CHECK(metal::isinf(metal::numeric_limits<half>::infinity()));
  CHECK(float(half(2049.0f)) == 2048.0f && float(half(2051.0f)) == 2052.0f);
  CHECK(as_type<ushort>(half(1.0f)) == 0x3C00);
  CHECK(float(half(1.0 + 0x1p-11 + 0x1p-40)) == 1.0f + 0x1p-10f);  // direct from double
}

static void test_as_type_limits_traits() {
  CHECK(as_type<uint>(1.0f) == 0x3F800000u);
  CHECK(as_type<float>(as_type<uint>(3.25f)) == 3.25f);
  float2 f2(1.0f, -2.0f);
  uint2 u2 = as_type<uint2>(f2);
  CHECK(u2.x == 0x3F800000u && u2.y == 0xC0000000u);
  CHECK(as_type<float2>(u2).y == -2.0f);
  CHECK(as_type<ulong>(f2) == ((ulong(0xC0000000u) << 32) | 0x3F800000u));
  CHECK(as_type<half2>(as_type<uint>(half2(1.5f, -1.0f))).x == half(1.5f));
  CHECK(as_type<uint2>(float4(1, 2, 3, 4).zw).x == as_type<uint>(3.0f));
  CHECK(as_type<ushort>(bfloat16_t(1.0f)) == 0x3F80);
  CHECK(float(as_type<bfloat16_t>(ushort(0x4000))) == 2.0f);

  CHECK(metal::numeric_limits<int>::max() == 2147483647);
  CHECK(metal::numeric_limits<float>::epsilon() == 0x1p-23f);
  CHECK(metal::numeric_limits<float>::denorm_min() == 0x1p-149f);
  CHECK(metal::numeric_limits<bool>::max() == true);
  CHECK(metal::numeric_limits<uchar>::max() == 255);
  static_assert(metal::is_same_v<uint, unsigned int>, "");
  static_assert(metal::is_floating_point_v<half> && metal::is_floating_point_v<bfloat16_t>, "");
  static_assert(metal::is_floating_point_v<float> && !metal::is_floating_point_v<int>, "");
  static_assert(metal::is_integral_v<short> && metal::is_signed_v<half>, "");
  static_assert(metal::is_unsigned_v<uint> && !metal::is_signed_v<uint>, "");
  // Metal's bfloat: only bfloat -> float (and, here, integer -> bfloat) are
  // implicit; a conditional with an integer or T(0) stays bfloat.
  static_assert(!metal::is_convertible_v<float, bfloat16_t> && !metal::is_convertible_v<half, bfloat16_t>, "");
  static_assert(metal::is_convertible_v<bfloat16_t, float> && metal::is_convertible_v<int, bfloat16_t>, "");
  static_assert(!metal::is_convertible_v<bfloat16_t, int> && !metal::is_convertible_v<bfloat16_t, half>, "");
  static_assert(metal::is_convertible_v<float, half> && metal::is_convertible_v<half, float>, "");
  {
    bfloat16_t q = bfloat16_t(2.5f);
    auto c0 = q > 1 ? q : 0;
    auto c1 = q > 1 ? q : bfloat16_t(0);
    auto c2 = q > 1 ? q : 0.5f;
    half hq = half(0.5f);
    auto c3 = hq > 1 ? hq : 0;
    static_assert(std::is_same<decltype(c0), bfloat16_t>::value && std::is_same<decltype(c1), bfloat16_t>::value, "");
    static_assert(std::is_same<decltype(c2), float>::value && std::is_same<decltype(c3), half>::value, "");
    CHECK(float(c0) == 2.5f && float(q < 1 ? q : 0) == 0.0f && c2 == 2.5f && float(c3) == 0.0f);
  }
  static_assert(metal::is_same_v<metal::remove_cv_t<const int>, int>, "");
  static_assert(metal::is_same_v<metal::decay_t<const float&>, float>, "");
  static_assert(metal::is_same_v<metal::conditional_t<true, int, float>, int>, "");
  static_assert(metal::is_same_v<metal::enable_if_t<true, int>, int>, "");
  static_assert(metal::is_same<int, int>::value && metal::is_same_v<metal::enable_if<true>::type, void>, "");
  static_assert(is_arithmetic_v<half>, "");
  static_assert(WorkPerThread<float>::n == 2 && WorkPerThread<uint8_t>::n == 8, "");
  CHECK(metal::isinf(Limits<float>::max) && Limits<float>::min < 0);
  CHECK(Limits<float>::finite_max == 0x1.fffffep127f);
  CHECK(Limits<float>::finite_min == -0x1.fffffep127f);
  CHECK(metal::isinf(Limits<half>::max) && metal::isinf(float(Limits<bfloat16_t>::min)));
  CHECK(Limits<int>::min == -2147483647 - 1 && Limits<uint8_t>::max == 255);
  CHECK(Limits<uint32_t>::min == 0u && Limits<bool>::max);
  CHECK(metal::isinf(Limits<complex64_t>::max.imag));
}

static void test_complex() {
  complex64_t a(1.0f, 2.0f), b(3.0f, -1.0f);
  complex64_t p = a * b;
  CHECK(p.real == 5.0f && p.imag == 5.0f);
  complex64_t q = p / b;  // back to a
  CHECK(q.real == 1.0f && q.imag == 2.0f);
  complex64_t s = a + b, d = a - b;
  CHECK(s.real == 4 && s.imag == 1 && d.real == -2 && d.imag == 3);
  complex64_t n = -a;
  CHECK(n.real == -1 && n.imag == -2);
  complex64_t z;
  CHECK(z.real == 0 && z.imag == 0);
  complex64_t r = 2.0f;
  CHECK(r.real == 2 && r.imag == 0);
  CHECK((a + 1.0f).real == 2 && (1.0f - a).imag == -2);
  CHECK((a * 2.0f).imag == 4 && (2 * a).real == 2 && (a / 2.0f).imag == 1);
  complex64_t inv = 1.0f / complex64_t(0.0f, 2.0f);  // -0.5i
  CHECK(inv.real == 0.0f && inv.imag == -0.5f);
  CHECK(a == complex64_t(1, 2) && a != b);
  CHECK(a < b && !(b < a) && complex64_t(1, 1) < a && a <= a && b > a && b >= a);
  complex64_t acc = a;
  acc += b;
  acc *= complex64_t(0, 1);  // (4 + i) * i = -1 + 4i
  CHECK(acc.real == -1 && acc.imag == 4);
  // MLX's division formula, evaluated literally (no scaling)
  complex64_t big(3e20f, 1.0f), dv(2e20f, 1e20f);
  complex64_t bq = big / dv;
  // |dv|^2 overflows, so the literal formula gives inf/inf = NaN (a scaled
  // division would give 1.4 - 0.2i).
  CHECK(metal::isnan(bq.real));
  float2 asv = a;
  CHECK(asv.x == 1 && asv.y == 2);
  complex64_t fromv = float2(5, 6);
  CHECK(fromv.imag == 6);
  complex_t<half> ch = a;  // element conversion
  CHECK(float(ch.imag) == 2.0f);
  complex64_t modr = complex64_t(-7, 7) % complex64_t(3, 3);
  CHECK(modr.real == 2 && modr.imag == 1);
  CHECK(select(a, b, true) == b);
}

static void test_atomics() {
  float fbuf[2] = {1.0f, 2.0f};
  device atomic<float>* af = reinterpret_cast<device atomic<float>*>(fbuf);
  CHECK(atomic_fetch_add_explicit(&af[1], 0.5f, memory_order_relaxed) == 2.0f);
  CHECK(fbuf[1] == 2.5f);
  CHECK(atomic_load_explicit(&af[0], memory_order_relaxed) == 1.0f);
  atomic_store_explicit(&af[0], 4.0f, memory_order_relaxed);
  CHECK(fbuf[0] == 4.0f);
  atomic_uint au;
  atomic_store_explicit(&au, 10, memory_order_relaxed);
  CHECK(atomic_fetch_sub_explicit(&au, 3, memory_order_relaxed) == 10u);
  CHECK(atomic_fetch_max_explicit(&au, 20, memory_order_relaxed) == 7u);
  CHECK(atomic_fetch_min_explicit(&au, 5, memory_order_relaxed) == 20u);
  CHECK(atomic_fetch_or_explicit(&au, 8, memory_order_relaxed) == 5u);
  CHECK(atomic_fetch_and_explicit(&au, 12, memory_order_relaxed) == 13u);
  CHECK(atomic_fetch_xor_explicit(&au, 1, memory_order_relaxed) == 12u);
  CHECK(atomic_exchange_explicit(&au, 99, memory_order_relaxed) == 13u);
  CHECK(atomic_load_explicit(&au, memory_order_relaxed) == 99u);
  uint expected = 5;
  CHECK(!atomic_compare_exchange_weak_explicit(&au, &expected, 1u, memory_order_relaxed,
                                               memory_order_relaxed));
  CHECK(expected == 99u);
  CHECK(atomic_compare_exchange_weak_explicit(&au, &expected, 1u, memory_order_relaxed,
                                              memory_order_relaxed));
  CHECK(atomic_load_explicit(&au, memory_order_relaxed) == 1u);
  {  // a local (threadgroup-style) atomic
    atomic_int ai{};
    atomic_fetch_add_explicit(&ai, -4, memory_order_relaxed);
    CHECK(ai.value == -4);
  }
  atomic_bool ab{};
  atomic_store_explicit(&ab, true, memory_order_relaxed);
  CHECK(atomic_load_explicit(&ab, memory_order_relaxed));
}

static void test_indexing() {
  // A 3x4 array stored transposed: element (i, j) at j*3 + i.
  const int shape[2] = {3, 4};
  const int64_t strides[2] = {1, 3};
  for (uint e = 0; e < 12; ++e) {
    uint i = e / 4, j = e % 4;
    CHECK(elem_to_loc(e, shape, strides, 2) == j * 3 + i);  // IdxT = uint
    CHECK(elem_to_loc<int64_t>(int64_t(e), shape, strides, 2) == int64_t(j * 3 + i));
  }
  static_assert(std::is_same<decltype(elem_to_loc(1u, shape, strides, 2)), uint>::value, "");
  // uint3 overload: x walks the last axis, y the previous, z the rest.
  const int shape3[3] = {2, 3, 4};
  const int64_t str3[3] = {1, 2, 6};  // fully transposed 2x3x4
  CHECK(elem_to_loc(uint3(3, 2, 1), shape3, str3, 3) == 3 * 6 + 2 * 2 + 1 * 1);
  CHECK(elem_to_loc(uint3(1, 2, 0), shape, strides, 2) == 1 * 3 + 2 * 1);
  static_assert(std::is_same<decltype(elem_to_loc(uint3(0), shape, strides, 2)), int64_t>::value, "");
  CHECK(elem_to_loc_1(5u, strides[1]) == 15);
  CHECK(elem_to_loc_2(uint2(2, 1), strides) == 2 * 3 + 1 * 1);
  CHECK(elem_to_loc_3(uint3(3, 2, 1), str3) == 3 * 6 + 2 * 2 + 1);
  const int64_t b3[3] = {12, 4, 1};  // row-major 2x3x4
  long2 l2 = elem_to_loc_2_nd(uint3(3, 2, 1), shape3, str3, b3, 3);
  CHECK(l2.x == 3 * 6 + 2 * 2 + 1 && l2.y == 3 + 2 * 4 + 12);
  vec<int64_t, 3> l3 = elem_to_loc_3_nd(uint3(3, 2, 1), shape3, str3, b3, str3, 3);
  CHECK(l3.x == 23 && l3.y == 23 && l3.z == 23);
  vec<int, 2> l2i = elem_to_loc_2_nd<int>(uint3(1, 1, 0), shape, strides, strides, 2);
  CHECK(l2i.x == 3 + 1 && l2i.y == 4);
  CHECK(ceildiv(10, 4) == 3 && ceildiv(8u, 4) == 2u);
}

constexpr bfloat16_t kBf = bfloat16_t(1.5f);
static_assert(kBf.bits_ == 0x3FC0, "constexpr bfloat");
constexpr float4 kVec = float4(1.0f, 2.0f, 3.0f, 4.0f);
constexpr complex64_t kC = complex64_t(1.0f, 2.0f) * complex64_t(3.0f, -1.0f);
static_assert(kC.real == 5.0f, "constexpr complex");

// Built as a library by tests/emulator/test_emulator_shim.py (the emulator's own build).
extern "C" int shim_selfcheck() {
  failures = 0;
  msl_snippet();
  test_layout();
  test_vectors();
  test_rounding_math();
  test_bfloat_half();
  test_as_type_limits_traits();
  test_complex();
  test_atomics();
  test_indexing();
  run_unary<float>();
  run_unary<half>();
  run_unary<bfloat16_t>();
  CHECK(kVec[3] == 4.0f);
  if (failures) {
    std::printf("%d check(s) failed\n", failures);
    return 1;
  }
  std::printf("all checks passed\n");
  return 0;
}
