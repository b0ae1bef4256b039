// metal_types.h: the parts of the Metal Shading Language (MSL) standard
// library that MLX custom kernels use, written so that kernel bodies compile
// unchanged as C++17 and compute what an Apple GPU computes: IEEE binary32
// with round-to-nearest-even, no contraction (fma only when written).
//
// Include standard headers *before* this one: the address-space qualifiers
// below are empty macros, which would rewrite identifiers such as `thread`
// inside headers included later.
//
// Deliberately not included: <cmath>, <math.h>, <cstdlib>, <algorithm>.  With
// libc++ (zig's clang) <cmath> puts non-template `float sqrt(float)` etc. in
// the global namespace, where `using namespace metal;` would make a plain
// `sqrt(x)` ambiguous.  Math here uses compiler builtins (__builtin_sqrtf...),
// and the scalar math functions are constrained templates, so if another
// header does bring those globals in, same-type calls still resolve (to the
// global non-template, same float semantics); mixed calls such as pow(x, 2)
// then clash with libc++'s templates, so keep <cmath> out of kernel TUs.
//
// half is _Float16.  clang keeps half expressions in float until the end of a
// full expression unless given `-Xclang -ffloat16-excess-precision=none`; use
// that flag to get the GPU's per-operation rounding.  Vector ops and the math
// functions here round per operation regardless.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

// Address spaces and function qualifiers mean nothing on the CPU.
// (threadgroup is defined by the emulator runtime, not here.)
#define device
#define constant
#define thread
#ifndef METAL_FUNC
#define METAL_FUNC inline
#endif
#ifndef MLX_MTL_PRAGMA_UNROLL
// Empty: an unroll pragma on a loop with a runtime bound makes clang warn.
#define MLX_MTL_PRAGMA_UNROLL
#endif

// <metal_math>'s constants (float).
#ifndef INFINITY
#define INFINITY __builtin_inff()
#endif
#ifndef HUGE_VALF
#define HUGE_VALF __builtin_huge_valf()
#endif
#ifndef NAN
#define NAN __builtin_nanf("")
#endif
#ifndef MAXFLOAT
#define MAXFLOAT 0x1.fffffep127f
#endif
#ifndef M_E_F
#define M_E_F 2.71828182845904523536f
#endif
#ifndef M_LOG2E_F
#define M_LOG2E_F 1.44269504088896340736f
#endif
#ifndef M_LOG10E_F
#define M_LOG10E_F 0.434294481903251827651f
#endif
#ifndef M_LN2_F
#define M_LN2_F 0.693147180559945309417f
#endif
#ifndef M_LN10_F
#define M_LN10_F 2.30258509299404568402f
#endif
#ifndef M_PI_F
#define M_PI_F 3.14159265358979323846f
#endif
#ifndef M_PI_2_F
#define M_PI_2_F 1.57079632679489661923f
#endif
#ifndef M_PI_4_F
#define M_PI_4_F 0.785398163397448309616f
#endif
#ifndef M_1_PI_F
#define M_1_PI_F 0.318309886183790671538f
#endif
#ifndef M_2_PI_F
#define M_2_PI_F 0.636619772367581343076f
#endif
#ifndef M_2_SQRTPI_F
#define M_2_SQRTPI_F 1.12837916709551257390f
#endif
#ifndef M_SQRT2_F
#define M_SQRT2_F 1.41421356237309504880f
#endif
#ifndef M_SQRT1_2_F
#define M_SQRT1_2_F 0.707106781186547524401f
#endif

// MSL builtin scalar names live in the global namespace, as in MSL.  Plain
// typedefs, so they coexist with glibc's identical <sys/types.h> ones.
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef std::uint64_t ulong;
typedef _Float16 half;
typedef _Float16 float16_t;

namespace metal {

// ---------------------------------------------------------------------------
// Type traits (MSL offers the <type_traits> set in namespace metal)
// ---------------------------------------------------------------------------
using std::conditional;
using std::conditional_t;
using std::decay;
using std::decay_t;
using std::declval;
using std::enable_if;
using std::enable_if_t;
using std::false_type;
using std::integral_constant;
using std::is_convertible;
using std::is_convertible_v;
using std::is_integral;
using std::is_integral_v;
using std::is_pointer_v;
using std::is_same;
using std::is_same_v;
using std::is_unsigned;
using std::is_unsigned_v;
using std::make_signed_t;
using std::make_unsigned_t;
using std::remove_const_t;
using std::remove_cv;
using std::remove_cv_t;
using std::remove_reference_t;
using std::true_type;
using std::bool_constant;
using std::remove_const;
using std::remove_reference;
using std::remove_pointer;
using std::remove_pointer_t;
using std::remove_volatile;
using std::remove_volatile_t;
using std::is_const;
using std::is_const_v;
// No void_t: Metal's library has none, and MLX's steel/utils/type_traits.h defines
// metal::void_t itself. Address spaces are empty macros here, so Metal's
// remove_addrspace leaves the type as it is.
template <class T> struct remove_addrspace { typedef T type; };
template <class T> using remove_addrspace_t = T;

// ---------------------------------------------------------------------------
// bfloat16: 16 stored bits; arithmetic goes through float and rounds back
// (RNE).  For +,-,*,/ and sqrt that is the correctly rounded bf16 result,
// because float carries more than 2*8+2 significand bits.
// ---------------------------------------------------------------------------
//
// Conversions follow Metal's native `bfloat`: bfloat -> float is implicit,
// anything else (float, half, double -> bfloat; bfloat -> half, integers) needs
// an explicit conversion, except integer -> bfloat, which stays implicit so that
// `c ? b : 0` and `T x = 0` compile and mean bfloat, as in Metal (a class type
// cannot convert both ways implicitly without making `?:` ambiguous).
struct bfloat16_t {
  uint16_t bits_;

  bfloat16_t() = default;
  template <class U, std::enable_if_t<std::is_integral<U>::value, int> = 0>
  constexpr bfloat16_t(U x) : bits_(convert(x)) {}
  template <class U,
            std::enable_if_t<std::is_floating_point<U>::value ||
                                 std::is_same<U, _Float16>::value,
                             int> = 0>
  constexpr explicit bfloat16_t(U x) : bits_(convert(x)) {}
  // Templates, so that no implicit bfloat -> float -> int chain exists.
  template <class U, std::enable_if_t<std::is_same<U, float>::value, int> = 0>
  constexpr operator U() const {
    return __builtin_bit_cast(float, uint32_t(bits_) << 16);
  }
  template <class U,
            std::enable_if_t<!std::is_same<U, float>::value &&
                                 (std::is_arithmetic<U>::value ||
                                  std::is_same<U, _Float16>::value),
                             int> = 0>
  constexpr explicit operator U() const {
    return U(__builtin_bit_cast(float, uint32_t(bits_) << 16));
  }
  static constexpr bfloat16_t from_bits(uint16_t b) { return {b, raw{}}; }

  // Round-to-nearest-even from float; NaNs stay NaN and become quiet.
  static constexpr uint16_t from_float(float f) {
    uint32_t u = __builtin_bit_cast(uint32_t, f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x40u);
    return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  }
  // From double in one rounding: first round to float "to odd" (truncate,
  // then set the last bit if inexact), which makes the final RNE exact.
  static constexpr uint16_t from_double(double d) {
    float f = float(d);
    if (f == f && double(f) != d) {
      uint32_t u = __builtin_bit_cast(uint32_t, f);
      double af = f < 0 ? -double(f) : double(f), ad = d < 0 ? -d : d;
      if (af > ad) u -= 1;  // RNE went away from zero: step back
      f = __builtin_bit_cast(float, u | 1u);
    }
    return from_float(f);
  }

