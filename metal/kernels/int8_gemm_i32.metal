// C = A B exactly in int32, batched (metal/include/int8_gemm.h; mlx_precise/int8/engine.py).
// Inputs: a, b int8, flat row-major (A_z [M, K] at a + z * p[5], leading dimension
// p[3]; B_z [K, N] at b + z * p[6], leading dimension p[4]); p int32 [8] =
// (M, N, K, lda, ldb, batch stride of a, batch stride of b, unused).
// Output: c int32 [batches, M, N]. Grid (ceil(N/32) * 256, ceil(M/32), batches),
// threadgroup (256, 1, 1).
threadgroup int8_t As[INT8_GEMM_BM * INT8_GEMM_BK];
threadgroup int8_t Bs[INT8_GEMM_BK * INT8_GEMM_BN];
const int M = p[0], N = p[1], K = p[2];
const uint3 g = threadgroup_position_in_grid;
const long z = long(g.z);
Int8GemmStoreI32 ep = {c + z * M * N, N};
int8_gemm_tile(a + z * p[5], p[3], b + z * p[6], p[4], M, N, K, As, Bs,
               int(g.y) * INT8_GEMM_BM, int(g.x) * INT8_GEMM_BN,
               thread_index_in_threadgroup, ep);
