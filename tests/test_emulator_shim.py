"""The shim's C++ self-check (tests/shim_selfcheck.cpp): vector types, swizzles,
half/bfloat16 rounding, rint ties, single-rounding fma, complex arithmetic,
elem_to_loc on strided layouts and atomics, each an assertion in C++."""

import subprocess
from pathlib import Path

from mlx_precise.emulator import compiler
from mlx_precise.emulator.kernel import SHIM_DIR


def test_shim_selfcheck(tmp_path):
    src = Path(__file__).parent / "shim_selfcheck.cpp"
    exe = tmp_path / "selfcheck"
    cmd = [*compiler.find_compiler(), *compiler.flags(shared=False), f"-I{SHIM_DIR}",
           str(src), "-o", str(exe)]
    build = subprocess.run(cmd, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "FAIL" not in run.stdout
