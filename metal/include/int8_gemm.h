// Tiled int8 x int8 -> int32 GEMM building block, parameterised by an epilogue.
//
// C[m, n] = sum_k A[m, k] * B[k, n] for row-major A [M, K] (element (m, k) at
// A[m * lda + k]) and row-major B [K, N] (element (k, n) at B[k * ldb + n]), summed
// exactly in int32: every product is at most 2^14 in magnitude, so no partial sum
// can overflow while K <= 131071 (= floor((2^31 - 1) / 2^14)). Any M, N, K >= 0:
// every load and every output is bounds-checked against the logical sizes.
//
// Usage, from a kernel body launched with threadgroup (INT8_GEMM_THREADS, 1, 1)
// and grid (ceil(N / BN) * INT8_GEMM_THREADS, ceil(M / BM), batches):
//
//   // The tiles are declared in the kernel body (Metal wants threadgroup
//   // arrays there; the emulator turns exactly these declarations into
//   // group-shared storage) and passed to the engine as pointers.
//   threadgroup int8_t As[INT8_GEMM_BM * INT8_GEMM_BK];
//   threadgroup int8_t Bs[INT8_GEMM_BK * INT8_GEMM_BN];
//   uint3 g = threadgroup_position_in_grid;
//   // batched: offset A, B and the output by g.z here
//   Int8GemmStoreI32 ep = {c, ldc};               // or your own epilogue
//   int8_gemm_tile(a, lda, b, ldb, M, N, K, As, Bs,
//                  int(g.y) * INT8_GEMM_BM, int(g.x) * INT8_GEMM_BN,
//                  thread_index_in_threadgroup, ep);
//
// An epilogue is any struct with `void operator()(int m, int n, int acc) const`;
// the engine calls it exactly once for every in-bounds output (m < M, n < N) of the
// tile, with the exact int32 sum, after the K loop (so it may read and write
// anything it likes, e.g. C[m, n] += acc, or scale and round: see the epilogues at
// the end of this file).
// Other tile shapes: int8_gemm_tile<BM, BN, BK, TM, TN>(...), launched with
// (BM / TM) * (BN / TN) threads and tiles As [BM * BK], Bs [BK * BN].
//
// Schedule (the classic shared-memory tiling): per K step the group stages a
// BM x BK block of A and a BK x BN block of B in threadgroup memory (coalesced
// loads along k and n, zero-filled outside the matrices, so tails need no special
// case), barriers, then each thread accumulates TM x TN outputs from registers.
// Thread t owns rows r + i * (BM / TM) and columns c + j * (BN / TN) with
// r = t / (BN / TN), c = t % (BN / TN): a simdgroup reads consecutive bytes of a
// B row and broadcasts A values, and a thread whose first row or column is out of
// bounds (small M) skips the arithmetic but still takes part in loads and barriers.
#pragma once

#include "doubleword.h"

#define INT8_GEMM_BM 32
#define INT8_GEMM_BN 32
#define INT8_GEMM_BK 32
#define INT8_GEMM_TM 2
#define INT8_GEMM_TN 2
#define INT8_GEMM_THREADS ((INT8_GEMM_BM / INT8_GEMM_TM) * (INT8_GEMM_BN / INT8_GEMM_TN))

template <int BM = INT8_GEMM_BM, int BN = INT8_GEMM_BN, int BK = INT8_GEMM_BK,
          int TM = INT8_GEMM_TM, int TN = INT8_GEMM_TN, typename Epilogue>
