// Metal on clang's C++ for OpenCL front end: the prelude of the strict check
// (mlx_precise/emulator/strict.py). It is parsed, never run: declarations suffice
// where nothing is evaluated at compile time.
//
// What makes the check strict is what OpenCL shares with Metal and plain C++ lacks:
// real address spaces (device -> __global, constant -> __constant, threadgroup ->
// __local, thread -> __private), `half` as a built-in type (so it cannot name a
// variable), no `double` (the fp64 extension is switched off), no function pointers,
// no static locals, no variable-length arrays and no __int128 on the SPIR target.
// On top of that this header gives `bfloat` Metal's one-way conversions (bfloat ->
// float implicit, float -> bfloat explicit) and declares Metal's standard library
// with per-type overloads, so that a call Metal finds ambiguous is ambiguous here.
#pragma OPENCL EXTENSION cl_khr_fp16 : enable

#define device __global
#define constant __constant
#define threadgroup __local
#define thread __private
#define METAL_FUNC inline
#define MLX_MTL_PRAGMA_UNROLL
// __METAL_VERSION__ comes from strict.py (-D__METAL_VERSION__=310 for MSL 3.1, the
// option `metal_version`); bfloat is a type from MSL 3.1 on (MSL spec, "Scalar data types").
#ifndef __METAL_VERSION__
#define __METAL_VERSION__ 310
#endif
#if __METAL_VERSION__ >= 310
#define __HAVE_BFLOAT__ 1
#endif
// <metal_math>'s constants (MSL spec, "Math functions"): float expressions.
#define INFINITY __builtin_inff()
#define HUGE_VALF __builtin_huge_valf()
#define NAN __builtin_nanf("")
#define MAXFLOAT 0x1.fffffep127f
#define FLT_MAX 0x1.fffffep127f
#define FLT_MIN 0x1p-126f
#define FLT_EPSILON 0x1p-23f
#define HALF_MAX ((half)65504.0f)
#define M_E_F 2.71828182845904523536f
#define M_LOG2E_F 1.44269504088896340736f
#define M_LOG10E_F 0.434294481903251827651f
#define M_LN2_F 0.693147180559945309417f
#define M_LN10_F 2.30258509299404568402f
#define M_PI_F 3.14159265358979323846f
#define M_PI_2_F 1.57079632679489661923f
#define M_PI_4_F 0.785398163397448309616f
#define M_1_PI_F 0.318309886183790671538f
#define M_2_PI_F 0.636619772367581343076f
#define M_2_SQRTPI_F 1.12837916709551257390f
#define M_SQRT2_F 1.41421356237309504880f
#define M_SQRT1_2_F 0.707106781186547524401f

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long int64_t;
typedef uchar uint8_t;
typedef ushort uint16_t;
typedef uint uint32_t;
typedef ulong uint64_t;
typedef __SIZE_TYPE__ size_t;
typedef __PTRDIFF_TYPE__ ptrdiff_t;

// Vector types: clang's extended vectors (swizzles, element-wise operators).
#define MPS_VEC(T)                                          \
  typedef T T##2 __attribute__((ext_vector_type(2)));       \
  typedef T T##3 __attribute__((ext_vector_type(3)));       \
  typedef T T##4 __attribute__((ext_vector_type(4)));
MPS_VEC(char)
MPS_VEC(uchar)
MPS_VEC(short)
MPS_VEC(ushort)
MPS_VEC(int)
MPS_VEC(uint)
MPS_VEC(long)
MPS_VEC(ulong)
MPS_VEC(float)
MPS_VEC(half)
// Metal's generic spelling metal::vec<T, N> (MLX's headers use it).
namespace metal {
template <class T, int N> struct mps_vec_of { typedef T type __attribute__((ext_vector_type(N))); };
template <class T, int N> using vec = typename mps_vec_of<T, N>::type;
}
// clang has no bool vectors; comparisons of float vectors give int vectors.
typedef int bool2 __attribute__((ext_vector_type(2)));
typedef int bool3 __attribute__((ext_vector_type(3)));
typedef int bool4 __attribute__((ext_vector_type(4)));
#undef MPS_VEC

