"""The Metal emulator runs MLX custom kernels with Metal's semantics.

Oracles are numpy computations of what each kernel must produce; every check is an
assertion on numbers.
"""

import os
import subprocess
import sys
import textwrap

import mlx.core as mx
import numpy as np
import pytest

from mlx_precise.emulator import KernelCompileError, metal_kernel


def run(kernel, inputs, out_shapes, out_dtypes, grid, tg, **kw):
    return kernel(inputs=inputs, grid=grid, threadgroup=tg, output_shapes=out_shapes,
                  output_dtypes=out_dtypes, **kw)


def test_mlx_doc_exp_contiguous_with_templates():
    """MLX's documented elementwise exp, float32 and float16, templated on T."""
    k = metal_kernel(name="myexp", input_names=["inp"], output_names=["out"], source="""
        uint elem = thread_position_in_grid.x;
        T tmp = inp[elem];
        out[elem] = metal::exp(tmp);
    """)
    x = np.linspace(-3, 3, 1000, dtype=np.float32).reshape(10, 100)
    (y,) = run(k, [mx.array(x)], [x.shape], [mx.float32], (x.size, 1, 1), (256, 1, 1),
               template=[("T", mx.float32)])
    np.testing.assert_allclose(np.array(y), np.exp(x.astype(np.float64)), rtol=2e-7)
    xh = mx.array(x).astype(mx.float16)
    (yh,) = run(k, [xh], [x.shape], [mx.float16], (x.size, 1, 1), (256, 1, 1),
                template=[("T", mx.float16)])
    ref = np.exp(np.array(xh).astype(np.float64))
    np.testing.assert_allclose(np.array(yh).astype(np.float64), ref, rtol=2e-3)


def test_mlx_doc_exp_strided_elem_to_loc():
    """The strided variant indexes through shape/strides/ndim and elem_to_loc."""
    k = metal_kernel(name="myexp_strided", input_names=["inp"], output_names=["out"],
                     ensure_row_contiguous=False, source="""
        uint elem = thread_position_in_grid.x;
        uint loc = elem_to_loc(elem, inp_shape, inp_strides, inp_ndim);
        T tmp = inp[loc];
        out[elem] = metal::exp(tmp);
    """)
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 10
    a = mx.array(x).transpose(2, 0, 1)
    (y,) = run(k, [a], [a.shape], [mx.float32], (a.size, 1, 1), (32, 1, 1),
               template=[("T", mx.float32)])
    np.testing.assert_allclose(np.array(y), np.exp(x.transpose(2, 0, 1)), rtol=2e-7)


