"""The emulator (and its siblings) under conditions a first-time user meets: many
threads on the first call, a compiler other than clang, an unusable cache directory,
and a kernel that does not compile."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from oracle import fft_reference, normwise_error

from mlx_precise.core import backends
from mlx_precise.emulator import compiler, metal_kernel

ROOT = Path(__file__).resolve().parents[2]


def _python(script: str, env: dict | None = None, timeout: int = 600):
    """Run ``script`` in a fresh interpreter (nothing built or cached in memory)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT,
                          env={**os.environ, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)


# ---- threads on first use --------------------------------------------------------

# Every thread starts at once (a barrier) in a process that has run nothing yet, and
# runs each operation; the results must match a serial run bit for bit. The first
# operation (an rfft) is the case once reported to fail this way; the Bluestein size goes through the cached
# chirp and kernel spectrum, the others through the other kernel families.
_THREADS_SCRIPT = """
    import json, sys, threading
    import mlx.core as mx, numpy as np
    import mlx_precise as mp

    backend = sys.argv[1]
    rng = np.random.default_rng(0)
    x = mx.array(rng.standard_normal(256).astype(np.float32))
    c = mx.array((rng.standard_normal(100) + 1j * rng.standard_normal(100)).astype(np.complex64))
    u = mx.array(rng.standard_normal((1, 4, 64)).astype(np.float32))
    k = mx.array(rng.standard_normal((4, 64)).astype(np.float32))
    ops = [
        lambda: mp.rfft_extended(x, backend=backend),
        lambda: mp.fft_extended(c, backend=backend),
        lambda: mp.complex_multiply_extended(c, c, backend=backend),
        lambda: mp.hyena_conv_extended(u, k, backend=backend),
    ]
    threads = 8
    start = threading.Barrier(threads)
    got, errors = {}, []

    def work(i):
        start.wait()
        for j in range(len(ops)):
            op = (i + j) % len(ops)
            try:
                y = ops[op]()
                mx.eval(y)
                got[(i, op)] = np.array(y)
            except BaseException as e:
                errors.append(f"thread {i} op {op}: {type(e).__name__}: {e}")

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    serial = [np.array(op()) for op in ops]
    differ = sorted({op for (i, op), y in got.items()
                     if y.tobytes() != serial[op].tobytes()})
    print(json.dumps({"errors": errors[:5], "n_errors": len(errors),
                      "results": len(got), "differ": differ}))
"""


@pytest.mark.parametrize("backend,runs", [("emulate", 3), ("cpu", 2)])
def test_threads_on_first_use(backend, runs):
    """Eight threads making their first calls together, in fresh processes (the race
    showed on the first use only, and not in every process). Before the fix a cached
    stand-in array was unevaluated when shared: MLX evaluates an array only on the
    thread whose stream built it ('There is no Stream(cpu, N) in current thread'),
    and concurrent evaluations of it could crash the process."""
    for _ in range(runs):
        proc = _python(_THREADS_SCRIPT.replace("sys.argv[1]", repr(backend)))
        assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out["n_errors"] == 0, out["errors"]
        assert out["results"] == 8 * 4 and out["differ"] == [], out


# ---- the compiler ----------------------------------------------------------------


def _fake_compiler(tmp_path: Path, version: str, dumpversion: str = "") -> str:
    """A script that answers ``--version`` / ``-dumpversion`` like a compiler."""
    script = tmp_path / "fakecxx"
    script.write_text("#!/bin/sh\n"
                      f"if [ \"$1\" = -dumpversion ]; then echo '{dumpversion}'; exit 0; fi\n"
                      f"cat <<'EOF'\n{version}\nEOF\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("version,dump,why", [
    ("Intel(R) oneAPI DPC++/C++ Compiler 2024.0.0", "", "neither clang nor GCC"),
    ("g++ (GCC) 9.4.0\nCopyright (C) 2019 Free Software Foundation", "9", "older than GCC 12"),
])
def test_unsupported_compiler_is_refused_in_one_line(tmp_path, monkeypatch, version, dump, why):
    """MLX_PRECISE_CXX naming a compiler the flags are not written for is refused
    before any build, in one line that names the compilers that work."""
    monkeypatch.setenv("MLX_PRECISE_CXX", _fake_compiler(tmp_path, version, dump))
    with pytest.raises(compiler.UnsupportedCompilerError) as e:
        compiler.find_compiler.__wrapped__()
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 400, msg
    for part in ("MLX_PRECISE_CXX", why, "clang++", "g++ >= 12", "pip install ziglang"):
        assert part in msg, (part, msg)
    # ... and the backend says so when asked for
    compiler.find_compiler.cache_clear()
    try:
        with pytest.raises(backends.BackendUnavailableError, match=why):
            backends.validate("emulate")
    finally:
        monkeypatch.undo()
        compiler.find_compiler.cache_clear()


