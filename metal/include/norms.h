// Building blocks of the tile norms (metal/kernels/norm_tile.metal,
// norm_reduce.metal): LAPACK xLANGE/xLANTR/xLANSY/xLANHE semantics with sums in
// double-word arithmetic (metal/include/doubleword.h; u = 2^-24).
//
// Special values (LAPACK's xLANGE / xNRM2; docs/norms.md): every quantity summed or
// maximised here is >= 0 or NaN, so
//  * max uses LAPACK's NaN-aware update  m = (m < v || isnan(v)) ? v : m
//    (IEEE fmax would drop a NaN);
//  * sums go through norm_acc, which turns an Inf or NaN operand (or an overflow of
//    the float32 range) into the pair (Inf, 0) or (NaN, 0): the double-word
//    algorithms themselves would turn Inf into NaN (Inf - Inf inside TwoSum).
// Subnormal entries read as zero (norm_daz): Apple GPUs flush float32 subnormals
// in arithmetic, and making it explicit gives every kind the same, documented
// behaviour on any device.
#pragma once

#include "doubleword.h"

// Powers of two as float32 bit patterns (exact; no transcendental on the device).
#define NORM_P2(e) as_type<float>(uint((e) + 127) << 23)

// Blue's three-accumulator scaling adapted to double-word sums of squares
// (Blue 1978; Anderson, LAWN 2017 / LAPACK 3.10 xLASSQ). Blue's float32 constants
// (tsml 2^-63, tbig 2^52, ssml 2^75, sbig 2^-76) only keep squares normal. Here a
// square is the exact pair TwoProdFMA(y, y), whose residual is exact only when
// exponent(y) >= -40 (doubleword.h, "Range"), and N squares must sum below 2^128.
// With every |x| in [2^-126, 2^128) (subnormals read as zero):
//   small  |x| <  2^-40 : y = |x| * 2^86   in [2^-40, 2^46)
//   medium |x| in [2^-40, 2^46): y = |x|
//   big    |x| >= 2^46  : y = |x| * 2^-84  in [2^-38, 2^44)
// so every y^2 lies in [2^-80, 2^92): TwoProdFMA is exact, every word of every
// square and sum is a multiple of 2^-126 (never flushed), and N < 2^35 squares
// (2^34 symmetric off-diagonal pairs) cannot overflow an accumulator.
#define NORM_TSML NORM_P2(-40)
#define NORM_TBIG NORM_P2(46)
#define NORM_SSML_E 86
#define NORM_SBIG_E (-84)

// Subnormal -> +0 (exponent field 0), by bits, so the result does not depend on how
// a device treats subnormals in abs or comparisons.
METAL_FUNC float norm_daz(float x) {
  return (as_type<uint>(x) & 0x7f800000u) == 0u ? 0.0f : x;
}

// LAPACK's NaN-aware running maximum (values >= 0 or NaN).
METAL_FUNC float norm_nanmax(float m, float v) {
  return (m < v || isnan(v)) ? v : m;
}

METAL_FUNC dw norm_dw_scale(dw x, float p2) {  // exact for a power of two p2
  return dw_make(x.hi * p2, x.lo * p2);
}

// a + b for a, b >= 0 (or Inf/NaN): accurate DW+DW (JMP alg 6, <= 3u^2 + 13u^3;
// same-sign operands, so no cancellation), with Inf and NaN propagated as LAPACK's
// plain sums do and overflow of float32's range giving Inf.
METAL_FUNC dw norm_acc(dw a, dw b) {
  float s = a.hi + b.hi;
  dw r = dw_add(a, b);
  if (isfinite(r.hi) && isfinite(r.lo)) {
    return r;
  }
  return dw_make(isnan(s) ? s : as_type<float>(0x7f800000u), 0.0f);
}

// sqrt of a double-word x > 0 with x.hi normal (our callers give x.hi in
// [2^-80, 2^127)): s = sqrt(x.hi) needs only be faithful; the residual
// x.hi - s^2 is one fma (exact for a correctly rounded s, within u of itself
// otherwise) and one Newton step in double-word order, as in the classical
// double-double square root (Dekker 1971; Karp & Markstein 1997):
//   sqrt(x) = s + (x - s^2) / (2s) - (x - s^2)^2 / (8 s^3) + ...
// With |x - s^2| <= ~5u s^2 the dropped term is <= ~3.2u^2 and the rounding of
// r and c adds <= ~5u^2: relative error <= ~9u^2 (derived here; the tests check
// the rounded Frobenius norms and complex moduli built on it). The one division
// only needs to be faithful (its result is a correction of relative size ~u).
METAL_FUNC dw norm_dw_sqrt(dw x) {
  float s = precise::sqrt(x.hi);
  float e = metal::fma(-s, s, x.hi);
  float r = e + x.lo;
  float c = r / (2.0f * s);
  return dw_fast_two_sum(s, c);
}