 private:
  struct raw {};
  constexpr bfloat16_t(uint16_t b, raw) : bits_(b) {}
  template <class U>
  static constexpr uint16_t convert(U x) {
    if constexpr (std::is_same<U, float>::value ||
                  std::is_same<U, _Float16>::value ||
                  std::is_same<U, bool>::value)
      return from_float(float(x));
    else
      return from_double(double(x));  // ints and double: one rounding
  }
};
typedef bfloat16_t bfloat;

namespace detail {
template <class T>
constexpr bool is_bf = std::is_same<T, bfloat16_t>::value;
template <class T>
constexpr bool is_num = std::is_arithmetic<T>::value ||
                        std::is_same<T, half>::value || is_bf<T>;
template <class T>
constexpr bool is_fp = std::is_floating_point<T>::value ||
                       std::is_same<T, half>::value || is_bf<T>;

// bfloat op X: with another bfloat or an integer the result is bfloat; with
// float/half/double it is float (MLX's bf16 rules).
template <class A, class B,
          bool = (is_bf<A> && is_num<B>) || (is_num<A> && is_bf<B>)>
struct bf_op {};
template <class A, class B>
struct bf_op<A, B, true> {
  using other = std::conditional_t<is_bf<A>, B, A>;
  using type = std::conditional_t<
      is_bf<other> || std::is_integral<other>::value, bfloat16_t, float>;
};
}  // namespace detail

#define MTL_BF_ARITH(op)                                                      \
  template <class A, class B, class R = typename detail::bf_op<A, B>::type>   \
  constexpr R operator op(A a, B b) {                                         \
    return R(float(a) op float(b));                                           \
  }                                                                           \
  template <class B, std::enable_if_t<detail::is_num<B>, int> = 0>            \
  constexpr bfloat16_t& operator op##=(bfloat16_t& a, B b) {                  \
    return a = bfloat16_t(float(a) op float(b));                              \
  }
MTL_BF_ARITH(+)
MTL_BF_ARITH(-)
MTL_BF_ARITH(*)
MTL_BF_ARITH(/)
#undef MTL_BF_ARITH
#define MTL_BF_CMP(op)                                                        \
  template <class A, class B, class = typename detail::bf_op<A, B>::type>     \
  constexpr bool operator op(A a, B b) {                                      \
    return float(a) op float(b);                                              \
  }
MTL_BF_CMP(==)
MTL_BF_CMP(!=)
MTL_BF_CMP(<)
MTL_BF_CMP(<=)
MTL_BF_CMP(>)
MTL_BF_CMP(>=)
#undef MTL_BF_CMP
constexpr bfloat16_t operator-(bfloat16_t a) {  // exact: flip the sign bit
  return bfloat16_t::from_bits(uint16_t(a.bits_ ^ 0x8000u));
}
constexpr bfloat16_t operator+(bfloat16_t a) { return a; }
constexpr bfloat16_t& operator++(bfloat16_t& a) { return a += 1; }
constexpr bfloat16_t& operator--(bfloat16_t& a) { return a -= 1; }
constexpr bfloat16_t operator++(bfloat16_t& a, int) {
  bfloat16_t o = a;
  a += 1;
  return o;
}
constexpr bfloat16_t operator--(bfloat16_t& a, int) {
  bfloat16_t o = a;
  a -= 1;
  return o;
}

// MSL's traits count half and bfloat as floating point.
template <class T>
struct is_floating_point
    : std::integral_constant<bool, detail::is_fp<std::remove_cv_t<T>>> {};
template <class T>
constexpr bool is_floating_point_v = is_floating_point<T>::value;
template <class T>
struct is_arithmetic
    : std::integral_constant<bool, detail::is_num<std::remove_cv_t<T>>> {};
template <class T>
constexpr bool is_arithmetic_v = is_arithmetic<T>::value;
template <class T>
struct is_signed : std::integral_constant<bool, std::is_signed<T>::value ||
                                                    is_floating_point_v<T>> {};
template <class T>
constexpr bool is_signed_v = is_signed<T>::value;

// ---------------------------------------------------------------------------
// numeric_limits: std's, plus half and bfloat
// ---------------------------------------------------------------------------
template <class T>
struct numeric_limits : std::numeric_limits<T> {};

namespace detail {
template <int Digits, int MaxExp>
struct fp_limits_base {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool is_iec559 = true;
  static constexpr int radix = 2;
  static constexpr int digits = Digits;
  static constexpr int max_exponent = MaxExp;
  static constexpr int min_exponent = 3 - MaxExp;
};
}  // namespace detail
template <>
struct numeric_limits<half> : detail::fp_limits_base<11, 16> {
  static constexpr half min() { return half(0x1p-14f); }
  static constexpr half max() { return half(65504.0f); }
  static constexpr half lowest() { return half(-65504.0f); }
  static constexpr half epsilon() { return half(0x1p-10f); }
  static constexpr half denorm_min() { return half(0x1p-24f); }
  static constexpr half infinity() { return half(__builtin_huge_valf()); }
  static constexpr half quiet_NaN() { return half(__builtin_nanf("")); }
};
template <>
struct numeric_limits<bfloat16_t> : detail::fp_limits_base<8, 128> {
  using T = bfloat16_t;
  static constexpr T min() { return T::from_bits(0x0080); }
  static constexpr T max() { return T::from_bits(0x7F7F); }
  static constexpr T lowest() { return T::from_bits(0xFF7F); }
  static constexpr T epsilon() { return T::from_bits(0x3C00); }
  static constexpr T denorm_min() { return T::from_bits(0x0001); }
  static constexpr T infinity() { return T::from_bits(0x7F80); }
  static constexpr T quiet_NaN() { return T::from_bits(0x7FC0); }
};

// ---------------------------------------------------------------------------
// Vectors.  vec<T,N> derives from vec_base<T,N>, an anonymous union of the
// storage d[N], the named components (x y z w / r g b a) and one member per
// swizzle.  A swizzle member (swz) is a view of the same storage that converts
// to vec and, if its components are distinct, can be assigned to.  Size and
// alignment follow MSL: a 3-vector occupies a 4-vector's space.
// ---------------------------------------------------------------------------
template <class T, int N>
struct vec;
template <class T, int N, int... I>
struct swz;