def test_missing_compiler_hint_names_an_installable_compiler(monkeypatch):
    monkeypatch.delenv("MLX_PRECISE_CXX", raising=False)
    monkeypatch.setattr(compiler.shutil, "which", lambda name: None)
    monkeypatch.setitem(sys.modules, "ziglang", None)  # import raises ImportError
    with pytest.raises(compiler.CompilerNotFoundError, match=r"pip install ziglang"):
        compiler.find_compiler.__wrapped__()


def test_emulate_extra_brings_a_compiler():
    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extra = meta["optional-dependencies"]["emulate"]
    assert any(req.startswith("ziglang") for req in extra), extra


def test_compile_error_is_trimmed_with_a_log(tmp_path, monkeypatch):
    """Diagnostics from the first error, a bounded number of lines, and the path of
    the full log (which keeps the numbered source); never the whole source."""
    monkeypatch.setenv("MLX_PRECISE_CACHE", str(tmp_path))
    body = "uint i = thread_position_in_grid.x;\n" + "\n".join(
        f"o[i] = x[i] + undefined_{j};" for j in range(60))
    k = metal_kernel(name="many_errors", input_names=["x"], output_names=["o"], source=body)
    with pytest.raises(compiler.KernelCompileError) as e:
        k(inputs=[mx.zeros((4,))], grid=(4, 1, 1), threadgroup=(4, 1, 1),
          output_shapes=[(4,)], output_dtypes=[mx.float32])
    msg = str(e.value)
    lines = msg.splitlines()
    assert len(lines) <= compiler._DIAGNOSTIC_LINES + 3, len(lines)
    assert "failed to compile" in lines[0] and "error" in lines[1] and "undefined_0" in lines[1]
    assert "#include" not in msg  # no source dump
    log = Path(lines[-1].split(": ", 1)[1])
    assert log.parent == tmp_path / "failed" and log.is_file()
    text = log.read_text()
    assert "undefined_59" in text and " | o[i] = x[i] + undefined_59;" in text
    assert log.with_suffix(".cpp").is_file() and str(log.with_suffix(".cpp")) in msg


# g++: the same kernels through GCC, against the oracles and bit for bit against the
# default compiler's results (both IEEE per operation, no contraction, flush-to-zero
# from the launcher).
_GXX_SCRIPT = """
    import ctypes, sys
    from pathlib import Path
    import mlx.core as mx, numpy as np
    import mlx_precise as mp
    from mlx_precise.core.kernels import eft_selftest
    from mlx_precise.emulator import compiler, metal_kernel
    from mlx_precise.emulator.kernel import SHIM_DIR, _preload_libm

    assert compiler._family(compiler.find_compiler()) == "gcc", compiler.find_compiler()
    _preload_libm()
    src = Path("tests/emulator/shim_selfcheck.cpp").read_text()
    lib = ctypes.CDLL(str(compiler.build(src, "shim_selfcheck", [SHIM_DIR])))
    assert lib.shim_selfcheck() == 0
    eft_selftest("emulate")  # TwoSum, the fma residual, flush-to-zero
    np.savez(sys.argv[1], **{name: np.array(y) for name, y in OPS().items()})
"""

