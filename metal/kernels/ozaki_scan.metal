// Exponent scan of the rows of a float64 matrix X (R, C), read as raw bits
// (x: uint32, 2 words per value, low word first). One thread per (k-block, row).
// params (int32): OZAKI_SCAN_ROWS (R), _COLS (C), _BLOCK (KB, block length),
// _BLOCKS (NB, number of blocks) (ozaki.h).
// info (int32, [R, NB, OZ_INFO_COUNT]) per row r and block j (columns j*KB ...
// j*KB+KB-1), fields OZ_INFO_* (ozaki.h):
//   MAX_EXPONENT  max exponent over nonzeros (OZ_NEG if none)
//   MIN_EXPONENT  min exponent over nonzeros (OZ_POS if none)
//   NONZEROS      number of nonzeros
//   NONFINITE     number of Inf/NaN
//   LOW_EXPONENT  min exponent of the lowest set bit over nonzeros (OZ_POS if none)
// Row maxima, the ESC estimate and the tight slice rule are built from these.
uint j = thread_position_in_grid.x;
uint r = thread_position_in_grid.y;
int R = params[OZAKI_SCAN_ROWS], C = params[OZAKI_SCAN_COLS];
int KB = params[OZAKI_SCAN_BLOCK], NB = params[OZAKI_SCAN_BLOCKS];
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
ulong o = ulong(OZ_INFO_COUNT) * (ulong(r) * ulong(NB) + ulong(j));
info[o + OZ_INFO_MAX_EXPONENT] = emax;
info[o + OZ_INFO_MIN_EXPONENT] = emin;
info[o + OZ_INFO_NONZEROS] = nnz;
info[o + OZ_INFO_NONFINITE] = bad;
info[o + OZ_INFO_LOW_EXPONENT] = low;
