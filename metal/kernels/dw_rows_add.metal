// Row sums of double-word values by row number (a scatter-add, an overlap-add):
// out[r, m] = the sum of v[k, m] over the k with row r, compensated (dw_acc in
// doubleword.h), in increasing k.
// Inputs: rows int32 (N,), the row numbers sorted ascending (-1: none); order int32
// (N,), the stable sorting permutation (position in v of the j-th sorted row); v_hi,
// v_lo float32 (N, M). Outputs: out_hi, out_lo float32 (R, M), zeros where no row is
// named (init_value 0). One thread per (column m, sorted position j): the first
// position of each run of equal rows sums the run, the others return.
uint m = thread_position_in_grid.x;
uint j = thread_position_in_grid.y;
const uint N = uint(rows_shape[0]);
const uint M = uint(v_hi_shape[1]);
if (m >= M || j >= N) {
  return;
}
const int r = rows[j];
if (r < 0 || (j > 0 && rows[j - 1] == r)) {
  return;
}
ulong k = ulong(order[j]);
dw_acc acc = dw_acc_make(dw_make(v_hi[k * M + m], v_lo[k * M + m]));
for (uint t = j + 1; t < N && rows[t] == r; ++t) {
  k = ulong(order[t]);
  acc = dw_acc_add(acc, dw_make(v_hi[k * M + m], v_lo[k * M + m]));
}
const dw s = dw_acc_value(acc);
const ulong o = ulong(r) * M + m;
out_hi[o] = s.hi;
out_lo[o] = s.lo;
