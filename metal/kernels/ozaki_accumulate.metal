// Accumulation: combine the slice products exactly and round once.
// prod (int32, [S, NKB, M, N]): prod[d, q] = sum over slice pairs p + p' = d
// (0-based, so d = 0 .. S-1 covers the kept pairs p + p' <= S - 1) of the int8
// GEMM A_p B_p' restricted to k-block q; each entry is exact in int32.
// tA (int32 [M]), tB (int32 [N]): the row / column scale exponents used to slice.
// params (int32): OZAKI_ACCUMULATE_M ... (ozaki.h). One thread per output (i, j).
//
// With slices of B bits, x ~ sum_p a_p 2^(tA - B(p+1)), so the kept terms are
//     c = 2^(tA + tB - B(S+1)) * sum_d D_d 2^(B(S-1-d)),   D_d = sum_q prod[d, q].
// D_d is summed in int64 (exact) and the weighted sum is formed by Horner's rule
// in a 128-bit two's-complement integer, exactly; oz_round_to_f64 then rounds it
// once to float64 (out: uint32 [M, N, 2], the bits, low word first).
uint j = thread_position_in_grid.x;
uint i = thread_position_in_grid.y;
int M = params[OZAKI_ACCUMULATE_M], N = params[OZAKI_ACCUMULATE_N];
int S = params[OZAKI_ACCUMULATE_SLICES], B = params[OZAKI_ACCUMULATE_SLICE_BITS];
int NKB = params[OZAKI_ACCUMULATE_K_BLOCKS];
if (int(i) >= M || int(j) >= N) return;
ulong plane = ulong(M) * ulong(N);
ulong e = ulong(i) * ulong(N) + ulong(j);
oz_i128 acc;
acc.hi = 0ul;
acc.lo = 0ul;
for (int d = 0; d < S; ++d) {
  long D = 0;
  for (int q = 0; q < NKB; ++q) {
    D += long(prod[(ulong(d) * ulong(NKB) + ulong(q)) * plane + e]);
  }
  acc = oz_shift_add(acc, uint(B), D);
}
ulong bits = oz_round_to_f64(acc, tA[i] + tB[j] - B * (S + 1));
out[2ul * e] = uint(bits & 0xFFFFFFFFul);
out[2ul * e + 1ul] = uint(bits >> 32);