namespace detail {
template <class T>
struct vt {
  static constexpr bool is_vec = false;
  static constexpr int n = 1;
  using elem = T;
};
template <class T, int N>
struct vt<vec<T, N>> {
  static constexpr bool is_vec = true;
  static constexpr int n = N;
  using elem = T;
};
template <class T, int N, int... I>
struct vt<swz<T, N, I...>> {
  static constexpr bool is_vec = true;
  static constexpr int n = int(sizeof...(I));
  using elem = T;
};
template <class T>
constexpr bool is_vecish = vt<T>::is_vec;
template <class T>
using elem_t = typename vt<T>::elem;
template <class T>
constexpr int n_of = vt<T>::n;

template <int... I>
constexpr bool distinct() {
  const int v[] = {I...};
  for (unsigned i = 0; i < sizeof...(I); ++i)
    for (unsigned j = i + 1; j < sizeof...(I); ++j)
      if (v[i] == v[j]) return false;
  return true;
}

// Component i of a vector, swizzle, or (broadcast) scalar.
template <class T, int N>
constexpr T comp(const vec<T, N>& v, int i) {
  return v.d[i];
}
template <class T, int N, int... I>
constexpr T comp(const swz<T, N, I...>& s, int i) {
  constexpr int idx[] = {I...};
  return s.d[idx[i]];
}
template <class S, std::enable_if_t<is_num<S>, int> = 0>
constexpr S comp(const S& s, int) {
  return s;
}

// Total component count of constructor arguments, -1 if one is not
// a scalar or vector.
template <class... A>
constexpr int count_n() {
  bool ok = ((is_num<A> || is_vecish<A>) && ...);
  return ok ? (n_of<A> + ...) : -1;
}

template <class T, int N>
constexpr std::size_t valign = sizeof(T) * (N == 3 ? 4 : N);

template <class T, int N>
struct vec_base;

#define MTL_I_x 0
#define MTL_I_y 1
#define MTL_I_z 2
#define MTL_I_w 3
// MTL_E<k>_<n>(M, p...): M(p..., c) for each component c of an n-vector.
// One macro per nesting level, since a macro cannot expand inside itself.
#define MTL_EA_2(M, ...) M(__VA_ARGS__, x) M(__VA_ARGS__, y)
#define MTL_EB_2(M, ...) M(__VA_ARGS__, x) M(__VA_ARGS__, y)
#define MTL_EC_2(M, ...) M(__VA_ARGS__, x) M(__VA_ARGS__, y)
#define MTL_ED_2(M, ...) M(__VA_ARGS__, x) M(__VA_ARGS__, y)
#define MTL_EA_3(M, ...) MTL_EA_2(M, __VA_ARGS__) M(__VA_ARGS__, z)
#define MTL_EB_3(M, ...) MTL_EB_2(M, __VA_ARGS__) M(__VA_ARGS__, z)
#define MTL_EC_3(M, ...) MTL_EC_2(M, __VA_ARGS__) M(__VA_ARGS__, z)
#define MTL_ED_3(M, ...) MTL_ED_2(M, __VA_ARGS__) M(__VA_ARGS__, z)
#define MTL_EA_4(M, ...) MTL_EA_3(M, __VA_ARGS__) M(__VA_ARGS__, w)
#define MTL_EB_4(M, ...) MTL_EB_3(M, __VA_ARGS__) M(__VA_ARGS__, w)
#define MTL_EC_4(M, ...) MTL_EC_3(M, __VA_ARGS__) M(__VA_ARGS__, w)
#define MTL_ED_4(M, ...) MTL_ED_3(M, __VA_ARGS__) M(__VA_ARGS__, w)
#define MTL_SWZ1(n, a) MTL_EB_##n(MTL_SWZ2, n, a)
#define MTL_SWZ2(n, a, b)                                                     \
  swz<T, n, MTL_I_##a, MTL_I_##b> a##b;                                       \
  MTL_EC_##n(MTL_SWZ3, n, a, b)
#define MTL_SWZ3(n, a, b, c)                                                  \
  swz<T, n, MTL_I_##a, MTL_I_##b, MTL_I_##c> a##b##c;                         \
  MTL_ED_##n(MTL_SWZ4, n, a, b, c)
#define MTL_SWZ4(n, a, b, c, d)                                               \
  swz<T, n, MTL_I_##a, MTL_I_##b, MTL_I_##c, MTL_I_##d> a##b##c##d;
#define MTL_SWIZZLES(n) MTL_EA_##n(MTL_SWZ1, n)

template <class T>
struct alignas(valign<T, 2>) vec_base<T, 2> {
  union {
    T d[2];
    struct { T x, y; };
    struct { T r, g; };
    MTL_SWIZZLES(2)
  };
};
template <class T>
struct alignas(valign<T, 3>) vec_base<T, 3> {
  union {
    T d[3];
    struct { T x, y, z; };
    struct { T r, g, b; };
    MTL_SWIZZLES(3)
  };
};
template <class T>
struct alignas(valign<T, 4>) vec_base<T, 4> {
  union {
    T d[4];
    struct { T x, y, z, w; };
    struct { T r, g, b, a; };
    MTL_SWIZZLES(4)
  };
};
}  // namespace detail
#undef MTL_I_x
#undef MTL_I_y
#undef MTL_I_z
#undef MTL_I_w
#undef MTL_EA_2
#undef MTL_EB_2
#undef MTL_EC_2
#undef MTL_ED_2
#undef MTL_EA_3
#undef MTL_EB_3
#undef MTL_EC_3
#undef MTL_ED_3
#undef MTL_EA_4
#undef MTL_EB_4
#undef MTL_EC_4
#undef MTL_ED_4
#undef MTL_SWZ1
#undef MTL_SWZ2
#undef MTL_SWZ3
#undef MTL_SWZ4
#undef MTL_SWIZZLES

template <class T, int N, int... I>
struct swz {
  static constexpr int M = int(sizeof...(I));
  T d[N];  // the whole vector's storage; components I... are viewed

  operator vec<T, M>() const {
    constexpr int idx[] = {I...};
    vec<T, M> r;
    for (int k = 0; k < M; ++k) r.d[k] = d[idx[k]];
    return r;
  }
  swz& operator=(const swz& o) {
    vec<T, M> t = o;
    return *this = t;
  }
  // From a scalar (broadcast), vector or swizzle.  The source is copied
  // first, so `v.xy = v.yx` works.
  template <class R>
  swz& operator=(const R& src) {
    static_assert(detail::distinct<I...>(),
                  "swizzle with repeated components is not assignable");
    vec<T, M> t(src);
    constexpr int idx[] = {I...};
    for (int k = 0; k < M; ++k) d[idx[k]] = t.d[k];
    return *this;
  }
};

template <class T, int N>
struct vec : detail::vec_base<T, N> {
  using value_type = T;
  using base = detail::vec_base<T, N>;

  vec() = default;
  vec(const vec&) = default;
  constexpr vec& operator=(const vec& o) {
    for (int i = 0; i < N; ++i) this->d[i] = o.d[i];
    return *this;
  }
  // Broadcast a scalar.
  template <class U, std::enable_if_t<detail::is_num<U>, int> = 0>
  constexpr vec(U s) : base{} {
    for (int i = 0; i < N; ++i) this->d[i] = static_cast<T>(s);
  }
  // N scalars, or any mix of scalars and vectors totalling N components:
  // float4(a, b, c, d), float4(v2, z, w), float3(v2, 1.0f), {a, b}, ...
  template <class A0, class A1, class... As,
            std::enable_if_t<detail::count_n<A0, A1, As...>() == N, int> = 0>
  constexpr vec(const A0& a0, const A1& a1, const As&... as) : base{} {
    int k = 0;
    put(k, a0);
    put(k, a1);
    (put(k, as), ...);
  }
  // Element-type conversion is explicit, as in MSL: float4(int4).
  template <class U, std::enable_if_t<!std::is_same<U, T>::value, int> = 0>
  constexpr explicit vec(const vec<U, N>& o) : base{} {
    for (int i = 0; i < N; ++i) this->d[i] = static_cast<T>(o.d[i]);
  }
  template <class U, int M, int... I,
            std::enable_if_t<sizeof...(I) == std::size_t(N), int> = 0>
  constexpr explicit vec(const swz<U, M, I...>& s) : base{} {
    for (int i = 0; i < N; ++i)
      this->d[i] = static_cast<T>(detail::comp(s, i));
  }

  constexpr T& operator[](int i) { return this->d[i]; }
  constexpr const T& operator[](int i) const { return this->d[i]; }

 private:
  template <class A>
  constexpr void put(int& k, const A& a) {
    if constexpr (detail::is_vecish<A>) {
      for (int i = 0; i < detail::n_of<A>; ++i)
        this->d[k++] = static_cast<T>(detail::comp(a, i));
    } else {
      this->d[k++] = static_cast<T>(a);
    }
  }
};

#define MTL_VEC_TYPEDEFS(T, name)                                             \
  typedef vec<T, 2> name##2;                                                  \
  typedef vec<T, 3> name##3;                                                  \
  typedef vec<T, 4> name##4;
MTL_VEC_TYPEDEFS(float, float)
MTL_VEC_TYPEDEFS(half, half)
MTL_VEC_TYPEDEFS(bfloat16_t, bfloat)
MTL_VEC_TYPEDEFS(int, int)
MTL_VEC_TYPEDEFS(uint, uint)
MTL_VEC_TYPEDEFS(short, short)
MTL_VEC_TYPEDEFS(ushort, ushort)
MTL_VEC_TYPEDEFS(char, char)
MTL_VEC_TYPEDEFS(uchar, uchar)
MTL_VEC_TYPEDEFS(bool, bool)
MTL_VEC_TYPEDEFS(int64_t, long)
MTL_VEC_TYPEDEFS(ulong, ulong)
#undef MTL_VEC_TYPEDEFS

static_assert(sizeof(float2) == 8 && alignof(float2) == 8, "MSL layout");
static_assert(sizeof(float3) == 16 && alignof(float3) == 16, "MSL layout");
static_assert(sizeof(float4) == 16 && alignof(float4) == 16, "MSL layout");
static_assert(sizeof(half3) == 8 && sizeof(bool3) == 4, "MSL layout");

// ---------------------------------------------------------------------------
// Vector operators: component-wise; a scalar operand is converted to the
// vector's element type and broadcast.  Vector-vector operands must agree in
// element type and length (MSL does not convert implicitly either).
// ---------------------------------------------------------------------------
namespace detail {
template <class A, class B, class = void>
struct vbin {};
template <class A, class B>
struct vbin<A, B,
            std::enable_if_t<is_vecish<A> && is_vecish<B> &&
                             std::is_same<elem_t<A>, elem_t<B>>::value &&
                             n_of<A> == n_of<B>>> {
  using E = elem_t<A>;
  static constexpr int n = n_of<A>;
};
template <class A, class B>
struct vbin<A, B, std::enable_if_t<is_vecish<A> && is_num<B>>> {
  using E = elem_t<A>;
  static constexpr int n = n_of<A>;
};
template <class A, class B>
struct vbin<A, B, std::enable_if_t<is_num<A> && is_vecish<B>>> {
  using E = elem_t<B>;
  static constexpr int n = n_of<B>;
};
// The GPU wraps signed integer + - * << and -x; doing them in the unsigned
// type gives that result without C++ undefined behaviour.
template <class E>
using wrap_t = typename std::conditional_t<
    std::is_integral<E>::value && std::is_signed<E>::value,
    std::make_unsigned<std::conditional_t<(sizeof(E) < sizeof(int)), int, E>>,
    std::enable_if<true, E>>::type;
}  // namespace detail

