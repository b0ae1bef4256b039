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
    """``fn`` on ``workers`` contiguous runs of ``items`` at once (in order);
    the lists it returns, concatenated. ``fn(run)`` must not share writable state
    across runs."""
    if workers <= 1 or len(items) <= 1:
        return list(fn(items))
    cut = [len(items) * i // workers for i in range(workers + 1)]
    with ThreadPoolExecutor(workers) as ex:
        parts = list(ex.map(fn, [items[cut[i]:cut[i + 1]] for i in range(workers)]))
    return [r for part in parts for r in part]
