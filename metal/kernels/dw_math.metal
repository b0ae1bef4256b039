// Elementwise double-word function selected by the template parameter FN
// (metal/include/dw_math.h; codes in mlx_precise/doubleword/functions.py FN_CODES):
//   0 exp, 1 expm1, 2 log, 3 log1p, 4 log2, 5 log10, 6 sin, 7 cos, 8 tanh, 9 sigmoid,
//   10 erf, 11 sqrt, 12 rsqrt, 13 reciprocal, 14 pow(a, b), 15 atan2(a, b) (a = y,
//   b = x), 16 complex exp of a + ib.
// Inputs ah, al, bh, bl: float32, length n (b unused by unary functions). Outputs
// zh, zl: the result (real part for FN 16), length n; wh, wl: the imaginary part for
// FN 16 (length n), not written otherwise.
static_assert(FN >= 0 && FN <= 16, "dw_math: FN must be 0..16");
uint i = thread_position_in_grid.x;
if (i >= uint(ah_shape[0])) return;
dw a = dw_make(ah[i], al[i]);
dw z;
if (FN == 0) {
  z = dwm_exp(a);
} else if (FN == 1) {
  z = dwm_expm1(a);
} else if (FN == 2) {
  z = dwm_log(a, 0);
} else if (FN == 3) {
  z = dwm_log1p(a);
} else if (FN == 4) {
  z = dwm_log(a, 2);
} else if (FN == 5) {
  z = dwm_log(a, 10);
} else if (FN == 6) {
  z = dwm_sincos1(a, false);
} else if (FN == 7) {
  z = dwm_sincos1(a, true);
} else if (FN == 8) {
  z = dwm_tanh(a);
} else if (FN == 9) {
  z = dwm_sigmoid(a);
} else if (FN == 10) {
  z = dwm_erf(a);
} else if (FN == 11) {
  z = dwm_sqrt(a);
} else if (FN == 12) {
  z = dwm_rsqrt(a);
} else if (FN == 13) {
  z = dw_div(dw_make(1.0f, 0.0f), a);
} else if (FN == 14) {
  z = dwm_pow(a, dw_make(bh[i], bl[i]));
} else if (FN == 15) {
  z = dwm_atan2(a, dw_make(bh[i], bl[i]));
} else {
  cdw c = dwm_cexp(a, dw_make(bh[i], bl[i]));
  z = c.re;
  wh[i] = c.im.hi;
  wl[i] = c.im.lo;
}
zh[i] = z.hi;
zl[i] = z.lo;
