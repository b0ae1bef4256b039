// Fused round trip float -> Q1.b -> float (metal/include/fixedpoint.h: fx_simulate),
// one read and one write per element.
// Inputs: x (float32, float16 or bfloat16, n elements);
//   params (int32, 8): as in fixedpoint_quantize.metal (FX_PARAM_* in fixedpoint.h).
// Output: y of dtype T (float32, or bfloat16 / float16 when the simulated value is
// stored in that format: the float32 result rounded once more, to nearest even), n
// elements. The conversion is explicit: Metal has no implicit float -> bfloat.
uint i = thread_position_in_grid.x;
if (i >= uint(x_shape[0])) return;
float t = as_type<float>(params[FX_PARAM_THRESHOLD_BITS]);
y[i] = static_cast<T>(fx_simulate(float(x[i]), t, params[FX_PARAM_ROUNDING],
                                  uint(params[FX_PARAM_BITS])));
