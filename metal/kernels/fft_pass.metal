// One pass of the double-word Stockham autosort FFT (radix-2/4 inside, any
// power-of-two radix R <= FFT_TG_POINTS outside), batched over rows.
//
// A transform of length n = R_1 R_2 ... R_P runs as P passes (mlx_precise/fft/engine.py
// plans them). Pass p, with Ns = R_1 ... R_(p-1) and R = R_p, computes for every
// row and every group j < n/R, with k = j mod Ns (the Stockham formulation of
// Van Loan, "Computational Frameworks for the FFT", 1.7; also Govindaraju et
// al., SC 2008):
//     v[r] = x[j + r n/R] * w_(Ns R)^(r k)        r < R      (pre-twiddle)
//     V    = DFT_R(v)                                         (threadgroup memory)
//     y[(j / Ns) Ns R + k + r Ns] = V[r] * scale
// The last pass leaves the transform in natural order. DFT_R is itself a
// Stockham FFT in threadgroup memory: one radix-2 stage when log2 R is odd, then
// radix-4 stages, ping-ponging between two buffers (one barrier per stage).
// Every operation is double-word (doubleword.h): accurate DW+DW additions,
// DWTimesDW3 products, twiddles split from values exact to ~2^-100.
//
// The first pass of a transform may load each row scaled by 2^-e (rs_in) and the
// last store it scaled back by 2^e (rs_out), e from the row's maximum rmax[row]
// (fft.h, fft_row_exponent).
//
// Inputs:  x_hi, x_lo float32 interleaved (re, im) words of rows x n points
//          (x_lo unread unless lo_in; its words from params[FFT_PASS_LO_AT] on:
//          the previous pass's packed output y passed as both, its low words a
//          plane past its high words); tab float32 twiddle table of order
//          NT = 2^logNT (fft.h); rmax float32 max |x| of each row (unread unless
//          rs_in or rs_out); params int32 (20,): the fields FFT_PASS_* of fft.h
//          (generated from FFT_PASS_PARAMS in mlx_precise/fft/engine.py).
// Output:  y float32, the high words of rows x n points, then (unless lo_out: none)
//          their low words from params[FFT_PASS_OUT_LO_AT] on (packed words).
// Grid: threadgroup t handles groups g = t C ... t C + C - 1 (g = row n/R + j,
// out-of-range groups are skipped); any threadgroup size works (loops).
const device float* xl = x_lo + params[FFT_PASS_LO_AT];
device float* y_hi = y;
device float* y_lo = y + params[FFT_PASS_OUT_LO_AT];
uint logn = uint(params[FFT_PASS_LOGN]);
uint logR = uint(params[FFT_PASS_LOG_R]);
uint logNs = uint(params[FFT_PASS_LOG_NS]);
uint logC = uint(params[FFT_PASS_LOG_C]);
uint G = uint(params[FFT_PASS_GROUPS]);  // rows * n / R
uint logNT = uint(params[FFT_PASS_LOG_NT]);
bool inverse = params[FFT_PASS_INVERSE] != 0;
bool lo_in = params[FFT_PASS_LO_IN] != 0;
bool lo_out = params[FFT_PASS_LO_OUT] != 0;
bool scaled = params[FFT_PASS_SCALED] != 0;
dw sc = dw_make(as_type<float>(params[FFT_PASS_SCALE_HI]), as_type<float>(params[FFT_PASS_SCALE_LO]));
bool rs_in = params[FFT_PASS_RS_IN] != 0;
bool rs_out = params[FFT_PASS_RS_OUT] != 0;
bool rs_per_part = params[FFT_PASS_RS_PER_PART] != 0;
int rs_growth = params[FFT_PASS_RS_GROWTH];

threadgroup float4 buf_a[FFT_TG_POINTS];
threadgroup float4 buf_b[FFT_TG_POINTS];
uint tid = thread_position_in_threadgroup.x;
uint nth = threads_per_threadgroup.x;
uint g0 = threadgroup_position_in_grid.x << logC;
uint R = 1u << logR;
uint C = 1u << logC;
uint npts = C << logR;
uint logGpr = logn - logR;  // log2 of groups per row
uint Ns = 1u << logNs;
uint half_nt = 1u << (logNT - 1);

