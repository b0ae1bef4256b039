// D = epilogue(A B) for int8 A [M, K] and B [K, N], row-major and contiguous, with
// the CUTLASS / vLLM scaled epilogue p[INT8_SCALED_MM_EPILOGUE] (an INT8_EPILOGUE_*
// code; Int8ScaledEpilogue in metal/include/int8_gemm.h; mlx_precise/int8/scaled.py:
// scaled_mm), rounded once to T.
// Inputs: a, b int8 (flat); scale_a, scale_b float32 (index m * p[INT8_SCALED_MM_SA_STEP],
// n * p[INT8_SCALED_MM_SB_STEP]); bias float32 [N]; azp_adj int32 [N]; azp int32 [M]
// (unused ones are zero placeholders); p int32 [8], the fields INT8_SCALED_MM_*
// (int8_gemm.h, generated from INT8_SCALED_MM_PARAMS).
// Output: d T [M, N]. Grid (ceil(N/32) * 256, ceil(M/32), 1), threadgroup (256, 1, 1).
threadgroup int8_t As[INT8_GEMM_BM * INT8_GEMM_BK];
threadgroup int8_t Bs[INT8_GEMM_BK * INT8_GEMM_BN];
const int M = p[INT8_SCALED_MM_M], N = p[INT8_SCALED_MM_N], K = p[INT8_SCALED_MM_K];
Int8ScaledEpilogue<T> ep = {scale_a, scale_b, bias, azp_adj, azp, d, N,
                            p[INT8_SCALED_MM_SA_STEP], p[INT8_SCALED_MM_SB_STEP],
                            p[INT8_SCALED_MM_EPILOGUE], p[INT8_SCALED_MM_HAS_BIAS] != 0};
int8_gemm_tile(a, K, b, N, M, N, K, As, Bs,
               int(threadgroup_position_in_grid.y) * INT8_GEMM_BM,
               int(threadgroup_position_in_grid.x) * INT8_GEMM_BN,
               thread_index_in_threadgroup, ep);
