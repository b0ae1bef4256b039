// Double-word matrix product: tile sizes and the per-output accumulator of
// metal/kernels/dw_gemm.metal (mlx_precise/linalg/gemm.py; docs/dwgemm.md).
//
// One output c = d + sum_k a_k b_k (d: the bias, or 0) with double-word operands
// a_k = ah + al, b_k = bh + bl is accumulated as Dot2 (Ogita, Rump, Oishi, "Accurate
// sum and dot product", SIAM J. Sci. Comput. 26(6), 2005) with its correction term
// kept in double-word:
//   (p, e)  = TwoProdFMA(ah, bh)              exact: p + e = ah bh (JMP alg 3)
//   r       = fma(ah, bl, fma(al, bh, e))     the cross terms and e, rounded twice
//   (s, t)  = TwoSum(s, p)                    exact: the running float sum of the p
//   c       = c + RN(t + r)                   DW + FP (JMP alg 4, <= 2u^2 relative)
// and the value is c + s by DW + FP once more. 21 float32 operations per term
// (against 29 for a DW*DW product, JMP alg 12, plus an accurate DW+DW sum, alg 6).
//
// Error (u = 2^-24; S = |d| + sum_k |a_k| |b_k|; derived in docs/dwgemm.md): the
// exact sum of the s, t and the float terms is the exact result except for
//   * r: |r - (e + ah bl + al bh)| <= 5u^2 |ah bh| (two roundings of terms below
//     2u |ah bh| and 3u |ah bh|), and al bl (<= u^2 |ah bh|) is left out;
//   * RN(t + r): <= u (|t| + |r|) <= u^2 |s_k| + 3u^2 |ah bh|, |s_k| <= S (1 + O(Ku));
//   * the DW + FP steps into c (|c| <= (K + 4) u S): <= 2u^2 |c| each, O(K^2 u^3) S;
//   * the final DW + FP: <= 2u^2 |c + s|.
// So |computed - exact| <= (K + 9) u^2 S + 2u^2 |exact| + O(K^2 u^3) S, i.e.
// c K u^2 S with c <= 12 for every K >= 1 (the tests assert (K + 12) u^2 S).
//
// Special values (the float32 rule of doubleword.h): the float sum s meets every
// product ah * bh and the bias high word, so it is Inf or NaN exactly when the float32
// sum of those is (a NaN operand, Inf * 0, Inf - Inf, overflow); such an output is s
// with a zero low word. Otherwise every operand is finite and so are c and r.
#pragma once

#include "doubleword.h"

// Output tile of one threadgroup (BM x BN), K step staged in threadgroup memory
// (BK), outputs per thread (TM x TN): (BM / TM) * (BN / TN) = 256 threads.
#define DW_GEMM_BM 32
#define DW_GEMM_BN 32
#define DW_GEMM_BK 16
#define DW_GEMM_TM 2
#define DW_GEMM_TN 2
#define DW_GEMM_THREADS ((DW_GEMM_BM / DW_GEMM_TM) * (DW_GEMM_BN / DW_GEMM_TN))

struct dwg_acc {
  float s;  // running float32 sum of the products' high parts (an exact TwoSum chain)
  dw c;     // every rounding error of that chain, the products' low parts, the lo words
};

// An accumulator holding the double-word d = dh + dl (the bias, or zero).
METAL_FUNC dwg_acc dwg_acc_make(float dh, float dl) {
  dwg_acc a;
  a.s = dh;
  a.c = dw_make(dl, 0.0f);
  return a;
}

// acc += (ah + al) * (bh + bl)  (see the top of this file). The error-free
// transforms are written out without doubleword.h's special-value checks (five per
// term, about a third more instructions): an Inf or NaN reaches s through
// s + p and stays there (Inf + finite = Inf, NaN sticks), and dwg_acc_value then
// discards c, whatever NaN the residuals made of it.
METAL_FUNC void dwg_acc_fma(thread dwg_acc& acc, float ah, float al, float bh, float bl) {
  const float p = ah * bh;                          // TwoProdFMA (JMP alg 3): p + e = ah bh
  const float e = metal::fma(ah, bh, -p);
  const float r = metal::fma(ah, bl, metal::fma(al, bh, e));
  const float s = acc.s + p;                        // TwoSum (JMP alg 2): s + t = acc.s + p
  const float sp = s - p, pp = s - sp;
  const float t = (acc.s - sp) + (p - pp);
  acc.s = s;
  const float x = t + r;                            // c + x by DW + FP (JMP alg 4):
  const float ch = acc.c.hi + x;                    //   TwoSum(c.hi, x) ...
  const float xp = ch - x, cp = ch - xp;
  const float v = acc.c.lo + ((acc.c.hi - xp) + (x - cp));
  const float h = ch + v;                           //   ... then Fast2Sum(ch, c.lo + err)
  acc.c = dw_make(h, v - (h - ch));
}

// The accumulated value as a normalised double-word: c + s by DW + FP (JMP alg 4),
// or s with a zero low word when s is Inf or NaN.
METAL_FUNC dw dwg_acc_value(dwg_acc acc) {
  if (dw_is_special(acc.s)) return dw_special(acc.s);
  return dw_add_fp(acc.c, acc.s);
}
