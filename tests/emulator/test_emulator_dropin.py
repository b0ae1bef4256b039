"""The emulator as a drop-in for other people's MLX custom Metal kernels.

Kernels written in the styles of MLX's documentation, mlx-lm and mlx-examples:
Metal's standard headers, the simd_* / quad_* collectives, simdgroup_matrix, half and
bfloat16 arithmetic, threadgroup memory and barriers, atomics with init_value,
templates, strided inputs (ensure_row_contiguous=False); plus MLX's argument checks,
derivatives and transformations, and the checked mode. Every result is compared with
a numpy computation of what the kernel must produce. Small kernels are grouped into
one compile each to keep the suite fast.
"""

import warnings

import mlx.core as mx
import numpy as np
import pytest

from mlx_precise.emulator import kernel as emu_kernel
from mlx_precise.emulator import metal_kernel

HEADERS = """
#include <metal_stdlib>
#include <metal_simdgroup>
#include <metal_simdgroup_matrix>
#include <metal_atomic>
#include <metal_math>
#include <metal_compute>
using namespace metal;
"""


def run(kernel, inputs, out_shapes, out_dtypes, grid, tg, **kw):
    return kernel(inputs=inputs, grid=grid, threadgroup=tg, output_shapes=out_shapes,
                  output_dtypes=out_dtypes, **kw)


# ---- simd_* / quad_* collectives ---------------------------------------------------

# (name, expression); x and y are int lanes, v a float2, h a half, b a bfloat.
SIMD_INT = [
    ("simd_sum", "simd_sum(x)"),
    ("simd_product", "simd_product(p)"),
    ("simd_max", "simd_max(x)"),
    ("simd_min", "simd_min(x)"),
    ("simd_and", "simd_and(x)"),
    ("simd_or", "simd_or(x)"),
    ("simd_xor", "simd_xor(x)"),
    ("prefix_excl_sum", "simd_prefix_exclusive_sum(x)"),
    ("prefix_incl_sum", "simd_prefix_inclusive_sum(x)"),
    ("prefix_excl_prod", "simd_prefix_exclusive_product(p)"),
    ("prefix_incl_prod", "simd_prefix_inclusive_product(p)"),
    ("ballot", "int(uint(uint64_t(simd_ballot(x > 0))))"),
    ("all", "int(simd_all(x > -1000))"),
    ("any", "int(simd_any(x > 45))"),
    ("is_first", "int(simd_is_first())"),
    ("active", "int(uint(uint64_t(simd_active_threads_mask())))"),
    ("quad_sum", "quad_sum(x)"),
    ("quad_max", "quad_max(x)"),
    ("quad_prefix_incl_sum", "quad_prefix_inclusive_sum(x)"),
    # shuffles: full simdgroups only (a source lane outside the active lanes is
    # undefined on the GPU)
    ("shuffle", "simd_shuffle(x, (lane * 5) % 32)"),
    ("broadcast", "simd_broadcast(x, 3)"),
    ("broadcast_first", "simd_broadcast_first(x)"),
    ("shuffle_down", "simd_shuffle_down(x, 3)"),
    ("shuffle_up", "simd_shuffle_up(x, 5)"),
    ("shuffle_xor", "simd_shuffle_xor(x, 6)"),
    ("rotate_down", "simd_shuffle_rotate_down(x, 7)"),
    ("rotate_up", "simd_shuffle_rotate_up(x, 9)"),
    ("fill_down", "simd_shuffle_and_fill_down(x, y, 5)"),
    ("fill_up", "simd_shuffle_and_fill_up(x, y, 3)"),
    ("fill_down_mod8", "simd_shuffle_and_fill_down(x, y, 3, 8)"),
    ("fill_up_mod8", "simd_shuffle_and_fill_up(x, y, 2, 8)"),
    ("quad_shuffle_xor", "quad_shuffle_xor(x, 1)"),
    ("quad_broadcast", "quad_broadcast(x, 2)"),
    ("quad_shuffle_down", "quad_shuffle_down(x, 1)"),
    # vector / swizzle / half / bfloat forms (values are small integers: exact)
    ("float2_xor", "int(simd_shuffle_xor(v, 16).y)"),
    ("swizzle_xor", "int(simd_shuffle_xor(v.yx, 1).x)"),
    ("float4_sum", "int(simd_sum(float4(v, v)).w)"),
    ("half_sum", "int(float(simd_sum(h)))"),
    ("bf_max", "int(float(simd_max(b)))"),
    ("bf_sum", "int(float(simd_sum(b)))"),
]
N_SHUFFLE_FREE = 19  # the first entries are defined for partial simdgroups too


