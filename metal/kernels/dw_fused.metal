// A chain of elementwise double-word operations in one launch: the program `prog`
// (int32; layout and operation codes in dw_fused.h) over the array slots a0 .. a11.
// Every slot is a float32 view of the output's shape (broadcast operands have stride
// 0, and any view is read through its strides: no operand is copied or expanded);
// slots the program does not read repeat a0. Outputs zh, zl: float32, the output's
// shape, row-contiguous: the high and low words of the result. One thread per
// output element. Template parameter MATH: the program may call the elementary
// functions of dw_math.h (DWF_OP_FN); without it the kernel leaves them out.
uint i = thread_position_in_grid.x;
const int nd = a0_ndim;
int idx[DWF_MAX_NDIM];
uint rem = i;
for (int d = nd - 1; d >= 0; --d) {
  uint extent = uint(a0_shape[d]);
  idx[d] = int(rem % extent);
  rem /= extent;
}
if (rem != 0u) return;  // past the last element
dw r[DWF_REGISTERS];
const int count = prog[DWF_PROG_COUNT];
for (int k = 0; k < count; ++k) {
  const device int* ins = prog + DWF_HEADER + DWF_INSTR * k;
  const int op = ins[0];
  const int x = ins[2];
  const int y = ins[3];
  dw z;
  if (op == DWF_OP_LOAD) {
    float w[2] = {0.0f, 0.0f};
    for (int h = 0; h < 2; ++h) {
      const int slot = h == 0 ? x : y;  // y < 0: no low word
      if (slot == 0) w[h] = a0[dwf_offset(idx, a0_strides, nd)];
      else if (slot == 1) w[h] = a1[dwf_offset(idx, a1_strides, nd)];
      else if (slot == 2) w[h] = a2[dwf_offset(idx, a2_strides, nd)];
      else if (slot == 3) w[h] = a3[dwf_offset(idx, a3_strides, nd)];
      else if (slot == 4) w[h] = a4[dwf_offset(idx, a4_strides, nd)];
      else if (slot == 5) w[h] = a5[dwf_offset(idx, a5_strides, nd)];
      else if (slot == 6) w[h] = a6[dwf_offset(idx, a6_strides, nd)];
      else if (slot == 7) w[h] = a7[dwf_offset(idx, a7_strides, nd)];
      else if (slot == 8) w[h] = a8[dwf_offset(idx, a8_strides, nd)];
      else if (slot == 9) w[h] = a9[dwf_offset(idx, a9_strides, nd)];
      else if (slot == 10) w[h] = a10[dwf_offset(idx, a10_strides, nd)];
      else if (slot == 11) w[h] = a11[dwf_offset(idx, a11_strides, nd)];
    }
    z = dw_make(w[0], w[1]);
  } else if (op == DWF_OP_CONST) {
    z = dw_make(as_type<float>(x), as_type<float>(y));
  } else if (op == DWF_OP_NEG) {
    z = dw_neg(r[x]);
  } else if (op == DWF_OP_ADD) {
    z = dw_add(r[x], r[y]);
  } else if (op == DWF_OP_SUB) {
    z = dw_sub(r[x], r[y]);
  } else if (op == DWF_OP_MUL) {
    z = dw_mul(r[x], r[y]);
  } else if (op == DWF_OP_DIV) {
    z = dw_div(r[x], r[y]);
  } else if (op == DWF_OP_ABS) {
    z = dw_make(metal::abs(r[x].hi), r[x].hi < 0.0f ? -r[x].lo : r[x].lo);
  } else if (op == DWF_OP_MAX || op == DWF_OP_MIN) {
    z = dwf_extremum(r[x], r[y], op == DWF_OP_MAX);
  } else if (MATH && op == DWF_OP_FN) {
    z = dwm_apply(ins[4], r[x], r[y]);
  } else {
    z = dw_make(NAN, 0.0f);  // not an operation of this instantiation (never built)
  }
  r[ins[1]] = z;
}
const dw out = r[prog[DWF_PROG_OUT]];
zh[i] = out.hi;
zl[i] = out.lo;
