// The elementary functions of dw_fused.h's programs (DWF_OP_FN): dwm_apply of
// dw_math.h, for the kernels instantiated with MATH (their headers list this one
// after dw_fused.h; the others leave dw_math.h out).
#pragma once
#include "dw_fused.h"
#include "dw_math.h"

template <>
struct dwf_math<true> {
  static METAL_FUNC dw apply(int fn, dw x, dw y) { return dwm_apply(fn, x, y); }
};
