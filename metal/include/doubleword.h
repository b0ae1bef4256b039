// Double-word ("float-float") arithmetic: a value is the unevaluated sum hi + lo of
// two float32 with hi = RN(hi + lo) ("normalised"), about 48 significand bits,
// i.e. ~14 decimal digits (relative precision ~2^-48, not 30 digits).
//
// Sources: JMP = Joldes, Muller, Popescu, "Tight and
// rigorous error bounds for basic building blocks of double-word arithmetic", ACM
// TOMS 44(2), 2017; MR = Muller, Rideau, "Formalization of double-word arithmetic...",
// ACM TOMS 48(1), 2022 (Coq-checked). u = 2^-24 (float32 unit roundoff). Bounds are on
// the relative error |computed - exact| / |exact| of the exact value hi + lo of the
// result, for normalised operands, and hold as long as nothing underflows or
// overflows (see "Range" below). Every float operation below is one IEEE float32
// operation rounded to nearest even: compile without fast math and without
// contraction (MLX: math_mode "safe"); products that must be exact use an explicit
// metal::fma, never a*b+c left to the compiler.
//
// Range (Apple GPUs, and the emulator, flush float32 subnormals to zero in every
// arithmetic input and result; loads and stores keep them):
//  * Additions (dw_two_sum, dw_fast_two_sum, dw_add_fp, dw_add) are exact replicas
//    of unbounded-exponent arithmetic when every nonzero input word has magnitude
//    >= 2^-103: such words are integer multiples of 2^-126, so every intermediate is
//    a multiple of 2^-126 too, hence 0 or normal, and flushing never triggers.
//    Below that, a result or error term that would be subnormal is flushed:
//    TwoSum(2^-100, 2^-104 + 2^-127) returns (2^-100 + 2^-104, 0), losing the 2^-127
//    residual, and TwoSum(1.25*2^-126, -2^-126) returns (0, 0), losing the whole
//    (subnormal) sum 2^-128. Subnormal inputs read as zero (DAZ).
//    (tests/doubleword/test_doubleword.py asserts these outputs.)
//  * dw_two_prod(a, b) is exact when exponent(a) + exponent(b) >= -80 (its residual
//    is a multiple of 2^(ea+eb-46)), in particular whenever |a*b| >= 2^-78; the
//    residual can be flushed for smaller products and is always lost (when nonzero)
//    once |a*b| < 2^-103.
//  * Products and quotients: every flushed intermediate moves the result r by at
//    most ~2^-126, i.e. 2^-126/|r| relative, so their bounds hold (to that extra
//    term) for |r| well above 2^-78; tests/doubleword/test_doubleword.py checks them for
//    |r| >= 2^-51 with low words >= 2^-35 |high word|. Below ~2^-78 the error
//    terms (~u^2 |r|) fall under 2^-126 and accuracy decays, down to float32's
//    around 2^-102, where the low word itself (~u |r|) is flushed.
//
// Special values (IEEE policy, one mechanism: dw_special): when the float32
// operation on the high words is not finite -- an Inf or NaN operand, or overflow of
// the rounded result -- the result is that float32 value with a zero low word, so
// Inf stays Inf and the value (hi + lo) is what the float32 operation gives. Without
// it the residual of an infinite TwoSum or TwoProd (Inf - Inf, fma(a, b, -Inf)) is
// NaN and turns every Inf into NaN. The error-free transforms apply the rule to
// their own result, and every compound operation to its first high-word operation,
// so that e.g. Inf * y stays Inf even where a low-word term (Inf * 0) is NaN.
// Overflow of the exact result gives the correctly signed Inf (as RN does).
//
// Signed zeros: a zero result keeps the sign float32 gives the same operation on the
// high words (-0 * 1 = -0, -0 + -0 = -0, x - x = +0). Fast2Sum adds a correction
// that is +0 whenever the high word is a zero, and -0 + +0 = +0 would lose a -0
// there: dw_fast_two_sum keeps a zero a (then b is zero too) as it is.
#pragma once

struct dw {
  float hi;
  float lo;
};

// A complex double-word number re + i*im.
struct cdw {
  dw re;
  dw im;
};

METAL_FUNC dw dw_make(float hi, float lo) {
  dw r;
  r.hi = hi;
  r.lo = lo;
  return r;
}

// The special-value rule (see "Special values" above): a non-finite float32 result
// h of the high-word operation is the result, with a zero low word.
METAL_FUNC bool dw_is_special(float h) { return !metal::isfinite(h); }
METAL_FUNC dw dw_special(float h) { return dw_make(h, 0.0f); }

