"""What a kernel's source is as MLX gets it (mlx_precise.core.kernels): the Metal
files without comments and indentation, line for line (MLX copies the whole source
into every launch and hashes it at every evaluation), and a prelude that takes the
body's first line."""

from __future__ import annotations

import pytest

from mlx_precise.core import kernels
from mlx_precise.core.kernels import Kernel
from mlx_precise.doubleword import fusion


def test_comments_and_indentation_are_dropped_line_for_line(tmp_path):
    text = ('// a comment line\n'
            '    float x = a / b;  // why\n'
            'static_assert(N > 0, "a // in a string stays"); // gone\n'
            '#define TWO \\\n'
            '    2\n')
    path = tmp_path / "k.metal"
    path.write_text(text)
    got = kernels._read(path)
    assert got == ('\n'
                   'float x = a / b;\n'
                   'static_assert(N > 0, "a // in a string stays");\n'
                   '#define TWO \\\n'
                   '2\n')
    assert got.count("\n") == text.count("\n")  # diagnostics' line numbers hold


def test_a_prelude_takes_the_first_line_of_the_body():
    """dw_fused4's slots: a0 .. a3 declared on line 1 (a comment in the file), the
    other slots repeating a0; the body's other lines as they are."""
    src = fusion.DW_FUSED4.source()
    first, _, rest = src.partition("\n")
    assert first == ("const dwf_slots s = {{a0, a1, a2, a3" + ", a0" * 8 + "}, {a0_strides, "
                     "a1_strides, a2_strides, a3_strides" + ", a0_strides" * 8 + "}};")
    assert rest == fusion.DW_FUSED.source().partition("\n")[2]
    assert "a4" not in src and "a11" in fusion.DW_FUSED.source()


def test_a_prelude_needs_a_comment_line_to_take(tmp_path):
    path = tmp_path / "k.metal"
    path.write_text("y[0] = x[0];\n")
    k = Kernel(name="k", body=str(path), inputs=("x",), outputs=("y",), extended=False,
               prelude="const int n = 1;")
    with pytest.raises(ValueError, match="must be a comment"):
        k.source()


def test_kernels_without_functions_leave_dw_math_out():
    """The program kernels without MATH do not carry dw_math.h (most of the source
    of those with it)."""
    for k in fusion.PROGRAM_KERNELS.values():
        math_ = k.variants["MATH"] == (True,)
        assert ("dwm_apply" in k.header()) == math_, k.name
        if not math_:
            assert len(k.header()) + len(k.source()) < 10_000, k.name
