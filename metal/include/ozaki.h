// Integer helpers of the split-integer (Ozaki-style) DGEMM emulation
// (mlx_precise/ozaki/engine.py, mlx_precise/esc/engine.py). float64 values arrive as
// raw bits (two uint32 words, low word first); nothing here uses a floating-point type, so
// the results are the same on every device and in the emulator.
//
//   exponents     oz_exponent: floor(log2|x|) of a float64 (subnormals included),
//                 OZ_NEG for zero ("-infinity"), OZ_NONFINITE for Inf/NaN.
//   significand   x = (-1)^sign * oz_significand(x) * 2^oz_ulp_exponent(x), exactly.
//   digits        oz_digit: b-bit field of the fixed-point magnitude trunc(|x| 2^shift).
//   128-bit       two's-complement accumulator (hi, lo) with shift-and-add, and
//                 oz_round_to_f64: ONE round-to-nearest-even of acc * 2^E to float64
//                 bits, gradual underflow and overflow to infinity included.
#pragma once

// Exponent of zero and the empty-set sentinels: far below (above) any sum of two
// real exponents (those lie in [-2148, 2046]), and their sums cannot overflow int.
constant constexpr int OZ_NEG = -(1 << 20);
constant constexpr int OZ_POS = (1 << 20);
constant constexpr int OZ_NONFINITE = (1 << 21);
// Exponent sums below this are "-infinity" (at least one operand was zero).
constant constexpr int OZ_NEG_LIMIT = -(1 << 19);

inline ulong oz_bits(uint lo, uint hi) {
  return (ulong(hi) << 32) | ulong(lo);
}

inline uint oz_biased(ulong bits) {
  return uint((bits >> 52) & 0x7FFul);
}

// 53-bit integer significand (implicit bit included for normal numbers).
inline ulong oz_significand(ulong bits) {
  ulong frac = bits & 0xFFFFFFFFFFFFFul;
  return oz_biased(bits) == 0u ? frac : (frac | (1ul << 52));
}

// Exponent of the significand's unit bit: x = m * 2^oz_ulp_exponent.
inline int oz_ulp_exponent(ulong bits) {
  uint e = oz_biased(bits);
  return e == 0u ? -1074 : int(e) - 1075;
}

// floor(log2|x|); OZ_NEG for +-0, OZ_NONFINITE for Inf/NaN.
inline int oz_exponent(ulong bits) {
  uint e = oz_biased(bits);
  if (e == 2047u) return OZ_NONFINITE;
  ulong m = oz_significand(bits);
  if (m == 0ul) return OZ_NEG;
  return oz_ulp_exponent(bits) + 63 - int(clz(m));
}

// Exponent of the lowest set bit of |x| (x finite, nonzero).
inline int oz_low_exponent(ulong bits) {
  return oz_ulp_exponent(bits) + int(ctz(oz_significand(bits)));
}

// Bits [lo, lo + b) of trunc(m * 2^shift), where lo is counted in the shifted
// integer: bit j of it is bit (j - shift) of m, and bits below m's bit 0 are zero.
inline uint oz_digit(ulong m, int pos, int b) {
  ulong mask = (1ul << uint(b)) - 1ul;
  if (pos >= 64) return 0u;
  if (pos >= 0) return uint((m >> uint(pos)) & mask);
  if (pos > -b) return uint((m << uint(-pos)) & mask);
  return 0u;
}

// ---- 128-bit two's-complement integers --------------------------------------

struct oz_i128 {
  ulong hi;
  ulong lo;
};

// a * 2^n + v for 0 <= n < 64 (Horner step of the accumulation).
inline oz_i128 oz_shift_add(oz_i128 a, uint n, long v) {
  oz_i128 r;
  r.hi = n == 0u ? a.hi : ((a.hi << n) | (a.lo >> (64u - n)));
  r.lo = a.lo << n;
  ulong add = ulong(v);
  ulong lo = r.lo + add;
  r.hi += (lo < r.lo ? 1ul : 0ul) + (v < 0 ? ~0ul : 0ul);  // carry, sign extension
  r.lo = lo;
  return r;
}

// Logical right shift of a 128-bit magnitude by n >= 0 (any n).
inline oz_i128 oz_shr(oz_i128 a, int n) {
  oz_i128 r;
  if (n >= 128) {
    r.hi = 0ul; r.lo = 0ul;
  } else if (n >= 64) {
    r.hi = 0ul; r.lo = a.hi >> uint(n - 64);
  } else if (n > 0) {
    r.hi = a.hi >> uint(n);
    r.lo = (a.lo >> uint(n)) | (a.hi << uint(64 - n));
  } else {
    r = a;
  }
  return r;
}

// True when the low n bits of a are not all zero (n >= 0, any n).
inline bool oz_low_bits_nonzero(oz_i128 a, int n) {
  if (n <= 0) return false;
  if (n >= 128) return (a.hi | a.lo) != 0ul;
  if (n >= 64) return a.lo != 0ul || (n > 64 && (a.hi << uint(128 - n)) != 0ul);
  return (a.lo << uint(64 - n)) != 0ul;
}

// Bit length of a 128-bit magnitude (0 for 0).
inline int oz_bit_length(oz_i128 a) {
  if (a.hi != 0ul) return 128 - int(clz(a.hi));
  if (a.lo != 0ul) return 64 - int(clz(a.lo));
  return 0;
}

// float64 bits of RN(acc * 2^E): acc is a two's-complement 128-bit integer
// (|acc| < 2^127). One rounding to nearest, ties to even, on float64's grid:
// the unit of the last place is 2^q with q = max(n - 53 + E, -1074) (n: bit length
// of |acc|), so subnormal results are rounded once, at their own grid (no double
// rounding), and results >= 2^1024 after rounding become infinity. Zero gives +0.
inline ulong oz_round_to_f64(oz_i128 acc, int E) {
  bool neg = (acc.hi >> 63) != 0ul;
  if (neg) {  // magnitude: two's-complement negation
    acc.hi = ~acc.hi;
    acc.lo = ~acc.lo;
    acc.lo += 1ul;
    if (acc.lo == 0ul) acc.hi += 1ul;
  }
  int n = oz_bit_length(acc);
  if (n == 0) return 0ul;
  int q = max(n - 53 + E, -1074);
  int r = q - E;  // low bits of |acc| below the last kept place
  ulong mant;
  if (r <= 0) {
    mant = acc.lo << uint(-r);  // exact: |acc| < 2^53 here and -r <= 53 - n
  } else {
    mant = oz_shr(acc, r).lo;  // < 2^53
    bool round_bit = (oz_shr(acc, r - 1).lo & 1ul) != 0ul;
    bool sticky = oz_low_bits_nonzero(acc, r - 1);
    if (round_bit && (sticky || (mant & 1ul) != 0ul)) mant += 1ul;
  }
  ulong sign = neg ? (1ul << 63) : 0ul;
  if (mant == (1ul << 53)) {  // rounding carried into a new binade
    mant = 1ul << 52;
    q += 1;
  }
  if (mant < (1ul << 52)) return sign | mant;  // subnormal (then q == -1074)
  int biased = q + 1075;  // value = mant * 2^q, mant in [2^52, 2^53)
  if (biased >= 2047) return sign | 0x7FF0000000000000ul;
  return sign | (ulong(biased) << 52) | (mant & 0xFFFFFFFFFFFFFul);
}
