"""mx.export_function, mx.compile and mx.vmap over an emulated kernel raise a named
error (TransformNotEmulatedError, a ValueError) that names the kernel and says why."""

import mlx.core as mx
import pytest

from mlx_precise.emulator import TransformNotEmulatedError, metal_kernel

TWICE = metal_kernel(name="twice_traced", input_names=["x"], output_names=["y"],
                     source="uint i = thread_position_in_grid.x; y[i] = 2.0f * x[i];")


def twice(x):
    return TWICE(inputs=[x], grid=(8, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(8,)],
                 output_dtypes=[mx.float32])[0]


def test_export_of_an_emulated_kernel_raises_a_named_error(tmp_path):
    path = tmp_path / "twice.mlxfn"
    with pytest.raises(TransformNotEmulatedError) as e:
        mx.export_function(str(path), twice, mx.ones((8,)))
    assert isinstance(e.value, ValueError)
    msg = str(e.value)
    assert "'twice_traced'" in msg and "mx.export_function" in msg and "eagerly" in msg
    for transform in (mx.compile(twice), mx.vmap(twice)):
        with pytest.raises(TransformNotEmulatedError, match="cannot be traced"):
            transform(mx.ones((8,)))
