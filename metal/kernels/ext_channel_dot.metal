// Per-channel dot products out[c] = sum_{b, t} a[b, c, t] * v[b, c, t] in double-word
// (exact products, compensated sums), rounded once: one threadgroup per channel.
// Inputs: a, v: float32 (B, C, L). Output: out float32 (C,).
// Each thread accumulates a strided slice with dw_acc; the partial double-words are
// then added pairwise in threadgroup memory (accurate DW+DW, JMP alg 6).
threadgroup float part_hi[256];
threadgroup float part_lo[256];
const uint c = threadgroup_position_in_grid.x;
const uint lid = thread_position_in_threadgroup.x;
const uint nt = threads_per_threadgroup.x;
const int B = a_shape[0];
const int C = a_shape[1];
const int L = a_shape[2];
dw_acc acc = dw_acc_make(dw_make(0.0f, 0.0f));
for (int e = int(lid); e < B * L; e += int(nt)) {
  const int b = e / L;
  const int t = e - b * L;
  const int idx = (b * C + int(c)) * L + t;
  acc = dw_acc_add(acc, dw_two_prod(a[idx], v[idx]));
}
dw s = dw_acc_value(acc);
part_hi[lid] = s.hi;
part_lo[lid] = s.lo;
threadgroup_barrier(mem_flags::mem_threadgroup);
for (uint stride = 128; stride > 0; stride >>= 1) {
  if (lid < stride && lid + stride < nt) {
    dw r = dw_add(dw_make(part_hi[lid], part_lo[lid]),
                  dw_make(part_hi[lid + stride], part_lo[lid + stride]));
    part_hi[lid] = r.hi;
    part_lo[lid] = r.lo;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
}
if (lid == 0 && int(c) < C) {
  out[c] = dw_to_float(dw_make(part_hi[0], part_lo[0]));
}