_OPS = """
def OPS():
    import mlx.core as mx, numpy as np
    import mlx_precise as mp
    from mlx_precise.emulator import metal_kernel
    rng = np.random.default_rng(1)
    c64 = (rng.standard_normal(64) + 1j * rng.standard_normal(64)).astype(np.complex64)
    c100 = (rng.standard_normal(100) + 1j * rng.standard_normal(100)).astype(np.complex64)
    r = rng.standard_normal(128).astype(np.float32)
    u = rng.standard_normal((1, 2, 32)).astype(np.float32)
    k = rng.standard_normal((2, 32)).astype(np.float32)
    # half rounds after each operation, as on the GPU: (1 + 2^-11) + 2^-11 is 1
    # (a tie to even, twice), not 1 + 2^-10 as in float; with d = 1 + 2^-10,
    # d * d - d is 2^-10 (the product rounded first), not 2^-10 + 2^-20.
    halves = metal_kernel(name="half_per_op", input_names=["x"], output_names=["o"], source='''
        half a = half(x[0]), b = half(x[1]), c = half(x[2]), d = half(x[3]);
        o[0] = float(a + b + c);
        o[1] = float(d * d - d);''')
    (h,) = halves(inputs=[mx.array(np.array([1, 2**-11, 2**-11, 1 + 2**-10], np.float32))],
                  grid=(1, 1, 1), threadgroup=(1, 1, 1), output_shapes=[(2,)],
                  output_dtypes=[mx.float32])
    dw = mp.fft_extended(mx.array(c100), round_output=False, backend="emulate")
    return {
        "fft64": mp.fft_extended(mx.array(c64), backend="emulate"),
        "fft100_hi": dw.hi, "fft100_lo": dw.lo,
        "rfft128": mp.rfft_extended(mx.array(r), backend="emulate"),
        "cmul": mp.complex_multiply_extended(mx.array(c64), mx.array(c64[::-1].copy()),
                                             backend="emulate"),
        "hyena": mp.hyena_conv_extended(mx.array(u), mx.array(k), backend="emulate"),
        "half": h,
    }
"""


def _gxx() -> str | None:
    gxx = shutil.which("g++")
    return gxx if gxx and compiler._family((gxx,), quiet=True) == "gcc" else None


@pytest.mark.skipif(_gxx() is None, reason="no g++ >= 12 here")
def test_gxx_runs_kernels_as_clang_does(tmp_path):
    out = tmp_path / "gxx.npz"
    proc = _python(_OPS + textwrap.dedent(_GXX_SCRIPT).replace("sys.argv[1]", repr(str(out))),
                   env={"MLX_PRECISE_CXX": _gxx()})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = dict(np.load(out))
    ns: dict = {}
    exec(_OPS, ns)
    want = {name: np.array(y) for name, y in ns["OPS"]().items()}  # the default compiler
    for name in want:
        assert got[name].tobytes() == want[name].tobytes(), name
    assert got["half"].tolist() == [1.0, 2.0**-10]
    rng = np.random.default_rng(1)
    c64 = (rng.standard_normal(64) + 1j * rng.standard_normal(64)).astype(np.complex64)
    c100 = (rng.standard_normal(100) + 1j * rng.standard_normal(100)).astype(np.complex64)
    assert normwise_error((got["fft100_hi"], got["fft100_lo"]), fft_reference(c100, "fft")) < 1e-13
    assert normwise_error(got["fft64"], fft_reference(c64, "fft")) < 1e-7


# ---- the cache directory ------------------------------------------------------------


def test_unusable_cache_dir_names_the_variable(monkeypatch):
    monkeypatch.setenv("MLX_PRECISE_CACHE", "/dev/null/x")
    with pytest.raises(compiler.CacheDirError) as e:
        compiler.cache_dir()
    assert "MLX_PRECISE_CACHE='/dev/null/x'" in str(e.value)
    # through a kernel that is not built yet
    k = metal_kernel(name="cache_probe", input_names=["x"], output_names=["o"],
                     source="uint i = thread_position_in_grid.x; o[i] = x[i] * 3.0f - 0.5f;")
    with pytest.raises(compiler.CacheDirError, match="MLX_PRECISE_CACHE"):
        k(inputs=[mx.zeros((4,))], grid=(4, 1, 1), threadgroup=(4, 1, 1),
          output_shapes=[(4,)], output_dtypes=[mx.float32])


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root can write into a read-only directory")
def test_read_only_cache_dir_names_the_variable(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    monkeypatch.setenv("MLX_PRECISE_CACHE", str(ro))
    try:
        with pytest.raises(compiler.CacheDirError, match="MLX_PRECISE_CACHE"):
            compiler.cache_dir()
    finally:
        ro.chmod(0o700)