namespace metal {

// ---- type traits (definitions: they are evaluated in constant expressions) ----
template <class T, T v>
struct integral_constant {
  static constexpr constant T value = v;
  constexpr operator T() const { return v; }
};
typedef integral_constant<bool, true> true_type;
typedef integral_constant<bool, false> false_type;
template <class A, class B> struct is_same : false_type {};
template <class A> struct is_same<A, A> : true_type {};
template <class A, class B> constexpr constant bool is_same_v = is_same<A, B>::value;
template <bool B, class T = void> struct enable_if {};
template <class T> struct enable_if<true, T> { typedef T type; };
template <bool B, class T = void> using enable_if_t = typename enable_if<B, T>::type;
template <bool B, class A, class C> struct conditional { typedef A type; };
template <class A, class C> struct conditional<false, A, C> { typedef C type; };
template <bool B, class A, class C> using conditional_t = typename conditional<B, A, C>::type;
template <class T> struct remove_cv { typedef T type; };
template <class T> struct remove_cv<const T> { typedef T type; };
template <class T> struct remove_cv<volatile T> { typedef T type; };
template <class T> struct remove_cv<const volatile T> { typedef T type; };
template <class T> using remove_cv_t = typename remove_cv<T>::type;
template <class T> struct remove_const { typedef T type; };
template <class T> struct remove_const<const T> { typedef T type; };
template <class T> using remove_const_t = typename remove_const<T>::type;
template <class T> struct remove_reference { typedef T type; };
template <class T> struct remove_reference<T&> { typedef T type; };
template <class T> using remove_reference_t = typename remove_reference<T>::type;
template <class T> struct decay { typedef remove_cv_t<remove_reference_t<T>> type; };
template <class T> using decay_t = typename decay<T>::type;
template <class T> T&& declval();
// No void_t: Metal's library has none, and MLX's steel/utils/type_traits.h defines
// metal::void_t itself.
template <bool B> using bool_constant = integral_constant<bool, B>;
template <class T> struct remove_volatile { typedef T type; };
template <class T> struct remove_volatile<volatile T> { typedef T type; };
template <class T> using remove_volatile_t = typename remove_volatile<T>::type;
template <class T> struct remove_pointer { typedef T type; };
template <class T> struct remove_pointer<T*> { typedef T type; };
template <class T> using remove_pointer_t = typename remove_pointer<T>::type;
template <class T> struct is_const : false_type {};
template <class T> struct is_const<const T> : true_type {};
template <class T> constexpr constant bool is_const_v = is_const<T>::value;
template <class T> struct add_const { typedef const T type; };
template <class T> using add_const_t = typename add_const<T>::type;
// Metal's remove_addrspace: the object's address space goes, cv stays.
template <class T> struct remove_addrspace { typedef T type; };
template <class T> struct remove_addrspace<__global T> { typedef T type; };
template <class T> struct remove_addrspace<__constant T> { typedef T type; };
template <class T> struct remove_addrspace<__local T> { typedef T type; };
template <class T> struct remove_addrspace<__private T> { typedef T type; };
template <class T> struct remove_addrspace<__generic T> { typedef T type; };
template <class T> using remove_addrspace_t = typename remove_addrspace<T>::type;
template <class B, class D> struct is_base_of : bool_constant<__is_base_of(B, D)> {};
template <class B, class D> constexpr constant bool is_base_of_v = is_base_of<B, D>::value;
template <class T> struct is_class : bool_constant<__is_class(T)> {};
template <class T> constexpr constant bool is_class_v = is_class<T>::value;
template <class T> struct is_pointer : false_type {};
template <class T> struct is_pointer<T*> : true_type {};
template <class T> constexpr constant bool is_pointer_v = is_pointer<T>::value;
template <class T> struct mps_integral : false_type {};
#define MPS_INTEGRAL(T) template <> struct mps_integral<T> : true_type {};
MPS_INTEGRAL(bool) MPS_INTEGRAL(char) MPS_INTEGRAL(signed char) MPS_INTEGRAL(uchar)
MPS_INTEGRAL(short) MPS_INTEGRAL(ushort) MPS_INTEGRAL(int) MPS_INTEGRAL(uint)
MPS_INTEGRAL(long) MPS_INTEGRAL(ulong)
#undef MPS_INTEGRAL
template <class T> struct is_integral : mps_integral<remove_cv_t<T>> {};
template <class T> constexpr constant bool is_integral_v = is_integral<T>::value;
template <class T> struct is_unsigned : integral_constant<bool, is_integral<T>::value && T(0) < T(-1)> {};
template <class T> constexpr constant bool is_unsigned_v = is_unsigned<T>::value;
template <class T> struct is_signed : integral_constant<bool, !is_unsigned<T>::value> {};
template <class T> constexpr constant bool is_signed_v = is_signed<T>::value;
template <class From, class To>
struct is_convertible {
 private:
  template <class U> static void sink(U);
  template <class F, class U, class = decltype(sink<U>(declval<F>()))>
  static true_type test(int);
  template <class F, class U> static false_type test(long);
 public:
  static constexpr constant bool value = decltype(test<From, To>(0))::value;
};
template <class F, class T> constexpr constant bool is_convertible_v = is_convertible<F, T>::value;

// ---- bfloat: bfloat -> float implicit, float -> bfloat explicit ----------------
// Address-space-qualified overloads make a bfloat readable from every space (C++ for
// OpenCL's member functions are `__generic`, which excludes `__constant`).
struct bfloat {
  ushort bits;
  bfloat() = default;
  template <class T, enable_if_t<is_integral_v<T>, int> = 0>
  bfloat(T);  // integers convert implicitly, so `c ? b : 0` is a bfloat, as in Metal
  explicit bfloat(float);
  explicit bfloat(half);
  bfloat(const bfloat&) = default;
  bfloat(const __constant bfloat&);
  bfloat& operator=(const bfloat&) = default;
  template <class T, enable_if_t<is_same_v<T, float>, int> = 0>
  operator T() const;
  template <class T, enable_if_t<is_same_v<T, float>, int> = 0>
  operator T() const __constant;
  bfloat& operator+=(bfloat);
  bfloat& operator-=(bfloat);
  bfloat& operator*=(bfloat);
  bfloat& operator/=(bfloat);
};
bfloat operator-(bfloat);
// Arithmetic gives a bfloat, comparisons a bool, with another bfloat or an integer (a
// float operand takes the built-in float operator through bfloat -> float).
#define MPS_BF_OP(R, op)                                               \
  R operator op(bfloat, bfloat);                                       \
  template <class I, enable_if_t<is_integral_v<I>, int> = 0>           \
  R operator op(bfloat, I);                                            \
  template <class I, enable_if_t<is_integral_v<I>, int> = 0>           \
  R operator op(I, bfloat);
MPS_BF_OP(bfloat, +) MPS_BF_OP(bfloat, -) MPS_BF_OP(bfloat, *) MPS_BF_OP(bfloat, /)
MPS_BF_OP(bool, <) MPS_BF_OP(bool, <=) MPS_BF_OP(bool, >) MPS_BF_OP(bool, >=)
MPS_BF_OP(bool, ==) MPS_BF_OP(bool, !=)
#undef MPS_BF_OP

// Metal's bfloat2/3/4 (MSL 3.1): clang's vector extension takes no class element, so
// they are classes with the members kernels use: x/y/z/w, [], element-wise
// arithmetic, a broadcast from a bfloat, construction from N bfloats, and explicit
// conversions to and from float and half vectors (Metal converts vectors explicitly).
template <int N> struct mps_bfvec_fields;
template <> struct mps_bfvec_fields<2> { bfloat x, y; };
template <> struct mps_bfvec_fields<3> { bfloat x, y, z; };
template <> struct mps_bfvec_fields<4> { bfloat x, y, z, w; };
template <int N> struct mps_bfvec : mps_bfvec_fields<N> {
  typedef float mps_float_vec __attribute__((ext_vector_type(N)));
  typedef half mps_half_vec __attribute__((ext_vector_type(N)));
  mps_bfvec() = default;
  mps_bfvec(bfloat);
  template <class A, class B, enable_if_t<N == 2 && is_same_v<A, bfloat> && is_same_v<B, bfloat>, int> = 0>
  mps_bfvec(A, B);
  template <class A, class B, class C, enable_if_t<N == 3 && is_same_v<A, bfloat> &&
                                                       is_same_v<B, bfloat> && is_same_v<C, bfloat>, int> = 0>
  mps_bfvec(A, B, C);
  template <class A, class B, class C, class D,
            enable_if_t<N == 4 && is_same_v<A, bfloat> && is_same_v<B, bfloat> &&
                            is_same_v<C, bfloat> && is_same_v<D, bfloat>, int> = 0>
  mps_bfvec(A, B, C, D);
  explicit mps_bfvec(mps_float_vec);
  explicit mps_bfvec(mps_half_vec);
  explicit operator mps_float_vec() const;
  explicit operator mps_half_vec() const;
  mps_bfvec(const mps_bfvec&) = default;
  mps_bfvec(const __constant mps_bfvec&);
  mps_bfvec& operator=(const mps_bfvec&) = default;
  __private bfloat& operator[](int);
  bfloat operator[](int) const;
  bfloat operator[](int) const __constant;
  mps_bfvec& operator+=(mps_bfvec);
  mps_bfvec& operator-=(mps_bfvec);
  mps_bfvec& operator*=(mps_bfvec);
  mps_bfvec& operator/=(mps_bfvec);
};
#define MPS_BFV_OP(op)                                                   \
  template <int N> mps_bfvec<N> operator op(mps_bfvec<N>, mps_bfvec<N>); \
  template <int N> mps_bfvec<N> operator op(mps_bfvec<N>, bfloat);       \
  template <int N> mps_bfvec<N> operator op(bfloat, mps_bfvec<N>);
MPS_BFV_OP(+) MPS_BFV_OP(-) MPS_BFV_OP(*) MPS_BFV_OP(/)
#undef MPS_BFV_OP
template <int N> mps_bfvec<N> operator-(mps_bfvec<N>);

template <int N> struct mps_vec_of<bfloat, N> { typedef mps_bfvec<N> type; };
typedef mps_bfvec<2> bfloat2;
typedef mps_bfvec<3> bfloat3;
typedef mps_bfvec<4> bfloat4;

template <class T> struct is_floating_point
    : integral_constant<bool, is_same_v<remove_cv_t<T>, float> || is_same_v<remove_cv_t<T>, half> ||
                                  is_same_v<remove_cv_t<T>, bfloat>> {};
template <class T> constexpr constant bool is_floating_point_v = is_floating_point<T>::value;
template <class T> struct is_arithmetic
    : integral_constant<bool, is_integral_v<T> || is_floating_point_v<T>> {};
template <class T> constexpr constant bool is_arithmetic_v = is_arithmetic<T>::value;

// ---- numeric limits (constexpr: kernels use them in constant expressions) -----
template <class T> struct numeric_limits;
#define MPS_LIMITS(T, LO, HI, LOWEST, EPS, INF, QNAN, DIG)                        \
  template <> struct numeric_limits<T> {                                          \
    static constexpr constant bool is_specialized = true;                                  \
    static constexpr constant int digits = DIG;                                            \
    static constexpr T min() { return LO; }                                       \
    static constexpr T max() { return HI; }                                       \
    static constexpr T lowest() { return LOWEST; }                                \
    static constexpr T epsilon() { return EPS; }                                  \
    static constexpr T infinity() { return INF; }                                 \
    static constexpr T quiet_NaN() { return QNAN; }                               \
  };
MPS_LIMITS(float, 0x1p-126f, 0x1.fffffep127f, -0x1.fffffep127f, 0x1p-23f,
           __builtin_inff(), __builtin_nanf(""), 24)
MPS_LIMITS(half, (half)0x1p-14f, (half)65504.0f, (half)-65504.0f, (half)0x1p-10f,
           (half)__builtin_inff(), (half)__builtin_nanf(""), 11)
#define MPS_ILIMITS(T, LO, HI, DIG) MPS_LIMITS(T, LO, HI, LO, T(0), T(0), T(0), DIG)
MPS_ILIMITS(bool, false, true, 1)
MPS_ILIMITS(char, -128, 127, 7)
MPS_ILIMITS(uchar, 0, 255, 8)
MPS_ILIMITS(short, -32768, 32767, 15)
MPS_ILIMITS(ushort, 0, 65535, 16)
MPS_ILIMITS(int, -2147483647 - 1, 2147483647, 31)
MPS_ILIMITS(uint, 0u, 4294967295u, 32)
MPS_ILIMITS(long, -9223372036854775807l - 1, 9223372036854775807l, 63)
MPS_ILIMITS(ulong, 0ul, 18446744073709551615ul, 64)
#undef MPS_ILIMITS
#undef MPS_LIMITS
template <> struct numeric_limits<bfloat> {
  static constexpr constant bool is_specialized = true;
  static constexpr constant int digits = 8;
  static bfloat min();
  static bfloat max();
  static bfloat lowest();
  static bfloat epsilon();
  static bfloat infinity();
  static bfloat quiet_NaN();
};

// ---- reinterpretation ---------------------------------------------------------
template <class To, class From>
To as_type(From x) {
  static_assert(sizeof(To) == sizeof(From), "as_type: the types differ in size");
  return __builtin_bit_cast(To, x);
}

// ---- math: one overload per type, as Metal declares them ----------------------
// Each overload set spans a type list; the arity macro writes one declaration.
#define MPS_FLOATS(M, name)                                                 \
  M(name, float) M(name, half) M(name, float2) M(name, float3)              \
  M(name, float4) M(name, half2) M(name, half3) M(name, half4)
#define MPS_INTS(M, name)                                                   \
  M(name, char) M(name, uchar) M(name, short) M(name, ushort) M(name, int)  \
  M(name, uint) M(name, long) M(name, ulong) M(name, int2) M(name, int3)    \
  M(name, int4) M(name, uint2) M(name, uint3) M(name, uint4)
#define MPS_ARITY1(name, T) T name(T);
#define MPS_ARITY2(name, T) T name(T, T);
#define MPS_ARITY3(name, T) T name(T, T, T);
#define MPS_F1(name) MPS_FLOATS(MPS_ARITY1, name)
#define MPS_F2(name) MPS_FLOATS(MPS_ARITY2, name)
#define MPS_F3(name) MPS_FLOATS(MPS_ARITY3, name)
#define MPS_I1(name) MPS_INTS(MPS_ARITY1, name)
#define MPS_I2(name) MPS_INTS(MPS_ARITY2, name)
#define MPS_I3(name) MPS_INTS(MPS_ARITY3, name)

#define MPS_MATH1(X)                                                        \
  X(acos) X(acosh) X(asin) X(asinh) X(atan) X(atanh) X(ceil) X(cos) X(cosh) \
  X(cospi) X(exp) X(exp2) X(exp10) X(fabs) X(floor) X(fract) X(log) X(log2) \
  X(log10) X(rint) X(round) X(rsqrt) X(sin) X(sinh) X(sinpi) X(sqrt) X(tan)  \
  X(tanh) X(tanpi) X(trunc) X(saturate) X(sign) X(erf) X(erfc)
#define MPS_MATH2(X)                                                        \
  X(atan2) X(copysign) X(fdim) X(fmax) X(fmin) X(fmod) X(pow) X(powr)       \
  X(step) X(nextafter)
#define MPS_MATH3(X) X(fma) X(mix) X(smoothstep)

MPS_MATH1(MPS_F1)
MPS_MATH2(MPS_F2)
MPS_MATH3(MPS_F3)
MPS_F1(abs) MPS_I1(abs)
MPS_F2(min) MPS_I2(min)
MPS_F2(max) MPS_I2(max)
MPS_F3(clamp) MPS_I3(clamp)
MPS_I1(popcount) MPS_I1(clz) MPS_I1(ctz) MPS_I1(reverse_bits)
MPS_I2(mulhi) MPS_I2(rotate) MPS_I2(absdiff) MPS_I2(addsat) MPS_I2(subsat)
MPS_I2(hadd) MPS_I2(rhadd)
MPS_I3(madhi) MPS_I3(madsat)
float ldexp(float, int); half ldexp(half, int);
float frexp(float, __private int&); half frexp(half, __private int&);
float modf(float, __private float&);
float sincos(float, __private float&); half sincos(half, __private half&);
float sincos(float, __local float&); float sincos(float, __global float&);
bool isnan(float); bool isnan(half); bool isinf(float); bool isinf(half);
bool isfinite(float); bool isfinite(half); bool isnormal(float); bool isnormal(half);
bool signbit(float); bool signbit(half);
bool2 isnan(float2); bool3 isnan(float3); bool4 isnan(float4);
bool2 isinf(float2); bool3 isinf(float3); bool4 isinf(float4);
bool all(bool); bool all(bool2); bool all(bool3); bool all(bool4);
bool any(bool); bool any(bool2); bool any(bool3); bool any(bool4);
template <class T> T select(T, T, bool);
template <class T, class B> T select(T, T, B);
float dot(float2, float2); float dot(float3, float3); float dot(float4, float4);
half dot(half2, half2); half dot(half3, half3); half dot(half4, half4);
float length(float2); float length(float3); float length(float4);
float3 cross(float3, float3);
template <class T> T normalize(T);
template <class T> T distance(T, T);

// MLX's preamble (bf16_math.h) adds bfloat overloads of these to metal, metal::fast
// and metal::precise (Metal's own take no bfloat).
#define MPS_BF_MATH                                                             \
  MPS_BF1(abs) MPS_BF1(acos) MPS_BF1(acosh) MPS_BF1(asin) MPS_BF1(asinh)        \
  MPS_BF1(atan) MPS_BF2(atan2) MPS_BF1(atanh) MPS_BF1(ceil) MPS_BF1(cos)        \
  MPS_BF1(cosh) MPS_BF1(cospi) MPS_BF2(divide) MPS_BF1(exp) MPS_BF1(exp10)      \
  MPS_BF1(exp2) MPS_BF1(fabs) MPS_BF2(fdim) MPS_BF1(floor) MPS_BF3(fma)         \
  MPS_BF2(fmax) MPS_BF3(fmax3) MPS_BF3(fmedian3) MPS_BF2(fmin) MPS_BF3(fmin3)   \
  MPS_BF2(fmod) MPS_BF1(fract) MPS_BF1(log) MPS_BF1(log10) MPS_BF1(log2)        \
  MPS_BF2(max) MPS_BF3(max3) MPS_BF3(median3) MPS_BF2(min) MPS_BF3(min3)        \
  MPS_BF2(nextafter) MPS_BF2(pow) MPS_BF2(powr) MPS_BF1(rint) MPS_BF1(round)    \
  MPS_BF1(rsqrt) MPS_BF1(sin) MPS_BF1(sinh) MPS_BF1(sinpi) MPS_BF1(sqrt)        \
  MPS_BF1(tan) MPS_BF1(tanh) MPS_BF1(tanpi) MPS_BF1(trunc)                      \
  bfloat frexp(bfloat, __private int&); bfloat ldexp(bfloat, int);
#define MPS_BF1(name) bfloat name(bfloat);
#define MPS_BF2(name) bfloat name(bfloat, bfloat);
#define MPS_BF3(name) bfloat name(bfloat, bfloat, bfloat);
MPS_BF_MATH
namespace precise {
MPS_BF_MATH
MPS_MATH1(MPS_F1)
MPS_MATH2(MPS_F2)
MPS_MATH3(MPS_F3)
float divide(float, float);
float sincos(float, __private float&);
}  // namespace precise
namespace fast {
MPS_BF_MATH
MPS_MATH1(MPS_F1)
MPS_MATH2(MPS_F2)
MPS_MATH3(MPS_F3)
float divide(float, float);
float sincos(float, __private float&);
}  // namespace fast
#undef MPS_BF_MATH
#undef MPS_BF1
#undef MPS_BF2
#undef MPS_BF3
#undef MPS_MATH1
#undef MPS_MATH2
#undef MPS_MATH3
#undef MPS_F1
#undef MPS_F2
#undef MPS_F3
#undef MPS_I1
#undef MPS_I2
#undef MPS_I3
#undef MPS_FLOATS
#undef MPS_INTS
#undef MPS_ARITY1
#undef MPS_ARITY2
#undef MPS_ARITY3

// ---- synchronisation, simdgroup and quadgroup functions -----------------------
enum class mem_flags : uint { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
constexpr mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(uint(a) | uint(b)); }
void threadgroup_barrier(mem_flags);
void simdgroup_barrier(mem_flags);
#define MPS_SIMD1(name) template <class T> T name(T);
#define MPS_SIMD2(name) template <class T> T name(T, ushort);
MPS_SIMD1(simd_sum) MPS_SIMD1(simd_product) MPS_SIMD1(simd_max) MPS_SIMD1(simd_min)
MPS_SIMD1(simd_and) MPS_SIMD1(simd_or) MPS_SIMD1(simd_xor)
MPS_SIMD1(simd_prefix_exclusive_sum) MPS_SIMD1(simd_prefix_inclusive_sum)
MPS_SIMD1(simd_prefix_exclusive_product) MPS_SIMD1(simd_prefix_inclusive_product)
MPS_SIMD1(simd_broadcast_first)
MPS_SIMD2(simd_shuffle) MPS_SIMD2(simd_shuffle_down) MPS_SIMD2(simd_shuffle_up)
MPS_SIMD2(simd_shuffle_xor) MPS_SIMD2(simd_broadcast)
MPS_SIMD2(simd_shuffle_rotate_down) MPS_SIMD2(simd_shuffle_rotate_up)
MPS_SIMD1(quad_sum) MPS_SIMD1(quad_product) MPS_SIMD1(quad_max) MPS_SIMD1(quad_min)
MPS_SIMD1(quad_prefix_exclusive_sum) MPS_SIMD1(quad_prefix_inclusive_sum)
MPS_SIMD2(quad_shuffle) MPS_SIMD2(quad_shuffle_down) MPS_SIMD2(quad_shuffle_up)
MPS_SIMD2(quad_shuffle_xor) MPS_SIMD2(quad_broadcast)
#undef MPS_SIMD1
#undef MPS_SIMD2
struct simd_vote { explicit simd_vote(ulong); bool all() const; bool any() const; };
simd_vote simd_ballot(bool);
bool simd_all(bool);
bool simd_any(bool);
bool simd_is_first();

// ---- simdgroup matrices (MSL spec, "SIMD-group matrix functions") ---------------
template <class T, int Rows, int Cols>
struct simdgroup_matrix {
  simdgroup_matrix() = default;
  explicit simdgroup_matrix(T);
  __private vec<T, 2>& thread_elements();
};
template <class T, int R, int C> simdgroup_matrix<T, R, C> make_filled_simdgroup_matrix(T);
#define MPS_SGM_SPACE(AS)                                                              \
  template <class T, int R, int C>                                                     \
  void simdgroup_load(__private simdgroup_matrix<T, R, C>&, const AS T*,              \
                      ulong elements_per_row = C, ulong2 origin = 0, bool transpose = false); \
  template <class T, int R, int C>                                                     \
  void simdgroup_store(simdgroup_matrix<T, R, C>, AS T*, ulong elements_per_row = C,   \
                       ulong2 origin = 0, bool transpose = false);
MPS_SGM_SPACE(__global) MPS_SGM_SPACE(__local)
#undef MPS_SGM_SPACE
template <class T, class A, class B, class C, int N>
void simdgroup_multiply_accumulate(__private simdgroup_matrix<T, N, N>&, simdgroup_matrix<A, N, N>,
                                   simdgroup_matrix<B, N, N>, simdgroup_matrix<C, N, N>);
template <class T, class A, class B, int N>
void simdgroup_multiply(__private simdgroup_matrix<T, N, N>&, simdgroup_matrix<A, N, N>,
                        simdgroup_matrix<B, N, N>);
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;

// ---- atomics: device or threadgroup objects, never constant -------------------
enum memory_order { memory_order_relaxed, memory_order_seq_cst };
template <class T> struct atomic { T value; };
// atomic_int, atomic_uint, atomic_float, atomic_bool: macros at the end of this
// file (OpenCL declares built-in types of these names at global scope, which would
// make them ambiguous under `using namespace metal`).
namespace metal = ::metal;  // so that `metal::atomic_float` expands to a valid name
#define MPS_ATOMIC(name)                                                       \
  template <class T, class U> T name(__global atomic<T>*, U, memory_order);    \
  template <class T, class U> T name(__local atomic<T>*, U, memory_order);     \
  template <class T, class U> T name(volatile __global atomic<T>*, U, memory_order); \
  template <class T, class U> T name(volatile __local atomic<T>*, U, memory_order);
MPS_ATOMIC(atomic_fetch_add_explicit) MPS_ATOMIC(atomic_fetch_sub_explicit)
MPS_ATOMIC(atomic_fetch_min_explicit) MPS_ATOMIC(atomic_fetch_max_explicit)
MPS_ATOMIC(atomic_fetch_and_explicit) MPS_ATOMIC(atomic_fetch_or_explicit)
MPS_ATOMIC(atomic_fetch_xor_explicit) MPS_ATOMIC(atomic_exchange_explicit)
#undef MPS_ATOMIC
template <class T, class U> void atomic_store_explicit(__global atomic<T>*, U, memory_order);
template <class T, class U> void atomic_store_explicit(__local atomic<T>*, U, memory_order);
template <class T> T atomic_load_explicit(const __global atomic<T>*, memory_order);
template <class T> T atomic_load_explicit(const __local atomic<T>*, memory_order);
template <class T, class U>
bool atomic_compare_exchange_weak_explicit(__global atomic<T>*, __private T*, U, memory_order, memory_order);
template <class T, class U>
bool atomic_compare_exchange_weak_explicit(__local atomic<T>*, __private T*, U, memory_order, memory_order);

}  // namespace metal

