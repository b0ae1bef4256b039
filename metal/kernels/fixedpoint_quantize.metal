// float -> Q1.b codes (metal/include/fixedpoint.h: fx_code).
// Inputs: x (float32, float16 or bfloat16, n elements, row-contiguous);
//   params (uint32, 4): [bits of the float32 threshold, rounding mode, b (15 or 31), 0].
// Output: q (int16 for b = 15, int32 for b = 31), n elements.
uint i = thread_position_in_grid.x;
if (i >= uint(x_shape[0])) return;
float t = as_type<float>(params[0]);
q[i] = fx_code(float(x[i]), t, params[1], params[2]);
