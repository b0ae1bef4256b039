// Tile partials of a matrix norm (mlx_precise/norms/engine.py), one threadgroup per
// nb x nb tile as SLATE's tile kernels use one thread block per tile.
//
// Inputs:
//   a  float32, the local m x n block, row-major; complex data as interleaved
//      (re, im) float32 pairs (complex64 viewed as float32), padded to >= 8 values.
//   p  int32, 16 parameters (NORM_TILE_* in norms.h, generated from NORM_TILE_PARAMS
//      in mlx_precise/norms/engine.py): sizes, kind, structure, and the
//      affine block-cyclic map from local to global indices,
//      g = off + (l / blk) * stride + l % blk  (identity: off 0, blk >= size).
// Output:
//   part float32 (flat, zero-initialised by the caller):
//     max: part[4t] = NaN-aware max over tile t = tr * ntc + tc, part[4t+1..3] = 0;
//     fro: part[6t .. 6t+5] = the tile's three accumulators (big, med, sml) as
//          (hi, lo) pairs;
//     one/inf: part[4 (r L + g) + {0..3}] = the two double-word classes (big, sml)
//          of the sum of |a| along line g (norms.h, norm_line; global column for
//          "one", global row for "inf") within tile row r = tr (column sums) or
//          tile column r = tc (row sums).
// Grid (T ntc, ntr, nz), threadgroup (T, 1, 1) with T <= 256. Thread t owns the
// lines t, t + T, ... of its tile: columns ("column mode": max, fro, one) or rows
// ("row mode": inf, and z = 1 of a symmetric one-norm, whose rows of off-diagonal
// stored entries add the mirrored triangle: partial rows NORM_TILE_ROWPART + tc).
//
// Which entries are read is LAPACK's (global indices gi, gj):
//   general: all; trapezoid upper gi <= gj, lower gi >= gj, unit diagonal never read
//   and counted as 1; symmetric/Hermitian: the stored triangle only, off-diagonal
//   entries count twice in the Frobenius sum and once per line in one/inf;
//   Hermitian: the imaginary part of the diagonal is ignored.

uint t = thread_position_in_threadgroup.x;
uint T = threads_per_threadgroup.x;
uint3 tg = threadgroup_position_in_grid;
int m = p[NORM_TILE_M], n = p[NORM_TILE_N], nb = p[NORM_TILE_NB];
int kind = p[NORM_TILE_KIND], st = p[NORM_TILE_STRUCTURE];
bool upper = p[NORM_TILE_UPPER] != 0, unit = p[NORM_TILE_UNIT] != 0;
bool cplx = p[NORM_TILE_COMPLEX] != 0, herm = st == NORM_STRUCTURE_HERMITIAN;
bool sym = st == NORM_STRUCTURE_SYMMETRIC || herm;
int roff = p[NORM_TILE_ROFF], rblk = p[NORM_TILE_RBLK], rstride = p[NORM_TILE_RSTRIDE];
int coff = p[NORM_TILE_COFF], cblk = p[NORM_TILE_CBLK], cstride = p[NORM_TILE_CSTRIDE];
int tc = int(tg.x), tr = int(tg.y);
int ntc = (n + nb - 1) / nb;
// Column sums for max/fro/one, row sums for inf and for the z = 1 pass of a
// symmetric one-norm (which then skips the diagonal: it was counted in z = 0).
bool rowmode = kind == NORM_KIND_INF || tg.z == 1u;
bool offdiag_only = tg.z == 1u;
int i0 = tr * nb, j0 = tc * nb;
int lines = rowmode ? metal::min(nb, m - i0) : metal::min(nb, n - j0);
int len = rowmode ? metal::min(nb, n - j0) : metal::min(nb, m - i0);

threadgroup float red[6 * 256];  // max/fro records of the threads, see below
float vmax = 0.0f;
norm_ssq ssq = norm_ssq_zero();