using namespace metal;

// ---- MLX's preamble (bf16.h, complex.h, utils.h) ------------------------------
typedef half float16_t;
typedef bfloat bfloat16_t;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;
struct complex64_t {
  float real;
  float imag;
  constexpr complex64_t(float r, float i) : real(r), imag(i) {}
  constexpr complex64_t(float r) : real(r), imag(0) {}
  complex64_t() = default;
  complex64_t(const complex64_t&) = default;
  complex64_t(const __constant complex64_t&);
  complex64_t& operator=(const complex64_t&) = default;
};
complex64_t operator+(complex64_t, complex64_t);
complex64_t operator-(complex64_t, complex64_t);
complex64_t operator*(complex64_t, complex64_t);
complex64_t operator/(complex64_t, complex64_t);
complex64_t operator-(complex64_t);
bool operator==(complex64_t, complex64_t);
bool operator!=(complex64_t, complex64_t);
template <class T> struct Limits {
  static constexpr constant T max = T();
  static constexpr constant T min = T();
  static constexpr constant T finite_max = T();
  static constexpr constant T finite_min = T();
};
template <class IdxT = int64_t>
IdxT elem_to_loc(IdxT elem, const __constant int* shape, const __constant int64_t* strides, int ndim);
template <class IdxT = int64_t>
IdxT elem_to_loc(uint3 elem, const __constant int* shape, const __constant int64_t* strides, int ndim);
int64_t elem_to_loc_1(uint elem, int64_t stride);
int64_t elem_to_loc_2(uint2 elem, const __constant int64_t strides[2]);
int64_t elem_to_loc_3(uint3 elem, const __constant int64_t strides[3]);
template <class T> T ceildiv(T, T);