// ---- error-free transforms --------------------------------------------------

// TwoSum (Knuth / Moller; JMP alg 2): s + t = a + b exactly and s = RN(a + b), for
// any ordering of |a|, |b| (6 ops). Exact as long as nothing over- or underflows
// (see Range). (s, t) is a normalised double-word.
METAL_FUNC dw dw_two_sum(float a, float b) {
  float s = a + b;
  if (dw_is_special(s)) return dw_special(s);
  float ap = s - b;
  float bp = s - ap;
  float da = a - ap;
  float db = b - bp;
  return dw_make(s, da + db);
}

// Fast2Sum (Dekker; JMP alg 1): s + t = a + b exactly when exponent(a) >=
// exponent(b) (e.g. |a| >= |b|). Otherwise the result can be
// inexact: Fast2Sum(2^-30, 1) = (1, 0) loses the 2^-30. Used only where JMP's
// proofs establish the condition (a == 0 is also fine: the result is (b, 0)).
METAL_FUNC dw dw_fast_two_sum(float a, float b) {
  float s = a + b;
  if (dw_is_special(s)) return dw_special(s);
  if (a == 0.0f && b == 0.0f) return dw_make(a * 1.0f, 0.0f);  // keeps a -0 (flushed)
  float z = s - a;
  return dw_make(s, b - z);
}

// TwoProdFMA (JMP alg 3): p + e = a * b exactly, p = RN(a * b), e = fma residual.
// Exact when exponent(a) + exponent(b) >= -80 and a*b does not overflow (see Range).
METAL_FUNC dw dw_two_prod(float a, float b) {
  float p = a * b;
  if (dw_is_special(p)) return dw_special(p);
  float e = metal::fma(a, b, -p);
  return dw_make(p, e);
}

// ---- conversions ------------------------------------------------------------

// float -> double-word (exact).
METAL_FUNC dw dw_from_float(float a) { return dw_make(a, 0.0f); }

// (hi, lo) pair -> normalised double-word via Fast2Sum: exact, provided
// exponent(hi) >= exponent(lo) (e.g. |hi| >= |lo|), which a pair split on the host
// (hi = RN(x), lo = RN(x - hi)) satisfies.
METAL_FUNC dw dw_from_pair(float hi, float lo) { return dw_fast_two_sum(hi, lo); }

// double-word -> float: RN(hi + lo), one rounding of the exact value hi + lo (equal
// to hi for a normalised pair). Note: the double-word value already carries its own
// error, so this is RN(exact result) except in rare near-midpoint cases.
METAL_FUNC float dw_to_float(dw x) { return x.hi + x.lo; }

// Negation: exact, and keeps the pair normalised.
METAL_FUNC dw dw_neg(dw x) { return dw_make(-x.hi, -x.lo); }

// ---- addition ---------------------------------------------------------------

// DW + FP (JMP alg 4, DWPlusFP): relative error <= 2u^2 (JMP, Table 1; the proof
// was corrected and Coq-checked in MR). 10 ops.
METAL_FUNC dw dw_add_fp(dw x, float y) {
  dw s = dw_two_sum(x.hi, y);
  if (dw_is_special(s.hi)) return s;
  float v = x.lo + s.lo;
  return dw_fast_two_sum(s.hi, v);
}

// Accurate DW + DW (JMP alg 6, AccurateDWPlusDW): relative error
// <= 3u^2 + 13u^3 (JMP, Table 1), even under cancellation.
// 20 ops. Never the "sloppy" JMP alg 5: no bound when the signs differ.
METAL_FUNC dw dw_add(dw x, dw y) {
  dw s = dw_two_sum(x.hi, y.hi);
  if (dw_is_special(s.hi)) return s;
  dw t = dw_two_sum(x.lo, y.lo);
  float c = s.lo + t.hi;
  dw v = dw_fast_two_sum(s.hi, c);
  float w = t.lo + v.lo;
  return dw_fast_two_sum(v.hi, w);
}

// x - y = x + (-y): negation is exact, so the alg 6 bound applies unchanged.
METAL_FUNC dw dw_sub(dw x, dw y) { return dw_add(x, dw_neg(y)); }

// ---- multiplication ---------------------------------------------------------