#define MTL_VEC_BINOP(op, C)                                                  \
  template <class A, class B, class P = detail::vbin<A, B>,                   \
            class E = typename P::E>                                          \
  constexpr vec<E, P::n> operator op(const A& a, const B& b) {                \
    vec<E, P::n> r{};                                                         \
    for (int i = 0; i < P::n; ++i)                                            \
      r.d[i] = static_cast<E>(C(static_cast<E>(detail::comp(a, i)))           \
                                  op C(static_cast<E>(detail::comp(b, i))));  \
    return r;                                                                 \
  }                                                                           \
  template <class A, class B, std::enable_if_t<detail::is_vecish<A>, int> = 0> \
  constexpr A& operator op##=(A& a, const B& b) {                             \
    a = a op b;                                                               \
    return a;                                                                 \
  }
#define MTL_W detail::wrap_t<E>
MTL_VEC_BINOP(+, MTL_W)
MTL_VEC_BINOP(-, MTL_W)
MTL_VEC_BINOP(*, MTL_W)
MTL_VEC_BINOP(/, E)
MTL_VEC_BINOP(%, E)
MTL_VEC_BINOP(&, E)
MTL_VEC_BINOP(|, E)
MTL_VEC_BINOP(^, E)
MTL_VEC_BINOP(<<, MTL_W)
MTL_VEC_BINOP(>>, E)
#undef MTL_VEC_BINOP
#undef MTL_W

#define MTL_VEC_BOOLOP(op, conv)                                              \
  template <class A, class B, class P = detail::vbin<A, B>,                   \
            class E = typename P::E>                                          \
  constexpr vec<bool, P::n> operator op(const A& a, const B& b) {             \
    vec<bool, P::n> r{};                                                      \
    for (int i = 0; i < P::n; ++i)                                            \
      r.d[i] = conv(detail::comp(a, i)) op conv(detail::comp(b, i));          \
    return r;                                                                 \
  }
MTL_VEC_BOOLOP(==, static_cast<E>)
MTL_VEC_BOOLOP(!=, static_cast<E>)
MTL_VEC_BOOLOP(<, static_cast<E>)
MTL_VEC_BOOLOP(<=, static_cast<E>)
MTL_VEC_BOOLOP(>, static_cast<E>)
MTL_VEC_BOOLOP(>=, static_cast<E>)
MTL_VEC_BOOLOP(&&, static_cast<bool>)
MTL_VEC_BOOLOP(||, static_cast<bool>)
#undef MTL_VEC_BOOLOP

#define MTL_VEC_UNOP(op, R, C)                                                \
  template <class A, std::enable_if_t<detail::is_vecish<A>, int> = 0,         \
            class E = detail::elem_t<A>>                                      \
  constexpr vec<R, detail::n_of<A>> operator op(const A& a) {                 \
    vec<R, detail::n_of<A>> r{};                                              \
    for (int i = 0; i < detail::n_of<A>; ++i)                                 \
      r.d[i] = static_cast<R>(op static_cast<C>(detail::comp(a, i)));         \
    return r;                                                                 \
  }
MTL_VEC_UNOP(-, E, detail::wrap_t<E>)
MTL_VEC_UNOP(+, E, E)
MTL_VEC_UNOP(~, E, E)
MTL_VEC_UNOP(!, bool, E)
#undef MTL_VEC_UNOP

template <class A, std::enable_if_t<detail::is_vecish<A>, int> = 0>
constexpr A& operator++(A& a) {
  return a += detail::elem_t<A>(1);
}
template <class A, std::enable_if_t<detail::is_vecish<A>, int> = 0>
constexpr A& operator--(A& a) {
  return a -= detail::elem_t<A>(1);
}
template <class A, std::enable_if_t<detail::is_vecish<A>, int> = 0>
constexpr vec<detail::elem_t<A>, detail::n_of<A>> operator++(A& a, int) {
  vec<detail::elem_t<A>, detail::n_of<A>> o = a;
  ++a;
  return o;
}
template <class A, std::enable_if_t<detail::is_vecish<A>, int> = 0>
constexpr vec<detail::elem_t<A>, detail::n_of<A>> operator--(A& a, int) {
  vec<detail::elem_t<A>, detail::n_of<A>> o = a;
  --a;
  return o;
}

template <class A, std::enable_if_t<detail::is_vecish<A>, int> = 0>
constexpr bool all(const A& a) {
  for (int i = 0; i < detail::n_of<A>; ++i)
    if (!detail::comp(a, i)) return false;
  return true;
}
template <class A, std::enable_if_t<detail::is_vecish<A>, int> = 0>
constexpr bool any(const A& a) {
  for (int i = 0; i < detail::n_of<A>; ++i)
    if (detail::comp(a, i)) return true;
  return false;
}
constexpr bool all(bool b) { return b; }
constexpr bool any(bool b) { return b; }

// ---------------------------------------------------------------------------
// as_type: reinterpret the bytes of a same-size scalar or vector.
// ---------------------------------------------------------------------------
template <class To, class From>
inline To as_type(const From& x) {
  static_assert(sizeof(To) == sizeof(From), "as_type: sizes differ");
  To r;
  __builtin_memcpy(static_cast<void*>(&r), static_cast<const void*>(&x),
                   sizeof(To));
  return r;
}
template <class To, class T, int N, int... I>
inline To as_type(const swz<T, N, I...>& s) {
  return as_type<To>(vec<T, int(sizeof...(I))>(s));
}

// ---------------------------------------------------------------------------
// Math.  Scalar functions are templates over float / half / bfloat (and
// double, computed in float since Metal has none): they evaluate in float
// with the float libm routine and round to the argument type (see the top of
// the file for why they are templates).  Vector and swizzle arguments are
// mapped component-wise; scalars next to vectors are broadcast.
// ---------------------------------------------------------------------------
namespace detail {
// Result type of a math call: the one floating type among the arguments
// (integers adopt it); float when several floating types are mixed.
template <class X, class Y>
using fmerge = std::conditional_t<
    std::is_void<X>::value, Y,
    std::conditional_t<std::is_void<Y>::value || std::is_same<X, Y>::value, X,
                       float>>;
template <class... T>
struct fpick {
  using type = void;
};
template <class H, class... T>
struct fpick<H, T...> {
  using type = fmerge<std::conditional_t<is_fp<H>, H, void>,
                      typename fpick<T...>::type>;
};
template <class... T>
using fcommon_t =
    std::enable_if_t<(is_num<T> && ...) &&
                         !std::is_void<typename fpick<T...>::type>::value,
                     typename fpick<T...>::type>;
// min/max/clamp/select also take integers.
template <class A, class B, class = void>
struct ncommon {};
template <class A, class B>
struct ncommon<A, B, std::enable_if_t<is_num<A> && is_num<B>>> {
  using type = std::conditional_t<
      std::is_same<A, B>::value, A,
      typename std::conditional_t<is_fp<A> || is_fp<B>, fpick<A, B>,
                                  std::common_type<A, B>>::type>;
};
template <class A, class B>
using ncommon_t = typename ncommon<A, B>::type;

template <class... A>
struct first_vec {};
template <class H, class... A>
struct first_vec<H, A...>
    : std::conditional_t<is_vecish<H>, vt<H>, first_vec<A...>> {};
template <class... A>
constexpr bool any_vec = (is_vecish<A> || ...);

template <class E, class A>
constexpr auto ecomp(const A& a, int i) {
  if constexpr (is_vecish<A>)
    return comp(a, i);
  else
    return static_cast<E>(a);
}
// Apply f component-wise; vectors must have equal length, scalars are
// converted to the first vector's element type.
template <class F, class... A>
constexpr auto vmap(F f, const A&... a) {
  using E = typename first_vec<A...>::elem;
  constexpr int n = first_vec<A...>::n;
  static_assert(((!is_vecish<A> || n_of<A> == n) && ...),
                "vector lengths differ");
  using R = decltype(f(ecomp<E>(a, 0)...));
  vec<R, n> r{};
  for (int i = 0; i < n; ++i) r.d[i] = f(ecomp<E>(a, i)...);
  return r;
}

// x*y+z rounded once to half/bfloat: the product of two such values is
// exact in double, the sum is rounded "to odd" in double (TwoSum tells
// whether it was exact), and the final narrowing then rounds correctly.
inline double fma_to_odd(double x, double y, double z) {
  double p = x * y;
  double s = p + z;
  double bb = s - p;
  double e = (p - (s - bb)) + (z - bb);
  if (e != 0) {
    uint64_t u = __builtin_bit_cast(uint64_t, s);
    if (!(u & 1)) u += ((e > 0) == (s > 0)) ? 1 : uint64_t(-1);
    s = __builtin_bit_cast(double, u);
  }
  return s;
}
}  // namespace detail

