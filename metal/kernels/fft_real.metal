// Real-data FFTs through a half-length complex FFT (n = 2N; the standard
// packing, e.g. Press et al., Numerical Recipes 12.3), in double-word.
//
// DIR 0, rfft post-processing: z_m = x_2m + i x_(2m+1) went through a complex
// FFT of length N giving Z; for k = 0..N (Z_N = Z_0):
//     A = Z_k + conj(Z_(N-k)),  B = Z_k - conj(Z_(N-k)),
//     X_k = (A - i w^k B) / 2,  w = exp(-2 pi i / n).
// DIR 1, irfft pre-processing: from X_0..X_N (imaginary parts of X_0 and X_N
// ignored, as numpy does), for k < N:
//     E = X_k + conj(X_(N-k)),  O = (X_k - conj(X_(N-k))) conj(w^k),
//     Z_k = E + i O,
// after which an inverse complex FFT of length N scaled by 1/n gives
// z_m = x_2m + i x_(2m+1).
// Halving and multiplying by +-i are exact; the rest is accurate DW+DW and
// DWTimesDW3 (doubleword.h). The result is multiplied by scale when scaled
// (used when N = 1, where no complex FFT runs). As the first or last kernel of a
// transform it may load each row scaled by 2^-e (rs_in) or store it scaled back by
// 2^e (rs_out), e from the row's maximum rmax[row] (fft.h, fft_row_exponent).
//
// Inputs:  x_hi, x_lo float32 interleaved words, rows x (N or N+1) points (x_lo
//          unread unless lo_in; its words from params[FFT_REAL_LO_AT] on: a
//          kernel's packed output passed as both); tab float32 twiddle table of order n (fft.h);
//          rmax float32 max |x| of each row (unread unless rs_in or rs_out);
//          params int32 (16,): the fields FFT_REAL_* of fft.h (generated from
//          FFT_REAL_PARAMS in mlx_precise/fft/engine.py).
// Output:  y float32, the high words of rows x (N+1 or N) points, then (lo_out)
//          their low words from params[FFT_REAL_OUT_LO_AT] on (packed words).
// Grid: one thread per output point.
const device float* xl = x_lo + params[FFT_REAL_LO_AT];
device float* y_hi = y;
device float* y_lo = y + params[FFT_REAL_OUT_LO_AT];
uint N = uint(params[FFT_REAL_N_HALF]);
uint rows = uint(params[FFT_REAL_ROWS]);
bool pre = params[FFT_REAL_PRE] != 0;
bool lo_in = params[FFT_REAL_LO_IN] != 0;
bool lo_out = params[FFT_REAL_LO_OUT] != 0;
bool scaled = params[FFT_REAL_SCALED] != 0;
dw sc = dw_make(as_type<float>(params[FFT_REAL_SCALE_HI]), as_type<float>(params[FFT_REAL_SCALE_LO]));
bool rs_in = params[FFT_REAL_RS_IN] != 0;
bool rs_out = params[FFT_REAL_RS_OUT] != 0;
bool rs_per_part = params[FFT_REAL_RS_PER_PART] != 0;
int rs_growth = params[FFT_REAL_RS_GROWTH];

uint i = thread_position_in_grid.x;
uint per_row = pre ? N : N + 1u;
if (i >= rows * per_row) {
  return;
}
uint row = i / per_row;
uint k = i - row * per_row;
int e = (rs_in || rs_out) ? fft_row_exponent(rmax[row], rs_growth) : 0;
float down = fft_pow2_neg(e);
cdw out;
if (!pre) {
  uint in0 = row * N;
  cdw zk = fft_load(x_hi, xl, in0 + (k == N ? 0u : k), lo_in);
  cdw zm = fft_load(x_hi, xl, in0 + (k == 0u ? 0u : N - k), lo_in);
  if (rs_in) {
    zk = fft_times(zk, down);
    zm = fft_times(zm, down);
  }
  zm = cdw_conj(zm);
  cdw a = cdw_add(zk, zm);
  cdw t = cdw_mul(cdw_sub(zk, zm), fft_twiddle(tab, k, N, false));
  cdw h = cdw_add(a, cdw_mul_neg_i(t));
  out = cdw_make(dw_make(0.5f * h.re.hi, 0.5f * h.re.lo), dw_make(0.5f * h.im.hi, 0.5f * h.im.lo));
} else {
  uint in0 = row * (N + 1u);
  cdw xk = fft_load(x_hi, xl, in0 + k, lo_in);
  cdw xm = fft_load(x_hi, xl, in0 + N - k, lo_in);
  if (rs_in) {
    xk = fft_times(xk, down);
    xm = fft_times(xm, down);
  }
  if (k == 0u) {
    xk.im = dw_make(0.0f, 0.0f);
    xm.im = dw_make(0.0f, 0.0f);
  }
  xm = cdw_conj(xm);
  cdw e = cdw_add(xk, xm);
  cdw o = cdw_mul(cdw_sub(xk, xm), fft_twiddle(tab, k, N, true));
  out = cdw_add(e, cdw_mul_i(o));
}
out = scaled ? cdw_scale(out, sc) : out;
if (rs_out) {
  out = fft_unscale(out, fft_pow2(e), rs_per_part);
}
fft_store(y_hi, y_lo, i, out, lo_out);
