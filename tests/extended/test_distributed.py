"""``mx.distributed``'s collectives on values the block carries: both words move
and sums, maxima and minima are of the exact values (before: MLX's collectives of
the high words, with an empty report: the gradient averaging of data-parallel
training summed float32 words). Two processes on this machine through MLX's ring
backend (``mlx.launch``), mlx.nn's tensor-parallel gradient sum among them, and the
single-process group; oracle: numpy float64 of every process's data (seeded by
rank)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from flow_helpers import value64

_SCRIPT = textwrap.dedent('''
    import json, sys
    import mlx.core as mx, numpy as np, mlx_precise as mp
    from mlx.nn.layers.distributed import sum_gradients
    from mlx_precise.extended import low_word

    def value(a):
        lo = low_word(a)
        return np.array(a).astype(float) + (0 if lo is None else np.array(lo).astype(float))

    group = mx.distributed.init(backend="ring", strict=True)
    rank, size = group.rank(), group.size()
    data = lambda r: np.random.default_rng(r).standard_normal((4, 3)).astype(np.float32)
    every = [data(r).astype(float) for r in range(size)]
    thirds = [e / 3 for e in every]
    want = {"sum": sum(thirds), "gather": np.concatenate(thirds),
            "max": np.max(thirds, axis=0), "min": np.min(thirds, axis=0),
            "scatter": sum(thirds)[rank * 2:(rank + 1) * 2], "sum of float32": sum(every)}
    for backend in sys.argv[1:]:
        with mp.use_backend(backend), mp.extended_precision(strict=True) as report:
            x = mx.array(data(rank)) / 3  # carries a low word
            got = {"sum": mx.distributed.all_sum(x), "gather": mx.distributed.all_gather(x),
                   "max": mx.distributed.all_max(x), "min": mx.distributed.all_min(x),
                   "scatter": mx.distributed.sum_scatter(x),
                   "sum of float32": mx.distributed.all_sum(mx.array(data(rank)))}
            got = {k: value(v) for k, v in got.items()}
            # mlx.nn's tensor-parallel gradient sum: a custom function whose vjp is
            # all_sum, taken in the block
            c, xs = mx.array(data(rank)[1]), mx.array(data(rank)[0])
            grad = mx.grad(lambda w: (sum_gradients(group)(w * xs / 3) * c).sum())(
                mx.array(np.float32([0.5, -1.0, 2.0])))
            got["tensor-parallel gradient"] = value(grad)
        want["tensor-parallel gradient"] = (sum(data(r)[1].astype(float) for r in range(size))
                                            * data(rank)[0].astype(float) / 3)
        err = {k: float(np.abs(got[k] - want[k]).max() / np.abs(want[k]).max()) for k in want}
        print("RESULT " + json.dumps({"rank": rank, "backend": backend, "err": err,
                                      "float32": dict(report.float32)}))
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes(tmp_path):
    launch = os.path.join(os.path.dirname(sys.executable), "mlx.launch")
    if not os.path.exists(launch):
        pytest.skip("mlx.launch is not installed beside this Python")
    script = tmp_path / "collectives.py"
    script.write_text(_SCRIPT)
    port = _free_port()
    run = subprocess.run([launch, "-n", "2", "--backend", "ring", "--starting-port", str(port),
                          "--python", sys.executable, str(script), "cpu", "emulate"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    results = [json.loads(line.split("RESULT ", 1)[1])
               for line in run.stdout.splitlines() if "RESULT " in line]
    assert len(results) == 4, run.stdout + run.stderr  # 2 ranks x 2 backends
    for r in results:
        assert not r["float32"], r
        for name, e in r["err"].items():
            assert e < 1e-13, (r["rank"], r["backend"], name, e)


def test_single_process_group(backend):
    """A group of one: the collectives are the identity on the value, low word
    included (before: a new array of the high word, unreported)."""
    x = mx.array(np.float32([1.0, 2.0, 5.0]))
    with mp.use_backend(backend), mp.extended_precision(strict=True):
        a = x / 3
        got = [value64(f(a)) for f in (mx.distributed.all_sum, mx.distributed.all_gather,
                                          mx.distributed.all_max)]
    for g in got:
        assert np.abs(g - np.array([1, 2, 5]) / 3).max() < 1e-13
