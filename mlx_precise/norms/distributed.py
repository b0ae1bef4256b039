"""Norms of a matrix sharded across processes (``mx.distributed``).

Every process of the group holds one local block of a global ``M x N`` matrix laid
out as a :class:`Layout`: ScaLAPACK/SLATE's 2D block-cyclic distribution, of which
block rows (:func:`block_rows`) and block columns (:func:`block_cols`) are special
cases. ``norm(A_local, kind, ..., group=group, layout=layout)`` (see
:func:`mlx_precise.norms.norm`) is collective: every process calls it and every
process gets the same norm of the global matrix.

Each process reduces its tiles to one partial, with LAPACK's entry selection
decided on global indices; partials are exchanged with ``mx.distributed.all_gather``
(sums of double-word pairs are not associative under ``all_sum``, and ``all_max``
is not NaN-aware), then reduced by the same kernel that reduces tile partials:

* max: the local NaN-aware maxima;
* one / inf: per global column (row) double-word sums, added across processes;
* Frobenius: Blue's three accumulators (big, med, sml). Their scales are fixed
  constants, so adding them component-wise across processes is exact in meaning,
  and the final step sees every class: a process holding only tiny entries cannot
  lose them to one holding large ones, nor overflow (SLATE's cross-process
  reduction does not carry the scale).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from .engine import (
    FRO,
    MAX,
    AxisMap,
    Spec,
    check_global_shape,
    cpu_partial,
    finish_cpu_result,
    kernel_partial,
    out_dtype,
    reduce_partials,
)
from ..core.backends import Backend

__all__ = ["Layout", "block_rows", "block_cols", "block_cyclic", "numroc"]


def numroc(n: int, nb: int, p: int, nprocs: int) -> int:
    """Number of the ``n`` rows (or columns) that process ``p`` of ``nprocs`` owns
    in a block-cyclic distribution with blocks of ``nb``, starting on process 0
    (ScaLAPACK's NUMROC)."""
    nblocks = n // nb
    count = (nblocks // nprocs) * nb
    extra = nblocks % nprocs
    if p < extra:
        count += nb
    elif p == extra:
        count += n % nb
    return count


def _pos_int(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Layout:
    """2D block-cyclic layout of a global ``shape = (M, N)`` matrix.

    Global block ``(I, J)`` (``block = (mb, nb)`` entries) lives on process row
    ``I mod Pr`` and process column ``J mod Pc`` of a ``grid = (Pr, Pc)`` process
    grid; rank ``r`` is grid position ``(r // Pc, r % Pc)`` (row-major). Each
    process stores its blocks as one dense row-major local matrix, blocks in
    increasing global order (ScaLAPACK's local storage).

    Raises:
        ValueError: a size that is not an int, negative sizes, or blocks or grid
            dimensions below 1.
    """

    shape: tuple[int, int]
    block: tuple[int, int]
    grid: tuple[int, int] = (1, 1)

    def __post_init__(self):
        for name, val, low in (("shape", self.shape, 0), ("block", self.block, 1),
                               ("grid", self.grid, 1)):
            if not isinstance(val, (tuple, list)) or len(val) != 2:
                raise ValueError(f"layout {name} must be a pair of ints, got {val!r}")
            object.__setattr__(self, name, tuple(
                _pos_int(v, f"layout {name}[{i}]", low) for i, v in enumerate(val)))

    @property
    def size(self) -> int:
        """Number of processes of the grid."""
        return self.grid[0] * self.grid[1]

    def coords(self, rank: int) -> tuple[int, int]:
        if not 0 <= rank < self.size:
            raise ValueError(f"rank must be in [0, {self.size}), got {rank}")
        return divmod(rank, self.grid[1])

    def local_shape(self, rank: int) -> tuple[int, int]:
        """Shape of rank ``rank``'s local matrix."""
        pr, pc = self.coords(rank)
        return (numroc(self.shape[0], self.block[0], pr, self.grid[0]),
                numroc(self.shape[1], self.block[1], pc, self.grid[1]))

    def row_map(self, rank: int) -> AxisMap:
        """Local row -> global row of rank ``rank``."""
        pr, _ = self.coords(rank)
        mb = self.block[0]
        return AxisMap(pr * mb, mb, self.grid[0] * mb)

    def col_map(self, rank: int) -> AxisMap:
        """Local column -> global column of rank ``rank``."""
        _, pc = self.coords(rank)
        nb = self.block[1]
        return AxisMap(pc * nb, nb, self.grid[1] * nb)

    def local_block(self, A, rank: int):
        """Rank ``rank``'s local matrix cut out of the global matrix ``A``
        (``mx.array`` or numpy array of shape ``self.shape``)."""
        if tuple(A.shape) != self.shape:
            raise ValueError(f"A must have the layout's global shape {self.shape}, "
                             f"got {tuple(A.shape)}")
        m, n = self.local_shape(rank)
        rows = self.row_map(rank).indices(m)
        cols = self.col_map(rank).indices(n)
        if isinstance(A, mx.array):
            return mx.take(mx.take(A, mx.array(rows, mx.int32), axis=0),
                           mx.array(cols, mx.int32), axis=1)
        return np.ascontiguousarray(A[np.ix_(rows, cols)])


def block_rows(shape, nprocs: int) -> Layout:
    """Block rows: process ``p`` owns rows ``[p b, (p + 1) b)``, ``b = ceil(M / P)``
    (the last processes may own fewer or none), all columns."""
    m, n = shape
    p = _pos_int(nprocs, "nprocs", 1)
    return Layout((m, n), (max(1, -(-m // p)), max(1, n)), (p, 1))


def block_cols(shape, nprocs: int) -> Layout:
    """Block columns: process ``p`` owns columns ``[p b, (p + 1) b)``,
    ``b = ceil(N / P)``, all rows."""
    m, n = shape
    p = _pos_int(nprocs, "nprocs", 1)
    return Layout((m, n), (max(1, m), max(1, -(-n // p))), (1, p))


def block_cyclic(shape, block, grid) -> Layout:
    """2D block-cyclic layout (ScaLAPACK / SLATE): ``block = (mb, nb)``,
    ``grid = (Pr, Pc)``."""
    return Layout(tuple(shape), tuple(block), tuple(grid))


def _gather(x: mx.array, group) -> mx.array:
    return mx.distributed.all_gather(x.reshape(-1), group=group, stream=mx.cpu)


def combine(values: mx.array, kind: int, nprocs: int, dtype, backend: str,
            kernel: bool) -> mx.array:
    """The norm from the gathered partial values of ``nprocs`` processes
    (concatenated along axis 0, as ``all_gather`` returns them)."""
    if kernel:  # float32 records: the tile-partial reduction kernel
        flat = values.reshape(-1)
        if kind == MAX:  # one NaN-aware max over the processes' maxima
            return reduce_partials(flat, 1, nprocs, False, backend)[1]
        length = flat.size // ((2 if kind == FRO else 4) * nprocs)
        return reduce_partials(flat, nprocs, length, kind == FRO, backend)[1]
    stacked = np.array(values, dtype=np.float64).reshape(nprocs, -1)
    return finish_cpu_result(kind, stacked, dtype)


def distributed_norm(A, spec: Spec, tile: int, backend: Backend, kernel_ok: bool,
                     group, layout) -> mx.array:
    """:func:`mlx_precise.norms.norm` of the global matrix whose local block on this
    process is ``A``; collective over ``group`` (default: ``mx.distributed.init()``)."""
    if layout is None:
        raise ValueError("layout is required with group: pass a "
                         "mlx_precise.norms.distributed.Layout (block_rows, block_cols, "
                         "block_cyclic)")
    if not isinstance(layout, Layout):
        raise TypeError(f"layout must be a mlx_precise.norms.distributed.Layout, "
                        f"got {type(layout).__name__}")
    if group is None:
        group = mx.distributed.init()
    nprocs, rank = group.size(), group.rank()
    if layout.size != nprocs:
        raise ValueError(f"layout has a {layout.grid[0]} x {layout.grid[1]} process grid "
                         f"({layout.size} processes) but the group has {nprocs}")
    expect = layout.local_shape(rank)
    if tuple(A.shape) != expect:
        raise ValueError(f"A on rank {rank} must be its local block of shape {expect} "
                         f"under {layout}, got {tuple(A.shape)}")
    gm, gn = layout.shape
    dtype = out_dtype(A)
    empty = check_global_shape(spec, gm, gn, f"a global shape ({gm}, {gn})")
    if empty is not None:
        return empty.astype(dtype)
    rows, cols = layout.row_map(rank), layout.col_map(rank)
    kernel = kernel_ok and backend.has_kernels
    if kernel:
        part = kernel_partial(A, spec, tile, backend, layout.shape, rows, cols)
    else:
        part = cpu_partial(A, spec, layout.shape, rows, cols)
    return combine(_gather(part.values, group), part.kind, nprocs, dtype, backend, kernel)
