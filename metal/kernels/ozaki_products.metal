// Slice products of the split-integer DGEMM, one launch for all of them, on the
// shared int8 GEMM engine (metal/include/int8_gemm.h).
// a: int8 [S, M, K] (slices of A), b: int8 [S, K, N] (slices of B), row-major.
// p (int32): OZAKI_PRODUCTS_M, _N, _K, _K_BLOCK (KB, k-block length),
// _K_BLOCKS (NKB, number of k-blocks) (metal/include/ozaki.h).
// Output c: int32 [S, NKB, M, N]: c[d, q] = sum_{i=0..d} A_i B_(d-i) over the
// k-block q (k in [q KB, q KB + KB)), i.e. the anti-diagonal d of Ozaki's kept
// pairs (i + j <= S - 1). The host picks KB so that |c| <= S KB max|digit|^2 fits
// int32, so every sum is exact.
// Grid (ceil(N/32) * 256, ceil(M/32), S * NKB), threadgroup (256, 1, 1): a group
// owns one 32 x 32 output tile of one (d, q) and runs the engine d + 1 times,
// storing the first product and adding the others in the epilogue (the engine
// calls the epilogue for a given output from the same thread every time, and ends
// each call with a barrier, so the tiles can be reused).
threadgroup int8_t As[INT8_GEMM_BM * INT8_GEMM_BK];
threadgroup int8_t Bs[INT8_GEMM_BK * INT8_GEMM_BN];
const int M = p[OZAKI_PRODUCTS_M], N = p[OZAKI_PRODUCTS_N], K = p[OZAKI_PRODUCTS_K];
const int KB = p[OZAKI_PRODUCTS_K_BLOCK], NKB = p[OZAKI_PRODUCTS_K_BLOCKS];
const uint3 g = threadgroup_position_in_grid;
const int d = int(g.z) / NKB;
const int q = int(g.z) % NKB;
const int k0 = q * KB;
const int kn = metal::min(KB, K - k0);
const int m0 = int(g.y) * INT8_GEMM_BM;
const int n0 = int(g.x) * INT8_GEMM_BN;
device int32_t* out = c + long(g.z) * M * N;
for (int i = 0; i <= d; ++i) {
  const device int8_t* ai = a + long(i) * M * K + k0;
  const device int8_t* bj = b + long(d - i) * K * N + long(k0) * N;
  if (i == 0) {
    Int8GemmStoreI32 ep = {out, N};
    int8_gemm_tile(ai, K, bj, N, M, N, kn, As, Bs, m0, n0, thread_index_in_threadgroup, ep);
  } else {
    Int8GemmAccumulateI32 ep = {out, N};
    int8_gemm_tile(ai, K, bj, N, M, N, kn, As, Bs, m0, n0, thread_index_in_threadgroup, ep);
  }
}
