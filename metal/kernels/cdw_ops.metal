// Elementwise complex double-word operation selected by the template parameter OP:
// cdw_add / cdw_mul of metal/include/doubleword.h, as the DoubleWord engine runs
// complex x + y and x * y on metal / emulate (mlx_precise/doubleword/kernel_engine.py).
// Inputs: x = (xrh, xrl) + i (xih, xil), y likewise; all float32, length n.
// Outputs zrh, zrl, zih, zil: float32, length n.
// OP is a code of dw_ops.h (generated from CDW_OP in mlx_precise/doubleword/dw_kernels.py):
//   CDW_OP_ADD  complex add       x + y  (accurate DW + DW per component)
//   CDW_OP_MUL  complex multiply  x * y  (DWTimesDW3 products, accurate DW + DW sums)
uint i = thread_position_in_grid.x;
if (i >= uint(xrh_shape[0])) return;
cdw x;
x.re = dw_make(xrh[i], xrl[i]);
x.im = dw_make(xih[i], xil[i]);
cdw y;
y.re = dw_make(yrh[i], yrl[i]);
y.im = dw_make(yih[i], yil[i]);
static_assert(OP >= 0 && OP < CDW_OP_COUNT, "cdw_ops: OP must be a CDW_OP code (dw_ops.h)");
cdw z = OP == CDW_OP_ADD ? cdw_add(x, y) : cdw_mul(x, y);
zrh[i] = z.re.hi;
zrl[i] = z.re.lo;
zih[i] = z.im.hi;
zil[i] = z.im.lo;
