"""tables_source() computes the constants of metal/include/dw_math.h at 400 bits
in a local mpmath context: the caller's mpmath precision is left as it was, and the
block is the header's (committed text) at any caller precision. One call: it takes
about 3.5 s."""

import mpmath

from mlx_precise.core.kernels import METAL_DIR
from mlx_precise.doubleword import functions as dwmath


def test_tables_source_is_the_header_block_at_any_caller_precision():
    saved = mpmath.mp.prec
    try:
        mpmath.mp.prec = 77
        text = dwmath.tables_source()
        assert mpmath.mp.prec == 77
    finally:
        mpmath.mp.prec = saved
    assert text in (METAL_DIR / "include" / "dw_math.h").read_text()
