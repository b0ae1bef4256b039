"""Kernel libraries built through the precompiled shim header (clang): the same
bytes as without it, and the header itself is cached as a library is (verified
before use, rebuilt when it was altered)."""

import hashlib
import json

import mlx.core as mx
import pytest

from mlx_precise.emulator import compiler, metal_kernel
from mlx_precise.emulator.kernel import SHIM_DIR

pytestmark = pytest.mark.skipif(compiler._family(compiler.find_compiler()) != "clang",
                                reason="precompiled headers are used with clang only")


def _unit(value: int) -> str:
    """The C++ unit of a kernel with barriers, simd functions and half arithmetic."""
    k = metal_kernel("pch_unit", ["x"], ["y"], f"""
        uint i = thread_position_in_grid.x;
        threadgroup float t[32];
        t[i] = simd_sum(x[i]) * {value}.0f;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        y[i] = T(t[31 - i]) + T(0.5f);
    """)
    return k._instantiate([mx.zeros((32,))], [mx.float16], [("T", mx.float16)]).cpp


def _build(cache, monkeypatch, source, precompile):
    monkeypatch.setenv("MLX_PRECISE_CACHE", str(cache))
    return compiler.build(source, "pch_unit", [SHIM_DIR], precompile=precompile)


def test_precompiled_header_gives_the_same_library(tmp_path, monkeypatch):
    for value in (2, 3):
        plain = _build(tmp_path / "plain", monkeypatch, _unit(value), None)
        fast = _build(tmp_path / "pch", monkeypatch, _unit(value), "runtime.h")
        assert plain.read_bytes() == fast.read_bytes()
    assert not list((tmp_path / "plain").glob("*.pch"))
    (pch,) = (tmp_path / "pch").glob("*.pch")
    assert pch.stat().st_mode & 0o777 == 0o600


def test_altered_precompiled_header_is_rebuilt_not_used(tmp_path, monkeypatch):
    cache = tmp_path / "pch"
    _build(cache, monkeypatch, _unit(2), "runtime.h")
    (pch,) = cache.glob("*.pch")
    pch.write_bytes(pch.read_bytes()[:-100] + b"\0" * 100)  # same owner, other content
    lib = _build(cache, monkeypatch, _unit(5), "runtime.h")
    assert lib.read_bytes() == _build(tmp_path / "plain", monkeypatch, _unit(5), None).read_bytes()
    (record,) = cache.glob("pch-*.json")
    digest = json.loads(record.read_text())["sha256"]
    rebuilt = cache / f"{record.stem}.{digest}.pch"
    assert hashlib.sha256(rebuilt.read_bytes()).hexdigest() == digest
