// Conservative ESC estimate per output (i, j) of C = A B from the k-block exponent
// summaries of ozaki_scan (rows of A: infoA [M, NB, OZ_INFO_COUNT]; columns of B,
// scanned as rows of B^T: infoB [N, NB, OZ_INFO_COUNT]). params (int32):
// OZAKI_ESC_ESTIMATE_M ... (ozaki.h).
// One thread per output; esc (int32, [M, N]).
//
// ESC(i, j) = e(max|a_i.|) + e(max|b_.j|) - max_k [e(a_ik) + e(b_kj)] (NVIDIA's
// "exponent span capacity", arXiv 2511.13778); zeros count as -infinity. The
// estimate replaces the max over k by a lower bound from each block, so it is never
// below the exact value. In a block of length n where A's part has exponents in
// [amin, amax] over na nonzeros and B's part [bmin, bmax] over nb nonzeros:
//   - B's part has no zero (nb == n): the k holding amax pairs with a nonzero
//     b_k >= 2^bmin, so max_k >= amax + bmin; symmetrically amin + bmax;
//   - na + nb > n: some k has both nonzero (pigeonhole), so max_k >= amin + bmin.
// A zero row or column gives an exactly zero output: ESC 0. When no block proves
// a nonzero pair the estimate is OZ_POS ("unbounded": the caller falls back).
uint j = thread_position_in_grid.x;
uint i = thread_position_in_grid.y;
int M = params[OZAKI_ESC_ESTIMATE_M], N = params[OZAKI_ESC_ESTIMATE_N];
int K = params[OZAKI_ESC_ESTIMATE_K];
int KB = params[OZAKI_ESC_ESTIMATE_BLOCK], NB = params[OZAKI_ESC_ESTIMATE_BLOCKS];
if (int(i) >= M || int(j) >= N) return;
int amax_all = OZ_NEG, bmax_all = OZ_NEG, lb = OZ_NEG;
for (int q = 0; q < NB; ++q) {
  int n = min(KB, K - q * KB);
  ulong a = ulong(OZ_INFO_COUNT) * (ulong(i) * ulong(NB) + ulong(q));
  ulong b = ulong(OZ_INFO_COUNT) * (ulong(j) * ulong(NB) + ulong(q));
  int amax = infoA[a + OZ_INFO_MAX_EXPONENT], amin = infoA[a + OZ_INFO_MIN_EXPONENT];
  int na = infoA[a + OZ_INFO_NONZEROS];
  int bmax = infoB[b + OZ_INFO_MAX_EXPONENT], bmin = infoB[b + OZ_INFO_MIN_EXPONENT];
  int nb = infoB[b + OZ_INFO_NONZEROS];
  amax_all = max(amax_all, amax);
  bmax_all = max(bmax_all, bmax);
  if (na == 0 || nb == 0) continue;
  if (nb == n) lb = max(lb, amax + bmin);
  if (na == n) lb = max(lb, amin + bmax);
  if (na + nb > n) lb = max(lb, amin + bmin);
}
int out;
if (amax_all == OZ_NEG || bmax_all == OZ_NEG) {
  out = 0;
} else if (lb == OZ_NEG) {
  out = OZ_POS;
} else {
  out = amax_all + bmax_all - lb;
}
esc[ulong(i) * ulong(N) + ulong(j)] = out;
