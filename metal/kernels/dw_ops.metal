// Elementwise double-word operation selected by the template parameter OP: the
// arithmetic of metal/include/doubleword.h as the DoubleWord engine runs it (x + y,
// x * y, x / y of DoubleWord operands on metal / emulate:
// mlx_precise/doubleword/kernel_engine.py), and the error-free transforms and
// division steps the self-test and tests/doubleword/test_doubleword.py check.
// Inputs xh, xl, yh, yl: float32, length n; x = (xh, xl), y = (yh, yl) as given (not
// renormalised). Outputs zh, zl: float32, length n. OP is one of the codes of
// dw_ops.h (generated from DW_OP in mlx_precise/doubleword/dw_kernels.py):
//   DW_OP_TWO_SUM       TwoSum(xh, yh)            -> (s, t)
//   DW_OP_FAST_TWO_SUM  Fast2Sum(xh, yh)          -> (s, t)
//   DW_OP_TWO_PROD      TwoProdFMA(xh, yh)        -> (p, e)
//   DW_OP_ADD_FP        DW + FP   x + yh          (JMP alg 4)
//   DW_OP_ADD           DW + DW   x + y           (JMP alg 6)
//   DW_OP_MUL_FP        DW * FP   x * yh          (JMP alg 9)
//   DW_OP_MUL           DW * DW   x * y           (JMP alg 12)
//   DW_OP_DIV           DW / DW   x / y           (JMP alg 18)
//   DW_OP_DIV_FAITHFUL  DW / DW   x / y started from the faithful neighbour of
//                       RN(1/yh) on the other side of 1/yh (not RN): checks that
//                       the bound needs only a faithful reciprocal.
//   DW_OP_RECIP_REFINE  (step 0 of DW / DW) zh = dw_recip_refine(yh, RN(1/yh)),
//                       zl = dw_recip_refine(yh, other faithful neighbour of 1/yh);
//                       x unused.
uint i = thread_position_in_grid.x;
if (i >= uint(xh_shape[0])) return;
dw x = dw_make(xh[i], xl[i]);
dw y = dw_make(yh[i], yl[i]);
static_assert(OP >= 0 && OP < DW_OP_COUNT, "dw_ops: OP must be a DW_OP code (dw_ops.h)");
dw z;
if (OP == DW_OP_TWO_SUM) {
  z = dw_two_sum(x.hi, y.hi);
} else if (OP == DW_OP_FAST_TWO_SUM) {
  z = dw_fast_two_sum(x.hi, y.hi);
} else if (OP == DW_OP_TWO_PROD) {
  z = dw_two_prod(x.hi, y.hi);
} else if (OP == DW_OP_ADD_FP) {
  z = dw_add_fp(x, y.hi);
} else if (OP == DW_OP_ADD) {
  z = dw_add(x, y);
} else if (OP == DW_OP_MUL_FP) {
  z = dw_mul_fp(x, y.hi);
} else if (OP == DW_OP_MUL) {
  z = dw_mul(x, y);
} else if (OP == DW_OP_DIV) {
  z = dw_div(x, y);
} else {  // DIV_FAITHFUL, RECIP_REFINE: from a faithful, not correctly rounded, reciprocal
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
  if (OP == DW_OP_DIV_FAITHFUL) {
    z = dw_div_from_recip(x, y, other);
  } else {
    z = dw_make(dw_recip_refine(y.hi, rn), dw_recip_refine(y.hi, other));
  }
}
zh[i] = z.hi;
zl[i] = z.lo;