// ---- threadgroup storage: see strict.py (threadgroup variables are declared in a
// non-kernel function here, so they bind to storage of the __local space) --------
template <class T> __local T* mps_threadgroup_storage();

// ---- names last: they must not touch the declarations above ---------------------
// Metal's atomic typedefs, as macros (see `atomic` above).
#define atomic_int metal::atomic<int>
#define atomic_uint metal::atomic<uint>
#define atomic_float metal::atomic<float>
#define atomic_bool metal::atomic<bool>
// OpenCL keywords that are ordinary identifiers in Metal (a variable named `local`).
// strict.py spells the diagnostics back.
#define local mps_kw_local
#define global mps_kw_global
#define private mps_kw_private
#define kernel mps_kw_kernel
#define read_only mps_kw_read_only
#define write_only mps_kw_write_only
#define read_write mps_kw_read_write
#define pipe mps_kw_pipe
// Metal does not support these: goto (MSL spec, "C++ features not supported"),
// union (Apple's compiler: "... not supported in Metal"), double (no such Metal type). clang
// reports a poisoned identifier at each use; strict.py names it.
#pragma GCC poison union goto double
// bfloat is a Metal type from MSL 3.1 on; MLX's bfloat16_t exists in every version
// (its bf16.h emulates it before 3.1).
#if __METAL_VERSION__ < 310
#define bfloat mps_bfloat_needs_msl_3_1
#define bfloat2 mps_bfloat_needs_msl_3_1
#define bfloat3 mps_bfloat_needs_msl_3_1
#define bfloat4 mps_bfloat_needs_msl_3_1
#endif
