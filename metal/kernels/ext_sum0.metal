// Sum of double-word rows: out[m] = sum_b x[b, m], compensated (dw_acc in
// doubleword.h), one rounding (ROUND) or double-word output.
// Inputs: x_hi, x_lo: float32 (B, M). Outputs: out_hi, out_lo float32 (M,) (out_lo
// 1 unused element if ROUND).
uint i = thread_position_in_grid.x;
const int B = x_hi_shape[0];
const int M = x_hi_shape[1];
if (i >= uint(M)) {
  return;
}
dw_acc acc = dw_acc_make(dw_make(x_hi[i], x_lo[i]));
for (int b = 1; b < B; ++b) {
  acc = dw_acc_add(acc, dw_make(x_hi[b * M + i], x_lo[b * M + i]));
}
dw s = dw_acc_value(acc);
if (ROUND) {
  out_hi[i] = dw_to_float(s);
} else {
  out_hi[i] = s.hi;
  out_lo[i] = s.lo;
}
