// Complex double-word division q = x / y (mlx_precise/doubleword/kernel_engine.py,
// _complex_div), one thread per element. x and y are first scaled by the powers
// of two 2^-ex, 2^-ey that bring their larger parts into [1, 2), so x' conj(y'),
// |y'|^2 and q' = x' conj(y') / |y'|^2 (|q'| in [1/3, 3]) neither overflow nor lose
// their low words to underflow for any float32 operands (cdw_mul <= 8.66u^2
// normwise; the sum of squares and the quotients by JMP alg. 6, 12, 18); then
// q = q' 2^(ex - ey) as three factors of one sign. Scalings by dw_ldexp (dw_ops.h):
// exact unless q leaves float32's range, rounded there as float32 multiplication
// rounds (gradual underflow).
// The float32 rule for special operands: where a part of x or y is Inf or NaN, or
// y = 0, `special` is set (the wrapper takes float32's complex quotient of the high
// words there) and the low words are 0; a quotient that overflows has zero low words.
//
// Inputs:  x_hi, x_lo, y_hi, y_lo float32 interleaved (re, im) words, n points each
//          (the grid); at int32: at[0], at[1] the offsets in floats of x's and y's
//          low words in x_lo, y_lo (0, or the second half of packed words passed as
//          both x_hi and x_lo: one buffer), at[2] that of q's low words in z (2 n).
// Outputs: z float32: q's interleaved high words, then its low words (packed);
//          special bool (n,).
uint i = thread_position_in_grid.x;
cdw x = cdw_load(x_hi, x_lo + at[0], i);
cdw y = cdw_load(y_hi, y_lo + at[1], i);
device float* z_hi = z;
device float* z_lo = z + at[2];
bool finite = metal::isfinite(x.re.hi) && metal::isfinite(x.im.hi) && metal::isfinite(y.re.hi)
              && metal::isfinite(y.im.hi);
// y = 0: both parts +-0, by the bits (a subnormal is not 0, as on a CPU)
bool y_zero = ((as_type<uint>(y.re.hi) | as_type<uint>(y.im.hi)) << 1) == 0u;
int ex = cdw_div_exponent(x);
int ey = cdw_div_exponent(y);
cdw xs = cdw_ldexp(x, -ex, 2);
cdw ys = cdw_ldexp(y, -ey, 2);
cdw ys_conj;
ys_conj.re = ys.re;
ys_conj.im = dw_neg(ys.im);
cdw num = cdw_mul(xs, ys_conj);
dw den = dw_add(dw_mul(ys.re, ys.re), dw_mul(ys.im, ys.im));
cdw q;
q.re = dw_div(num.re, den);
q.im = dw_div(num.im, den);
q = cdw_ldexp(q, ex - ey, 3);
bool keep_lo = finite && !y_zero && metal::isfinite(q.re.hi) && metal::isfinite(q.im.hi);
z_hi[2 * i] = q.re.hi;
z_hi[2 * i + 1] = q.im.hi;
z_lo[2 * i] = keep_lo ? q.re.lo : 0.0f;
z_lo[2 * i + 1] = keep_lo ? q.im.lo : 0.0f;
special[i] = !finite || y_zero;
