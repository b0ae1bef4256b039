// C = D + A B in double-word, batched, real (CPLX = 0) or complex (CPLX = 1)
// (metal/include/dw_gemm.h: accumulator and error bound; mlx_precise/linalg/gemm.py).
// Inputs: ah, al (A's words), bh, bl (B's), dh, dl (the bias D's, any 8 floats when
// there is none): float32 flat buffers; a complex value is two consecutive floats
// (real, imaginary), as a complex64 array viewed as float32. A low word that is
// zero (a float32 operand) need not be stored: p[DW_GEMM_P_A_LO], _B_LO, _D_LO say
// whether al, bl, dl hold one (else the buffer is any 8 floats, never read, and the
// low word reads as 0). A kernel that declares no al (bl) input reads A's (B's) low
// words p[DW_GEMM_P_AL_AT] (_BL_AT) floats past its high words (packed words: one
// buffer), as its line 1 defines al (bl). p: int64 parameters, the fields DW_GEMM_P_* (dw_gemm.h,
// generated from DW_GEMM_PARAMS in mlx_precise/linalg/gemm.py), then from
// p[DW_GEMM_DIMS_AT] on one record of DW_GEMM_DIM_COUNT fields DW_GEMM_DIM_* per batch
// dimension, outermost first (size, sa, sb, sc, sd, sj). Strides are in floats: A(m, k)
// of batch z at oa(z) + m sam + k sak, B(k, n) at ob(z) + k sbk + n sbn, C(m, n) at oc(z) + m scm + n scn, D(m, n) at od(z) + m sdm + n sdn, where
// o*(z) = sum_d i_d s*_d for the batch index z = (i_0, ..., i_{nb-1}) (row-major, as
// MLX's elem_to_loc; a broadcast dimension has stride 0).
// WIN = 1 (real only): A is the window of a 1-D convolution over the signal in ah, al
// (an im2col read in place, Chellapilla et al. 2006, without the copy): k = t kc + c
// (tap t, channel c < kc), A(m, k) = signal[pos] at oa(z) + pos sam + c sak with
// pos = m win_s + t win_d - win_lo, and 0 where pos is outside [0, win_len) (the zero
// padding); B(k, n) at ob(z) + t sbt + c sbk + n sbn. The k order is that of the
// gathered columns, so the sums are the same. Row m of C is the output position
// j = m out_s + oj(z) - out_lo (oj(z) = sum_d i_d sj_d: a transposed convolution's
// phase), written at oc(z) + j scm + n scn only for j in [0, out_len) (the crop).
// Output: cw float32, C's high words written at oc(z) + m scm + n scn (+1 imag), its
// low words p[DW_GEMM_P_CL_AT] floats further (packed words).
// Grid (ceil(N / 32) * 256, ceil(M / 32), batches), threadgroup (256, 1, 1): a group
// computes one 32 x 32 tile of one batch, each thread 2 x 2 outputs.
constexpr int NC = CPLX + 1;  // float parts per value
constexpr int IM = NC - 1;    // the imaginary part (only read when CPLX)
constexpr int BM = DW_GEMM_BM, BN = DW_GEMM_BN, BK = DW_GEMM_BK;
constexpr int TM = DW_GEMM_TM, TN = DW_GEMM_TN;
constexpr int COLS = BN / TN, ROWS = BM / TM, NT = ROWS * COLS;
// Staged tiles, [part][word][row][col]: A as BM x BK, B as BK x BN.
threadgroup float As[NC * 2 * BM * BK];
threadgroup float Bs[NC * 2 * BK * BN];

const long M = p[DW_GEMM_P_M], N = p[DW_GEMM_P_N], K = p[DW_GEMM_P_K];
const long sam = p[DW_GEMM_P_SAM], sak = p[DW_GEMM_P_SAK];
const long sbk = p[DW_GEMM_P_SBK], sbn = p[DW_GEMM_P_SBN];
const long scm = p[DW_GEMM_P_SCM], scn = p[DW_GEMM_P_SCN];
const long sdm = p[DW_GEMM_P_SDM], sdn = p[DW_GEMM_P_SDN];
const bool has_bias = p[DW_GEMM_P_HAS_BIAS] != 0;
const int nb = int(p[DW_GEMM_P_BATCH_DIMS]);
const bool a_lo = p[DW_GEMM_P_A_LO] != 0, b_lo = p[DW_GEMM_P_B_LO] != 0;
const bool d_lo = p[DW_GEMM_P_D_LO] != 0;
const long kc = p[DW_GEMM_P_KC], sbt = p[DW_GEMM_P_SBT];
const long win_s = p[DW_GEMM_P_WIN_S], win_d = p[DW_GEMM_P_WIN_D];
const long win_lo = p[DW_GEMM_P_WIN_LO], win_len = p[DW_GEMM_P_WIN_LEN];
const long out_s = p[DW_GEMM_P_OUT_S], out_lo = p[DW_GEMM_P_OUT_LO];
const long out_len = p[DW_GEMM_P_OUT_LEN];
device float* ch = cw;
device float* cl = cw + p[DW_GEMM_P_CL_AT];
const uint3 g = threadgroup_position_in_grid;
const int tid = int(thread_index_in_threadgroup);

