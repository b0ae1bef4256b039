// Elementwise double-word function selected by the template parameter FN, a code
// of dw_math.h (generated from FN in mlx_precise/doubleword/functions.py):
// DWM_FN_EXP, _EXPM1, _LOG, _LOG1P, _LOG2, _LOG10, _SIN, _COS, _TANH, _SIGMOID,
// _ERF, _SQRT, _RSQRT, _RECIPROCAL, _POWER (pow(a, b)), _ARCTAN2 (atan2(a, b),
// a = y, b = x), _CEXP (complex exp of a + ib).
// Inputs ah, al, bh, bl: float32, length n (b unused by unary functions). Outputs
// zh, zl: the result (real part for DWM_FN_CEXP), length n; wh, wl: the imaginary
// part for DWM_FN_CEXP (length n), not written otherwise.
static_assert(FN >= 0 && FN < DWM_FN_COUNT, "dw_math: FN must be a DWM_FN code (dw_math.h)");
uint i = thread_position_in_grid.x;
if (i >= uint(ah_shape[0])) return;
dw a = dw_make(ah[i], al[i]);
dw z;
if (FN == DWM_FN_CEXP) {
  cdw c = dwm_cexp(a, dw_make(bh[i], bl[i]));
  z = c.re;
  wh[i] = c.im.hi;
  wl[i] = c.im.lo;
} else {  // the real functions by their codes (dwm_apply in dw_math.h)
  z = dwm_apply(FN, a, dw_make(bh[i], bl[i]));
}
zh[i] = z.hi;
zl[i] = z.lo;
