// Depthwise causal convolution (Hyena's short filter: PyTorch Conv1d(C, C, K,
// groups=C, padding=K-1) cut to the first L steps), accumulated in double-word:
//   y[b, c, t] = bias[c] + sum_{j<K} w[c, j] * x[b, c, t + j - (K - 1)], x = 0 for t < 0.
// Inputs: x float32 (B, C, L); w float32 (C, K); bias float32 (C,) (unused, 1
// element, unless HAS_BIAS). Template TAPS: K at compile time (0: read K from w).
// Outputs: out_hi float32 (B, C, L): RN(y) if ROUND, else the high words; out_lo:
// the low words (1 unused element if ROUND).
// Products are exact (TwoProdFMA); the sum uses the compensated accumulator dw_acc
// (doubleword.h): error <= 2u^2 |y| + O(K u^3 sum |terms|) before the one rounding.
uint i = thread_position_in_grid.x;
const int L = x_shape[2];
const int C = x_shape[1];
if (i >= uint(x_shape[0] * C * L)) {
  return;
}
const int K = TAPS > 0 ? TAPS : w_shape[1];
const int t = int(i % uint(L));
const int c = int((i / uint(L)) % uint(C));
// Offsets, not pointer locals: MLX passes an input of fewer than 8 elements as a
// `constant` pointer, which cannot initialise a `device` one.
const uint row = i - uint(t);
const int wc = c * K;
dw_acc acc = dw_acc_make(dw_make(HAS_BIAS ? bias[c] : 0.0f, 0.0f));
for (int j = 0; j < K; ++j) {
  const int s = t + j - (K - 1);
  if (s >= 0) {
    acc = dw_acc_add(acc, dw_two_prod(w[wc + j], x[row + uint(s)]));
  }
}
dw y = dw_acc_value(acc);
if (ROUND) {
  out_hi[i] = dw_to_float(y);
} else {
  out_hi[i] = y.hi;
  out_lo[i] = y.lo;
}