def _simd_oracle(x, y, p, active):
    """What each SIMD_INT entry yields for one simdgroup (arrays of 32 lanes; lanes
    >= active absent)."""
    a = np.arange(32) < active
    xa, pa = x[a], p[a]
    lane = np.arange(32)
    i32 = lambda v: np.asarray(v, dtype=np.int64).astype(np.int32)  # noqa: E731
    quad = lambda f: np.array([f(x[(l & ~3):(l & ~3) + 4][a[(l & ~3):(l & ~3) + 4]]) if a[l] else 0  # noqa: E731
                               for l in lane])
    within = lambda src: np.where((src >= 0) & (src < 32), x[np.clip(src, 0, 31)], x)  # noqa: E731
    qwithin = lambda src: x[(lane & ~3) + src % 4]  # noqa: E731
    seg = lambda m: (lane // m) * m  # noqa: E731

    def fill_down(d, m):
        j = lane % m
        return np.where(j + d < m, x[np.clip(seg(m) + j + d, 0, 31)], y[np.clip(seg(m) + j + d - m, 0, 31)])

    def fill_up(d, m):
        j = lane % m
        return np.where(j >= d, x[np.clip(seg(m) + j - d, 0, 31)], y[np.clip(seg(m) + j + m - d, 0, 31)])

    ballot = int(sum(1 << int(l) for l in lane[a] if x[l] > 0))
    full = {
        "simd_sum": xa.sum(), "simd_product": i32(np.prod(pa.astype(np.int64))),
        "simd_max": xa.max(), "simd_min": xa.min(),
        "simd_and": np.bitwise_and.reduce(xa), "simd_or": np.bitwise_or.reduce(xa),
        "simd_xor": np.bitwise_xor.reduce(xa),
        "prefix_excl_sum": np.cumsum(x * a) - x, "prefix_incl_sum": np.cumsum(x * a),
        "prefix_excl_prod": i32(np.cumprod(np.where(a, p, 1).astype(np.int64)) // p),
        "prefix_incl_prod": i32(np.cumprod(np.where(a, p, 1).astype(np.int64))),
        "ballot": np.int64(ballot).astype(np.uint32).astype(np.int32),
        "all": int(np.all(xa > -1000)), "any": int(np.any(xa > 45)),
        "is_first": (lane == 0).astype(int),
        "active": np.int64((1 << active) - 1).astype(np.uint32).astype(np.int32),
        "quad_sum": quad(np.sum), "quad_max": quad(np.max),
        "quad_prefix_incl_sum": np.array([x[(l & ~3):l + 1].sum() for l in lane]),
        "shuffle": x[(lane * 5) % 32], "broadcast": x[3], "broadcast_first": x[0],
        "shuffle_down": within(lane + 3), "shuffle_up": within(lane - 5),
        "shuffle_xor": x[lane ^ 6], "rotate_down": x[(lane + 7) % 32],
        "rotate_up": x[(lane - 9) % 32],
        "fill_down": fill_down(5, 32), "fill_up": fill_up(3, 32),
        "fill_down_mod8": fill_down(3, 8), "fill_up_mod8": fill_up(2, 8),
        "quad_shuffle_xor": x[lane ^ 1], "quad_broadcast": qwithin(2),
        "quad_shuffle_down": np.where(lane % 4 + 1 < 4, x[np.clip(lane + 1, 0, 31)], x),
        "float2_xor": y[lane ^ 16], "swizzle_xor": y[lane ^ 1],
        "float4_sum": y.sum(), "half_sum": x.sum(), "bf_max": x.max(), "bf_sum": x.sum(),
    }
    return [np.broadcast_to(np.asarray(full[n]), (32,))[a] for n, _ in SIMD_INT]


@pytest.fixture(scope="module")
def simd_kernel():
    body = "\n".join(f"    out[{i} * n + gid] = {expr};" for i, (_, expr) in enumerate(SIMD_INT))
    return metal_kernel(name="simd_family", input_names=["xs", "ys", "ps"], output_names=["out"],
                        header=HEADERS, source=f"""
    uint gid = thread_position_in_grid.x;
    uint n = threads_per_grid.x;
    uint lane = thread_index_in_simdgroup;
    int x = xs[gid], y = ys[gid], p = ps[gid];
    float2 v = float2(float(x), float(y));
    half h = half(x);
    bfloat16_t b = bfloat16_t(x);
{body}
""")


@pytest.mark.parametrize("n", [128, 104])
def test_simd_and_quad_family_vs_numpy(simd_kernel, n):
    """Every simd_/quad_ collective on two 64-thread groups; n = 104 leaves the last
    simdgroup with 8 active lanes, where only the reductions, prefixes and votes
    (defined over active lanes) are compared."""
    rng = np.random.default_rng(1)
    x = rng.integers(-50, 51, size=n).astype(np.int32)
    y = rng.integers(-50, 51, size=n).astype(np.int32)
    p = rng.choice(np.array([-1, 1, 1, 2], dtype=np.int32), size=n)
    (out,) = run(simd_kernel, [mx.array(x), mx.array(y), mx.array(p)],
                 [(len(SIMD_INT) * n,)], [mx.int32], (n, 1, 1), (64, 1, 1))
    got = np.array(out).reshape(len(SIMD_INT), n)
    for s0 in range(0, n, 32):
        active = min(32, n - s0)
        sl = slice(s0, s0 + 32)
        pad = lambda v: np.pad(v[sl], (0, 32 - active))  # noqa: E731
        want = _simd_oracle(pad(x), pad(y), np.where(np.arange(32) < active, pad(p), 1), active)
        checked = len(SIMD_INT) if active == 32 else N_SHUFFLE_FREE
        for k in range(checked):
            np.testing.assert_array_equal(got[k, s0:s0 + active], want[k], err_msg=SIMD_INT[k][0])


# ---- simdgroup_matrix ---------------------------------------------------------------

MATMUL = metal_kernel(name="sg_matmul", input_names=["A", "B"], output_names=["C", "D", "E"],
                      header=HEADERS, source="""
    // C = alpha * A B and D = A^T B + C for (M x K) (K x N) tiles of 8, one simdgroup
    // per 8x8 output tile; A staged through threadgroup memory, B read from device.
    constexpr int K = 16, N = 16, M = 16;
    threadgroup T As[M * K];
    uint lane = thread_index_in_simdgroup;
    uint2 tile = threadgroup_position_in_grid.xy;  // (column, row) tile
    for (uint i = lane; i < M * K; i += 32) As[i] = A[i];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    simdgroup_matrix<T, 8, 8> a, b, acc = make_filled_simdgroup_matrix<T, 8, 8>(T(0));
    for (int k = 0; k < K; k += 8) {
        simdgroup_load(a, As, K, ulong2(k, tile.y * 8));
        simdgroup_load(b, B, N, ulong2(tile.x * 8, k));
        simdgroup_multiply_accumulate(acc, a, b, acc);
    }
    // Scale through the lane's own elements, as MLX's steel MMA does.
    thread auto& e = acc.thread_elements();
    e = e * T(2);
    simdgroup_store(acc, C, N, ulong2(tile.x * 8, tile.y * 8));
    // D = A^T B + C with transposed loads of A (M == K here).
    simdgroup_matrix<T, 8, 8> c2, d;
    simdgroup_load(c2, C, N, ulong2(tile.x * 8, tile.y * 8));
    d = c2;
    for (int k = 0; k < M; k += 8) {
        simdgroup_load(a, As, K, ulong2(tile.y * 8, k), true);
        simdgroup_load(b, B, N, ulong2(tile.x * 8, k));
        simdgroup_multiply_accumulate(d, a, b, d);
    }
    simdgroup_store(d, D, N, ulong2(tile.x * 8, tile.y * 8));
    // E = A B with fragments filled and read through thread_elements at the lane's
    // (row sm, columns sn, sn + 1), the way MLX's steel GEMM addresses them.
    short qid = lane / 4;
    short sm = (qid & 4) + (lane / 2) % 4, sn = (qid & 2) * 2 + (lane % 2) * 2;
    simdgroup_matrix<T, 8, 8> fa, fb, fe = simdgroup_matrix<T, 8, 8>(0);
    for (int k = 0; k < K; k += 8) {
        simdgroup_barrier(mem_flags::mem_none);
        fa.thread_elements()[0] = As[(tile.y * 8 + sm) * K + k + sn];
        fa.thread_elements()[1] = As[(tile.y * 8 + sm) * K + k + sn + 1];
        fb.thread_elements()[0] = B[(k + sm) * N + tile.x * 8 + sn];
        fb.thread_elements()[1] = B[(k + sm) * N + tile.x * 8 + sn + 1];
        simdgroup_multiply_accumulate(fe, fa, fb, fe);
    }
    thread const auto& out = fe.thread_elements();
    E[(tile.y * 8 + sm) * N + tile.x * 8 + sn] = out[0];
    E[(tile.y * 8 + sm) * N + tile.x * 8 + sn + 1] = out[1];
""")


@pytest.mark.parametrize("dtype,ulp", [(mx.float32, 2.0**-23), (mx.float16, 2.0**-10),
                                       (mx.bfloat16, 2.0**-7)])
def test_simdgroup_matrix_matmul(dtype, ulp):
    """8x8 simdgroup_matrix load (plain and transposed) / multiply_accumulate /
    thread_elements (written and read per lane, steel style) / store in float, half
    and bfloat vs numpy float64 products of the same (rounded) inputs; the result
    of each tile step is rounded to T."""
    rng = np.random.default_rng(2)
    A = mx.array(rng.integers(-8, 9, (16, 16)) / 8).astype(dtype)
    B = mx.array(rng.standard_normal((16, 16))).astype(dtype)
    C, D, E = run(MATMUL, [A, B], [(16, 16)] * 3, [dtype] * 3, (32 * 2, 2, 1), (32, 1, 1),
                  template=[("T", dtype)])
    a, b = (np.array(t.astype(mx.float32)).astype(np.float64) for t in (A, B))
    c, d, e = (np.array(t.astype(mx.float32)).astype(np.float64) for t in (C, D, E))
    assert np.array_equal(2 * e, c)  # the same products, scaled exactly
    scale = np.abs(a) @ np.abs(b)
    # two rounded k-steps (then exact doubling) / three for D: a few units of T
    assert np.all(np.abs(c - 2 * (a @ b)) <= 4 * ulp * 2 * scale + 1e-30)
    assert np.all(np.abs(d - (a.T @ b + c)) <= 6 * ulp * (np.abs(a.T) @ np.abs(b) + np.abs(c)))
    if dtype == mx.float32:  # float accumulation of exact k/8 * float: tight
        np.testing.assert_allclose(c, 2 * (a @ b), rtol=0, atol=4e-6 * scale.max())


# ---- half and bfloat16 in the styles of mlx-lm / MLX's docs ----------------------------

SOFTMAX = metal_kernel(name="row_softmax", input_names=["x"], output_names=["y", "kl"],
                       header=HEADERS, source="""
    // One threadgroup per row: max and sum by simd_max/simd_sum and threadgroup
    // memory, the mlx-lm way; T is float, half or bfloat (accumulate in float).
    threadgroup float part[32];
    uint row = threadgroup_position_in_grid.y;
    uint lid = thread_position_in_threadgroup.x;
    uint sg = simdgroup_index_in_threadgroup, lane = thread_index_in_simdgroup;
    uint nsg = simdgroups_per_threadgroup;
    const device T* xr = x + row * D;
    float m = -INFINITY;
    for (uint i = lid; i < D; i += threads_per_threadgroup.x) m = max(m, float(xr[i]));
    m = simd_max(m);
    if (lane == 0) part[sg] = m;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    m = lane < nsg ? part[lane] : -INFINITY;
    m = simd_max(m);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float s = 0;
    for (uint i = lid; i < D; i += threads_per_threadgroup.x) s += metal::exp(float(xr[i]) - m);
    s = simd_sum(s);
    if (lane == 0) part[sg] = s;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    s = simd_sum(lane < nsg ? part[lane] : 0.0f);
    for (uint i = lid; i < D; i += threads_per_threadgroup.x) {
        T v = static_cast<T>(metal::exp(float(xr[i]) - m) / s);
        // conditional expressions with T and literals, as in mlx-lm's kernels
        y[row * D + i] = v > T(1e-3f) ? v : 0;
        T w = i % 2 ? v : T(0);
        if (i == 0) kl[row] = static_cast<T>(m + metal::log(s));  // logsumexp
        (void)w;
    }
""")


@pytest.mark.parametrize("dtype,rtol", [(mx.float32, 1e-6), (mx.float16, 2e-3), (mx.bfloat16, 1.6e-2)])
def test_softmax_half_bfloat_conditionals(dtype, rtol):
    rng = np.random.default_rng(3)
    rows, D = 3, 200
    x = mx.array(rng.standard_normal((rows, D)) * 3).astype(dtype)
    y, lse = run(SOFTMAX, [x], [(rows, D), (rows,)], [dtype, dtype], (96, rows, 1), (96, 1, 1),
                 template=[("T", dtype), ("D", D)])
    xf = np.array(x.astype(mx.float32)).astype(np.float64)
    p = np.exp(xf - xf.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    want = np.where(p > float(np.array(mx.array(1e-3).astype(dtype).astype(mx.float32))), p, 0)
    got = np.array(y.astype(mx.float32)).astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-7)
    lse_want = xf.max(1) + np.log(np.exp(xf - xf.max(1, keepdims=True)).sum(1))
    np.testing.assert_allclose(np.array(lse.astype(mx.float32)), lse_want, rtol=rtol)


def test_bfloat_conversions_must_be_explicit():
    """float -> bfloat needs a conversion, as with Metal's native bfloat."""
    k = metal_kernel(name="bf_implicit", input_names=["x"], output_names=["o"],
                     source="uint i = thread_position_in_grid.x; bfloat16_t b = x[i] * 2.0f; o[i] = b;")
    with pytest.raises(emu_kernel.compiler.KernelCompileError, match="bfloat16_t"):
        run(k, [mx.ones((4,))], [(4,)], [mx.bfloat16], (4, 1, 1), (4, 1, 1))


# ---- templates, atomics with init_value, strided inputs ------------------------------

ATOMICS = metal_kernel(name="atomic_stats", input_names=["x"], output_names=["hist", "stats"],
                       atomic_outputs=True, source="""
    uint i = thread_position_in_grid.x;
    T v = x[i];
    int bin = clamp(int((float(v) + 4.0f) * (BINS / 8.0f)), 0, BINS - 1);
    atomic_fetch_add_explicit(&hist[bin], 1, memory_order_relaxed);
    if (WITH_MAX) atomic_fetch_max_explicit(&stats[0], int(float(v) * 16), memory_order_relaxed);
    atomic_fetch_min_explicit(&stats[1], int(float(v) * 16), memory_order_relaxed);
""")


def test_atomics_with_init_value_and_int_bool_templates():
    rng = np.random.default_rng(4)
    x = (rng.integers(-64, 64, 3000) / 16).astype(np.float32)
    bins = 16
    hist, stats = run(ATOMICS, [mx.array(x)], [(bins,), (2,)], [mx.int32, mx.int32],
                      (x.size, 1, 1), (256, 1, 1), init_value=7,
                      template=[("T", mx.float32), ("BINS", bins), ("WITH_MAX", True)])
    b = np.clip(((x + 4) * (bins / 8)).astype(int), 0, bins - 1)
    assert np.array(hist).tolist() == (np.bincount(b, minlength=bins) + 7).tolist()
    assert np.array(stats).tolist() == [max(7, int(x.max() * 16)), min(7, int(x.min() * 16))]


STRIDED = metal_kernel(name="strided_raw", input_names=["inp"], output_names=["out", "meta"],
                       ensure_row_contiguous=False, source="""
    uint elem = thread_position_in_grid.x;
    // int64_t: with a uint index, negative strides wrap (on the GPU too)
    out[elem] = inp[elem_to_loc(int64_t(elem), inp_shape, inp_strides, inp_ndim)];
    if (elem < uint(inp_ndim)) meta[elem] = int(inp_strides[elem]);
""")
CONTIG = metal_kernel(name="strided_raw", input_names=["inp"], output_names=["out", "meta"],
                      source=STRIDED.source)


def test_ensure_row_contiguous_false_passes_real_strides():
    """A kernel reading raw memory through its strides sees MLX's layout: transposed,
    broadcast (stride 0), reversed (negative stride) and sliced views, float32 and
    bfloat16; with ensure_row_contiguous=True the same arrays arrive row-contiguous."""
    for dtype in (mx.float32, mx.bfloat16):
        base = mx.arange(24, dtype=mx.float32).reshape(4, 6).astype(dtype)
        views = {
            "transposed": (base.T, [1, 6]),
            "broadcast": (mx.broadcast_to(base[0], (4, 6)), [0, 1]),
            "reversed": (base[::-1, :], [-6, 1]),
            "sliced": (base[1:, ::2], [6, 2]),
        }
        for name, (v, strides) in views.items():
            want = np.array(v.astype(mx.float32))
            for k, expect in ((STRIDED, strides), (CONTIG, [want.shape[1], 1])):
                out, meta = run(k, [v], [v.shape, (2,)], [dtype, mx.int32], (v.size, 1, 1),
                                (32, 1, 1), init_value=0)
                np.testing.assert_array_equal(np.array(out.astype(mx.float32)), want, err_msg=name)
                assert np.array(meta).tolist() == expect, name


TILED = metal_kernel(name="tiled_matmul", input_names=["a", "b"], output_names=["c"], source="""
    // Classic shared-memory tiled matmul (TS x TS tiles), bounds-checked edges.
    threadgroup float ta[TS][TS];
    threadgroup float tb[TS][TS];
    uint2 l = thread_position_in_threadgroup.xy;
    uint2 g = thread_position_in_grid.xy;  // (column, row)
    int M = a_shape[0], K = a_shape[1], N = b_shape[1];
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TS) {
        ta[l.y][l.x] = (int(g.y) < M && k0 + int(l.x) < K) ? a[g.y * K + k0 + l.x] : 0.0f;
        tb[l.y][l.x] = (k0 + int(l.y) < K && int(g.x) < N) ? b[(k0 + l.y) * N + g.x] : 0.0f;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (int k = 0; k < TS; ++k) acc = fma(ta[l.y][k], tb[k][l.x], acc);
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (int(g.y) < M && int(g.x) < N) c[g.y * N + g.x] = acc;
""")


def test_tiled_matmul_threadgroup_memory():
    rng = np.random.default_rng(5)
    a = rng.integers(-9, 10, (37, 29)).astype(np.float32)
    b = rng.integers(-9, 10, (29, 21)).astype(np.float32)
    ts = 8
    grid = (-(-21 // ts) * ts, -(-37 // ts) * ts, 1)
    (c,) = run(TILED, [mx.array(a), mx.array(b)], [(37, 21)], [mx.float32], grid, (ts, ts, 1),
               template=[("TS", ts)])
    np.testing.assert_array_equal(np.array(c), a @ b)  # small integers: exact


# ---- MLX's argument checks, derivatives and transformations --------------------------

def test_compile_options_validated_like_mlx():
    kw = dict(name="opts", input_names=["x"], output_names=["o"], source="o[0] = x[0];")
    for bad in ({"fast_math": True}, {"math_mode": "bogus"}):
        with pytest.raises(ValueError) as ours:
            metal_kernel(**kw, compile_options=bad)
        with pytest.raises(ValueError) as theirs:
            mx.fast.metal_kernel(**kw, compile_options=bad)
        assert str(ours.value) == str(theirs.value)
    emu_kernel._warn_math_mode.cache_clear()
    for mode in ("fast", "relaxed"):
        with pytest.warns(RuntimeWarning, match=f"math_mode='{mode}'.*'safe'"):
            metal_kernel(**kw, compile_options={"math_mode": mode})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning per mode per process
        metal_kernel(**kw, compile_options={"math_mode": "fast"})
        metal_kernel(**kw, compile_options={"math_mode": "safe"})


DOUBLE = metal_kernel(name="double_it", input_names=["x"], output_names=["o"],
                      source="uint i = thread_position_in_grid.x; o[i] = 2.0f * x[i];")


def _double(x):
    return run(DOUBLE, [x], [x.shape], [x.dtype], (x.size, 1, 1), (32, 1, 1))[0]


def test_derivatives_and_transformations(tmp_path):
    x = mx.array([1.0, -2.0, 3.5])
    with pytest.raises(ValueError, match=r"\[Primitive::vjp\] Not implemented for CustomKernel"):
        mx.grad(lambda t: _double(t).sum())(x)
    with pytest.raises(ValueError, match=r"\[Primitive::jvp\] Not implemented for CustomKernel"):
        mx.jvp(_double, [x], [mx.ones_like(x)])

    @mx.custom_function
    def doubled(t):
        return _double(t)

    @doubled.vjp
    def doubled_vjp(primals, cotangent, output):
        return 2 * cotangent

    g = mx.grad(lambda t: (doubled(t) * t).sum())(x)  # d/dt (2t * t) = 4t
    assert np.array(g).tolist() == [4.0, -8.0, 14.0]
    export = lambda t: mx.export_function(str(tmp_path / "f.mlxfn"), _double, t)  # noqa: E731
    for transform in (mx.compile(_double), mx.vmap(_double), export):
        with pytest.raises(ValueError, match=r"'double_it' cannot be traced by function transformations \(mx.compile, mx.vmap"):
            transform(x)


# ---- checked mode: stray accesses and divergent barriers never crash -------------------

COPY = metal_kernel(name="oob_copy", input_names=["x"], output_names=["o"], checked=True,
                    source="uint i = thread_position_in_grid.x; o[i] = x[i % 64];")
READ = metal_kernel(name="oob_read", input_names=["x"], output_names=["o"], checked=True,
                    source="uint i = thread_position_in_grid.x; o[i % 64] = x[i];")
EARLY = """
    threadgroup float buf[64];
    uint l = thread_position_in_threadgroup.x;
    if (SKIP && l >= 48) return;
    buf[l] = x[l];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (l < 48) o[l] = buf[63 - l] + (SKIP ? 0.0f : 0.0f);
"""
DIVERGE = """
    threadgroup float buf[64];
    uint l = thread_position_in_threadgroup.x;
    buf[l] = x[l];
    if (l < 16) {
        threadgroup_barrier(mem_flags::mem_threadgroup);
    } else {
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    o[l] = buf[63 - l];
"""
TG_OVERRUN = metal_kernel(name="tg_overrun", input_names=["x"], output_names=["o"], checked=True,
                          source="""
    threadgroup float buf[64];
    uint l = thread_position_in_threadgroup.x;
    buf[(l + 64) % 65] = x[l];  // thread 0 writes buf[64]
    threadgroup_barrier(mem_flags::mem_threadgroup);
    o[l] = buf[l];
""")
BIG_LOCALS = metal_kernel(name="big_locals", input_names=["x"], output_names=["o"], checked=True,
                          source="""
    uint l = thread_position_in_threadgroup.x;
    volatile float big[100000];  // 400 kB: more than a thread's stack here
    for (int i = 0; i < 100000; i += 1000) big[i] = x[l];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    o[l] = big[l * 1000];
""")
DIVZERO = metal_kernel(name="int_div", input_names=["x"], output_names=["o"], checked=True,
                       source="uint i = thread_position_in_grid.x; o[i] = 100 / x[i];")


def test_out_of_bounds_writes_and_reads_raise():
    x = mx.arange(64, dtype=mx.float32)
    for grid, index in ((64 + 64, 64), (6400, 64)):
        with pytest.raises(RuntimeError, match=rf"'oob_copy'.*out-of-bounds write of output 'o' at "
                                               rf"element {index} \(valid: 0\.\.63\) by thread \({index},0,0\)"):
            run(COPY, [x], [(64,)], [mx.float32], (grid, 1, 1), (64, 1, 1))
    with pytest.raises(RuntimeError, match=r"out-of-bounds read of input 'x' at element 64 .*thread \(64,0,0\)"):
        run(READ, [x], [(64,)], [mx.float32], (65, 1, 1), (64, 1, 1))
    # 3 floats: element 3 lies in the alignment slack, found by its canary
    with pytest.raises(RuntimeError, match=r"write of output 'o' at byte 12 \(element 3; valid: 0\.\.2\)"):
        run(COPY, [x], [(3,)], [mx.float32], (4, 1, 1), (4, 1, 1))
    with pytest.raises(RuntimeError, match=r"'int_div': integer division by zero .*thread \(2,0,0\)"):
        run(DIVZERO, [mx.array([1, 5, 0, 4])], [(4,)], [mx.int32], (4, 1, 1), (4, 1, 1))
    # a thread's local array larger than its (fiber) stack
    with pytest.raises(RuntimeError, match=r"'big_locals': invalid memory write .*not inside any kernel "
                                           r"buffer.*by thread \(0,0,0\)"):
        run(BIG_LOCALS, [x], [(64,)], [mx.float32], (64, 1, 1), (64, 1, 1))
    # past the end of a threadgroup array
    with pytest.raises(RuntimeError, match=r"'tg_overrun': out-of-bounds write of threadgroup array "
                                           r"'buf' at element 64 \(valid: 0\.\.63\) by thread \(0,0,0\)"):
        run(TG_OVERRUN, [x], [(64,)], [mx.float32], (64, 1, 1), (64, 1, 1))
    # the process carries on: the same kernel still runs in bounds
    (o,) = run(COPY, [x], [(64,)], [mx.float32], (64, 1, 1), (64, 1, 1))
    assert np.array(o).tolist() == np.arange(64).tolist()


def test_divergent_barriers_raise_in_checked_mode():
    x = mx.arange(64, dtype=mx.float32)
    diverge = metal_kernel(name="diverge", input_names=["x"], output_names=["o"], source=DIVERGE,
                           checked=True)
    with pytest.raises(RuntimeError, match=r"divergent threadgroup_barrier .* thread \(0,0,0\) waits at "
                                           r"the barrier on line \d+ of the generated source .* thread "
                                           r"\(16,0,0\) waits at another barrier"):
        run(diverge, [x], [(64,)], [mx.float32], (64, 1, 1), (64, 1, 1))
    for checked in (True, False):
        early = metal_kernel(name="early", input_names=["x"], output_names=["o"], source=EARLY,
                             checked=checked)
        if checked:
            with pytest.raises(RuntimeError, match=r"thread \(48,0,0\) has returned without reaching it"):
                run(early, [x], [(48,)], [mx.float32], (64, 1, 1), (64, 1, 1), template=[("SKIP", True)])
        (o,) = run(early, [x], [(48,)], [mx.float32], (64, 1, 1), (64, 1, 1), template=[("SKIP", False)])
        assert np.array(o).tolist() == list(range(63, 15, -1))


def test_library_cache_key_covers_the_headers(tmp_path, monkeypatch):
    """A library built against other shim headers (another version of the package)
    is never reused: the cache key hashes the include directories' files."""
    import ctypes

    from mlx_precise.emulator import compiler

    monkeypatch.setenv("MLX_PRECISE_CACHE", str(tmp_path / "cache"))
    inc = tmp_path / "inc"
    inc.mkdir()
    src = '#include "v.h"\nextern "C" int version() { return V; }\n'
    got = []
    for v in (1, 2):
        (inc / "v.h").write_text(f"#define V {v}\n")
        lib = compiler.build(src, "cache_key", [inc])
        got.append((lib, ctypes.CDLL(str(lib)).version()))
    assert got[0][0] != got[1][0] and [g[1] for g in got] == [1, 2]
