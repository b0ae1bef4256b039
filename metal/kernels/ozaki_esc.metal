// Exact ESC per output (i, j) of C = A B (see ozaki_esc_estimate.metal for the
// definition), from the raw bits of A (a: [M, K] float64 as uint32 pairs) and of
// B^T (bt: [N, K]). params (int32): OZAKI_ESC_M, _N, _K (ozaki.h). One thread per output;
// esc (int32, [M, N]). Outputs with no k where both entries are nonzero are
// exactly zero and get 0. Inputs must be finite (checked by the caller).
uint j = thread_position_in_grid.x;
uint i = thread_position_in_grid.y;
int M = params[OZAKI_ESC_M], N = params[OZAKI_ESC_N], K = params[OZAKI_ESC_K];
if (int(i) >= M || int(j) >= N) return;
int amax = OZ_NEG, bmax = OZ_NEG, pmax = OZ_NEG;
for (int k = 0; k < K; ++k) {
  ulong ia = 2ul * (ulong(i) * ulong(K) + ulong(k));
  ulong ib = 2ul * (ulong(j) * ulong(K) + ulong(k));
  int ea = oz_exponent(oz_bits(a[ia], a[ia + 1]));
  int eb = oz_exponent(oz_bits(bt[ib], bt[ib + 1]));
  amax = max(amax, ea);
  bmax = max(bmax, eb);
  pmax = max(pmax, ea + eb);  // OZ_NEG + anything stays below OZ_NEG_LIMIT
}
esc[ulong(i) * ulong(N) + ulong(j)] = pmax < OZ_NEG_LIMIT ? 0 : amax + bmax - pmax;
