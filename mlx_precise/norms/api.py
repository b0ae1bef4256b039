"""The public norm: :func:`norm`, LAPACK semantics over the tile engine
(:mod:`.engine`) or, with ``group`` / ``layout``, over a distributed matrix
(:mod:`.distributed`)."""

from __future__ import annotations

import mlx.core as mx

from ..core import backends
from ..core.streams import streamed
from ..core.autodiff import guarded, host_guard
from .distributed import distributed_norm
from .engine import _local_norm, as_matrix, check_tile, is_complex, make_spec


@host_guard
@streamed
def norm(A, kind: str = "fro", *, structure: str = "general", uplo: str = "lower",
         diag: str = "nonunit", tile: int | None = None, group=None, layout=None,
         backend: str | None = None, stream=None) -> mx.array:
    """Matrix norm with LAPACK semantics (xLANGE / xLANTR / xLANSY / xLANHE).

    Args:
        A: ``(m, n)`` matrix: an ``mx.array`` of dtype float32 or complex64 (Metal
            kernels on backend ``metal``/``emulate``) or float64, or a numpy array of
            dtype float32, complex64, float64 or complex128. float64/complex128 data
            always takes the float64 cpu path. With ``group``, ``A`` is this
            process's local block (see :mod:`mlx_precise.norms.distributed`).
        kind: ``"max"`` (max |a_ij|), ``"one"`` (max column sum), ``"inf"`` (max row
            sum) or ``"fro"`` (Frobenius); LAPACK's letters M, 1/O, I, F/E also work.
        structure: ``"general"``, ``"trapezoid"`` (``uplo``, ``diag``: LAPACK reads
            rows ``0..min(m, j+1)-1`` of column j for upper, ``j..m-1`` for lower),
            ``"symmetric"`` or ``"hermitian"`` (square; only the ``uplo`` triangle is
            read; Hermitian ignores the imaginary part of the diagonal).
        uplo: ``"lower"`` or ``"upper"``; ignored for ``"general"``.
        diag: ``"nonunit"`` or ``"unit"`` (trapezoid only: the diagonal is not read
            and counts as 1).
        tile: tile size ``nb`` (tiles are ``nb x nb``; default 64).
        group, layout: an ``mx.distributed`` group and the
            :class:`~mlx_precise.norms.distributed.Layout` of ``A`` over it.
        backend: ``"metal"``, ``"emulate"``, ``"cpu"`` or None (the active one).
        stream: MLX stream or device (``mx.Stream``, ``mx.Device``) the op's MLX
            ops and kernel launches run on; None: the default stream.

    Returns:
        0-d ``mx.array``: float32 for float32/complex64 input, float64 otherwise.
        0 for an empty matrix; NaN if an entry read is NaN, else Inf if one is Inf
        (for max/one/inf a complex entry's modulus follows C99 ``hypot``: Inf if a
        part is Inf; the Frobenius norm sums the squares of the parts, as zLASSQ,
        so a NaN part gives NaN). On ``metal``/``emulate``, float32 subnormal
        entries (|x| < 2^-126) count as zero; the cpu path counts them exactly.

    Raises:
        TypeError: ``A`` is not an array or has another dtype (e.g. an integer).
        ValueError: ``A`` not 2-D; unknown ``kind``, ``structure``, ``uplo`` or
            ``diag``; ``diag="unit"`` without ``structure="trapezoid"``; a
            non-square symmetric/Hermitian matrix; a bad ``tile``; ``layout``
            inconsistent with ``A`` or ``group``; a block of 2^31 or more float32
            values for the kernels.
        BackendUnavailableError: the backend asked for cannot run here.
        NotDifferentiableError: under ``mx.grad`` (norms have no VJP here).
    """
    A, kernel_ok = as_matrix(A)
    spec = make_spec(kind, structure, uplo, diag, is_complex(A))
    nb = check_tile(tile)
    name = backends.resolve(backend)
    if group is not None or layout is not None:
        return distributed_norm(A, spec, nb, name, kernel_ok, group, layout)
    if isinstance(A, mx.array):
        # no VJP: mx.grad raises NotDifferentiableError instead of returning zeros
        return guarded(lambda a: _local_norm(a, spec, nb, name, kernel_ok), [A], "norm",
                       "its VJP is not implemented")
    return _local_norm(A, spec, nb, name, kernel_ok)
