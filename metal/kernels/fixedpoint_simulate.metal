// Fused round trip float -> Q1.b -> float (metal/include/fixedpoint.h: fx_simulate),
// one read and one write per element.
// Inputs: x (float32, float16 or bfloat16, n elements);
//   params (uint32, 4): [bits of the float32 threshold, rounding mode, b (15 or 31), 0].
// Output: y of dtype T (float32, or bfloat16 / float16 when the simulated value is
// stored in that format: the float32 result rounded once more, to nearest even), n
// elements. The conversion is explicit: Metal has no implicit float -> bfloat.
uint i = thread_position_in_grid.x;
if (i >= uint(x_shape[0])) return;
float t = as_type<float>(params[0]);
y[i] = static_cast<T>(fx_simulate(float(x[i]), t, params[1], params[2]));
