// Reduction of tile partials (norm_tile.metal) to a norm, in one threadgroup.
//
// Inputs:
//   part float32 (flat, >= 8 values): NR x L records, record (r, k) at
//        part[W (r L + k)]:
//        NORM_RECORDS_LINES (W = 4): two double-word pairs (big hi, big lo, sml hi, sml lo),
//          the classes of a line sum (norms.h, norm_line); the norm is the
//          NaN-aware max over k of the rounded line sums (a max-norm partial is
//          (value, 0, 0, 0));
//        NORM_RECORDS_BLUE (W = 2): one pair; L = 3 lines big, med, sml of Blue's
//          accumulators (norms.h, norm_ssq), finished as the Frobenius norm.
//   p    int32 (8 values): p[NORM_REDUCE_NR] = NR, p[NORM_REDUCE_L] = L,
//        p[NORM_REDUCE_RECORDS] = a NORM_RECORDS_* code (norms.h, generated from
//        NORM_REDUCE_PARAMS in mlx_precise/norms/engine.py).
// Outputs:
//   sums   float32 (W L): the records summed over r, i.e. the combined partial,
//          which the distributed norm gathers across processes and feeds back here;
//   result float32 (1): the norm rounded once to float32.
// Grid (T, 1, 1), threadgroup (T, 1, 1), 4 <= T <= 256. When L >= T each thread
// sums whole lines; otherwise g = T / L threads share a line (strided over r) and
// their sums are added in order. All sums are double-word (norm_acc).
uint t = thread_position_in_threadgroup.x;
uint T = threads_per_threadgroup.x;
uint nr = uint(p[NORM_REDUCE_NR]), L = uint(p[NORM_REDUCE_L]);
bool blue = p[NORM_REDUCE_RECORDS] == NORM_RECORDS_BLUE;
uint W = blue ? 2u : 4u;
threadgroup float buf[4 * 256];
threadgroup float mx[256];
float vmax = 0.0f;
if (L >= T) {
  for (uint k = t; k < L; k += T) {
    norm_line s = norm_sum_records(part, W, L, nr, k, 0u, 1u);
    sums[W * k] = s.big.hi;
    sums[W * k + 1u] = s.big.lo;
    if (W == 4u) {
      sums[W * k + 2u] = s.sml.hi;
      sums[W * k + 3u] = s.sml.lo;
    }
    vmax = norm_nanmax(vmax, norm_line_finish(s));
  }
} else {
  uint g = T / L;
  norm_line s = norm_line_zero();
  if (t < g * L) {
    s = norm_sum_records(part, W, L, nr, t % L, t / L, g);
  }
  buf[4u * t] = s.big.hi;
  buf[4u * t + 1u] = s.big.lo;
  buf[4u * t + 2u] = s.sml.hi;
  buf[4u * t + 3u] = s.sml.lo;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (t < L) {  // reads only slots >= L, written by other threads before the barrier
    for (uint q = 1u; q < g; ++q) {
      uint o = 4u * (t + q * L);
      norm_line x;
      x.big = dw_make(buf[o], buf[o + 1u]);
      x.sml = dw_make(buf[o + 2u], buf[o + 3u]);
      s = norm_line_merge(s, x);
    }
    buf[4u * t] = s.big.hi;
    buf[4u * t + 1u] = s.big.lo;
    buf[4u * t + 2u] = s.sml.hi;
    buf[4u * t + 3u] = s.sml.lo;
    for (uint c = 0u; c < W; ++c) {
      sums[W * t + c] = buf[4u * t + c];
    }
    vmax = norm_nanmax(vmax, norm_line_finish(s));
  }
}
mx[t] = vmax;
threadgroup_barrier(mem_flags::mem_threadgroup);
for (uint s2 = 1u; s2 < T; s2 *= 2u) {
  if ((t & (2u * s2 - 1u)) == 0u && t + s2 < T) {
    mx[t] = norm_nanmax(mx[t], mx[t + s2]);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
}
if (t == 0u) {
  if (blue) {  // lines 0, 1, 2: Blue's big, med, sml (each in a record's .big)
    norm_ssq a;
    a.big = dw_make(buf[0], buf[1]);
    a.med = dw_make(buf[4], buf[5]);
    a.sml = dw_make(buf[8], buf[9]);
    result[0] = norm_ssq_finish(a);
  } else {
    result[0] = mx[0];
  }
}
