// Helpers of the double-word FFT kernels (fft_pass.metal, fft_real.metal).
//
// A complex double-word point is a cdw (doubleword.h): in device memory its words
// live in two interleaved float32 arrays, hi = (re.hi, im.hi, ...) and
// lo = (re.lo, im.lo, ...) (the views of a DoubleWord's complex64 words); in
// threadgroup memory one float4 (re.hi, re.lo, im.hi, im.lo).
#pragma once
#include "doubleword.h"

// Points of one threadgroup's transforms: two ping-pong buffers of this many
// float4 = 2 x 16 KiB, Apple's 32 KiB threadgroup-memory limit.
#define FFT_TG_POINTS 1024

METAL_FUNC cdw cdw_make(dw re, dw im) {
  cdw r;
  r.re = re;
  r.im = im;
  return r;
}

METAL_FUNC cdw cdw_zero() { return cdw_make(dw_make(0.0f, 0.0f), dw_make(0.0f, 0.0f)); }

METAL_FUNC cdw cdw_sub(cdw x, cdw y) { return cdw_make(dw_sub(x.re, y.re), dw_sub(x.im, y.im)); }

// Exact: -i * x and i * x are a swap and a negation.
METAL_FUNC cdw cdw_mul_neg_i(cdw x) { return cdw_make(x.im, dw_neg(x.re)); }
METAL_FUNC cdw cdw_mul_i(cdw x) { return cdw_make(dw_neg(x.im), x.re); }

METAL_FUNC cdw cdw_conj(cdw x) { return cdw_make(x.re, dw_neg(x.im)); }

// Componentwise scaling by a double-word real s: DWTimesDW3 (<= 4u^2, MR) per
// component; exact when s is a power of two (lo = 0) and nothing underflows.
METAL_FUNC cdw cdw_scale(cdw x, dw s) { return cdw_make(dw_mul(x.re, s), dw_mul(x.im, s)); }

METAL_FUNC float4 cdw_pack(cdw x) { return float4(x.re.hi, x.re.lo, x.im.hi, x.im.lo); }
METAL_FUNC cdw cdw_unpack(float4 v) { return cdw_make(dw_make(v.x, v.y), dw_make(v.z, v.w)); }

// Point i of interleaved word arrays; lo is not read when the data are plain
// complex64 (has_lo false: the low words are 0).
METAL_FUNC cdw fft_load(const device float* hi, const device float* lo, uint i, bool has_lo) {
  cdw v;
  v.re = dw_make(hi[2 * i], has_lo ? lo[2 * i] : 0.0f);
  v.im = dw_make(hi[2 * i + 1], has_lo ? lo[2 * i + 1] : 0.0f);
  return v;
}

// Stores the high words, and the low words when has_lo. Every result of
// doubleword.h is normalised (hi = RN(hi + lo)), so hi alone is the result
// rounded once to complex64.
METAL_FUNC void fft_store(device float* hi, device float* lo, uint i, cdw v, bool has_lo) {
  hi[2 * i] = v.re.hi;
  hi[2 * i + 1] = v.im.hi;
  if (has_lo) {
    lo[2 * i] = v.re.lo;
    lo[2 * i + 1] = v.im.lo;
  }
}

// Twiddle w^e = exp(-2 pi i e / m) (conjugated when inverse) from the host table
// (mlx_precise/fft/twiddles.py): entries e < m/2 = half_m as (re hi, re lo, im hi,
// im lo), correctly rounded double-words of values exact to ~2^-100;
// w^(e + m/2) = -w^e (exact negation). Needs e < m.
METAL_FUNC cdw fft_twiddle(const device float* tab, uint e, uint half_m, bool inverse) {
  bool neg = e >= half_m;
  uint i = 4u * (neg ? e - half_m : e);
  cdw w = cdw_make(dw_make(tab[i], tab[i + 1]), dw_make(tab[i + 2], tab[i + 3]));
  if (neg) {
    w = cdw_make(dw_neg(w.re), dw_neg(w.im));
  }
  return inverse ? cdw_conj(w) : w;
}