// |re + i im| as a double-word (C99 hypot semantics: Inf if either part is Inf,
// else NaN if either is NaN), from |z|^2 = TwoProd(a,a) + TwoProd(b,b) scaled into
// [2^-80, 2^93) as in the Blue scaling above (exact squares, DW+DW <= 3u^2), then
// norm_dw_sqrt: relative error <= ~11u^2. When max(|re|, |im|) < 2^-40 the result
// is returned scaled, |z| 2^86, and ``small`` is set: scaled back, its low word
// would fall below 2^-126 and be flushed.
METAL_FUNC dw norm_cabs_scaled(float re, float im, thread bool& small) {
  float a = metal::abs(re);
  float b = metal::abs(im);
  small = false;
  if (isinf(a) || isinf(b)) {
    return dw_make(as_type<float>(0x7f800000u), 0.0f);
  }
  if (isnan(a) || isnan(b)) {
    return dw_make(a + b, 0.0f);
  }
  float m = metal::max(a, b);
  if (m == 0.0f) {
    return dw_make(0.0f, 0.0f);
  }
  float s = 1.0f, inv = 1.0f;
  if (m >= NORM_TBIG) {
    s = NORM_P2(NORM_SBIG_E);
    inv = NORM_P2(-NORM_SBIG_E);
  } else if (m < NORM_TSML) {
    s = NORM_P2(NORM_SSML_E);
    small = true;
  }
  float x = a * s, y = b * s;
  dw q = dw_add(dw_two_prod(x, x), dw_two_prod(y, y));
  return norm_dw_scale(norm_dw_sqrt(q), inv);
}

// Sums of |a| along a line (a column or row of a tile, then across tiles) in two
// double-word classes, so that no low word is flushed: ``big`` sums the terms
// >= 2^-40 (partial sums >= 2^-40: every word stays far above 2^-126), ``sml``
// sums |a| 2^86 for |a| < 2^-40 (in [2^-40, 2^46): up to 2^35 terms fit). A single
// double-word sum of terms below ~2^-102 would lose its low words to flush-to-zero,
// i.e. add like plain float32.
struct norm_line {
  dw big;
  dw sml;
};

METAL_FUNC norm_line norm_line_zero() {
  norm_line r;
  r.big = dw_make(0.0f, 0.0f);
  r.sml = r.big;
  return r;
}

// l += |a| for a real value (|a| exact) or a complex modulus from norm_cabs_scaled.
METAL_FUNC void norm_line_add(thread norm_line& l, dw v, bool small) {
  if (small) {
    l.sml = norm_acc(l.sml, v);
  } else {
    l.big = norm_acc(l.big, v);
  }
}

METAL_FUNC void norm_line_add_real(thread norm_line& l, float a) {  // a = |x|, no subnormal
  if (a < NORM_TSML) {
    l.sml = norm_acc(l.sml, dw_make(a * NORM_P2(NORM_SSML_E), 0.0f));
  } else {
    l.big = norm_acc(l.big, dw_make(a, 0.0f));
  }
}

METAL_FUNC norm_line norm_line_merge(norm_line a, norm_line b) {
  a.big = norm_acc(a.big, b.big);
  a.sml = norm_acc(a.sml, b.sml);
  return a;
}

// The line sum rounded once to float32: big + sml 2^-86 (the scaled-down small
// words lose at most 2^-126 each against big >= 2^-40), or sml alone rounded and
// scaled back exactly (sml >= 2^-40, so the result is >= 2^-126: normal).
METAL_FUNC float norm_line_finish(norm_line l) {
  if (l.big.hi != 0.0f) {  // also Inf and NaN
    float down = NORM_P2(-NORM_SSML_E / 2);
    return dw_to_float(norm_acc(l.big, norm_dw_scale(norm_dw_scale(l.sml, down), down)));
  }
  return dw_to_float(l.sml) * NORM_P2(-NORM_SSML_E);
}

