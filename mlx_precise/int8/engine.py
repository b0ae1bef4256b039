"""Exact int8 x int8 -> int32 matrix products: the shared int8 GEMM engine.

The Metal engine is ``metal/include/int8_gemm.h`` (a tiled GEMM parameterised by
an epilogue, called once per output with the exact int32 sum); this module declares
its plain int32-output kernel, :func:`int8_matmul`, and the host-side helpers that
every kernel built on the engine uses (:func:`gemm_grid`, :func:`device_buffer`,
:data:`INT8_GEMM_I32_PARAMS`), so that grid sizes and buffer layouts are derived in one place.
:mod:`mlx_precise.int8` builds the scaled epilogues of W8A8 inference on it.

Exactness: each product of two int8 values is at most 2^14 in magnitude, so int32
sums are exact for K <= :data:`MAX_K` = 131071 (the cpu backend sums in float64,
exact for K < 2^39; the same limit is enforced on every backend).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..core import backends
from ..core.streams import streamed
from ..doubleword.types import read_input
from ..core.autodiff import host_guard
from ..core.kernels import Kernel, ParamLayout, generated_block

# Tile of one threadgroup and its thread count: INT8_GEMM_BM/BN and
# INT8_GEMM_THREADS in metal/include/int8_gemm.h.
TILE_M = 32
TILE_N = 32
THREADS = 256
MAX_K = (2**31 - 1) // 2**14  # 131071: |sum of K products| <= K * 2^14 < 2^31
# Inputs with fewer elements than this are passed in Metal's constant address space
# (a different kernel signature); the engine takes device pointers.
_MIN_DEVICE_ELEMENTS = 8

INT8_GEMM_I32_PARAMS = ParamLayout("INT8_GEMM_I32", (
    "m", "n", "k",
    "lda", "ldb",          # leading dimensions of A_z [M, K] and B_z [K, N] (row-major)
    "batch_stride_a",      # elements from A_z to A_(z+1) (0: one A for every batch)
    "batch_stride_b",
), size=8)
"""The int32 ``p`` buffer of :data:`INT8_GEMM_I32` (``INT8_GEMM_I32_M`` ... in
``metal/include/int8_gemm.h``)."""


def codes_source() -> str:
    """The first generated block of ``metal/include/int8_gemm.h`` (a test checks that
    the header holds exactly this text)."""
    return generated_block("mlx_precise.int8.engine.codes_source()", INT8_GEMM_I32_PARAMS)


INT8_GEMM_I32 = Kernel(
    name="int8_gemm_i32",
    body="int8_gemm_i32.metal",
    headers=("int8_gemm.h",),
    inputs=("a", "b", "p"),
    outputs=("c",),
    input_dtypes={"a": (mx.int8,), "b": (mx.int8,), "p": (mx.int32,)},
    extended=False,  # integer arithmetic only
    variants={"c": (mx.int32,)},
    input_forms=dict.fromkeys(("a", "b", "p"), ("device",)),  # device_buffer, 8 params
)
"""``C_z = A_z B_z`` in int32 (see ``metal/kernels/int8_gemm_i32.metal``): inputs
``a``, ``b`` int8 flat buffers (:func:`device_buffer`), ``p`` int32 ``(8,)``
(:data:`INT8_GEMM_I32_PARAMS`); output ``c`` int32 ``(batches, M, N)``; grid from
:func:`gemm_grid`."""


def gemm_grid(m: int, n: int, batches: int = 1):
    """``(grid, threadgroup)`` for a kernel built on ``int8_gemm_tile`` with the
    default tile: one threadgroup of :data:`THREADS` threads per 32 x 32 output
    tile, ``threadgroup_position_in_grid = (tile column, tile row, batch)``."""
    tiles_n = max(-(-int(n) // TILE_N), 1)
    tiles_m = max(-(-int(m) // TILE_M), 1)
    return (tiles_n * THREADS, tiles_m, max(int(batches), 1)), (THREADS, 1, 1)


def device_buffer(x: mx.array) -> mx.array:
    """``x`` flattened (row-major), padded with zeros to at least 8 elements so
    that Metal passes it as a ``device`` pointer (MLX passes smaller inputs in the
    ``constant`` address space), which also keeps one kernel instantiation."""
    flat = mx.reshape(x, (-1,))
    if flat.size < _MIN_DEVICE_ELEMENTS:
        flat = mx.concatenate([flat, mx.zeros((_MIN_DEVICE_ELEMENTS - flat.size,), flat.dtype)])
    return flat


def _require_int8(x, name: str) -> mx.array:
    x = read_input(x, name)
    if x.dtype != mx.int8:
        raise TypeError(f"{name} must have dtype int8, got {x.dtype}")
    return x


def check_k(k: int) -> None:
    """Raise ValueError when K is too long for an exact int32 accumulator."""
    if k > MAX_K:
        raise ValueError(
            f"K = {k} is too large: int32 accumulation of int8 products is exact only "
            f"for K <= {MAX_K}; split the reduction"
        )


@host_guard
@streamed
def int8_matmul(a: mx.array, b: mx.array, *, backend: str | None = None, stream=None) -> mx.array:
    """Exact integer matrix product of int8 matrices.

    Args:
        a: int8 ``[M, K]``, or ``[batches, M, K]``.
        b: int8 ``[K, N]`` (shared by every batch), or ``[batches, K, N]``.
        backend: ``"metal"``, ``"emulate"``, ``"cpu"`` or None (the active one).
        stream: MLX stream or device (``mx.Stream``, ``mx.Device``) the op's MLX
            ops and kernel launches run on; None: the default stream.

    Returns:
        int32 ``[M, N]`` (``[batches, M, N]`` when an input is batched): the exact
        sum ``C[m, n] = sum_k A[m, k] B[k, n]``.

    Raises:
        TypeError: an input is not an int8 ``mx.array``.
        ValueError: wrong ranks, mismatched K or batch counts, K > 131071.
    """
    _require_int8(a, "a")
    _require_int8(b, "b")
    if a.ndim not in (2, 3) or b.ndim not in (2, 3):
        raise ValueError(
            f"a must be [M, K] or [batches, M, K] and b [K, N] or [batches, K, N], got "
            f"shapes {tuple(a.shape)} and {tuple(b.shape)}"
        )
    batched = a.ndim == 3 or b.ndim == 3
    a3 = a if a.ndim == 3 else a[None]
    b3 = b if b.ndim == 3 else b[None]
    batches, m, k = a3.shape
    if a.ndim == 2 and b.ndim == 3:
        batches = b3.shape[0]
    if b3.shape[1] != k:
        raise ValueError(f"inner dimensions differ: a has K = {k}, b has K = {b3.shape[1]}")
    if a.ndim == 3 and b.ndim == 3 and b3.shape[0] != a3.shape[0]:
        raise ValueError(
            f"batch counts differ: a has {a3.shape[0]}, b has {b3.shape[0]}"
        )
    n = b3.shape[2]
    check_k(k)
    name = backends.resolve(backend)
    if not name.has_kernels:
        # float64 sums of integers below 2^53 are exact, whatever the order.
        c = np.matmul(np.array(a3, dtype=np.float64), np.array(b3, dtype=np.float64))
        c = mx.array(np.broadcast_to(c, (batches, m, n)).astype(np.int32))
    elif batches * m * n == 0:
        c = mx.zeros((batches, m, n), dtype=mx.int32)
    else:
        grid, tg = gemm_grid(m, n, batches)
        stride_a = m * k if a3.shape[0] > 1 else 0
        stride_b = k * n if b3.shape[0] > 1 else 0
        (c,) = INT8_GEMM_I32(
            inputs=[device_buffer(a3), device_buffer(b3),
                    INT8_GEMM_I32_PARAMS.pack(m=m, n=n, k=k, lda=k, ldb=n,
                                              batch_stride_a=stride_a,
                                              batch_stride_b=stride_b)],
            grid=grid, threadgroup=tg, output_shapes=[(batches, m, n)],
            output_dtypes=[mx.int32], backend=name,
        )
    return c if batched else c[0]

