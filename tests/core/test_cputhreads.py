"""The cpu backend's block threads (mlx_precise/core/cputhreads.py)."""

import os
import threading

from mlx_precise.core import cputhreads


def test_map_runs_keeps_order_and_covers_every_item_once():
    items = list(range(23))
    for workers in (1, 2, 3, 7, 23, 40):
        seen = []

        def run(part):
            seen.extend(part)
            return [10 * i for i in part]

        assert cputhreads.map_runs(run, items, workers) == [10 * i for i in items]
        assert sorted(seen) == items
    assert cputhreads.map_runs(lambda part: list(part), [], 2) == []
    done = []  # a run done for its writes returns None
    for workers in (1, 3):
        assert cputhreads.map_runs(lambda part: done.extend(part), items, workers) == []
    assert sorted(done) == sorted(items + items)


def test_map_runs_uses_the_calling_thread_and_another():
    """Two runs: the first on the caller, the second on a pool thread, each run a
    contiguous slice."""
    where = {}

    def run(part):
        where[tuple(part)] = threading.get_ident()
        return []

    cputhreads.map_runs(run, [0, 1, 2, 3, 4], 2)
    assert list(where) == [(0, 1), (2, 3, 4)] or list(where) == [(2, 3, 4), (0, 1)]
    assert where[(0, 1)] == threading.get_ident() != where[(2, 3, 4)]


def test_workers_for():
    cores = os.cpu_count() or 1
    assert cputhreads.workers_for(1 << 30, 1) == 1  # one block: one thread
    assert cputhreads.workers_for(100, 50) == 1  # too little work to pay for a thread
    assert cputhreads.workers_for(1 << 30, 1000) == cores
    assert cputhreads.workers_for(3 << 20, 1000) == min(cores, 3)
