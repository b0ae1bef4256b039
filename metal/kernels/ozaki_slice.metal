// Slicing: the rows of a float64 matrix X (R, C) (x: raw bits, uint32 pairs) are
// cut into S int8 slices of B bits each (out: int8 [S, R, C], slice 0 most
// significant). Row r is scaled by 2^-t[r] (t: int32 [R], chosen by the host so
// that |x| < 2^t[r] with the headroom the digit set needs), then
//     x ~ sum_p out[p, r, c] * 2^(t[r] - B (p + 1)),
// the digits of V = trunc(|x| 2^(B S - t[r])) with x's sign: truncation toward
// zero, so |x - kept| < 2^(t[r] - B S). Digits are read straight from the 53-bit
// significand (no floating-point scaling: exact for subnormals and huge values).
//   BAL = 0: sign-magnitude digits, |d| <= 2^B - 1 (B <= 7).
//   BAL = 1: balanced digits in [-2^(B-1), 2^(B-1) - 1] (B = 8), obtained from the
//            sign-magnitude digits by carrying from the least significant slice
//            up; the host's headroom (|x| < 2^(t - 2)) keeps the top digit in range.
// params (int32): OZAKI_SLICE_ROWS (R), _COLS (C), _SLICES (S), _SLICE_BITS (B),
// _BALANCED (BAL) (ozaki.h). One thread per element.
uint c = thread_position_in_grid.x;
uint r = thread_position_in_grid.y;
int R = params[OZAKI_SLICE_ROWS], C = params[OZAKI_SLICE_COLS];
int S = params[OZAKI_SLICE_SLICES], B = params[OZAKI_SLICE_SLICE_BITS];
int BAL = params[OZAKI_SLICE_BALANCED];
if (int(r) >= R || int(c) >= C) return;
ulong e = ulong(r) * ulong(C) + ulong(c);
ulong bits = oz_bits(x[2ul * e], x[2ul * e + 1ul]);
ulong m = oz_significand(bits);
int sgn = (bits >> 63) != 0ul ? -1 : 1;
int shift = oz_ulp_exponent(bits) + B * S - t[r];
ulong plane = ulong(R) * ulong(C);
int carry = 0;
int radix_half = 1 << (B - 1);  // balanced digits lie in [-radix_half, radix_half)
for (int p = S - 1; p >= 0; --p) {
  int d = sgn * int(oz_digit(m, B * (S - 1 - p) - shift, B)) + carry;
  carry = 0;
  if (BAL != 0) {
    if (d >= radix_half) {
      d -= 2 * radix_half;
      carry = 1;
    } else if (d < -radix_half) {
      d += 2 * radix_half;
      carry = -1;
    }
  }
  out[ulong(p) * plane + e] = char(d);
}
