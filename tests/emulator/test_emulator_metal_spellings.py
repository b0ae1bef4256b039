"""Metal spellings C++ lacks, in the emulator: half and bfloat literals (``1.5h``,
``2H``, ``0x1p-3h``, ``0.5bf``) compile with Metal's meaning, and Metal 4 tensor code
is refused in one line with a named exception."""

import mlx.core as mx
import numpy as np
import pytest

from mlx_precise.emulator import Metal4TensorError, metal_kernel
from mlx_precise.emulator.signature import metal_literals


def test_literal_rewrite_touches_only_metal_half_and_bfloat_literals():
    text = ('x2h + 1.5h + 2H + 0x1p-3h + .5h + 1.e-2h + 6.1e4H + 0.5bf + 3BF + 0h\n'
            '0x1h + 0x1Ah + 1e5h2 + 017h + a.b2h + v.x + "3h" + \'h\' + 1.5f + 1.5 + 0x1p-3f')
    out = metal_literals(text, "H({})", "B({})")
    assert out.splitlines() == [
        "x2h + H(1.5) + H(2) + H(0x1p-3) + H(.5) + H(1.e-2) + H(6.1e4) + B(0.5) + B(3) + H(0)",
        # hex integers, malformed numbers, octal digits, members, strings, other suffixes
        '0x1h + 0x1Ah + 1e5h2 + 017h + a.b2h + v.x + "3h" + \'h\' + 1.5f + 1.5 + 0x1p-3f',
    ]


def test_half_and_bfloat_literals_run_with_metal_values():
    src = """
        uint i = thread_position_in_grid.x;
        half a = 1.5h; half b = 2H; half c = 0x1p-3h; half x2h = 0.1h;  // x2h: a name
        half big = 65519.0h;  // rounds to 65504 in half (once, from the literal)
        bfloat16_t d = 0.1bf;
        y[i] = float(a) + float(b) * x[i] + float(c) + float(x2h) + float(d) + float(big);
    """
    k = metal_kernel(name="literals", input_names=["x"], output_names=["y"], source=src)
    x = mx.arange(8, dtype=mx.float32)
    (y,) = k(inputs=[x], grid=(8, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(8,)],
             output_dtypes=[mx.float32])
    bf01 = np.frombuffer(np.float32(0.1).tobytes(), np.uint32)[0]
    bf01 = np.frombuffer(np.uint32(((bf01 + 0x7FFF + ((bf01 >> 16) & 1)) >> 16) << 16).tobytes(),
                         np.float32)[0]  # 0.1 rounded to bfloat (nearest even)
    terms = [np.float32(1.5), np.float32(2) * np.arange(8, dtype=np.float32), np.float32(0.125),
             np.float32(np.float16(0.1)), np.float32(bf01), np.float32(np.float16(65519.0))]
    want = terms[0] + terms[1]
    for t in terms[2:]:
        want = want + t
    np.testing.assert_array_equal(np.array(y), want)
    assert np.float16(65519.0) == 65504.0


def test_metal4_tensor_code_is_refused_in_one_line():
    header = "#include <metal_stdlib>\n#include <metal_tensor>\nusing namespace metal;\n"
    k = metal_kernel(name="m5_only", input_names=["x"], output_names=["y"], header=header,
                     source="uint i = thread_position_in_grid.x; y[i] = x[i];")
    with pytest.raises(Metal4TensorError) as e:
        k(inputs=[mx.ones((8,))], grid=(8, 1, 1), threadgroup=(8, 1, 1),
          output_shapes=[(8,)], output_dtypes=[mx.float32])
    msg = str(e.value)
    assert "\n" not in msg and "m5_only" in msg and "#include <metal_tensor>" in msg
    assert "not emulate" in msg and isinstance(e.value, NotImplementedError)
    # mpp::tensor_ops without the include (a header that pulls it in elsewhere), but
    # not in a comment
    k2 = metal_kernel(name="m5_ops", input_names=["x"], output_names=["y"],
                      source="uint i = thread_position_in_grid.x; // mpp::tensor_ops\n"
                             "using namespace mpp::tensor_ops; y[i] = x[i];")
    with pytest.raises(Metal4TensorError, match=r"m5_ops.*\(mpp::tensor_ops\)"):
        k2(inputs=[mx.ones((8,))], grid=(8, 1, 1), threadgroup=(8, 1, 1),
           output_shapes=[(8,)], output_dtypes=[mx.float32])
