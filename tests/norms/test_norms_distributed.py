"""The distributed norm across two real processes: ``mlx.launch -n 2 --backend ring``
on localhost runs tests/norms/norms_distributed_worker.py (the venv's python), every rank
computes the norm of its local block of the same global matrices (block rows,
block columns, 2D block-cyclic on 1 x 2 and 2 x 1 grids; float32 and complex64
through the kernels, float64 and float32 through the cpu path), and each result is
checked against the single-process exact oracle (tests/oracle.py ``lapack_norm``)
of the global matrix: max exact, one/inf/fro within 1 ulp, NaN/Inf propagated,
the Frobenius norm of a matrix whose ranks hold entries ~1e-30 and ~1e30 exact.
Both ranks must return the same bits. The in-process simulation of the same
combination logic is in tests/norms/test_norms.py (test_layouts_simulated).
"""

import json
import math
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from norms_distributed_worker import cases, global_matrix
from oracle import lapack_norm, ulp_distance, ulps_f64

from mlx_precise.norms import norm

WORKER = Path(__file__).with_name("norms_distributed_worker.py")


def find_launcher() -> str | None:
    """``mlx.launch`` beside the running python (the venv's), else on PATH."""
    here = Path(sys.executable).parent / "mlx.launch"
    return str(here) if here.exists() else shutil.which("mlx.launch")


def free_port_block(count: int = 4) -> int:
    """A port p with p .. p + count - 1 free now (the ring backend listens on one
    port per rank from --starting-port)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count >= 65536:
            continue
        try:
            socks = []
            for p in range(base, base + count):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise RuntimeError("no block of free ports found")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    launcher = find_launcher()
    if launcher is None:
        pytest.skip(f"mlx.launch not found beside {sys.executable} nor on PATH: "
                    "cannot start two mx.distributed processes")
    # Build the kernels here first: the two workers then load them from the cache
    # instead of compiling the same sources side by side.
    norm(mx.ones((3, 3)), "fro", backend="emulate")
    out = tmp_path_factory.mktemp("norms_dist")
    cmd = [launcher, "-n", "2", "--backend", "ring", "--starting-port", str(free_port_block()),
           "--python", sys.executable, str(WORKER), str(out)]
    env = dict(os.environ)
    env.pop("MLX_PRECISE_BACKEND", None)  # the worker names its backends
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env,
                          cwd=str(WORKER.parent))
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    res = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [(r["rank"], r["size"]) for r in res] == [(0, 2), (1, 2)]
    return [r["results"] for r in res]


def test_two_processes_match_the_single_process_oracle(ranks):
    worst = {}
    for cid, matrix, dtype, backend, layout, kind, structure, uplo, diag in cases():
        got0, got1 = (float.fromhex(r[cid]) for r in ranks)
        assert got0 == got1 or (math.isnan(got0) and math.isnan(got1)), cid
        ref = lapack_norm(global_matrix(matrix, dtype), kind, structure, uplo, diag)
        f64 = dtype == "float64"
        want = ref.rn(np.float64 if f64 else np.float32)
        if np.isnan(want) or np.isinf(want):
            assert (np.isnan(want) and math.isnan(got0)) or want == got0, (cid, got0, want)
            continue
        u = float(ulps_f64(got0, want) if f64 else ulp_distance(got0, want, "float32"))
        worst[dtype, backend] = max(worst.get((dtype, backend), 0.0), u)
        assert u <= (0 if kind == "max" else 1), (cid, got0, want)
    print("\nworst ulps over 2 processes:", worst, end="")


def test_scaled_accumulators_combine(ranks):
    """Rank 0 holds the ~1e-30 half (small accumulator), rank 1 the ~1e30 half (big):
    the Frobenius norm is the correctly rounded one, not 0, Inf, or one half's."""
    cid = "tall_scaled/float32/emulate/rows/fro/general/lower/nonunit"
    got = float.fromhex(ranks[0][cid])
    ref = lapack_norm(global_matrix("tall_scaled", "float32"), "fro")
    assert got == ref.rn() and 1e30 < got < 1e36
