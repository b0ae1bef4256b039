// Elementwise double-word operation selected by the template parameter OP (test and
// self-check kernel for metal/include/doubleword.h; see
// tests/doubleword/test_doubleword.py).
// Inputs xh, xl, yh, yl: float32, length n; x = (xh, xl), y = (yh, yl) as given (not
// renormalised). Outputs zh, zl: float32, length n.
//   OP 0  TwoSum(xh, yh)            -> (s, t)
//   OP 1  Fast2Sum(xh, yh)          -> (s, t)
//   OP 2  TwoProdFMA(xh, yh)        -> (p, e)
//   OP 3  DW + FP   x + yh          (JMP alg 4)
//   OP 4  DW + DW   x + y           (JMP alg 6)
//   OP 5  DW * FP   x * yh          (JMP alg 9)
//   OP 6  DW * DW   x * y           (JMP alg 12)
//   OP 7  DW / DW   x / y           (JMP alg 18)
//   OP 8  DW / DW   x / y started from the faithful neighbour of RN(1/yh) on the
//         other side of 1/yh (not RN): checks that the bound needs only a faithful
//         reciprocal.
//   OP 9  (step 0 of DW / DW) zh = dw_recip_refine(yh, RN(1/yh)), zl =
//         dw_recip_refine(yh, other faithful neighbour of 1/yh); x unused.
uint i = thread_position_in_grid.x;
if (i >= uint(xh_shape[0])) return;
dw x = dw_make(xh[i], xl[i]);
dw y = dw_make(yh[i], yl[i]);
static_assert(OP >= 0 && OP <= 9, "dw_ops: OP must be 0..9");
dw z;
if (OP == 0) {
  z = dw_two_sum(x.hi, y.hi);
} else if (OP == 1) {
  z = dw_fast_two_sum(x.hi, y.hi);
} else if (OP == 2) {
  z = dw_two_prod(x.hi, y.hi);
} else if (OP == 3) {
  z = dw_add_fp(x, y.hi);
} else if (OP == 4) {
  z = dw_add(x, y);
} else if (OP == 5) {
  z = dw_mul_fp(x, y.hi);
} else if (OP == 6) {
  z = dw_mul(x, y);
} else if (OP == 7) {
  z = dw_div(x, y);
} else {  // OP 8, 9: start from a faithful but not correctly rounded reciprocal
  float rn = 1.0f / y.hi;
  // r = 1 - y.hi*rn (exact) > 0 means |rn| < 1/|y.hi|: step one ulp up in
  // magnitude (+1 on the sign-magnitude bits), r < 0 one down; r == 0: 1/y.hi is
  // a float and the only faithful value.
  float r = metal::fma(-y.hi, rn, 1.0f);
  uint b = as_type<uint>(rn);
  if (r != 0.0f) {
    b = r > 0.0f ? b + 1u : b - 1u;
  }
  float other = as_type<float>(b);
  if (OP == 8) {
    z = dw_div_from_recip(x, y, other);
  } else {
    z = dw_make(dw_recip_refine(y.hi, rn), dw_recip_refine(y.hi, other));
  }
}
zh[i] = z.hi;
zl[i] = z.lo;
