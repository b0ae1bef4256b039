"""Core-level threads for the ``cpu`` backend's blocked numpy loops.

numpy releases the GIL inside its ufunc loops, copies and BLAS calls, so a loop
over independent blocks (rows of a norm, digit pieces of a DGEMM) runs on every
core when its blocks are dealt out as one contiguous run per thread.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

_MIN_VALUES = 1 << 20  # a thread pays for itself once it streams about this many values


def workers_for(values: int, runs: int) -> int:
    """Threads for ``runs`` blocks of ``values`` values in all: one per core, at
    most one per block, and one per ~2^20 values (thread start-up is ~0.1 ms)."""
    return max(1, min(os.cpu_count() or 1, runs, values // _MIN_VALUES))


def map_runs(fn, items: list, workers: int) -> list:
    """``fn`` on ``workers`` contiguous runs of ``items`` at once, the first run on
    the calling thread (so at least two threads work whenever ``workers >= 2``)
    and the others on a pool of ``workers - 1`` threads; the lists it returns
    (None: nothing, for a run done for its writes), concatenated in order.
    ``fn(run)`` must not share writable state across runs."""
    workers = min(workers, len(items))
    if workers <= 1:
        return list(fn(items) or [])
    cut = [len(items) * i // workers for i in range(workers + 1)]
    runs = [items[cut[i]:cut[i + 1]] for i in range(workers)]
    with ThreadPoolExecutor(workers - 1) as ex:
        rest = [ex.submit(fn, run) for run in runs[1:]]
        parts = [fn(runs[0])] + [f.result() for f in rest]
    return [r for part in parts for r in part or []]
