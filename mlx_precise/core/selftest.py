"""The self-test's parts: the :class:`Check` a capability's check returns, and the
registry that ``python -m mlx_precise selftest`` (:mod:`mlx_precise.tools.selftest`)
collects the checks from.

Each capability registers its checks in a ``checks`` module of its own, imported by
the capability's ``__init__``, so the foundation imports no capability::

    register(30, selftest_checks)   # in mlx_precise/fft/checks.py

A registered function takes ``(backend, done)``, ``done`` the checks that ran before
it (in ``order``), and returns its list of :class:`Check`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass
class Check:
    name: str
    passed: bool
    figure: str

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}  {self.name:<34} {self.figure}"


# (order, function): every capability's checks, run by ascending order.
_REGISTRY: list[tuple[int, Callable]] = []


def register(order: int, checks: Callable[[str, list], list]) -> None:
    """Add ``checks(backend, done) -> list[Check]`` to the self-test, run at
    ``order`` (ascending; the foundation's number system first). ``backend`` is a
    resolved :class:`~mlx_precise.core.backends.Backend` (ask its capabilities)."""
    if all(fn is not checks for _, fn in _REGISTRY):
        _REGISTRY.append((order, checks))


def registered() -> list[Callable]:
    """The registered check functions, in the order they run."""
    return [fn for _, fn in sorted(_REGISTRY, key=lambda e: e[0])]
