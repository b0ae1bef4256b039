"""The package's own compiled float64 loops run compiled only where MLX's CPU kernel
folder (``<temp>/mlx/<version>/cpu``, whose libraries MLX loads by name) is private;
elsewhere uncompiled, with the same bits and one warning."""

import math
import os

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


def test_a_missing_folder_is_made_private_and_the_loops_run_compiled(temp, monkeypatch):
    assert jit.kernel_folder() == _folder(temp)
    assert jit.folder_is_private()
    st = os.stat(_folder(temp))
    assert st.st_uid == os.geteuid() and not st.st_mode & 0o022
    y = _exp(VALUES)
    assert _exp_error_ulps(y) < 1.0
    # MLX built its kernels where the check looked, and nowhere else under <temp>
    assert any(p.suffix == ".so" for p in _folder(temp).iterdir())
    assert [p.name for p in temp.iterdir()] == ["mlx"]


@pytest.mark.parametrize("how", ["group-writable", "world-writable", "sticky world-writable",
                                 "a parent world-writable"])
def test_a_folder_others_can_write_runs_the_loops_uncompiled(temp, how):
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
    y = _exp(VALUES)
    # nothing was built (or loaded) there, and the results are the compiled ones
    assert not any(folder.iterdir())
    os.chmod(target, 0o755)
    jit._private.clear()
    assert jit.folder_is_private()
    assert np.array_equal(_exp(VALUES), y, equal_nan=True)
    assert _exp_error_ulps(y) < 1.0


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
    assert _exp_error_ulps(_exp(VALUES[:2000])) < 1.0


def test_the_check_runs_once_per_folder(temp):
    assert jit.folder_is_private()
    os.chmod(_folder(temp), 0o777)  # (after the check: only a new <temp> is checked again)
    assert jit.folder_is_private()
    assert list(jit._private) == [os.fsencode(str(temp))]
