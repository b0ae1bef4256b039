"""``python -m mlx_precise selftest``: every kernel at small sizes against exact oracles.

Each check prints one line, ``PASS``/``FAIL``, its name and the measured figure. The
oracle is exact rational arithmetic (:mod:`fractions`), independent of the kernels.
This is what a Mac user runs to prove the Metal path on real hardware::

    python -m mlx_precise selftest --backend metal
"""

from __future__ import annotations

import time

import mlx.core as mx

from ..core import backends
from ..core.selftest import Check, registered


def run(backend: str | None = None, verbose: bool = True) -> list[Check]:
    """Run every check on ``backend`` (default: the active one); returns the checks.

    The checks are those the capabilities registered (:mod:`mlx_precise.core.selftest`:
    each capability's ``checks`` module), in their order."""
    name = backends.resolve(backend)
    checks: list[Check] = []
    for group in registered():
        checks += group(name, checks)
    if verbose:
        for c in checks:
            print(c.line(), flush=True)
    return checks


def main(backend: str | None = None) -> int:
    name = backends.resolve(backend)
    print(f"mlx-precise selftest on backend '{name}' (MLX {mx.__version__})", flush=True)
    t0 = time.perf_counter()
    checks = run(name)
    failed = sum(not c.passed for c in checks)
    print(f"{len(checks) - failed} passed, {failed} failed ({time.perf_counter() - t0:.1f} s)")
    return 1 if failed else 0