def test_threadgroup_tree_reduction_with_barriers():
    """Shared memory + barriers: per-group sums of integers (exact), odd grid size."""
    k = metal_kernel(name="tg_reduce", input_names=["x"], output_names=["sums"], source="""
        threadgroup int buf[256];
        uint lid = thread_position_in_threadgroup.x;
        uint gid = thread_position_in_grid.x;
        uint n = threads_per_threadgroup.x;
        buf[lid] = gid < x_shape[0] ? x[gid] : 0;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint s = 128; s > 0; s >>= 1) {
            if (lid < s && lid + s < n) buf[lid] += buf[lid + s];
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }
        if (lid == 0) sums[threadgroup_position_in_grid.x] = buf[0];
    """)
    rng = np.random.default_rng(0)
    x = rng.integers(-1000, 1000, size=1000).astype(np.int32)
    groups = -(-x.size // 256)
    (s,) = run(k, [mx.array(x)], [(groups,)], [mx.int32], (x.size, 1, 1), (256, 1, 1))
    expected = [x[i * 256:(i + 1) * 256].sum() for i in range(groups)]
    assert np.array(s).tolist() == expected


def test_simd_sum_reduction_and_shuffles():
    """simd_sum / prefix sums / shuffles over simdgroups of 32, partial last group."""
    k = metal_kernel(name="simd_ops", input_names=["x"], output_names=["o"], source="""
        uint i = thread_position_in_grid.x;
        uint lane = thread_index_in_simdgroup;
        int v = x[i];
        o[i * 6 + 0] = simd_sum(v);
        o[i * 6 + 1] = simd_prefix_exclusive_sum(v);
        o[i * 6 + 2] = simd_shuffle_down(v, 3);
        o[i * 6 + 3] = simd_shuffle_xor(v, 5);
        o[i * 6 + 4] = simd_max(v);
        o[i * 6 + 5] = simd_broadcast(v, 0) + int(simdgroup_index_in_threadgroup) * 0 + int(lane) * 0;
    """)
    n = 80  # groups of 64: simdgroups of 32, 32 | 16 (the last one partial)
    x = np.random.default_rng(1).integers(-50, 50, size=n).astype(np.int32)
    (o,) = run(k, [mx.array(x)], [(n * 6,)], [mx.int32], (n, 1, 1), (64, 1, 1))
    o = np.array(o).reshape(n, 6)
    for start in range(0, n, 32):
        g = x[start:start + 32]
        m = len(g)
        lanes = np.arange(m)
        assert (o[start:start + m, 0] == g.sum()).all()
        assert (o[start:start + m, 1] == np.concatenate([[0], np.cumsum(g)[:-1]])).all()
        down = np.where(lanes + 3 < m, g[np.minimum(lanes + 3, m - 1)], g)
        assert (o[start:start + m, 2] == down).all()
        xor = np.where((lanes ^ 5) < m, g[np.minimum(lanes ^ 5, m - 1)], g)
        assert (o[start:start + m, 3] == xor).all()
        assert (o[start:start + m, 4] == g.max()).all()
        assert (o[start:start + m, 5] == g[0]).all()


def test_simd_sum_float_two_level_reduction():
    """A float sum: simd_sum per simdgroup, then threadgroup memory and a barrier."""
    k = metal_kernel(name="simd_float_sum", input_names=["x"], output_names=["o"], source="""
        threadgroup float partial[32];
        uint gid = thread_position_in_grid.x;
        float v = gid < x_shape[0] ? x[gid] : 0.0f;
        v = simd_sum(v);
        if (thread_index_in_simdgroup == 0) partial[simdgroup_index_in_threadgroup] = v;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (simdgroup_index_in_threadgroup == 0) {
            float p = thread_index_in_simdgroup < simdgroups_per_threadgroup
                ? partial[thread_index_in_simdgroup] : 0.0f;
            p = simd_sum(p);
            if (thread_index_in_simdgroup == 0) o[threadgroup_position_in_grid.x] = p;
        }
    """)
    # Small integers in float: every order of summation is exact.
    x = np.random.default_rng(2).integers(-100, 100, size=1024).astype(np.float32)
    (o,) = run(k, [mx.array(x)], [(4,)], [mx.float32], (1024, 1, 1), (256, 1, 1))
    assert np.array(o).tolist() == [x[i * 256:(i + 1) * 256].sum() for i in range(4)]


def test_atomic_histogram():
    k = metal_kernel(name="hist", input_names=["x"], output_names=["h"], atomic_outputs=True,
                     source="""
        uint i = thread_position_in_grid.x;
        atomic_fetch_add_explicit(&h[x[i]], 1, memory_order_relaxed);
    """)
    x = np.random.default_rng(3).integers(0, 16, size=5000).astype(np.uint32)
    (h,) = run(k, [mx.array(x)], [(16,)], [mx.int32], (x.size, 1, 1), (128, 1, 1),
               init_value=0)
    assert np.array(h).tolist() == np.bincount(x, minlength=16).tolist()


def test_grid_attributes_non_uniform_3d():
    """dispatchThreads semantics: edge threadgroups are cut to the grid."""
    k = metal_kernel(name="attrs3d", input_names=["x"], output_names=["o"], source="""
        uint3 p = thread_position_in_grid;
        uint idx = (p.z * threads_per_grid.y + p.y) * threads_per_grid.x + p.x;
        uint3 t = threads_per_threadgroup;
        uint3 g = threadgroup_position_in_grid;
        o[idx * 4 + 0] = thread_index_in_threadgroup;
        o[idx * 4 + 1] = t.x * 100 + t.y * 10 + t.z;
        o[idx * 4 + 2] = g.x * 100 + g.y * 10 + g.z;
        o[idx * 4 + 3] = x[0] + threadgroups_per_grid.x;
    """)
    grid, tg = (5, 3, 2), (4, 2, 2)
    (o,) = run(k, [mx.array([7], dtype=mx.uint32)], [(30 * 4,)], [mx.uint32], grid, tg)
    o = np.array(o).reshape(2, 3, 5, 4)
    for z in range(2):
        for y in range(3):
            for xx in range(5):
                g = (xx // 4, y // 2, z // 2)
                actual = tuple(min(tg[d], grid[d] - g[d] * tg[d]) for d in range(3))
                lx, ly, lz = xx - g[0] * 4, y - g[1] * 2, z - g[2] * 2
                lin = lx + ly * actual[0] + lz * actual[0] * actual[1]
                assert o[z, y, xx].tolist() == [
                    lin, actual[0] * 100 + actual[1] * 10 + actual[2],
                    g[0] * 100 + g[1] * 10 + g[2], 7 + 2]


def test_flush_to_zero_and_no_contraction():
    """Subnormal float32 inputs and results flush to zero in arithmetic (Apple GPU),
    stores keep bits; a*b+c is two roundings, fma one."""
    k = metal_kernel(name="numerics", input_names=["x"], output_names=["o"], source="""
        uint i = thread_position_in_grid.x;
        o[0] = x[0] * 2.0f;          // subnormal input -> 0
        o[1] = x[1] * x[2];          // normal * normal -> subnormal result -> 0
        o[2] = x[0];                 // plain copy keeps the subnormal bits
        o[3] = x[3] * x[4] + x[5];   // no contraction
        o[4] = metal::fma(x[3], x[4], x[5]);
        o[5] = float(i);
    """)
    sub = np.float32(1e-40)
    a = np.float32(1 + 2.0**-23)
    x = np.array([sub, 2.0**-70, 2.0**-70, a, a, -1.0], dtype=np.float32)
    (o,) = run(k, [mx.array(x)], [(6,)], [mx.float32], (1, 1, 1), (1, 1, 1))
    o = np.array(o)
    assert o[0] == 0 and o[1] == 0
    assert o[2] == sub and o[2].view(np.uint32) == sub.view(np.uint32)
    exact = np.float64(a) * np.float64(a) - 1  # 2^-22 + 2^-46, exact in float64
    assert o[3] == np.float32(np.float32(np.float64(a) * np.float64(a)) - 1)
    assert o[3] == np.float32(2.0**-22)
    assert o[4] == np.float32(exact)


def test_unwritten_output_is_poisoned_and_init_value():
    k = metal_kernel(name="partial_write", input_names=["x"], output_names=["o"],
                     source="uint i = thread_position_in_grid.x; if (i == 0) o[0] = x[0];")
    (o,) = run(k, [mx.array([3.0])], [(3,)], [mx.float32], (1, 1, 1), (1, 1, 1))
    o = np.array(o)
    assert o[0] == 3.0 and np.isnan(o[1:]).all()
    (o,) = run(k, [mx.array([3.0])], [(3,)], [mx.float32], (1, 1, 1), (1, 1, 1),
               init_value=-2.0)
    assert np.array(o).tolist() == [3.0, -2.0, -2.0]


def test_bfloat16_complex_bool_scalar_inputs():
    k = metal_kernel(name="types", input_names=["b", "c", "m", "s"], output_names=["o", "oc"],
                     source="""
        uint i = thread_position_in_grid.x;
        float v = float(b[i]) * s;
        o[i] = m[i] ? bfloat16_t(v) : bfloat16_t(-v);
        oc[i] = c[i] * c[i];
    """)
    b = mx.array([1.5, -2.0, 3.25, 1024.0]).astype(mx.bfloat16)
    c = mx.array(np.array([1 + 2j, 3 - 1j, -1j, 2], dtype=np.complex64))
    m = mx.array([True, False, True, False])
    (o, oc) = run(k, [b, c, m, mx.array(2.0)], [(4,), (4,)], [mx.bfloat16, mx.complex64],
                  (4, 1, 1), (4, 1, 1))
    assert o.dtype == mx.bfloat16
    assert np.array(o.astype(mx.float32)).tolist() == [3.0, 4.0, 6.5, -2048.0]
    cc = np.array([1 + 2j, 3 - 1j, -1j, 2], dtype=np.complex64)
    assert np.array(oc).tolist() == (cc * cc).tolist()


def test_bad_input_errors():
    k = metal_kernel(name="copy", input_names=["x"], output_names=["o"],
                     source="uint i = thread_position_in_grid.x; o[i] = x[i];")
    x = mx.zeros((4,))
    with pytest.raises(ValueError, match="Expected `inputs` to have size 1"):
        run(k, [x, x], [(4,)], [mx.float32], (4, 1, 1), (4, 1, 1))
    with pytest.raises(ValueError, match="maximum allowed threads per threadgroup"):
        run(k, [x], [(4,)], [mx.float32], (4, 1, 1), (64, 32, 1))
    with pytest.raises(TypeError, match="no float64"):
        run(k, [x.astype(mx.float64)], [(4,)], [mx.float32], (4, 1, 1), (4, 1, 1))
    with pytest.raises(ValueError, match="grid must be 3 positive ints"):
        run(k, [x], [(4,)], [mx.float32], (4, 0, 1), (4, 1, 1))
    with pytest.raises(ValueError, match="at least one output"):
        metal_kernel(name="none", input_names=["x"], output_names=[], source="")
    # compile_options: see test_emulator_dropin.py (validated as MLX validates them)


def test_compile_error_shows_numbered_source_and_message():
    k = metal_kernel(name="broken", input_names=["x"], output_names=["o"],
                     source="uint i = thread_position_in_grid.x;\no[i] = x[i] + undefined_thing;")
    with pytest.raises(KernelCompileError) as e:
        run(k, [mx.zeros((4,))], [(4,)], [mx.float32], (4, 1, 1), (4, 1, 1))
    msg = str(e.value)
    assert "kernel 'broken (custom_kernel_broken_floatc_float)' failed to compile" in msg
    assert "undefined_thing" in msg and "error" in msg
    assert " | o[i] = x[i] + undefined_thing;" in msg  # numbered source line


def test_concurrent_builds_share_one_cache(tmp_path):
    """Two processes building the same new kernel at once both succeed."""
    script = textwrap.dedent("""
        import mlx.core as mx, numpy as np
        from mlx_precise.emulator import metal_kernel
        k = metal_kernel(name="race", input_names=["x"], output_names=["o"],
                         source="uint i = thread_position_in_grid.x; o[i] = x[i] * 2.0f + 1.0f;")
        (o,) = k(inputs=[mx.arange(8, dtype=mx.float32)], grid=(8, 1, 1), threadgroup=(8, 1, 1),
                 output_shapes=[(8,)], output_dtypes=[mx.float32])
        assert np.array(o).tolist() == [2.0 * i + 1 for i in range(8)]
    """)
    env = dict(os.environ, MLX_PRECISE_CACHE=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env) for _ in range(2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    libs = list(tmp_path.glob("custom_kernel_race*.so"))
    assert len(libs) == 1
