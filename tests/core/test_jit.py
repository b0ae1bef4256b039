"""The package's own compiled float64 loops run compiled only where MLX's CPU kernel
folder (``<temp>/mlx/<version>/cpu``, whose libraries MLX loads by name) is private;
elsewhere uncompiled, with the same bits and one warning."""

import hashlib
import math
import os
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest

from mlx_precise.core import jit
from mlx_precise.doubleword import engine64

import mpmath


@pytest.fixture
def temp(tmp_path, monkeypatch):
    """A fresh <temp> for MLX's compiler (TMPDIR), forgotten by the check afterwards."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(jit, "_private", {})
    return tmp_path


def _folder(temp):
    return temp / "mlx" / mx.__version__ / "cpu"


def _exp(v):
    with mx.stream(mx.cpu):
        x = mx.array(v, dtype=mx.float64)
        return np.array(engine64.exp64(x))


VALUES = np.concatenate([np.linspace(-700.0, 709.0, 20001), [0.0, -0.0, 1e-300, 88.7]])


def _exp_error_ulps(y):
    worst = 0.0
    with mpmath.workprec(120):
        for v, got in zip(VALUES[::97], y[::97]):
            want = mpmath.exp(mpmath.mpf(float(v)))
            ulp = math.ulp(float(want))
            worst = max(worst, abs(float((mpmath.mpf(float(got)) - want) / ulp)))
    return worst


_RUN = """
import hashlib, warnings, numpy as np, mlx.core as mx
from mlx_precise.doubleword import engine64
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    with mx.stream(mx.cpu):
        y = np.array(engine64.exp64(mx.array(np.linspace(-700.0, 709.0, 20001), dtype=mx.float64)))
print(hashlib.sha256(y.tobytes()).hexdigest(), len(w), w[0].category.__name__ if w else "")
"""


def _fresh_process(temp) -> tuple[str, int, str]:
    """exp64 of 20001 values (compiled when allowed) in a new process (MLX keeps
    the kernels it built in memory: only a new process shows what it loads);
    (digest of the results, warnings, the first warning's class)."""
    env = {**os.environ, "TMPDIR": str(temp)}
    out = subprocess.run([sys.executable, "-c", _RUN], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    return out[0], int(out[1]), out[2] if len(out) > 2 else ""


def test_the_loops_run_compiled_only_in_a_private_folder(tmp_path):
    safe, unsafe = tmp_path / "safe", tmp_path / "unsafe"
    safe.mkdir()
    digest, warned, _ = _fresh_process(safe)
    # the folder was made private and MLX built its kernels there, nowhere else
    folder = _folder(safe)
    st = os.stat(folder)
    assert st.st_uid == os.geteuid() and not st.st_mode & 0o022 and warned == 0
    assert any(p.suffix == ".so" for p in folder.iterdir())
    assert [p.name for p in safe.iterdir()] == ["mlx"]
    # another user could write the folder: nothing built or loaded there, one
    # warning, the same bits
    _folder(unsafe).mkdir(parents=True)
    os.chmod(_folder(unsafe), 0o777)
    assert _fresh_process(unsafe) == (digest, 1, "UnsafeJitFolderWarning")
    assert not any(_folder(unsafe).iterdir())
    y = _exp(VALUES[:20001])
    assert hashlib.sha256(y.tobytes()).hexdigest() == digest
    assert _exp_error_ulps(y) < 1.0


@pytest.mark.parametrize("how", ["group-writable", "world-writable", "sticky world-writable",
                                 "a parent world-writable"])
def test_a_folder_others_can_write_is_refused(temp, how):
    folder = _folder(temp)
    folder.mkdir(parents=True)
    target, mode = {
        "group-writable": (folder, 0o775),
        "world-writable": (folder, 0o777),
        "sticky world-writable": (folder, 0o1777),  # others may still add a library
        "a parent world-writable": (folder.parent, 0o777),
    }[how]
    os.chmod(target, mode)
    with pytest.warns(jit.UnsafeJitFolderWarning, match="can write it"):
        assert not jit.folder_is_private()
    os.chmod(target, 0o755)
    jit._private.clear()
    assert jit.folder_is_private()


def test_a_sticky_shared_temp_is_fine(temp):
    os.chmod(temp, 0o1777)
    assert jit.folder_is_private()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
@pytest.mark.parametrize("what", ["mlx", "link"])
def test_a_folder_or_link_of_another_user_is_refused(temp, what):
    folder = _folder(temp)
    if what == "mlx":
        folder.mkdir(parents=True)
        os.chown(temp / "mlx", 65534, 65534)
        match = "belongs to uid 65534"
    else:
        real = temp / "elsewhere"
        real.mkdir()
        os.symlink(real, temp / "mlx")
        os.lchown(temp / "mlx", 65534, 65534)
        match = "link that belongs to uid 65534"
    with pytest.warns(jit.UnsafeJitFolderWarning, match=match):
        assert not jit.folder_is_private()


def test_the_check_runs_once_per_folder(temp):
    assert jit.folder_is_private()
    os.chmod(_folder(temp), 0o777)  # (after the check: only a new <temp> is checked again)
    assert jit.folder_is_private()
    assert list(jit._private) == [os.fsencode(str(temp))]


def _built(temp) -> int:
    folder = _folder(temp)
    return sum(p.suffix == ".so" for p in folder.iterdir()) if folder.exists() else 0


def test_a_small_call_compiles_once_repeated_a_big_one_at_once(temp):
    """MLX's compiler spends about 0.8 s per kernel: a small call runs its ops
    separately until a call of the same shapes has been seen COMPILE_AT times, then
    compiled (one kernel); a call of FUSE_MIN elements compiles at once. The same
    bits either way; float64 oracle: numpy."""
    c = 1.0 + float(np.random.default_rng().random())  # a constant: a kernel no one built

    def formula(x):
        return x * c + c

    f = jit.compile(formula)
    v = np.linspace(-3.0, 3.0, 7)
    want = v * c + c
    with mx.stream(mx.cpu):
        x = mx.array(v, dtype=mx.float64)
        for call in range(1, jit.COMPILE_AT + 2):
            np.testing.assert_array_equal(np.array(f(x)), want)
            assert _built(temp) == (call >= jit.COMPILE_AT), call
            if call == 3:  # another shape is counted apart
                np.testing.assert_array_equal(np.array(f(x[:3])), want[:3])
                assert _built(temp) == 0
        g = jit.compile(lambda x: x * (c + 1.0))
        big = mx.arange(jit.FUSE_MIN, dtype=mx.float64)
        np.testing.assert_array_equal(np.array(g(big)), np.arange(jit.FUSE_MIN) * (c + 1.0))
    assert _built(temp) == 2
