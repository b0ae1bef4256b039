"""Kernel buffers fenced by inaccessible memory, so a stray access is an error.

Each buffer the emulator hands to a kernel lives in its own anonymous mapping: the
data pages are readable and writable (inputs too: the kernel's `const` is checked by
the compiler), and wide PROT_NONE regions sit before and after them. The data ends
at the start of the guard after it (rounded up to 16 bytes, so vector types stay
aligned), hence one element past the end already faults. The runtime catches the
fault (shim/runtime.h) and :func:`describe` turns its address into the buffer and
element. Bytes between the data and the guards are filled with a canary so that a
write there is found after the launch (:meth:`Guarded.slack_write`); outside checked
mode the filler is the poison (all-ones bytes) that reads past the end return.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import threading

import numpy as np

_PROT_NONE, _PROT_RW = 0, mmap.PROT_READ | mmap.PROT_WRITE
_MAP_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
_PAGE = mmap.PAGESIZE
_ALIGN = 16
CANARY = 0xA5  # checked mode's slack filler (a write there is reported)
POISON = 0xFF  # what reads past the end return outside checked mode (NaN, -1)
# Guards are address space only (no memory): wide enough that an index tens of
# times the buffer's size still lands in one rather than in another mapping.
_MIN_GUARD, _MAX_GUARD = 64 << 20, 4 << 30


# Mappings of freed buffers, kept for reuse by the next buffer of as many data
# pages (most launches repeat their shapes): mapping, protecting and unmapping, and
# the page faults of fresh data pages, cost more than a launch of a small grid.
# A kept mapping is exactly as a new one would be (guards PROT_NONE, data pages
# read-write); its bytes are all rewritten on reuse (the slack by Guarded, the data
# by its owner). Mappings whose guards a poisoned read opened (``tainted``) are
# unmapped instead.
_POOL_PER_SIZE = 8
_POOL_MAX_BYTES = 64 << 20  # of data pages kept in all
_pool: dict[int, list[tuple[int, int, int]]] = {}  # data bytes: [(base, size, guard)]
_pool_bytes = 0
_pool_lock = threading.Lock()


def _pool_take(data_bytes: int):
    global _pool_bytes
    with _pool_lock:
        kept = _pool.get(data_bytes)
        if not kept:
            return None
        _pool_bytes -= data_bytes
        return kept.pop()


def _pool_put(data_bytes: int, mapping: tuple[int, int, int]) -> bool:
    global _pool_bytes
    with _pool_lock:
        kept = _pool.setdefault(data_bytes, [])
        if len(kept) >= _POOL_PER_SIZE or _pool_bytes + data_bytes > _POOL_MAX_BYTES:
            return False
        kept.append(mapping)
        _pool_bytes += data_bytes
        return True


def release_pool() -> None:
    """Unmap every kept mapping."""
    global _pool_bytes
    with _pool_lock:
        for kept in _pool.values():
            for base, size, _ in kept:
                _libc().munmap(base, size)
        _pool.clear()
        _pool_bytes = 0


@functools.lru_cache(maxsize=None)
def _fill_pattern(byte: int) -> bytes:
    return bytes((byte,)) * _PAGE


@functools.lru_cache(maxsize=None)
def _libc():
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


class Guarded:
    """One fenced buffer of ``nbytes`` bytes for kernel argument ``name``.

    ``array`` is a writable uint8 numpy view of the data (length ``nbytes``);
    ``ptr`` its address. The data holds elements ``first .. first + nbytes/itemsize
    - 1`` of the kernel's pointer, whose element 0 is at ``origin`` (``first`` < 0
    for a strided view with negative strides)."""

    def __init__(self, name: str, kind: str, nbytes: int, itemsize: int, first: int = 0,
                 slack: int = CANARY):
        self.name, self.kind, self.itemsize = name, kind, itemsize
        self.first, self.last = first, first + nbytes // itemsize - 1
        self.nbytes = nbytes
        self.tainted = False  # a guard page was opened (poison): never reuse the mapping
        padded = _round_up(max(nbytes, 1), _ALIGN)
        data_pages = _round_up(padded, _PAGE)
        self.data_pages = data_pages
        kept = _pool_take(data_pages)
        if kept is not None:
            self.base, self.size, self.guard = kept
        else:
            self.guard = max(_MIN_GUARD, min(_MAX_GUARD, _round_up(16 * data_pages, _PAGE)))
            self.size = 2 * self.guard + data_pages
            libc = _libc()
            base = libc.mmap(None, self.size, _PROT_NONE, _MAP_FLAGS, -1, 0)
            if base in (None, ctypes.c_void_p(-1).value):
                raise MemoryError(f"cannot map {self.size} bytes for kernel buffer {name!r}")
            self.base = base
            if libc.mprotect(base + self.guard, data_pages, _PROT_RW) != 0:
                self.tainted = True
                self.free()
                raise MemoryError(f"cannot map kernel buffer {name!r}")
        page0 = self.base + self.guard
        self.lo = page0
        self.hi = page0 + data_pages  # first byte of the guard after the data
        self.ptr = self.hi - padded
        self.origin = self.ptr - first * itemsize
        self.slack = slack
        # A writable byte view of the data pages: slicing it and assigning bytes is
        # the cheapest way to fill them from Python (no ctypes call, no numpy).
        self.pages = memoryview((ctypes.c_uint8 * data_pages).from_address(page0)).cast("B")
        start = self.ptr - self.lo
        self.data = self.pages[start:start + nbytes]
        self._slack_before = _fill_pattern(slack)[:start]  # each is shorter than a page
        self._slack_after = _fill_pattern(slack)[:data_pages - start - nbytes]
        self.refill_slack()  # the slack only: the caller fills the data itself
        self.array = np.frombuffer(self.data, np.uint8) if nbytes else np.empty(0, np.uint8)

    def refill_slack(self) -> None:
        """Fill the slack around the data with the buffer's filler again (a buffer
        reused from launch to launch starts each one as a new buffer would)."""
        start = len(self._slack_before)
        self.pages[:start] = self._slack_before
        self.pages[start + self.nbytes:] = self._slack_after

    def fill(self, byte: int) -> None:
        """Set every data byte to ``byte``."""
        if self.nbytes <= _PAGE:
            self.data[:] = _fill_pattern(byte)[:self.nbytes]
        else:
            self.array[:] = byte

    def slack_write(self) -> int | None:
        """Byte offset from ``ptr`` of the first canary byte a kernel overwrote in the
        unguarded slack around the data, or None."""
        start, end = self.ptr - self.lo, self.ptr - self.lo + self.nbytes
        if (self.pages[:start].tobytes() == self._slack_before
                and self.pages[end:].tobytes() == self._slack_after):
            return None  # (the common case, without numpy)
        whole = np.ctypeslib.as_array((ctypes.c_uint8 * (self.hi - self.lo)).from_address(self.lo))
        for lo, hi in ((0, start), (end, len(whole))):
            bad = np.flatnonzero(whole[lo:hi] != self.slack)
            if bad.size:
                return int(lo + bad[0]) - start
        return None

    def free(self):
        """Give the memory back (kept for reuse unless ``tainted``). The numpy views
        of the data must not be used afterwards."""
        if self.base is not None:
            mapping = (self.base, self.size, self.guard)
            self.base = None
            if self.tainted or not _pool_put(self.data_pages, mapping):
                _libc().munmap(*mapping[:2])

    def element(self, address: int) -> int | None:
        """Element index (relative to logical element 0) of an address inside this
        buffer's mapping, guards included; None when the address is elsewhere."""
        if self.base is None or not self.base <= address < self.base + self.size:
            return None
        return (address - self.origin) // self.itemsize


def describe(kernel: str, buffers: list[Guarded], access: str, address: int, thread: str) -> str:
    """The message for a faulting access at ``address``."""
    for b in buffers:
        idx = b.element(address)
        if idx is not None:
            return (f"kernel {kernel!r}: out-of-bounds {access} of {b.kind} {b.name!r} at "
                    f"element {idx} (valid: {b.first}..{b.last}) by {thread}")
    return (f"kernel {kernel!r}: invalid memory {access} at address {address:#x} "
            f"(not inside any kernel buffer: a stray pointer or threadgroup/stack "
            f"array overflow) by {thread}")
