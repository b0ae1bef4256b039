// Q1.b codes -> float32 values q / 2^b (metal/include/fixedpoint.h: fx_value).
// Input: q (int16 for BITS = 15, int32 for BITS = 31), n elements.
// Output: y (float32), n elements. Template: BITS (15 or 31).
uint i = thread_position_in_grid.x;
if (i >= uint(q_shape[0])) return;
y[i] = fx_value(int(q[i]), uint(BITS));
