// Double-word complex multiply out = a * b over broadcast operands, one rounding.
// Inputs: a_hi, a_lo, b_hi, b_lo: complex64 views of the output's shape (broadcast
// operands have stride 0; read through their strides); size: int32 0-d, the number
// of outputs. Output: out complex64: RN(a*b) (output shape) if ROUND, else the high
// words, then from out[size] on the low words (packed words).
// Products by DWTimesDW3 (exact when the low words are 0), sums by accurate DW+DW
// (cdw_mul in doubleword.h): each component of a product of complex64 inputs has
// relative error <= 3u^2 + 13u^3 before the final rounding, so it is faithful and
// exactly rounded except within 3u^2 of a rounding midpoint.
uint i = thread_position_in_grid.x;
if (i >= uint(size)) {
  return;
}
uint ia = elem_to_loc(i, a_hi_shape, a_hi_strides, a_hi_ndim);
uint ial = elem_to_loc(i, a_hi_shape, a_lo_strides, a_hi_ndim);
uint ib = elem_to_loc(i, a_hi_shape, b_hi_strides, a_hi_ndim);
uint ibl = elem_to_loc(i, a_hi_shape, b_lo_strides, a_hi_ndim);
complex64_t ah = a_hi[ia], al = a_lo[ial], bh = b_hi[ib], bl = b_lo[ibl];
cdw x, y;
x.re = dw_make(ah.real, al.real);
x.im = dw_make(ah.imag, al.imag);
y.re = dw_make(bh.real, bl.real);
y.im = dw_make(bh.imag, bl.imag);
cdw z = cdw_mul(x, y);
if (ROUND) {
  out[i] = complex64_t(dw_to_float(z.re), dw_to_float(z.im));
} else {
  out[i] = complex64_t(z.re.hi, z.im.hi);
  out[uint(size) + i] = complex64_t(z.re.lo, z.im.lo);
}
