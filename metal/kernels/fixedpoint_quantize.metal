// float -> Q1.b codes (metal/include/fixedpoint.h: fx_code).
// Inputs: x (float32, float16 or bfloat16, n elements, row-contiguous);
//   params (int32, 8): FX_PARAM_THRESHOLD_BITS (the float32 threshold's bit pattern),
//   FX_PARAM_ROUNDING (an FX_ROUNDING_* code), FX_PARAM_BITS (b: 15 or 31) (fixedpoint.h).
// Output: q (int16 for b = 15, int32 for b = 31), n elements.
uint i = thread_position_in_grid.x;
if (i >= uint(x_shape[0])) return;
float t = as_type<float>(params[FX_PARAM_THRESHOLD_BITS]);
q[i] = fx_code(float(x[i]), t, params[FX_PARAM_ROUNDING], uint(params[FX_PARAM_BITS]));
