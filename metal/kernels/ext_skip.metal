// Skip term of the Hyena convolution, in double-word: out = y + D[c] * u, one rounding.
// Inputs: y_hi, y_lo: float32 (B, C, L), the double-word convolution; u: float32
// (B, C, L); D: float32 (C,) (unused, 1 element, unless HAS_D).
// Outputs: out_hi float32 (B, C, L): RN(out) if ROUND, else the high words; out_lo:
// the low words (1 unused element if ROUND).
// D*u is exact (TwoProdFMA) and the sum an accurate DW+DW (JMP alg 6, <= 3u^2).
uint i = thread_position_in_grid.x;
const int L = u_shape[2];
const int C = u_shape[1];
if (i >= uint(u_shape[0] * C * L)) {
  return;
}
dw y = dw_make(y_hi[i], y_lo[i]);
if (HAS_D) {
  const int c = int((i / uint(L)) % uint(C));
  y = dw_add(y, dw_two_prod(D[c], u[i]));
}
if (ROUND) {
  out_hi[i] = dw_to_float(y);
} else {
  out_hi[i] = y.hi;
  out_lo[i] = y.lo;
}
