// C = A B exactly in int32, batched (metal/include/int8_gemm.h; mlx_precise/int8/engine.py).
// Inputs: a, b int8, flat row-major (A_z [M, K] at a + z * p[INT8_GEMM_I32_BATCH_STRIDE_A],
// leading dimension p[INT8_GEMM_I32_LDA]; B_z [K, N] likewise); p int32 [8], the
// fields INT8_GEMM_I32_* (int8_gemm.h, generated from INT8_GEMM_I32_PARAMS).
// Output: c int32 [batches, M, N]. Grid (ceil(N/32) * 256, ceil(M/32), batches),
// threadgroup (256, 1, 1).
threadgroup int8_t As[INT8_GEMM_BM * INT8_GEMM_BK];
threadgroup int8_t Bs[INT8_GEMM_BK * INT8_GEMM_BN];
const int M = p[INT8_GEMM_I32_M], N = p[INT8_GEMM_I32_N], K = p[INT8_GEMM_I32_K];
const uint3 g = threadgroup_position_in_grid;
const long z = long(g.z);
Int8GemmStoreI32 ep = {c + z * M * N, N};
int8_gemm_tile(a + z * p[INT8_GEMM_I32_BATCH_STRIDE_A], p[INT8_GEMM_I32_LDA],
               b + z * p[INT8_GEMM_I32_BATCH_STRIDE_B], p[INT8_GEMM_I32_LDB], M, N, K, As, Bs,
               int(g.y) * INT8_GEMM_BM, int(g.x) * INT8_GEMM_BN,
               thread_index_in_threadgroup, ep);