METAL_FUNC void int8_gemm_tile(
    const device int8_t* A, int lda,
    const device int8_t* B, int ldb,
    int M, int N, int K,
    threadgroup int8_t* As,  // BM * BK, declared in the kernel body
    threadgroup int8_t* Bs,  // BK * BN, declared in the kernel body
    int m0, int n0,          // first row and column of this group's output tile
    uint tid,                // thread_index_in_threadgroup, < (BM/TM)*(BN/TN)
    thread const Epilogue& ep) {
  static_assert(BM % TM == 0 && BN % TN == 0, "int8_gemm_tile: TM | BM and TN | BN");
  constexpr int COLS = BN / TN;  // threads along n
  constexpr int ROWS = BM / TM;  // threads along m
  constexpr int NT = ROWS * COLS;
  const int r = int(tid) / COLS;
  const int c = int(tid) % COLS;
  // Rows r + i*ROWS grow with i, so the first one decides whether any is in range.
  const bool active = (m0 + r < M) && (n0 + c < N);

  int acc[TM][TN];
  for (int i = 0; i < TM; ++i)
    for (int j = 0; j < TN; ++j) acc[i][j] = 0;

  for (int k0 = 0; k0 < K; k0 += BK) {
    for (int e = int(tid); e < BM * BK; e += NT) {
      const int m = m0 + e / BK, k = k0 + e % BK;
      As[e] = (m < M && k < K) ? A[long(m) * lda + k] : int8_t(0);
    }
    for (int e = int(tid); e < BK * BN; e += NT) {
      const int k = k0 + e / BN, n = n0 + e % BN;
      Bs[e] = (k < K && n < N) ? B[long(k) * ldb + n] : int8_t(0);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (active) {
      const int kn = metal::min(BK, K - k0);  // the zero-filled tail adds nothing
      for (int kk = 0; kk < kn; ++kk) {
        int a[TM], b[TN];
        for (int i = 0; i < TM; ++i) a[i] = int(As[(r + i * ROWS) * BK + kk]);
        for (int j = 0; j < TN; ++j) b[j] = int(Bs[kk * BN + c + j * COLS]);
        for (int i = 0; i < TM; ++i)
          for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }

  if (!active) return;
  for (int i = 0; i < TM; ++i) {
    const int m = m0 + r + i * ROWS;
    if (m >= M) break;
    for (int j = 0; j < TN; ++j) {
      const int n = n0 + c + j * COLS;
      if (n < N) ep(m, n, acc[i][j]);
    }
  }
}

// ---- epilogues ----------------------------------------------------------------

// C[m * ldc + n] = acc.
struct Int8GemmStoreI32 {
  device int32_t* c;
  int ldc;
  void operator()(int m, int n, int acc) const { c[long(m) * ldc + n] = acc; }
};

// C[m * ldc + n] += acc (the caller keeps the sum in range).
struct Int8GemmAccumulateI32 {
  device int32_t* c;
  int ldc;
  void operator()(int m, int n, int acc) const { c[long(m) * ldc + n] += acc; }
};

// The CUTLASS / vLLM scaled epilogues (vLLM's csrc/quantization/cutlass_w8a8; docs/int8.md), evaluated in
// double-word arithmetic (metal/include/doubleword.h) in the published order of
// operations and rounded once to the output type T (float, half or bfloat16_t):
//   kind 0  ScaledEpilogue             D = s_a[m] * (s_b[n] * acc)
//   kind 1  ScaledEpilogueBias         D = s_a[m] * (s_b[n] * acc) + bias[n]
//   kind 2  ScaledEpilogueAzp          D = s_a[m] * (s_b[n] * (acc - azp_adj[n])) + bias[n]
//   kind 3  ScaledEpilogueAzpPerToken  D = s_a[m] * (s_b[n] * (acc - azp[m] azp_adj[n])) + bias[n]
// (kinds 2 and 3 add bias[n] only when has_bias). The integer x = acc - ... is
// formed in 64 bits (CUTLASS's int32 can wrap), converted to a double-word (exact
// while |x| < 2^48, else within u^2 |x|), multiplied by s_b and by s_a (DW*FP,
// JMP alg 9, <= 2u^2 each) and added to the bias (DW+FP, JMP alg 4, <= 2u^2):
// |y - D| <= ~4u^2 |s_a s_b x| + 2u^2 |D| (u = 2^-24). One final rounding of y
// therefore gives the correctly rounded D except when D lies that close to a
// rounding boundary (or the bias cancels s_a s_b x to below ~2^-20 of it), and
// provided intermediate values stay within float32's range: products below
// ~2^-78 lose the low word to flush-to-zero (doubleword.h, "Range").
// Scale indexing: s_a[m * sa_step], s_b[n * sb_step] (step 0: one per-tensor scale).
template <typename T>
struct Int8ScaledEpilogue {
  const device float* scale_a;
  const device float* scale_b;
  const device float* bias;
  const device int32_t* azp_adj;
  const device int32_t* azp;
  device T* d;
  int ldd;
  int sa_step;
  int sb_step;
  int kind;
  bool has_bias;

  void operator()(int m, int n, int acc) const {
    long x = long(acc);
    if (kind == 2) x -= long(azp_adj[n]);
    if (kind == 3) x -= long(azp[m]) * long(azp_adj[n]);
    const float sa = scale_a[m * sa_step];
    const float sb = scale_b[n * sb_step];
    // x -> double-word: h = float(x / 2^24) 2^24 (exact while |x| < 2^48) and the
    // 64-bit remainder r = x - h (|r| < 2^24 then, an exact float; beyond 2^48,
    // |r| <= 2^-24 |x| + 2^24 and float(r) errs by <= u^2 |x|); TwoSum joins them
    // exactly, whatever the device's rounding of integer -> float conversions.
    const float qf = float(x / 16777216);  // x / 2^24 truncated; |.| < 2^39
    const dw xd = dw_two_sum(qf * 16777216.0f, float(x - long(qf) * 16777216));
    dw y = dw_mul_fp(dw_mul_fp(xd, sb), sa);
    if (has_bias) y = dw_add_fp(y, bias[n]);
    float out = y.hi;
    if (!metal::isfinite(out)) {
      // Overflow or Inf/NaN operands: the double-word steps turn Inf into NaN
      // (inf - inf in the error terms), so give what float32 arithmetic gives.
      out = sa * (sb * float(x));
      if (has_bias) out += bias[n];
    } else if (!metal::is_same<T, float>::value && y.lo != 0.0f) {
      // Round hi + lo to float "to odd" (truncate towards zero, force the last
      // significand bit to 1 when inexact): then one RNE rounding to half or
      // bfloat16 (11 or 8 significand bits <= 24 - 2) equals the correct rounding
      // of hi + lo itself (Boldo & Melquiond, "Emulation of FMA and correctly
      // rounded sums: proved algorithms using rounding to odd", IEEE TC 2008).
      uint bits = as_type<uint>(out);
      bits = ((out > 0.0f) == (y.lo > 0.0f)) ? (bits | 1u) : ((bits - 1u) | 1u);
      out = as_type<float>(bits);
    }
    d[long(m) * ldd + n] = T(out);
  }
};
