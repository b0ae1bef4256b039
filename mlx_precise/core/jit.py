"""``mx.compile`` for the package's own float64 loops (the cpu backend), used only
where MLX's CPU kernel folder is private.

MLX's CPU compiler writes each kernel it builds as a shared library to
``<temp>/mlx/<version>/cpu`` and loads any library already there under the
kernel's name (``mlx/backend/cpu/compiled.cpp``); ``<temp>`` is C++'s
``std::filesystem::temp_directory_path()``: ``TMPDIR`` (then ``TMP``, ``TEMP``,
``TEMPDIR``), else ``/tmp``. A folder another user can write (or one they made
first in a shared ``/tmp``) would let them run code in this process. So before
the package's first compiled call for a ``<temp>``, the folder is made if it is
missing (mode 0755, as MLX makes it: readable by all, writable by this user only)
and checked (:func:`mlx_precise.emulator.private.unsafe_folder`): this user's or
root's, writable by nobody else, the folders above it not writable by others
unless sticky. Where it fails, the loops run as separate MLX ops instead, the same
operations in the same order (so the same bits: the compiler does not contract
``a * b + c``), and a :class:`UnsafeJitFolderWarning` says once why and how to fix
it. Code that calls ``mx.compile`` itself gets MLX's (not checked here).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import mlx.core as mx

from ..emulator.private import unsafe_folder
from .plain import plain

class UnsafeJitFolderWarning(UserWarning):
    """MLX's CPU kernel folder could be written by another user: the package's
    float64 loops run uncompiled (same results, slower)."""


def _temp() -> bytes:
    # (read per compiled call: os.environ's own dictionary of bytes, which its
    # assignments update with the process environment, without .get's encoding)
    get = os.environ._data.get
    return get(b"TMPDIR") or get(b"TMP") or get(b"TEMP") or get(b"TEMPDIR") or b"/tmp"


def kernel_folder() -> Path:
    """The folder MLX's CPU compiler reads and writes now."""
    return Path(os.fsdecode(_temp())) / "mlx" / mx.__version__ / "cpu"


_private: dict[bytes, bool] = {}  # <temp> -> its kernel folder is private


def _check(folder: Path) -> bool:
    try:
        os.makedirs(folder, mode=0o755, exist_ok=True)
        found = unsafe_folder(folder, root_may_own=True)
    except OSError as e:
        found = folder, f"it cannot be made or read ({type(e).__name__}: {e.strerror or e})"
    if found is None:
        return True
    where, why = found
    warnings.warn(UnsafeJitFolderWarning(
        f"MLX's CPU compiler loads the libraries in {str(folder)!r}, but {str(where)!r} is "
        f"unsafe because {why}: another user could run code as you there. mlx-precise "
        "runs its float64 loops uncompiled instead (same results, slower). Fix: set "
        "TMPDIR to a folder only you can write (before the first compiled call), or "
        f"remove {str(where)!r} if it is not yours"), stacklevel=4)
    return False


def folder_is_private() -> bool:
    """Whether MLX's CPU kernel folder can be trusted (checked once per folder)."""
    temp = _temp()
    ok = _private.get(temp)
    if ok is None:
        ok = _private[temp] = _check(kernel_folder())
    return ok


FUSE_MIN = 1 << 14
"""Elements from which a call is big: compiled at once (one loop over its elements
where separate ops would make a pass and a full-size temporary each)."""

COMPILE_AT = 32
"""Calls with the same shapes and dtypes after which a small call compiles. MLX's
compiler builds a C++ kernel for each new graph, about 0.8 s with the system
compiler (measured: ``g++ -O3`` spends 0.75 s of it reading MLX's preamble), once
per machine (the library stays in the folder); compiled, a loop of dozens of ops
on a few elements saves about 0.2 ms of host time per call (exp64: 40 us against
220 us). Code that calls a loop a few times (a script, a test) never pays the build;
a loop that repeats does, once."""

_SEEN_MAX = 1024


class compile:  # noqa: N801 (named as the mx.compile it stands for)
    """``fn`` compiled by MLX, run compiled where :func:`folder_is_private` and the
    call is big (an array argument of :data:`FUSE_MIN` elements or more) or its
    shapes and dtypes were seen :data:`COMPILE_AT` times; else as it is (the same
    MLX ops, separately: the same bits, as the compiler does not contract
    ``a * b + c``). ``at_once``: compiled at every call (the caller compiles only
    what it has seen repeat)."""

    __slots__ = ("fn", "compiled", "_seen")

    def __init__(self, fn, at_once: bool = False):
        self.fn, self.compiled = fn, plain.compile(fn)
        # (shape, dtype) of each array argument -> calls; None: compiled at once
        self._seen: dict | None = None if at_once else {}

    def _worth_it(self, args) -> bool:
        if self._seen is None:
            return True
        arrays = [a for a in args if isinstance(a, mx.array)]
        if any(a.size >= FUSE_MIN for a in arrays):
            return True
        key = tuple((a.shape, a.dtype) for a in arrays)
        seen = self._seen.get(key, 0) + 1
        if seen > COMPILE_AT:
            return True
        if len(self._seen) >= _SEEN_MAX:  # (forgotten all at once: rare, bounded)
            self._seen.clear()
        self._seen[key] = seen
        return seen == COMPILE_AT

    def __call__(self, *args):
        if self._worth_it(args) and folder_is_private():
            return self.compiled(*args)
        return self.fn(*args)
