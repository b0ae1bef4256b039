// Elementwise double-word function selected by the template parameter FN, a code
// of dw_math.h (generated from FN in mlx_precise/doubleword/functions.py):
// DWM_FN_EXP, _EXPM1, _LOG, _LOG1P, _LOG2, _LOG10, _SIN, _COS, _TANH, _SIGMOID,
// _ERF, _SQRT, _RSQRT, _RECIPROCAL, _POWER (pow(a, b)), _ARCTAN2 (atan2(a, b),
// a = y, b = x), _CEXP (complex exp of a + ib).
// Inputs ah, al, bh, bl: float32, length n (b unused by unary functions). Output z:
// float32, length 2 n: the result's high words zh, then its low words zl (packed
// words). DWM_FN_CEXP reads and writes complex words: ah, al the interleaved (re, im)
// words of n / 2 points (b unused), zh, zl those of the result (the views of
// complex64 words: no split into parts nor join).
static_assert(FN >= 0 && FN < DWM_FN_COUNT, "dw_math: FN must be a DWM_FN code (dw_math.h)");
uint i = thread_position_in_grid.x;
device float* zh = z;
device float* zl = z + ah_shape[0];
if (FN == DWM_FN_CEXP) {
  if (i >= uint(ah_shape[0]) / 2u) return;
  cdw c = dwm_cexp(dw_make(ah[2 * i], al[2 * i]), dw_make(ah[2 * i + 1], al[2 * i + 1]));
  zh[2 * i] = c.re.hi;
  zh[2 * i + 1] = c.im.hi;
  zl[2 * i] = c.re.lo;
  zl[2 * i + 1] = c.im.lo;
  return;
}
if (i >= uint(ah_shape[0])) return;
// the real functions by their codes (dwm_apply in dw_math.h)
dw v = dwm_apply(FN, dw_make(ah[i], al[i]), dw_make(bh[i], bl[i]));
zh[i] = v.hi;
zl[i] = v.lo;
