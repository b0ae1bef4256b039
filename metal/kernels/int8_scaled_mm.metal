// D = epilogue(A B) for int8 A [M, K] and B [K, N], row-major and contiguous, with
// the CUTLASS / vLLM scaled epilogue p[5] (Int8ScaledEpilogue in
// metal/include/int8_gemm.h; mlx_precise/int8/scaled.py: scaled_mm), rounded once to T.
// Inputs: a, b int8 (flat); scale_a, scale_b float32 (index m * p[3], n * p[4]);
// bias float32 [N]; azp_adj int32 [N]; azp int32 [M] (unused ones are zero
// placeholders); p int32 [8] = (M, N, K, sa_step, sb_step, kind, has_bias, 0).
// Output: d T [M, N]. Grid (ceil(N/32) * 256, ceil(M/32), 1), threadgroup (256, 1, 1).
threadgroup int8_t As[INT8_GEMM_BM * INT8_GEMM_BK];
threadgroup int8_t Bs[INT8_GEMM_BK * INT8_GEMM_BN];
const int M = p[0], N = p[1], K = p[2];
Int8ScaledEpilogue<T> ep = {scale_a, scale_b, bias, azp_adj, azp, d, N,
                            p[3], p[4], p[5], p[6] != 0};
int8_gemm_tile(a, K, b, N, M, N, K, As, Bs,
               int(threadgroup_position_in_grid.y) * INT8_GEMM_BM,
               int(threadgroup_position_in_grid.x) * INT8_GEMM_BN,
               thread_index_in_threadgroup, ep);
