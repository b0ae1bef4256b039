// Elementwise complex double-word operation selected by the template parameter OP
// (test kernel for cdw_add / cdw_mul in metal/include/doubleword.h).
// Inputs: x = (xrh, xrl) + i (xih, xil), y likewise; all float32, length n.
// Outputs zrh, zrl, zih, zil: float32, length n.
//   OP 0  complex add       x + y  (accurate DW + DW per component)
//   OP 1  complex multiply  x * y  (DWTimesDW3 products, accurate DW + DW sums)
uint i = thread_position_in_grid.x;
if (i >= uint(xrh_shape[0])) return;
cdw x;
x.re = dw_make(xrh[i], xrl[i]);
x.im = dw_make(xih[i], xil[i]);
cdw y;
y.re = dw_make(yrh[i], yrl[i]);
y.im = dw_make(yih[i], yil[i]);
static_assert(OP == 0 || OP == 1, "cdw_ops: OP must be 0 or 1");
cdw z = OP == 0 ? cdw_add(x, y) : cdw_mul(x, y);
zrh[i] = z.re.hi;
zrl[i] = z.re.lo;
zih[i] = z.im.hi;
zil[i] = z.im.lo;
