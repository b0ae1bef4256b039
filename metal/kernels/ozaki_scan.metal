// Exponent scan of the rows of a float64 matrix X (R, C), read as raw bits
// (x: uint32, 2 words per value, low word first). One thread per (k-block, row).
// params (int32): [R, C, KB (block length), NB (number of blocks), ...].
// info (int32, [R, NB, 5]) per row r and block j (columns j*KB ... j*KB+KB-1):
//   0 max exponent over nonzeros (OZ_NEG if none)
//   1 min exponent over nonzeros (OZ_POS if none)
//   2 number of nonzeros
//   3 number of Inf/NaN
//   4 min exponent of the lowest set bit over nonzeros (OZ_POS if none)
// Row maxima, the ESC estimate and the tight slice rule are built from these.
uint j = thread_position_in_grid.x;
uint r = thread_position_in_grid.y;
int R = params[0], C = params[1], KB = params[2], NB = params[3];
if (int(r) >= R || int(j) >= NB) return;
int k0 = int(j) * KB;
int k1 = min(k0 + KB, C);
int emax = OZ_NEG, emin = OZ_POS, nnz = 0, bad = 0, low = OZ_POS;
for (int k = k0; k < k1; ++k) {
  ulong idx = 2ul * (ulong(r) * ulong(C) + ulong(k));
  ulong bits = oz_bits(x[idx], x[idx + 1]);
  int e = oz_exponent(bits);
  if (e == OZ_NONFINITE) {
    bad += 1;
  } else if (e != OZ_NEG) {
    nnz += 1;
    emax = max(emax, e);
    emin = min(emin, e);
    low = min(low, oz_low_exponent(bits));
  }
}
ulong o = 5ul * (ulong(r) * ulong(NB) + ulong(j));
info[o] = emax;
info[o + 1] = emin;
info[o + 2] = nnz;
info[o + 3] = bad;
info[o + 4] = low;