// Three double-word accumulators of Blue's scaled sum of squares.
struct norm_ssq {
  dw big;  // sum of (|x| 2^-84)^2 over |x| >= 2^46 (Inf lands here)
  dw med;  // sum of x^2 over 2^-40 <= |x| < 2^46 (NaN lands here)
  dw sml;  // sum of (|x| 2^86)^2 over 0 < |x| < 2^-40
};

METAL_FUNC norm_ssq norm_ssq_zero() {
  norm_ssq r;
  r.big = dw_make(0.0f, 0.0f);
  r.med = r.big;
  r.sml = r.big;
  return r;
}

// acc += w x^2 for one real value x (a real entry, or one part of a complex one:
// zLASSQ treats the parts as separate reals); w is 1 or 2 (a symmetric
// off-diagonal entry counts twice; doubling a pair is exact).
METAL_FUNC void norm_ssq_add(thread norm_ssq& acc, float x, float w) {
  float a = metal::abs(norm_daz(x));
  if (a == 0.0f) {
    return;
  }
  if (a >= NORM_TBIG) {
    float y = a * NORM_P2(NORM_SBIG_E);
    acc.big = norm_acc(acc.big, norm_dw_scale(dw_two_prod(y, y), w));
  } else if (a < NORM_TSML) {
    float y = a * NORM_P2(NORM_SSML_E);
    acc.sml = norm_acc(acc.sml, norm_dw_scale(dw_two_prod(y, y), w));
  } else {
    acc.med = norm_acc(acc.med, norm_dw_scale(dw_two_prod(a, a), w));
  }
}

METAL_FUNC norm_ssq norm_ssq_merge(norm_ssq a, norm_ssq b) {
  a.big = norm_acc(a.big, b.big);
  a.med = norm_acc(a.med, b.med);
  a.sml = norm_acc(a.sml, b.sml);
  return a;
}

// sqrt(big 2^168 + med + sml 2^-172) rounded once to float32 (Blue's final step,
// LAPACK xLASSQ order): NaN if any accumulator is NaN, else Inf if one is Inf. The
// smaller class is scaled down onto the larger's scale (exact except for words that
// fall below 2^-126: they are < 2^-46 of the larger accumulator, >= 2^-80); small
// values are dropped when big ones exist (their squares are < 2^-172 of one big
// square, and there are fewer than 2^35 of them).
METAL_FUNC float norm_ssq_finish(norm_ssq a) {
  if (isnan(a.big.hi) || isnan(a.med.hi) || isnan(a.sml.hi)) {
    return a.big.hi + a.med.hi + a.sml.hi;
  }
  if (isinf(a.big.hi) || isinf(a.med.hi) || isinf(a.sml.hi)) {
    return as_type<float>(0x7f800000u);
  }
  if (a.big.hi > 0.0f) {
    dw med = norm_dw_scale(norm_dw_scale(a.med, NORM_P2(NORM_SBIG_E)), NORM_P2(NORM_SBIG_E));
    return dw_to_float(norm_dw_sqrt(dw_add(a.big, med))) * NORM_P2(-NORM_SBIG_E);
  }
  if (a.med.hi > 0.0f) {
    float down = NORM_P2(-NORM_SSML_E);
    dw sml = norm_dw_scale(norm_dw_scale(a.sml, down), down);
    return dw_to_float(norm_dw_sqrt(dw_add(a.med, sml)));
  }
  if (a.sml.hi > 0.0f) {
    return dw_to_float(norm_dw_sqrt(a.sml)) * NORM_P2(-NORM_SSML_E);
  }
  return 0.0f;
}

// Sum over r = r0, r0 + step, ... < nr of the records (r, k) of a partial array
// (norm_reduce.metal): W = 4 floats per record (a norm_line) or W = 2 (one pair,
// returned in .big).
METAL_FUNC norm_line norm_sum_records(const device float* part, uint W, uint L, uint nr,
                                      uint k, uint r0, uint step) {
  norm_line s = norm_line_zero();
  for (uint r = r0; r < nr; r += step) {
    uint at = W * (r * L + k);
    s.big = norm_acc(s.big, dw_make(part[at], part[at + 1u]));
    if (W == 4u) {
      s.sml = norm_acc(s.sml, dw_make(part[at + 2u], part[at + 3u]));
    }
  }
  return s;
}