#define MTL_VEC_OVERLOAD1(name)                                               \
  template <class V, std::enable_if_t<detail::is_vecish<V>, int> = 0>         \
  inline auto name(const V& v) {                                              \
    return detail::vmap([](auto e) { return name(e); }, v);                   \
  }
#define MTL_FP1(name, expr)                                                   \
  template <class T, std::enable_if_t<detail::is_fp<T>, int> = 0>             \
  inline T name(T x_) {                                                       \
    const float x = float(x_);                                                \
    return T(expr);                                                           \
  }                                                                           \
  MTL_VEC_OVERLOAD1(name)
#define MTL_FPPRED(name, expr)                                                \
  template <class T, std::enable_if_t<detail::is_fp<T>, int> = 0>             \
  inline bool name(T x_) {                                                    \
    const float x = float(x_);                                                \
    return (expr);                                                            \
  }                                                                           \
  MTL_VEC_OVERLOAD1(name)
#define MTL_VEC_OVERLOAD2(name)                                               \
  template <class A, class B,                                                 \
            std::enable_if_t<detail::any_vec<A, B>, int> = 0>                 \
  inline auto name(const A& a, const B& b) {                                  \
    return detail::vmap([](auto p, auto q) { return name(p, q); }, a, b);     \
  }
#define MTL_FP2(name, expr)                                                   \
  template <class A, class B, class R = detail::fcommon_t<A, B>>              \
  inline R name(A x_, B y_) {                                                 \
    const float x = float(x_), y = float(y_);                                 \
    return R(expr);                                                           \
  }                                                                           \
  MTL_VEC_OVERLOAD2(name)
#define MTL_VEC_OVERLOAD3(name)                                               \
  template <class A, class B, class C,                                        \
            std::enable_if_t<detail::any_vec<A, B, C>, int> = 0>              \
  inline auto name(const A& a, const B& b, const C& c) {                      \
    return detail::vmap([](auto p, auto q, auto r) { return name(p, q, r); }, \
                        a, b, c);                                             \
  }

MTL_FP1(sqrt, __builtin_sqrtf(x))
MTL_FP1(rsqrt, 1.0f / __builtin_sqrtf(x))
MTL_FP1(exp, __builtin_expf(x))
MTL_FP1(exp2, __builtin_exp2f(x))
MTL_FP1(exp10, __builtin_powf(10.0f, x))
MTL_FP1(log, __builtin_logf(x))
MTL_FP1(log2, __builtin_log2f(x))
MTL_FP1(log10, __builtin_log10f(x))
MTL_FP1(sin, __builtin_sinf(x))
MTL_FP1(cos, __builtin_cosf(x))
MTL_FP1(tan, __builtin_tanf(x))
MTL_FP1(asin, __builtin_asinf(x))
MTL_FP1(acos, __builtin_acosf(x))
MTL_FP1(atan, __builtin_atanf(x))
MTL_FP1(sinh, __builtin_sinhf(x))
MTL_FP1(cosh, __builtin_coshf(x))
MTL_FP1(tanh, __builtin_tanhf(x))
MTL_FP1(asinh, __builtin_asinhf(x))
MTL_FP1(acosh, __builtin_acoshf(x))
MTL_FP1(atanh, __builtin_atanhf(x))
MTL_FP1(floor, __builtin_floorf(x))
MTL_FP1(ceil, __builtin_ceilf(x))
MTL_FP1(trunc, __builtin_truncf(x))
MTL_FP1(rint, __builtin_rintf(x))    // ties to even (default rounding mode)
MTL_FP1(round, __builtin_roundf(x))  // ties away from zero
MTL_FP1(fabs, __builtin_fabsf(x))
MTL_FP1(saturate, __builtin_fminf(__builtin_fmaxf(x, 0.0f), 1.0f))
// MSL: 1 for x > 0, -1 for x < 0, x itself for +-0, and 0 for NaN.
MTL_FP1(sign, x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : (x == x ? x : 0.0f)))
MTL_FPPRED(isnan, __builtin_isnan(x))
MTL_FPPRED(isinf, __builtin_isinf(x))
MTL_FPPRED(isfinite, __builtin_isfinite(x))
MTL_FPPRED(isnormal, __builtin_isnormal(x))
MTL_FPPRED(signbit, __builtin_signbitf(x) != 0)

MTL_FP2(pow, __builtin_powf(x, y))
MTL_FP2(powr, __builtin_powf(x, y))
MTL_FP2(atan2, __builtin_atan2f(x, y))
MTL_FP2(fmod, __builtin_fmodf(x, y))
MTL_FP2(copysign, __builtin_copysignf(x, y))
MTL_FP2(fdim, __builtin_fdimf(x, y))
MTL_FP2(fmin, __builtin_fminf(x, y))  // a NaN argument yields the other one
MTL_FP2(fmax, __builtin_fmaxf(x, y))
MTL_FP2(divide, x / y)
MTL_FP2(step, y < x ? 0.0f : 1.0f)  // step(edge, x): 0 if x < edge, else 1
#undef MTL_FP1
#undef MTL_FPPRED
#undef MTL_FP2

// fract(x) = x - floor(x), kept below 1 in the value type.
template <class T, std::enable_if_t<detail::is_fp<T>, int> = 0>
inline T fract(T x_) {
  const float x = float(x_);
  T r = T(x - __builtin_floorf(x));
  return float(r) == 1.0f
             ? T(1.0f - float(metal::numeric_limits<T>::epsilon()) * 0.5f)
             : r;
}
MTL_VEC_OVERLOAD1(fract)

// abs and min/max/clamp accept integers too.
template <class T, std::enable_if_t<detail::is_num<T>, int> = 0>
constexpr T abs(T x) {
  if constexpr (detail::is_fp<T>)
    return T(__builtin_fabsf(float(x)));
  else if constexpr (std::is_signed<T>::value)  // wraps like the GPU for MIN
    return x < 0 ? T(std::make_unsigned_t<T>(0) - std::make_unsigned_t<T>(x))
                 : x;
  else
    return x;
}
MTL_VEC_OVERLOAD1(abs)

template <class A, class B, class R = detail::ncommon_t<A, B>>
constexpr R min(A a, B b) {
  if constexpr (detail::is_fp<R>)
    return R(__builtin_fminf(float(a), float(b)));
  else
    return R(b) < R(a) ? R(b) : R(a);
}
template <class A, class B, class R = detail::ncommon_t<A, B>>
constexpr R max(A a, B b) {
  if constexpr (detail::is_fp<R>)
    return R(__builtin_fmaxf(float(a), float(b)));
  else
    return R(a) < R(b) ? R(b) : R(a);
}
MTL_VEC_OVERLOAD2(min)
MTL_VEC_OVERLOAD2(max)

// clamp(x, lo, hi) = min(max(x, lo), hi), as MSL defines it.
template <class A, class B, class C,
          std::enable_if_t<detail::is_num<A> && detail::is_num<B> &&
                               detail::is_num<C>,
                           int> = 0>
constexpr auto clamp(A x, B lo, C hi) {
  return min(max(x, lo), hi);
}
MTL_VEC_OVERLOAD3(clamp)

