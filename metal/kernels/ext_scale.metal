// Double-word scaling out = x * s by a double-word constant s = (s[0], s[1])
// computed on the host (e.g. 1/n, split exactly from a rational).
// Inputs: x_hi, x_lo: float32, 1-D, length n (complex data as interleaved float32;
// x_lo unused, 1 element, unless DW_IN); s: float32 (2,).
// Outputs: out_hi float32 (n,): RN(x*s) if ROUND, else the high words; out_lo
// float32: the low words (1 unused element if ROUND).
// float x: DWTimesFP3 (JMP alg 9, <= 2u^2); double-word x: DWTimesDW3 (<= 4u^2, MR).
uint i = thread_position_in_grid.x;
if (i >= uint(x_hi_shape[0])) {
  return;
}
dw sc = dw_make(s[0], s[1]);
dw z = DW_IN ? dw_mul(dw_make(x_hi[i], x_lo[i]), sc) : dw_mul_fp(sc, x_hi[i]);
if (ROUND) {
  out_hi[i] = dw_to_float(z);
} else {
  out_hi[i] = z.hi;
  out_lo[i] = z.lo;
}