// Load with the pre-twiddle. Consecutive threads take consecutive addresses:
// the points of one group when they are contiguous (one group per row), else
// the same point of consecutive groups.
bool r_fast = logGpr == 0;
for (uint p = tid; p < npts; p += nth) {
  uint c = r_fast ? p >> logR : p & (C - 1);
  uint r = r_fast ? p & (R - 1) : p >> logC;
  uint g = g0 + c;
  cdw v = cdw_zero();
  if (g < G) {
    uint row = g >> logGpr;
    uint j = g & ((1u << logGpr) - 1u);
    v = fft_load(x_hi, xl, (row << logn) + j + (r << logGpr), lo_in);
    if (rs_in) {
      v = fft_times(v, fft_pow2_neg(fft_row_exponent(rmax[row], rs_growth)));
    }
    uint k = j & (Ns - 1u);
    if (k != 0u && r != 0u) {
      v = cdw_mul(v, fft_twiddle(tab, (r * k) << (logNT - logNs - logR), half_nt, inverse));
    }
  }
  buf_a[(c << logR) + r] = cdw_pack(v);
}
threadgroup_barrier(mem_flags::mem_threadgroup);

threadgroup float4* src = buf_a;
threadgroup float4* dst = buf_b;
uint logL = 0;  // length of the sub-transforms done so far
if (logR & 1u) {
  // Radix-2 stage with L = 1: no twiddles.
  for (uint b = tid; b < (npts >> 1); b += nth) {
    uint base = (b >> (logR - 1u)) << logR;
    uint q = b & ((R >> 1) - 1u);
    cdw a = cdw_unpack(src[base + q]);
    cdw d = cdw_unpack(src[base + q + (R >> 1)]);
    dst[base + 2u * q] = cdw_pack(cdw_add(a, d));
    dst[base + 2u * q + 1u] = cdw_pack(cdw_sub(a, d));
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  threadgroup float4* t = src;
  src = dst;
  dst = t;
  logL = 1;
}
for (; logL < logR; logL += 2u) {
  // Radix-4 stage: sub-transforms of length L = 2^logL become length 4L.
  uint L = 1u << logL;
  uint quarter = R >> 2;
  for (uint b = tid; b < (npts >> 2); b += nth) {
    uint base = (b >> (logR - 2u)) << logR;
    uint q = b & (quarter - 1u);
    uint k = q & (L - 1u);
    cdw v0 = cdw_unpack(src[base + q]);
    cdw v1 = cdw_unpack(src[base + q + quarter]);
    cdw v2 = cdw_unpack(src[base + q + 2u * quarter]);
    cdw v3 = cdw_unpack(src[base + q + 3u * quarter]);
    if (k != 0u) {
      uint sh = logNT - logL - 2u;  // w_(4L)^t = table entry t * NT / (4L)
      v1 = cdw_mul(v1, fft_twiddle(tab, k << sh, half_nt, inverse));
      v2 = cdw_mul(v2, fft_twiddle(tab, (2u * k) << sh, half_nt, inverse));
      v3 = cdw_mul(v3, fft_twiddle(tab, (3u * k) << sh, half_nt, inverse));
    }
    // DFT_4 with w_4 = -i (forward) or i (inverse): multiplications are exact.
    cdw s02 = cdw_add(v0, v2);
    cdw d02 = cdw_sub(v0, v2);
    cdw s13 = cdw_add(v1, v3);
    cdw d13 = inverse ? cdw_mul_i(cdw_sub(v1, v3)) : cdw_mul_neg_i(cdw_sub(v1, v3));
    uint o = base + ((q >> logL) << (logL + 2u)) + k;
    dst[o] = cdw_pack(cdw_add(s02, s13));
    dst[o + L] = cdw_pack(cdw_add(d02, d13));
    dst[o + 2u * L] = cdw_pack(cdw_sub(s02, s13));
    dst[o + 3u * L] = cdw_pack(cdw_sub(d02, d13));
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  threadgroup float4* t = src;
  src = dst;
  dst = t;
}

// Store (scaled), in the autosort order of the pass.
r_fast = logNs == 0;
for (uint p = tid; p < npts; p += nth) {
  uint c = r_fast ? p >> logR : p & (C - 1);
  uint r = r_fast ? p & (R - 1) : p >> logC;
  uint g = g0 + c;
  if (g < G) {
    uint row = g >> logGpr;
    uint j = g & ((1u << logGpr) - 1u);
    uint o = (row << logn) + ((j >> logNs) << (logNs + logR)) + (j & (Ns - 1u)) + (r << logNs);
    cdw v = cdw_unpack(src[(c << logR) + r]);
    v = scaled ? cdw_scale(v, sc) : v;
    if (rs_out) {
      v = fft_unscale(v, fft_pow2(fft_row_exponent(rmax[row], rs_growth)), rs_per_part);
    }
    fft_store(y_hi, y_lo, o, v, lo_out);
  }
}
