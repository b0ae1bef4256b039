// (this line: the slots' declaration, dwf_slots s, made by the kernel's prelude)
// The sums (or products) of the rows of a double-word expression, each by the
// pairwise tree of mlx_precise/extended/arith.py's reduce_sum (so its bits): level
// l + 1 pairs element j with element j + k_(l+1) of level l (size k_l, k_(l+1) =
// ceil(k_l / 2), the missing partner of an odd level the neutral element), down to
// one value; a row of one element is that element.
// Inputs: the slots (a0 .. a3, a7 or a11: dw_reduce4, dw_reduce8, dw_reduce) and the
// program prog of the expression (dw_fused.h); the program's iteration walks the kept axes, then the reduced ones, so that
// element j of row r is its element r n + j; its header also holds the row length n
// (DWF_PROG_N, at most 2 DWF_REDUCE_MAX) and the operation (DWF_PROG_REDUCE:
// DWF_OP_ADD or DWF_OP_MUL).
// Output z: float32, the high word of each row's value, then (from DWF_PROG_PLANE,
// the number of rows) its low word (packed words). One threadgroup per row: the first
// level from the expression's values (the program runs where an element is read),
// the next ones in threadgroup memory, one barrier apart.
threadgroup float wh[DWF_REDUCE_MAX];
threadgroup float wl[DWF_REDUCE_MAX];
const int n = prog[DWF_PROG_N];
const bool mul = prog[DWF_PROG_REDUCE] == DWF_OP_MUL;
const dw neutral = dw_make(mul ? 1.0f : 0.0f, 0.0f);
const uint row = threadgroup_position_in_grid.x;
const int t = int(thread_position_in_threadgroup.x);
const int nt = int(threads_per_threadgroup.x);
const uint first = row * uint(n);
int idx[DWF_MAX_NDIM];
const int k1 = (n + 1) / 2;
for (int j = t; j < k1; j += nt) {
  dwf_index(first + uint(j), prog, idx);
  dw v = dwf_eval<MATH>(s, idx, prog);
  if (n > 1) {
    dw b = neutral;
    if (j + k1 < n) {
      dwf_index(first + uint(j + k1), prog, idx);
      b = dwf_eval<MATH>(s, idx, prog);
    }
    v = mul ? dw_mul(v, b) : dw_add(v, b);
  }
  wh[j] = v.hi;
  wl[j] = v.lo;
}
// Level k -> ceil(k / 2): element j (< h) reads j + h (>= h), which no thread writes
// in this level.
for (int k = k1; k > 1;) {
  const int h = (k + 1) / 2;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int j = t; j < h; j += nt) {
    const dw a = dw_make(wh[j], wl[j]);
    const dw b = j + h < k ? dw_make(wh[j + h], wl[j + h]) : neutral;
    const dw v = mul ? dw_mul(a, b) : dw_add(a, b);
    wh[j] = v.hi;
    wl[j] = v.lo;
  }
  k = h;
}
threadgroup_barrier(mem_flags::mem_threadgroup);
if (t == 0) {
  z[row] = wh[0];
  z[uint(prog[DWF_PROG_PLANE]) + row] = wl[0];
}
