"""tables_source() computes the constants of metal/include/dw_math.h at 400 bits
in a local mpmath context: the caller's mpmath precision is left as it was."""

import mpmath

from mlx_precise.doubleword import functions as dwmath


def test_tables_source_leaves_mpmath_precision_unchanged():
    saved = mpmath.mp.prec
    try:
        mpmath.mp.prec = 77
        text = dwmath.tables_source()
        assert mpmath.mp.prec == 77
        mpmath.mp.prec = 53
        assert dwmath.tables_source() == text  # the same block at any caller precision
        assert mpmath.mp.prec == 53
    finally:
        mpmath.mp.prec = saved