// DW * FP with FMA (JMP alg 9, DWTimesFP3): relative error <= 2u^2 (JMP, Table 1).
// 6 ops.
METAL_FUNC dw dw_mul_fp(dw x, float y) {
  dw c = dw_two_prod(x.hi, y);
  if (dw_is_special(c.hi)) return c;
  float cl3 = metal::fma(x.lo, y, c.lo);
  return dw_fast_two_sum(c.hi, cl3);
}

// DW * DW with FMA (JMP alg 12, DWTimesDW3): relative error <= 4u^2 (MR's Coq-checked
// bound; JMP's Table 1 gives 5u^2, with a proof MR found flawed and repaired). 9 ops.
METAL_FUNC dw dw_mul(dw x, dw y) {
  dw c = dw_two_prod(x.hi, y.hi);
  if (dw_is_special(c.hi)) return c;
  float tl0 = x.lo * y.lo;
  float tl1 = metal::fma(x.hi, y.lo, tl0);
  float cl2 = metal::fma(x.lo, y.hi, tl1);
  float cl3 = c.lo + cl2;
  return dw_fast_two_sum(c.hi, cl3);
}

// ---- division ---------------------------------------------------------------

// DW / DW (JMP alg 18, DWDivDW3) from a starting reciprocal t0 ~ 1/y.hi that need
// only be FAITHFUL (|t0 - 1/y.hi| < ulp): no reliance on a correctly rounded
// division (DESIGN: kernel-writing rules).
//
// Step 0 (ours, before alg 18): one float32 Newton step t = RN(t0 + t0*e0),
// e0 = 1 - y.hi*t0. For faithful t0, e0 = -eps (t0 = (1 + eps)/y.hi, |eps| < 2u) is
// exact (a multiple of ulp(y.hi)*ulp(t0) below 2^24 of those units), so t is the
// single rounding of (1 - eps^2)/y.hi, |eps^2| < 4u^2. From t0 = RN(1/y.hi), t == t0.
// From the other faithful neighbour, t == RN(1/y.hi) too, for all 2^23 significands
// of y.hi but one (checked exhaustively in tests/doubleword/test_doubleword.py;
// scaling y.hi by 2^k and its sign change nothing while 1/y.hi is normal): y.hi =
// +-(2 - 2^-23)*2^k, t0 = +-2^(-k-1), where (1 - eps^2)/y.hi is the midpoint
// 2^(-k-1)(1 + 2^-24) and rounds to even, t = t0, |t*y.hi - 1| = u instead of
// u - u^2. So JMP's hypothesis th = RN(1/yh) holds, up to that one O(u^2) change in
// |1 - yh*th| <= u, which moves alg 18's bound by O(u^3); MR's 4u^2 (instead of
// JMP's 5u^2) for the final DWTimesDW3 leaves about 1u^2 to absorb it. Without this
// step a faithful t0 does NOT suffice: |1 - y*t0| can reach ~3u, leaving ~9u^2 from
// the Newton step alone (measured up to 9.46u^2 on adversarial operands, against
// ~3.7u^2 with the step; test_dw_div_faithful_start_adversarial).
//
// dw_recip_refine is step 0; dw_div_from_recip is step 0 + alg 18.
// Alg 18 then: rh = 1 - y.hi*t (exact, fma), rl = -y.lo*t, (eh, el) =
// Fast2Sum(rh, rl), delta = e*t (DWTimesFP3), m = delta + t (DWPlusFP) ~ 1/y (one
// Newton step in double-word), z = x*m (DWTimesDW3). Relative error <= 9.8u^2
// (JMP, Table 1: "DW/DW with FMA, alg 18").
// Domain: 2^-126 <= |y.hi| <= 2^96 (so 1/y.hi and e*t are normal; dw_div scales
// larger |y.hi| into it) and a result well above 2^-78 in
// magnitude (see Range); y == 0 gives Inf/NaN.
METAL_FUNC float dw_recip_refine(float yh, float t0) {
  float e0 = metal::fma(-yh, t0, 1.0f);
  return metal::fma(t0, e0, t0);
}

METAL_FUNC dw dw_div_from_recip(dw x, dw y, float t0) {
  // Special values: x.hi / y.hi as float32 gives them (y = 0, Inf or NaN operands,
  // overflow); a finite quotient by an infinite y is that signed zero.
  float q = x.hi / y.hi;
  if (dw_is_special(q) || dw_is_special(y.hi)) return dw_special(q);
  float th = dw_recip_refine(y.hi, t0);
  float rh = metal::fma(-y.hi, th, 1.0f);
  float rl = -(y.lo * th);
  dw e = dw_fast_two_sum(rh, rl);
  dw d = dw_mul_fp(e, th);
  dw m = dw_add_fp(d, th);
  return dw_mul(x, m);
}