// Fused multiply-add, one rounding.
template <class A, class B, class C, class R = detail::fcommon_t<A, B, C>>
inline R fma(A a, B b, C c) {
  if constexpr (std::is_same<R, float>::value)
    return __builtin_fmaf(float(a), float(b), float(c));
  else if constexpr (std::is_same<R, double>::value)
    return __builtin_fma(double(a), double(b), double(c));
  else  // half / bfloat: operands are exact in float
    return R(detail::fma_to_odd(double(float(a)), double(float(b)),
                                double(float(c))));
}
MTL_VEC_OVERLOAD3(fma)

// mix(x, y, a) = x + (y - x) * a, each step rounded in the value type.
template <class A, class B, class C, class R = detail::fcommon_t<A, B, C>>
constexpr R mix(A x, B y, C a) {
  R d = R(R(y) - R(x));
  R m = R(d * R(a));
  return R(R(x) + m);
}
MTL_VEC_OVERLOAD3(mix)

template <class A, class B, class C, class R = detail::fcommon_t<A, B, C>>
inline R smoothstep(A e0, B e1, C x) {
  float t = float(clamp((float(x) - float(e0)) / (float(e1) - float(e0)),
                        0.0f, 1.0f));
  return R(t * t * (3.0f - 2.0f * t));
}
MTL_VEC_OVERLOAD3(smoothstep)

template <class T, class K,
          std::enable_if_t<detail::is_fp<T> && std::is_integral<K>::value,
                           int> = 0>
inline T ldexp(T x, K k) {
  return T(__builtin_ldexpf(float(x), int(k)));
}
template <class A, class B, std::enable_if_t<detail::is_vecish<A>, int> = 0>
inline vec<detail::elem_t<A>, detail::n_of<A>> ldexp(const A& a, const B& b) {
  vec<detail::elem_t<A>, detail::n_of<A>> r{};
  for (int i = 0; i < detail::n_of<A>; ++i)
    r.d[i] = ldexp(detail::comp(a, i), int(detail::comp(b, i)));
  return r;
}

template <class T, std::enable_if_t<detail::is_fp<T>, int> = 0>
inline T frexp(T x, int& e) {
  return T(__builtin_frexpf(float(x), &e));
}
template <class T, int N>
inline vec<T, N> frexp(const vec<T, N>& x, vec<int, N>& e) {
  vec<T, N> r;
  for (int i = 0; i < N; ++i) r.d[i] = frexp(x.d[i], e.d[i]);
  return r;
}
template <class T, std::enable_if_t<detail::is_fp<T>, int> = 0>
inline T modf(T x, T& ip) {
  float i;
  T r = T(__builtin_modff(float(x), &i));
  ip = T(i);
  return r;
}
template <class T, int N>
inline vec<T, N> modf(const vec<T, N>& x, vec<T, N>& ip) {
  vec<T, N> r;
  for (int i = 0; i < N; ++i) r.d[i] = modf(x.d[i], ip.d[i]);
  return r;
}
template <class T, std::enable_if_t<detail::is_fp<T>, int> = 0>
inline T sincos(T x, T& c) {
  c = cos(x);
  return sin(x);
}
template <class T, int N>
inline vec<T, N> sincos(const vec<T, N>& x, vec<T, N>& c) {
  c = cos(x);
  return sin(x);
}

// select(a, b, c): c ? b : a, component-wise when any argument is a vector.
namespace detail {
template <class A, class B, class = void>
struct scommon : ncommon<A, B> {};
template <class A>
struct scommon<A, A, void> {  // any type, e.g. complex_t
  using type = A;
};
template <class A, class B, bool = any_vec<A, B>>
struct sel_elem {
  using type = typename first_vec<A, B>::elem;
};
template <class A, class B>
struct sel_elem<A, B, false> {
  using type = typename ncommon<A, B>::type;
};
}  // namespace detail
template <class A, class B, class C,
          std::enable_if_t<!detail::any_vec<A, B, C>, int> = 0,
          class R = typename detail::scommon<A, B>::type>
constexpr R select(A a, B b, C c) {
  return c ? R(b) : R(a);
}
template <class A, class B, class C,
          std::enable_if_t<detail::any_vec<A, B, C>, int> = 0,
          class E = typename detail::sel_elem<A, B>::type>
constexpr vec<E, detail::first_vec<A, B, C>::n> select(const A& a, const B& b,
                                                      const C& c) {
  constexpr int n = detail::first_vec<A, B, C>::n;
  vec<E, n> r{};
  for (int i = 0; i < n; ++i)
    r.d[i] = detail::comp(c, i) ? static_cast<E>(detail::comp(b, i))
                                : static_cast<E>(detail::comp(a, i));
  return r;
}

// Geometric functions.
template <class A, class B,
          std::enable_if_t<detail::is_vecish<A> && detail::is_vecish<B>,
                           int> = 0,
          class P = detail::vbin<A, B>, class E = typename P::E>
constexpr E dot(const A& a, const B& b) {
  E s = E(detail::comp(a, 0) * detail::comp(b, 0));
  for (int i = 1; i < P::n; ++i)
    s = E(s + E(detail::comp(a, i) * detail::comp(b, i)));
  return s;
}
template <class A, std::enable_if_t<detail::is_vecish<A>, int> = 0>
inline detail::elem_t<A> length(const A& a) {
  return sqrt(dot(a, a));
}
template <class A, class B, std::enable_if_t<detail::is_vecish<A>, int> = 0>
inline detail::elem_t<A> distance(const A& a, const B& b) {
  return length(a - b);
}
template <class A, std::enable_if_t<detail::is_vecish<A>, int> = 0>
inline auto normalize(const A& a) {
  return a * rsqrt(dot(a, a));
}
template <class A, class B,
          std::enable_if_t<detail::n_of<A> == 3 && detail::n_of<B> == 3 &&
                               detail::is_vecish<A> && detail::is_vecish<B>,
                           int> = 0>
constexpr auto cross(const A& a, const B& b) {
  using detail::comp;
  using E = detail::elem_t<A>;
  return vec<E, 3>(E(comp(a, 1) * comp(b, 2) - comp(a, 2) * comp(b, 1)),
                   E(comp(a, 2) * comp(b, 0) - comp(a, 0) * comp(b, 2)),
                   E(comp(a, 0) * comp(b, 1) - comp(a, 1) * comp(b, 0)));
}

// Integer bit functions; clz(0) and ctz(0) are the bit width, as in MSL.
namespace detail {
template <class T>
using int_only = std::enable_if_t<
    std::is_integral<T>::value && !std::is_same<T, bool>::value, int>;
}
template <class T, detail::int_only<T> = 0>
constexpr T popcount(T x) {
  return T(__builtin_popcountll(
      (unsigned long long)std::make_unsigned_t<T>(x)));
}
template <class T, detail::int_only<T> = 0>
constexpr T clz(T x) {
  constexpr int bits = int(sizeof(T) * 8);
  unsigned long long u = std::make_unsigned_t<T>(x);
  return T(u == 0 ? bits : __builtin_clzll(u) - (64 - bits));
}
template <class T, detail::int_only<T> = 0>
constexpr T ctz(T x) {
  constexpr int bits = int(sizeof(T) * 8);
  unsigned long long u = std::make_unsigned_t<T>(x);
  return T(u == 0 ? bits : __builtin_ctzll(u));
}
// High half of the full product.
template <class T, detail::int_only<T> = 0>
constexpr T mulhi(T a, T b) {
  constexpr int bits = int(sizeof(T) * 8);
  if constexpr (bits <= 32) {
    using W = std::conditional_t<std::is_signed<T>::value, int64_t, uint64_t>;
    return T((W(a) * W(b)) >> bits);
  } else {
    using W = std::conditional_t<std::is_signed<T>::value, __int128,
                                 unsigned __int128>;
    return T((W(a) * W(b)) >> 64);
  }
}
MTL_VEC_OVERLOAD1(popcount)
MTL_VEC_OVERLOAD1(clz)
MTL_VEC_OVERLOAD1(ctz)
MTL_VEC_OVERLOAD2(mulhi)
#undef MTL_VEC_OVERLOAD1
#undef MTL_VEC_OVERLOAD2
#undef MTL_VEC_OVERLOAD3

