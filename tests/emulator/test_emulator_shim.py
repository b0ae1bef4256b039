"""The shim's C++ self-check (tests/emulator/shim_selfcheck.cpp): vector types, swizzles,
half/bfloat16 rounding, rint ties, single-rounding fma, complex arithmetic,
elem_to_loc on strided layouts and atomics, each an assertion in C++. Built by the
emulator's own compiler, flags and cache, and run through ctypes."""

import ctypes
from pathlib import Path

from mlx_precise.emulator import compiler
from mlx_precise.emulator.kernel import SHIM_DIR, _preload_libm


def test_shim_selfcheck(capfd):
    src = (Path(__file__).parent / "shim_selfcheck.cpp").read_text()
    _preload_libm()
    lib = ctypes.CDLL(str(compiler.build(src, "shim_selfcheck", [SHIM_DIR])))
    failed = lib.shim_selfcheck()
    out = capfd.readouterr().out
    assert failed == 0, out
    assert "all checks passed" in out and "FAIL" not in out
