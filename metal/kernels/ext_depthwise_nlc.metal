// Depthwise convolution of a channels-last signal (MLX's conv1d with groups = C),
// accumulated in double-word, read and written in place (no transposes, no padded
// copy, no output slice around the launch):
//   y[n, q, o] = sum_{j < K'} w'[o, j] * x[n, q STRIDE + j - PAD, o / M],
// x = 0 outside [0, L), w' the K taps spread by DIL (w'[o, k DIL] = w[o, k], 0
// between them, K' = DIL (K - 1) + 1), M = Cout / C the channel multiplier. The
// products of the spread zeros and of the padding are taken as they come (0 * x,
// w * 0), in the order of j: the sum of ext_depthwise on the transposed, padded
// signal with the spread filter, bit for bit.
// Inputs: x float32 (N, L, C); w float32 (Cout, K, 1), read flat. Template: TAPS = K,
// PAD, DIL, STRIDE. Output: out float32 (2 N, Q, Cout), Q = (L + 2 PAD - DIL (K - 1)
// - 1) / STRIDE + 1: the high words of the (N, Q, Cout) result, then its low words
// (packed words).
// Products are exact (TwoProdFMA); the sum uses the compensated accumulator dw_acc
// (doubleword.h): error <= 2u^2 |y| + O(K' u^3 sum |terms|).
uint i = thread_position_in_grid.x;
const int L = x_shape[1];
const int C = x_shape[2];
const int Cout = w_shape[0];
const int Q = (L + 2 * PAD - DIL * (TAPS - 1) - 1) / STRIDE + 1;
const uint plane = uint(x_shape[0] * Q * Cout);
if (i >= plane) {
  return;
}
const int o = int(i % uint(Cout));
const int q = int((i / uint(Cout)) % uint(Q));
// Offsets, not pointer locals: MLX passes an input of fewer than 8 elements as a
// `constant` pointer, which cannot initialise a `device` one.
const int row = int(i / uint(Cout * Q)) * L;
const int c = o / (Cout / C);
dw_acc acc = dw_acc_make(dw_make(0.0f, 0.0f));
for (int j = 0; j < DIL * (TAPS - 1) + 1; ++j) {
  const float wj = j % DIL == 0 ? w[o * TAPS + j / DIL] : 0.0f;
  const int t = q * STRIDE + j - PAD;
  const float xt = t >= 0 && t < L ? x[(row + t) * C + c] : 0.0f;
  acc = dw_acc_add(acc, dw_two_prod(wj, xt));
}
dw y = dw_acc_value(acc);
out[i] = y.hi;
out[plane + i] = y.lo;
