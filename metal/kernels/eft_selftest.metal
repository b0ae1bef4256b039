// Device self-test of the error-free transforms that double-word arithmetic rests on
// (metal/include/doubleword.h). The host passes a = [1, 2^-30, 1 + 2^-23, 1 - 2^-23]
// (float32, length 4) so that the compiler cannot fold the results, and checks r
// (float32, length 8) exactly (mlx_precise/core/kernels.py: eft_selftest):
//   r[0..1] TwoSum(a0, a1)            = (1, 2^-30): dies under fast/relaxed math
//   r[2..3] TwoProdFMA(a2, a3)        = (1, -2^-46): needs a true single-rounding fma
//   r[4..5] TwoSum(a1, -a3)           = (-(1 - 2^-23), 2^-30): |a| < |b| order
//   r[6]    a1^4 * 2^-10 = 2^-130     subnormal: 0 under flush-to-zero
//   r[7]    a1^4 * 2^-5  = 2^-125     normal: never flushed
uint i = thread_position_in_grid.x;
if (i != 0) return;
dw s = dw_two_sum(a[0], a[1]);
dw p = dw_two_prod(a[2], a[3]);
dw s2 = dw_two_sum(a[1], -a[3]);
float d = (a[1] * a[1]) * (a[1] * a[1]);
r[0] = s.hi;
r[1] = s.lo;
r[2] = p.hi;
r[3] = p.lo;
r[4] = s2.hi;
r[5] = s2.lo;
r[6] = d * 0.0009765625f;
r[7] = d * 0.03125f;