long oa = 0, ob = 0, oc = 0, od = 0, oj = 0;
long z = long(g.z);
for (int d = nb - 1; d >= 0; --d) {
  const int rec = DW_GEMM_DIMS_AT + DW_GEMM_DIM_COUNT * d;
  const long size = p[rec + DW_GEMM_DIM_SIZE];
  const long i = z % size;
  z /= size;
  oa += i * p[rec + DW_GEMM_DIM_SA];
  ob += i * p[rec + DW_GEMM_DIM_SB];
  oc += i * p[rec + DW_GEMM_DIM_SC];
  od += i * p[rec + DW_GEMM_DIM_SD];
  oj += i * p[rec + DW_GEMM_DIM_SJ];
}

const long m0 = long(g.y) * BM, n0 = long(g.x) * BN;
const int r = tid / COLS, c = tid % COLS;  // this thread: rows r + i ROWS, cols c + j COLS
// Rows and columns grow with i and j: the first decides whether any is in range. An
// idle thread still stages tiles and meets every barrier.
const bool active = (m0 + r < M) && (n0 + c < N);

dwg_acc acc[TM][TN][NC];
for (int i = 0; i < TM; ++i)
  for (int j = 0; j < TN; ++j) {
    const long m = m0 + r + i * ROWS, n = n0 + c + j * COLS;
    const bool in = has_bias && m < M && n < N;
    const long at = od + m * sdm + n * sdn;
    for (int q = 0; q < NC; ++q)
      acc[i][j][q] = in ? dwg_acc_make(dh[at + q], d_lo ? dl[at + q] : 0.0f)
                        : dwg_acc_make(0.0f, 0.0f);
  }

for (long k0 = 0; k0 < K; k0 += BK) {
  // Coalesced staging (consecutive threads take consecutive k of A, n of B for
  // row-major operands); zeros outside the matrices, never read below.
  for (int e = tid; e < BM * BK; e += NT) {
    const int mm = e / BK, kk = e % BK;
    const long m = m0 + mm, k = k0 + kk;
    bool in = m < M && k < K;
    long at = oa + m * sam + k * sak;
    if (WIN) {  // tap t, channel k - t kc, at its position in the signal (0 outside)
      const long t = k / kc, pos = m * win_s + t * win_d - win_lo;
      in = in && pos >= 0 && pos < win_len;
      at = oa + pos * sam + (k - t * kc) * sak;
    }
    for (int q = 0; q < NC; ++q) {
      As[((q * 2 + 0) * BM + mm) * BK + kk] = in ? ah[at + q] : 0.0f;
      As[((q * 2 + 1) * BM + mm) * BK + kk] = in && a_lo ? al[at + q] : 0.0f;
    }
  }
  for (int e = tid; e < BK * BN; e += NT) {
    const int kk = e / BN, nn = e % BN;
    const long k = k0 + kk, n = n0 + nn;
    const bool in = k < K && n < N;
    const long t = WIN ? k / kc : 0;
    const long at = ob + t * sbt + (k - t * kc) * sbk + n * sbn;
    for (int q = 0; q < NC; ++q) {
      Bs[((q * 2 + 0) * BK + kk) * BN + nn] = in ? bh[at + q] : 0.0f;
      Bs[((q * 2 + 1) * BK + kk) * BN + nn] = in && b_lo ? bl[at + q] : 0.0f;
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (active) {
    const int kn = K - k0 < BK ? int(K - k0) : BK;  // the zero-filled tail adds nothing
    for (int kk = 0; kk < kn; ++kk) {
      float a[TM][NC][2], b[TN][NC][2];
      for (int i = 0; i < TM; ++i)
        for (int q = 0; q < NC; ++q)
          for (int w = 0; w < 2; ++w) a[i][q][w] = As[((q * 2 + w) * BM + r + i * ROWS) * BK + kk];
      for (int j = 0; j < TN; ++j)
        for (int q = 0; q < NC; ++q)
          for (int w = 0; w < 2; ++w) b[j][q][w] = Bs[((q * 2 + w) * BK + kk) * BN + c + j * COLS];
      for (int i = 0; i < TM; ++i)
        for (int j = 0; j < TN; ++j) {
          if (NC == 1) {
            dwg_acc_fma(acc[i][j][0], a[i][0][0], a[i][0][1], b[j][0][0], b[j][0][1]);
          } else {
            // (ar + i ai)(br + i bi): four exact-product terms, each part its own sum
            // (no Gauss 3M: its imaginary part cancels, see docs/dwgemm.md);
            // -ai is exact.
            dwg_acc_fma(acc[i][j][0], a[i][0][0], a[i][0][1], b[j][0][0], b[j][0][1]);
            dwg_acc_fma(acc[i][j][0], -a[i][IM][0], -a[i][IM][1], b[j][IM][0], b[j][IM][1]);
            dwg_acc_fma(acc[i][j][IM], a[i][0][0], a[i][0][1], b[j][IM][0], b[j][IM][1]);
            dwg_acc_fma(acc[i][j][IM], a[i][IM][0], a[i][IM][1], b[j][0][0], b[j][0][1]);
          }
        }
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
}

if (active) {
  for (int i = 0; i < TM; ++i) {
    const long m = m0 + r + i * ROWS;
    if (m >= M) break;
    for (int j = 0; j < TN; ++j) {
      const long n = n0 + c + j * COLS;
      if (n >= N) break;
      long row = m;
      if (WIN) {  // the output position of row m: outside the crop, not written
        row = m * out_s + oj - out_lo;
        if (row < 0 || row >= out_len) continue;
      }
      const long at = oc + row * scm + n * scn;
      for (int q = 0; q < NC; ++q) {
        const dw v = dwg_acc_value(acc[i][j][q]);
        ch[at + q] = v.hi;
        cl[at + q] = v.lo;
      }
    }
  }
}