for (int l = int(t); l < lines; l += int(T)) {
  norm_line line = norm_line_zero();
  int li = rowmode ? i0 + l : 0, lj = rowmode ? 0 : j0 + l;
  int lg = rowmode
      ? roff + (li / rblk) * rstride + li % rblk
      : coff + (lj / cblk) * cstride + lj % cblk;
  for (int q = 0; q < len; ++q) {
    int i = rowmode ? li : i0 + q;
    int j = rowmode ? j0 + q : lj;
    int gi = rowmode ? lg
                     : roff + (i / rblk) * rstride + i % rblk;
    int gj = rowmode ? coff + (j / cblk) * cstride + j % cblk
                     : lg;
    bool diag = gi == gj;
    if (st != NORM_STRUCTURE_GENERAL && (upper ? gi > gj : gi < gj)) {
      continue;  // outside the stored triangle / trapezoid: never read
    }
    if (offdiag_only && diag) {
      continue;
    }
    float re = 1.0f, im = 0.0f;  // a unit diagonal is not read and counts as 1
    if (!(unit && diag)) {
      uint at = uint(i) * uint(n) + uint(j);
      if (cplx) {
        re = norm_daz(a[2u * at]);
        im = (herm && diag) ? 0.0f : norm_daz(a[2u * at + 1u]);
      } else {
        re = norm_daz(a[at]);
      }
    }
    if (kind == NORM_KIND_FRO) {
      float w = (sym && !diag) ? 2.0f : 1.0f;
      norm_ssq_add(ssq, re, w);
      if (cplx) {
        norm_ssq_add(ssq, im, w);
      }
    } else if (cplx) {
      bool small;
      dw v = norm_cabs_scaled(re, im, small);
      if (kind == NORM_KIND_MAX) {  // RN(|z| 2^86) 2^-86 = RN(|z|): exact scaling, |z| >= 2^-126
        vmax = norm_nanmax(vmax, small ? v.hi * NORM_P2(-NORM_SSML_E) : v.hi);
      } else {
        norm_line_add(line, v, small);
      }
    } else if (kind == NORM_KIND_MAX) {
      vmax = norm_nanmax(vmax, metal::abs(re));
    } else {
      norm_line_add_real(line, metal::abs(re));
    }
  }
  if (kind == NORM_KIND_ONE || kind == NORM_KIND_INF) {
    int prow = rowmode ? (offdiag_only ? p[NORM_TILE_ROWPART] : 0) + tc : tr;
    uint at = 4u * (uint(prow) * uint(p[NORM_TILE_L]) + uint(lg));
    part[at] = line.big.hi;
    part[at + 1u] = line.big.lo;
    part[at + 2u] = line.sml.hi;
    part[at + 3u] = line.sml.lo;
  }
}

if (kind == NORM_KIND_MAX || kind == NORM_KIND_FRO) {
  // Tree reduction of the threads' records in threadgroup memory (any T <= 256).
  uint r = 6u * t;
  if (kind == NORM_KIND_MAX) {
    red[r] = vmax;
  } else {
    red[r] = ssq.big.hi; red[r + 1] = ssq.big.lo;
    red[r + 2] = ssq.med.hi; red[r + 3] = ssq.med.lo;
    red[r + 4] = ssq.sml.hi; red[r + 5] = ssq.sml.lo;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint s = 1u; s < T; s *= 2u) {
    if ((t & (2u * s - 1u)) == 0u && t + s < T) {
      uint o = 6u * (t + s);
      if (kind == NORM_KIND_MAX) {
        red[r] = norm_nanmax(red[r], red[o]);
      } else {
        for (uint c = 0u; c < 6u; c += 2u) {
          dw x = norm_acc(dw_make(red[r + c], red[r + c + 1]), dw_make(red[o + c], red[o + c + 1]));
          red[r + c] = x.hi;
          red[r + c + 1] = x.lo;
        }
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (t == 0u) {
    uint tile = uint(tr) * uint(ntc) + uint(tc);
    if (kind == NORM_KIND_MAX) {
      part[4u * tile] = red[0];
      part[4u * tile + 1u] = 0.0f;
      part[4u * tile + 2u] = 0.0f;
      part[4u * tile + 3u] = 0.0f;
    } else {
      for (uint c = 0u; c < 6u; ++c) {
        part[6u * tile + c] = red[c];
      }
    }
  }
}
