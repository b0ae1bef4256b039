"""The emulator generates exactly the kernel source the installed MLX generates.

MLX prints its generated source with ``verbose=True``; on a build without Metal the
kernel can still be traced by ``mx.export_function``, which is how MLX's own text is
obtained here. The emulator's text (:meth:`MetalKernel.generate`) must be identical.
"""

import os
import sys
import tempfile

import mlx.core as mx
import pytest

from mlx_precise.emulator import metal_kernel

FENCE = "```\n"


def mlx_generated_source(kernel_kwargs, call_kwargs, inputs):
    """The text MLX itself prints for this kernel and these inputs."""
    k = mx.fast.metal_kernel(**kernel_kwargs)

    def f(*xs):
        return k(inputs=list(xs), verbose=True, **call_kwargs)

    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryDirectory() as d, tempfile.TemporaryFile("w+b") as tmp:
        os.dup2(tmp.fileno(), 1)
        try:
            mx.export_function(os.path.join(d, "k.mlxfn"), f, *inputs)
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        tmp.seek(0)
        printed = tmp.read().decode()
    start = printed.index(FENCE) + len(FENCE)
    end = printed.rindex("\n" + FENCE)
    return printed[start:end]


CASES = {
    # MLX's documented example: templates and elem_to_loc with shape/strides/ndim.
    "doc_exp_strided": (
        dict(name="myexp_strided", input_names=["inp"], output_names=["out"],
             source="""
        uint elem = thread_position_in_grid.x;
        uint loc = elem_to_loc(elem, inp_shape, inp_strides, inp_ndim);
        T tmp = inp[loc];
        out[elem] = metal::exp(tmp);
             """, ensure_row_contiguous=False),
        dict(template=[("T", mx.float32)], grid=(16, 1, 1), threadgroup=(16, 1, 1),
             output_shapes=[(4, 4)], output_dtypes=[mx.float32]),
        [mx.zeros((4, 4))],
    ),
    # device, constant (< 8 elements) and 0-d inputs, int/bool/dtype templates.
    "input_kinds_templates": (
        dict(name="kinds", input_names=["big", "small", "scalar"], output_names=["o"],
             header="#define TWO 2\n",
             source="uint i = thread_index_in_threadgroup; o[i] = big[i] * small[0] + scalar + N + B;"),
        dict(template=[("T", mx.float16), ("N", 7), ("B", True), ("C", False)],
             grid=(32, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(32,)],
             output_dtypes=[mx.float16]),
        [mx.zeros((32,), mx.float16), mx.zeros((3,), mx.int32), mx.array(1.5)],
    ),
    # Every attribute MLX knows and many dtypes.
    "all_attributes": (
        dict(name="attrs", input_names=["a", "b"], output_names=["o", "p"],
             source="""// dispatch_quadgroups_per_threadgroup dispatch_simdgroups_per_threadgroup
             // dispatch_threads_per_threadgroup grid_origin grid_size
             // quadgroup_index_in_threadgroup quadgroups_per_threadgroup
             // simdgroup_index_in_threadgroup simdgroups_per_threadgroup
             // thread_execution_width thread_index_in_quadgroup thread_index_in_simdgroup
             // thread_index_in_threadgroup thread_position_in_grid
             // thread_position_in_threadgroup threadgroup_position_in_grid
             // threadgroups_per_grid threads_per_grid threads_per_simdgroup
             // threads_per_threadgroup b_ndim a_strides
             """),
        dict(grid=(8, 2, 2), threadgroup=(4, 2, 1), output_shapes=[(4,), (2, 2)],
             output_dtypes=[mx.uint8, mx.complex64]),
        [mx.zeros((2, 8), mx.bfloat16), mx.zeros((9,), mx.int64)],
    ),
    # Atomic outputs.
    "atomic_histogram": (
        dict(name="hist", input_names=["x"], output_names=["h"], atomic_outputs=True,
             source="""uint i = thread_position_in_grid.x;
             atomic_fetch_add_explicit(&h[x[i]], 1, memory_order_relaxed);"""),
        dict(grid=(64, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(8,)],
             output_dtypes=[mx.int32], init_value=0),
        [mx.zeros((64,), mx.uint32)],
    ),
    # Shape parameters and no attribute: MLX writes a malformed signature; the
    # emulator reproduces it (and so fails to compile just as Metal would).
    "malformed_no_attribute": (
        dict(name="noattr", input_names=["a"], output_names=["o1", "o2"],
             source="o1[0] = a[0] + a_shape[0]; o2[0] = 0;"),
        dict(grid=(1, 1, 1), threadgroup=(1, 1, 1), output_shapes=[(1,), (1,)],
             output_dtypes=[mx.float32, mx.float32]),
        [mx.zeros((16,))],
    ),
    "int_types_uint_template": (
        dict(name="ints", input_names=["a", "b", "c"], output_names=["o"],
             source="uint i = thread_position_in_grid.x; o[i] = a[i] + b[0] + c[0];"),
        dict(template=[("T", mx.uint16), ("K", -3)], grid=(8, 1, 1), threadgroup=(8, 1, 1),
             output_shapes=[(8,)], output_dtypes=[mx.int16]),
        [mx.zeros((8,), mx.int8), mx.zeros((1,), mx.uint64), mx.zeros((2,), mx.bool_)],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_generated_source_matches_mlx(case):
    kernel_kwargs, call_kwargs, inputs = CASES[case]
    expected = mlx_generated_source(kernel_kwargs, call_kwargs, inputs)
    assert "[[kernel]] void custom_kernel_" in expected
    ours = metal_kernel(**kernel_kwargs)
    _, _, text = ours.generate(inputs, call_kwargs["output_dtypes"], call_kwargs.get("template"))
    assert text.rstrip("\n") == expected.rstrip("\n")