// precise:: and fast:: carry the same names.  Here both are the float libm
// routines (the GPU's fast variants are approximations that can't be
// reproduced bit for bit anyway).
#define MTL_MATH_NAMES                                                        \
  using metal::sqrt; using metal::rsqrt; using metal::exp; using metal::exp2; \
  using metal::exp10; using metal::log; using metal::log2; using metal::log10; \
  using metal::sin; using metal::cos; using metal::tan; using metal::asin;    \
  using metal::acos; using metal::atan; using metal::sinh; using metal::cosh; \
  using metal::tanh; using metal::asinh; using metal::acosh;                  \
  using metal::atanh; using metal::floor; using metal::ceil;                  \
  using metal::trunc; using metal::rint; using metal::round;                  \
  using metal::fabs; using metal::abs; using metal::fract;                    \
  using metal::saturate; using metal::sign; using metal::isnan;               \
  using metal::isinf; using metal::isfinite; using metal::signbit;            \
  using metal::pow; using metal::powr; using metal::atan2; using metal::fmod; \
  using metal::copysign; using metal::fdim; using metal::fmin;                \
  using metal::fmax; using metal::divide; using metal::min; using metal::max; \
  using metal::clamp; using metal::fma; using metal::mix;                     \
  using metal::smoothstep; using metal::ldexp; using metal::frexp;            \
  using metal::modf; using metal::sincos; using metal::step;                  \
  using metal::length; using metal::distance; using metal::normalize;         \
  using metal::dot; using metal::cross;
namespace precise {
MTL_MATH_NAMES
}
namespace fast {
MTL_MATH_NAMES
}
#undef MTL_MATH_NAMES

// ---------------------------------------------------------------------------
// Atomics.  The emulator runs one GPU thread at a time on one OS thread, so
// plain loads and stores are atomic.  atomic<T> has T's size, so a device
// atomic<float>* can point into a float buffer.
// ---------------------------------------------------------------------------
enum memory_order {
  memory_order_relaxed,
  memory_order_acquire,
  memory_order_release,
  memory_order_acq_rel,
  memory_order_seq_cst
};
template <class T>
struct atomic {
  T value;
};
typedef atomic<int> atomic_int;
typedef atomic<uint> atomic_uint;
typedef atomic<float> atomic_float;
typedef atomic<bool> atomic_bool;
typedef atomic<ulong> atomic_ulong;

namespace detail {
template <class T>
struct nondeduced {
  using type = T;
};
template <class T>
using nd = typename nondeduced<T>::type;
}  // namespace detail

template <class T>
inline T atomic_load_explicit(const volatile atomic<T>* o, memory_order) {
  return o->value;
}
template <class T>
inline void atomic_store_explicit(volatile atomic<T>* o, detail::nd<T> v,
                                  memory_order) {
  o->value = v;
}
template <class T>
inline T atomic_exchange_explicit(volatile atomic<T>* o, detail::nd<T> v,
                                  memory_order) {
  T old = o->value;
  o->value = v;
  return old;
}
#define MTL_ATOMIC_RMW(name, expr)                                            \
  template <class T>                                                          \
  inline T atomic_fetch_##name##_explicit(volatile atomic<T>* o,              \
                                          detail::nd<T> v, memory_order) {    \
    T old = o->value;                                                         \
    o->value = (expr);                                                        \
    return old;                                                               \
  }
MTL_ATOMIC_RMW(add, T(detail::wrap_t<T>(old) + detail::wrap_t<T>(v)))
MTL_ATOMIC_RMW(sub, T(detail::wrap_t<T>(old) - detail::wrap_t<T>(v)))
MTL_ATOMIC_RMW(and, T(old & v))
MTL_ATOMIC_RMW(or, T(old | v))
MTL_ATOMIC_RMW(xor, T(old ^ v))
MTL_ATOMIC_RMW(min, v < old ? v : old)
MTL_ATOMIC_RMW(max, old < v ? v : old)
#undef MTL_ATOMIC_RMW
// Compares bit patterns, like the hardware (and C++ std::atomic).
template <class T>
inline bool atomic_compare_exchange_weak_explicit(volatile atomic<T>* o,
                                                  detail::nd<T>* expected,
                                                  detail::nd<T> desired,
                                                  memory_order, memory_order) {
  T cur = o->value;
  if (__builtin_memcmp(&cur, expected, sizeof(T)) == 0) {
    o->value = desired;
    return true;
  }
  *expected = cur;
  return false;
}

}  // namespace metal

using namespace metal;

// ---------------------------------------------------------------------------
// MLX's Metal preamble (mlx/backend/metal/kernels/{complex,utils}.h), global
// as in MLX.
// ---------------------------------------------------------------------------
template <class T>
struct complex_t;
template <class T>
constexpr bool is_complex_v = false;
template <class T>
constexpr bool is_complex_v<complex_t<T>> = true;

template <class T>
struct complex_t {
  using value_type = T;
  T real;
  T imag;

  constexpr complex_t() : real(0), imag(0) {}
  constexpr complex_t(T re, T im) : real(re), imag(im) {}
  template <class U, std::enable_if_t<metal::detail::is_num<U>, int> = 0>
  constexpr complex_t(U x) : real(static_cast<T>(x)), imag(static_cast<T>(0)) {}
  template <class U, std::enable_if_t<!std::is_same<U, T>::value, int> = 0>
  constexpr complex_t(complex_t<U> c)
      : real(static_cast<T>(c.real)), imag(static_cast<T>(c.imag)) {}
  constexpr complex_t(vec<T, 2> v) : real(v.x), imag(v.y) {}
  operator vec<T, 2>() const { return vec<T, 2>(real, imag); }
  // As in MLX, a complex converts to a scalar by taking its real part.
  template <class U, std::enable_if_t<metal::detail::is_num<U>, int> = 0>
  constexpr operator U() const {
    return static_cast<U>(real);
  }
};
typedef complex_t<half> complex32_t;
typedef complex_t<float> complex64_t;
static_assert(sizeof(complex64_t) == 8, "complex64_t layout");

template <class T>
constexpr complex_t<T> operator-(complex_t<T> x) {
  return {-x.real, -x.imag};
}
template <class T>
constexpr complex_t<T> operator+(complex_t<T> a, complex_t<T> b) {
  return {a.real + b.real, a.imag + b.imag};
}
template <class T>
constexpr complex_t<T> operator-(complex_t<T> a, complex_t<T> b) {
  return {a.real - b.real, a.imag - b.imag};
}
template <class T>
constexpr complex_t<T> operator*(complex_t<T> a, complex_t<T> b) {
  return {a.real * b.real - a.imag * b.imag, a.real * b.imag + a.imag * b.real};
}
template <class T>
constexpr complex_t<T> operator/(complex_t<T> a, complex_t<T> b) {
  T den = b.real * b.real + b.imag * b.imag;
  return {(a.real * b.real + a.imag * b.imag) / den,
          (a.imag * b.real - a.real * b.imag) / den};
}
// MLX's floor-style remainder, per component.
template <class T>
constexpr complex_t<T> operator%(complex_t<T> a, complex_t<T> b) {
  T re = a.real - b.real * static_cast<int64_t>(a.real / b.real);
  T im = a.imag - b.imag * static_cast<int64_t>(a.imag / b.imag);
  if (re != 0 && ((re < 0) != (b.real < 0))) re += b.real;
  if (im != 0 && ((im < 0) != (b.imag < 0))) im += b.imag;
  return {re, im};
}
template <class T, class U, std::enable_if_t<metal::detail::is_num<U>, int> = 0>
constexpr complex_t<T> operator+(complex_t<T> a, U s) {
  return {a.real + static_cast<T>(s), a.imag};
}
template <class T, class U, std::enable_if_t<metal::detail::is_num<U>, int> = 0>
constexpr complex_t<T> operator+(U s, complex_t<T> b) {
  return {static_cast<T>(s) + b.real, b.imag};
}
template <class T, class U, std::enable_if_t<metal::detail::is_num<U>, int> = 0>
constexpr complex_t<T> operator-(complex_t<T> a, U s) {
  return {a.real - static_cast<T>(s), a.imag};
}
template <class T, class U, std::enable_if_t<metal::detail::is_num<U>, int> = 0>
constexpr complex_t<T> operator-(U s, complex_t<T> b) {
  return {static_cast<T>(s) - b.real, -b.imag};
}
// Scaling by a real multiplies each part (no 0*inf terms).
template <class T, class U, std::enable_if_t<metal::detail::is_num<U>, int> = 0>
constexpr complex_t<T> operator*(complex_t<T> a, U s) {
  return {a.real * static_cast<T>(s), a.imag * static_cast<T>(s)};
}
template <class T, class U, std::enable_if_t<metal::detail::is_num<U>, int> = 0>
constexpr complex_t<T> operator*(U s, complex_t<T> b) {
  return {static_cast<T>(s) * b.real, static_cast<T>(s) * b.imag};
}
template <class T, class U, std::enable_if_t<metal::detail::is_num<U>, int> = 0>
constexpr complex_t<T> operator/(complex_t<T> a, U s) {
  return {a.real / static_cast<T>(s), a.imag / static_cast<T>(s)};
}
// MLX: s / b = (s*b.real, -s*b.imag) / |b|^2.
template <class T, class U, std::enable_if_t<metal::detail::is_num<U>, int> = 0>
constexpr complex_t<T> operator/(U s, complex_t<T> b) {
  T t = static_cast<T>(s);
  T den = b.real * b.real + b.imag * b.imag;
  return {(t * b.real) / den, (-t * b.imag) / den};
}
#define MTL_CPLX_CASSIGN(op)                                                  \
  template <class T, class B>                                                 \
  constexpr complex_t<T>& operator op##=(complex_t<T>& a, B b) {              \
    return a = a op b;                                                        \
  }
