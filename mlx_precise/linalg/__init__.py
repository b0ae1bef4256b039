"""Double-word linear algebra: the matrix product engine (:mod:`.gemm`).

:func:`matmul` multiplies :class:`~mlx_precise.DoubleWord` matrices with MLX's
``matmul`` / ``addmm`` semantics (batched, broadcasting, real and complex) in
double-word arithmetic: a tiled Metal kernel with exact FMA products and Dot2-style
compensated accumulation on ``metal`` / ``emulate``, float64 on ``cpu``
(docs/dwgemm.md). Inside ``extended_precision()`` MLX's ``@``, ``mx.matmul`` and
``mx.addmm`` use it.
"""

from .gemm import MatmulShapeError, matmul

__all__ = ["MatmulShapeError", "matmul"]
