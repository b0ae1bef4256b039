// Elementwise double-word function selected by the template parameter FN, a code
// of dw_math.h (generated from FN in mlx_precise/doubleword/functions.py):
// DWM_FN_EXP, _EXPM1, _LOG, _LOG1P, _LOG2, _LOG10, _SIN, _COS, _TANH, _SIGMOID,
// _ERF, _SQRT, _RSQRT, _RECIPROCAL, _POWER (pow(a, b)), _ARCTAN2 (atan2(a, b),
// a = y, b = x), _CEXP (complex exp of a + ib).
// Inputs ah, al, bh, bl: float32, n words each (b unused by unary functions), a's
// low words at the offset at[0] of al and b's at at[1] of bl (0, or half a packed
// buffer passed as both words: one buffer); at int32, at[2] = n. Output z: float32,
// length 2 n: the result's high words zh, then its low words zl (packed words).
// DWM_FN_CEXP reads and writes complex words: ah, al the interleaved (re, im) words
// of n / 2 points (b unused), zh, zl those of the result (the views of complex64
// words: no split into parts nor join).
static_assert(FN >= 0 && FN < DWM_FN_COUNT, "dw_math: FN must be a DWM_FN code (dw_math.h)");
uint i = thread_position_in_grid.x;
uint n = uint(at[2]);
auto a_lo = al + at[0];  // (device or constant: the address space MLX passes al in)
auto b_lo = bl + at[1];
device float* zh = z;
device float* zl = z + n;
if (FN == DWM_FN_CEXP) {
  if (i >= n / 2u) return;
  cdw c = dwm_cexp(dw_make(ah[2 * i], a_lo[2 * i]), dw_make(ah[2 * i + 1], a_lo[2 * i + 1]));
  zh[2 * i] = c.re.hi;
  zh[2 * i + 1] = c.im.hi;
  zl[2 * i] = c.re.lo;
  zl[2 * i + 1] = c.im.lo;
  return;
}
if (i >= n) return;
// the real functions by their codes (dwm_apply in dw_math.h)
dw v = dwm_apply(FN, dw_make(ah[i], a_lo[i]), dw_make(bh[i], b_lo[i]));
zh[i] = v.hi;
zl[i] = v.lo;