// DW / DW: relative error <= 9.8u^2 (see dw_div_from_recip). The one float32 division
// in the extended path: `/` is correctly rounded under safe math (measured on an M2)
// and in the emulator, but the bound only needs it faithful.
// Divisors above 2^96 divide x 2^-64 by y 2^-64 (exact scalings, the same quotient):
// above 2^126 1/y.hi is subnormal, flushed (the quotient came out 0), and above
// ~2^101 the Newton correction e*t (|e| up to u) falls below 2^-126 (2^-24 error).
METAL_FUNC dw dw_div(dw x, dw y) {
  if (metal::fabs(y.hi) > 7.9228163e28f) {  // 2^96; 2^-64 below
    x = dw_make(x.hi * 5.4210109e-20f, x.lo * 5.4210109e-20f);
    y = dw_make(y.hi * 5.4210109e-20f, y.lo * 5.4210109e-20f);
  }
  return dw_div_from_recip(x, y, 1.0f / y.hi);
}

// ---- complex ----------------------------------------------------------------

// Complex add: componentwise accurate DW + DW, so each component (and the
// normwise error) is within 3u^2 + 13u^3.
METAL_FUNC cdw cdw_add(cdw x, cdw y) {
  cdw r;
  r.re = dw_add(x.re, y.re);
  r.im = dw_add(x.im, y.im);
  return r;
}

// Complex multiply (a + ib)(c + id) = (ac - bd) + i(ad + bc): each real product
// by DWTimesDW3 (exact hi*hi via TwoProdFMA; relative error <= 4u^2, MR), each sum
// by accurate DW + DW (<= 3u^2 + 13u^3).
// Normwise bound (derived here, not published): with A = |ac| + |bd|,
// B = |ad| + |bc|, the error of the real part is <= 4u^2 A + (3u^2 + 13u^3)
// (|ac - bd| + 4u^2 A), likewise for the imaginary part with B, and
// A^2 + B^2 = |x|^2|y|^2 + 4|abcd| <= 2|x|^2|y|^2. So
// ||error||_2 <= (4*sqrt(2) + 3)u^2 |xy| + O(u^3) < 8.66u^2 |xy|.
// A single component can lose relative accuracy only under cancellation
// (|ac - bd| << A).
METAL_FUNC cdw cdw_mul(cdw x, cdw y) {
  cdw r;
  r.re = dw_sub(dw_mul(x.re, y.re), dw_mul(x.im, y.im));
  r.im = dw_add(dw_mul(x.re, y.im), dw_mul(x.im, y.re));
  return r;
}

// ---- compensated summation -------------------------------------------------

// Accumulator for sums of many double-word terms t_k (e.g. exact products from
// dw_two_prod) with error O(u^3 sum |t_k|) instead of the O(k u^2 sum |t_k|) of a
// chain of dw_add: the high words go through an exact TwoSum chain (Ogita, Rump,
// Oishi, "Accurate sum and dot product", SISC 2005, alg Sum2/Dot2) and every error
// term, together with every low word (each below u |t_k| or u |partial sum|), is
// added into a double-word correction c by DW+FP (JMP alg 4, 2u^2). The result
// dw_acc_value = c + s by DW+FP again, so
//   |result - sum t_k| <= 2u^2 |sum t_k| + (4n + O(1)) u^3 sum |t_k| + O(u^4)
// for n terms: faithful (and almost always exactly rounded) after one rounding
// whenever |sum t_k| >= 2^-20 sum |t_k| and n < 2^15.
struct dw_acc {
  float s;  // running float sum of the high words
  dw c;     // error terms and low words
};

METAL_FUNC dw_acc dw_acc_make(dw t) {
  dw_acc a;
  a.s = t.hi;
  a.c = dw_make(t.lo, 0.0f);
  return a;
}

METAL_FUNC dw_acc dw_acc_add(dw_acc a, dw t) {
  dw e = dw_two_sum(a.s, t.hi);
  a.s = e.hi;
  a.c = dw_add_fp(dw_add_fp(a.c, e.lo), t.lo);
  return a;
}

METAL_FUNC dw dw_acc_value(dw_acc a) { return dw_add_fp(a.c, a.s); }