MTL_CPLX_CASSIGN(+)
MTL_CPLX_CASSIGN(-)
MTL_CPLX_CASSIGN(*)
MTL_CPLX_CASSIGN(/)
#undef MTL_CPLX_CASSIGN
template <class T>
constexpr bool operator==(complex_t<T> a, complex_t<T> b) {
  return a.real == b.real && a.imag == b.imag;
}
template <class T>
constexpr bool operator!=(complex_t<T> a, complex_t<T> b) {
  return !(a == b);
}
// Lexicographic on (real, imag), as MLX orders complex values.
template <class T>
constexpr bool operator>(complex_t<T> a, complex_t<T> b) {
  return a.real > b.real || (a.real == b.real && a.imag > b.imag);
}
template <class T>
constexpr bool operator>=(complex_t<T> a, complex_t<T> b) {
  return a.real > b.real || (a.real == b.real && a.imag >= b.imag);
}
template <class T>
constexpr bool operator<(complex_t<T> a, complex_t<T> b) {
  return b > a;
}
template <class T>
constexpr bool operator<=(complex_t<T> a, complex_t<T> b) {
  return b >= a;
}

// Work per thread: 8 bytes' worth of elements.
template <class U>
struct WorkPerThread {
  static_assert(sizeof(U) <= 8, "Type too large");
  static constexpr int n = int(8 / sizeof(U));
};

// Reduction identities: infinities for floating types, numeric_limits
// extremes for integers.
template <class U>
struct Limits {
  static constexpr U max = metal::numeric_limits<U>::max();
  static constexpr U min = metal::numeric_limits<U>::min();
  static constexpr U finite_max = metal::numeric_limits<U>::max();
  static constexpr U finite_min = metal::numeric_limits<U>::min();
};
#define MTL_FLOAT_LIMITS(T)                                                   \
  template <>                                                                 \
  struct Limits<T> {                                                          \
    static constexpr T max = metal::numeric_limits<T>::infinity();            \
    static constexpr T min = -metal::numeric_limits<T>::infinity();           \
    static constexpr T finite_max = metal::numeric_limits<T>::max();          \
    static constexpr T finite_min = -metal::numeric_limits<T>::max();         \
  };
MTL_FLOAT_LIMITS(float)
MTL_FLOAT_LIMITS(half)
MTL_FLOAT_LIMITS(bfloat16_t)
#undef MTL_FLOAT_LIMITS
template <>
struct Limits<bool> {
  static constexpr bool max = true;
  static constexpr bool min = false;
};
template <class T>
struct Limits<complex_t<T>> {
  static constexpr T inf = metal::numeric_limits<T>::infinity();
  static constexpr complex_t<T> max = complex_t<T>(inf, inf);
  static constexpr complex_t<T> min = complex_t<T>(-inf, -inf);
};

// ceil(N / M) for positive integers.
template <class T, class U>
inline T ceildiv(T N, U M) {
  return (N + M - 1) / M;
}

// Memory offset of row-major element `elem` of an array with the given
// shape and strides.  The arithmetic types follow MLX's (IdxT is deduced from
// elem in the first overload, so a uint index computes in uint).
template <class IdxT = int64_t>
inline IdxT elem_to_loc(IdxT elem, const int* shape, const int64_t* strides,
                        int ndim) {
  IdxT loc = 0;
  for (int d = ndim - 1; d >= 0 && elem > 0; --d) {
    loc += (elem % shape[d]) * IdxT(strides[d]);
    elem /= shape[d];
  }
  return loc;
}
// Grid position: x walks the last axis, y the one before, z all the others.
// (Axes that do not exist are skipped; MLX reads strides[-1] there.)
template <class IdxT = int64_t>
inline IdxT elem_to_loc(uint3 elem, const int* shape, const int64_t* strides,
                        int ndim) {
  IdxT loc = ndim > 0 ? IdxT(elem.x * IdxT(strides[ndim - 1])) : IdxT(0);
  if (ndim > 1) loc += elem.y * IdxT(strides[ndim - 2]);
  for (int d = ndim - 3; d >= 0; --d) {
    loc += (elem.z % shape[d]) * IdxT(strides[d]);
    elem.z /= shape[d];
  }
  return loc;
}
template <class IdxT = int64_t>
inline IdxT elem_to_loc_1(uint elem, const int64_t& stride) {
  return elem * IdxT(stride);
}
template <class IdxT = int64_t>
inline IdxT elem_to_loc_2(uint2 elem, const int64_t strides[2]) {
  return elem.x * IdxT(strides[1]) + elem.y * IdxT(strides[0]);
}
template <class IdxT = int64_t>
inline IdxT elem_to_loc_3(uint3 elem, const int64_t strides[3]) {
  return elem.x * IdxT(strides[2]) + elem.y * IdxT(strides[1]) +
         elem.z * IdxT(strides[0]);
}
// The same walk for two / three arrays sharing a shape.
template <class IdxT = int64_t>
inline vec<IdxT, 2> elem_to_loc_2_nd(uint3 elem, const int* shape,
                                     const int64_t* a_strides,
                                     const int64_t* b_strides, int ndim) {
  vec<IdxT, 2> loc(IdxT(0), IdxT(0));
  if (ndim > 0) {
    loc.x = IdxT(elem.x * IdxT(a_strides[ndim - 1]));
    loc.y = IdxT(elem.x * IdxT(b_strides[ndim - 1]));
  }
  if (ndim > 1) {
    loc.x += IdxT(IdxT(elem.y) * IdxT(a_strides[ndim - 2]));
    loc.y += IdxT(elem.y * IdxT(b_strides[ndim - 2]));
  }
  for (int d = ndim - 3; d >= 0; --d) {
    uint l = elem.z % shape[d];
    loc.x += l * IdxT(a_strides[d]);
    loc.y += l * IdxT(b_strides[d]);
    elem.z /= shape[d];
  }
  return loc;
}
template <class IdxT = int64_t>
inline vec<IdxT, 3> elem_to_loc_3_nd(uint3 elem, const int* shape,
                                     const int64_t* a_strides,
                                     const int64_t* b_strides,
                                     const int64_t* c_strides, int ndim) {
  vec<IdxT, 3> loc(IdxT(0), IdxT(0), IdxT(0));
  if (ndim > 0) {
    loc.x = IdxT(elem.x * IdxT(a_strides[ndim - 1]));
    loc.y = IdxT(elem.x * IdxT(b_strides[ndim - 1]));
    loc.z = IdxT(elem.x * IdxT(c_strides[ndim - 1]));
  }
  if (ndim > 1) {
    loc.x += IdxT(elem.y * IdxT(a_strides[ndim - 2]));
    loc.y += IdxT(elem.y * IdxT(b_strides[ndim - 2]));
    loc.z += IdxT(elem.y * IdxT(c_strides[ndim - 2]));
  }
  for (int d = ndim - 3; d >= 0; --d) {
    uint l = elem.z % shape[d];
    loc.x += l * IdxT(a_strides[d]);
    loc.y += l * IdxT(b_strides[d]);
    loc.z += l * IdxT(c_strides[d]);
    elem.z /= shape[d];
  }
  return loc;
}
