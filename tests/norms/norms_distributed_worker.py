"""Worker for tests/norms/test_norms_distributed.py, started on every process by
``mlx.launch -n 2 --backend ring``: builds the same global matrices on every rank
(fixed seeds), cuts out this rank's local block for each layout, computes the
distributed norm and writes ``{case id: float.hex(result)}`` plus the group's rank
and size to ``<outdir>/rank<r>.json``.

Usage: ``python norms_distributed_worker.py OUTDIR``. :func:`cases` and
:func:`global_matrix` are imported by the test, which computes the oracle.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

COMBOS = (("general", "lower", "nonunit"), ("trapezoid", "upper", "unit"),
          ("trapezoid", "lower", "nonunit"), ("symmetric", "lower", "nonunit"),
          ("hermitian", "upper", "nonunit"))
KINDS = ("max", "one", "inf", "fro")
LAYOUTS = ("rows", "cols", "cyclic_1x2", "cyclic_2x1")


def make_layout(name: str, shape):
    from mlx_precise.norms import distributed as nd

    if name == "rows":
        return nd.block_rows(shape, 2)
    if name == "cols":
        return nd.block_cols(shape, 2)
    if name == "cyclic_1x2":
        return nd.block_cyclic(shape, (4, 3), (1, 2))
    return nd.block_cyclic(shape, (5, 2), (2, 1))


def global_matrix(matrix: str, dtype: str) -> np.ndarray:
    """The global matrices, identical on every rank."""
    rng = np.random.default_rng(sum(map(ord, matrix + dtype)))
    shape = (19, 19) if matrix.startswith("square") else (23, 17)
    a = rng.standard_normal(shape) * 2.0 ** rng.integers(-8, 9, shape)
    if dtype == "complex64":
        a = a + 1j * rng.standard_normal(shape)
    if matrix.endswith("scaled"):  # top rows ~1e-30, bottom rows ~1e30: rank 0 vs 1
        a[: shape[0] // 2] *= 1e-30
        a[shape[0] // 2:] *= 1e30
    if matrix.endswith("nan"):
        a[-1, -1] = np.nan  # bottom-right corner tile (rank 1 in block rows/cols)
        a[0, 3] = np.inf
    return a.astype(dtype)


def cases():
    """Every case: (id, matrix, dtype, backend, layout, kind, structure, uplo, diag)."""
    out = []
    for dtype, backend in (("float32", "emulate"), ("complex64", "emulate"),
                           ("float64", "cpu"), ("float32", "cpu")):
        for layout in LAYOUTS if dtype != "float32" or backend != "cpu" else ("cyclic_1x2",):
            for structure, uplo, diag in COMBOS:
                square = structure in ("symmetric", "hermitian")
                for kind in KINDS:
                    out.append(("square" if square else "tall", dtype, backend, layout,
                                kind, structure, uplo, diag))
    for matrix in ("tall_scaled", "tall_nan", "square_nan"):
        for layout in ("rows", "cyclic_2x1"):
            for kind in KINDS:
                structure = "symmetric" if matrix.startswith("square") else "general"
                out.append((matrix, "float32", "emulate", layout, kind, structure,
                            "lower", "nonunit"))
    return [("/".join(c),) + c for c in out]


def main(outdir: str) -> None:
    import mlx.core as mx

    from mlx_precise.norms import norm

    group = mx.distributed.init()
    rank = group.rank()
    results = {}
    mats = {}
    for cid, matrix, dtype, backend, lname, kind, structure, uplo, diag in cases():
        if (matrix, dtype) not in mats:
            mats[(matrix, dtype)] = global_matrix(matrix, dtype)
        a = mats[(matrix, dtype)]
        layout = make_layout(lname, a.shape)
        local = layout.local_block(a, rank)
        arr = local if dtype == "float64" else mx.array(local)
        r = norm(arr, kind, structure=structure, uplo=uplo, diag=diag, tile=4,
                 group=group, layout=layout, backend=backend)
        results[cid] = float(r.item()).hex()
    out = {"rank": rank, "size": group.size(), "results": results}
    (Path(outdir) / f"rank{rank}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
