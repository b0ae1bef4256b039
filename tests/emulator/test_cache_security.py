"""The emulator's library cache holds code this process runs: it must be private,
and a library is loaded only if this user owns it, nobody else can write it and its
content is what this user's compiler produced. Each attack here ran code on the
landed main before the cache was made private."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mlx_precise.emulator import compiler
from mlx_precise.emulator.kernel import SHIM_DIR, _preload_libm

is_root = hasattr(os, "geteuid") and os.geteuid() == 0
needs_root = pytest.mark.skipif(not is_root, reason="giving a file to another user needs root")
NOBODY = 65534

# A library an attacker plants: its constructor leaves a marker when it is loaded.
_EVIL = textwrap.dedent("""
    #include <fcntl.h>
    #include <unistd.h>
    __attribute__((constructor)) static void pwn() {
      int fd = open(MARKER, O_CREAT | O_WRONLY, 0600);
      if (fd >= 0) close(fd);
    }
    extern "C" int answer() { return 666; }
""")
_GOOD = 'extern "C" int answer() { return 42; }\n'


def _evil_library(tmp_path: Path, marker: Path) -> bytes:
    src = tmp_path / "evil.cpp"
    src.write_text(f'#define MARKER "{marker}"\n' + _EVIL)
    out = tmp_path / "evil.so"
    # Linked as the emulator links its kernels (no C++ runtime: quick with any
    # compiler); open / close resolve from the process when it is loaded.
    subprocess.run([*compiler.find_compiler(), "-fPIC", "-fno-exceptions", *compiler.link_flags(),
                    str(src), "-o", str(out)], check=True, capture_output=True)
    return out.read_bytes()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("MLX_PRECISE_CACHE", str(folder))
    _preload_libm()
    return folder


def _only_library(folder: Path) -> Path:
    libs = list(folder.glob("*.so"))
    assert len(libs) == 1, libs
    return libs[0]


# ---- the folder ----------------------------------------------------------------------


def test_default_cache_is_private_under_a_permissive_umask(tmp_path, monkeypatch):
    monkeypatch.delenv("MLX_PRECISE_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    old = os.umask(0o002)
    try:
        path = compiler.cache_dir()
    finally:
        os.umask(old)
    assert path == tmp_path / ".cache" / "mlx_precise" / "emulator"
    for p in (tmp_path / ".cache", tmp_path / ".cache" / "mlx_precise", path):
        assert p.stat().st_mode & 0o777 == 0o700, (p, oct(p.stat().st_mode))


def test_default_cache_made_permissive_by_an_older_version_is_tightened(tmp_path, monkeypatch):
    monkeypatch.delenv("MLX_PRECISE_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    old = tmp_path / ".cache" / "mlx_precise" / "emulator"
    old.mkdir(parents=True)
    for p in (tmp_path / ".cache", old.parent, old):
        p.chmod(0o755)
    old.chmod(0o775)
    assert compiler.cache_dir() == old and old.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("mode", [0o1777, 0o777, 0o775, 0o720])
def test_configured_cache_others_can_write_is_refused(tmp_path, monkeypatch, mode):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    monkeypatch.setenv("MLX_PRECISE_CACHE", str(shared))
    with pytest.raises(compiler.InsecureCacheError) as e:
        compiler.cache_dir()
    msg = str(e.value)
    assert "MLX_PRECISE_CACHE" in msg and str(shared) in msg and "chmod go-w" in msg
    assert oct(mode)[2:] in msg
    assert isinstance(e.value, compiler.CacheDirError)  # callers catching the old error


def test_cache_under_a_folder_others_can_write_is_refused(tmp_path, monkeypatch):
    """Anyone who can write a folder above the cache can rename the cache away and
    put their own in its place; a sticky folder (/tmp) forbids that."""
    above = tmp_path / "open"
    (above / "cache").mkdir(parents=True)
    (above / "cache").chmod(0o700)
    above.chmod(0o777)
    monkeypatch.setenv("MLX_PRECISE_CACHE", str(above / "cache"))
    with pytest.raises(compiler.InsecureCacheError, match=str(above)):
        compiler.cache_dir()
    above.chmod(0o1777)
    assert compiler.cache_dir() == above / "cache"


def test_new_configured_cache_is_private(tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_PRECISE_CACHE", str(tmp_path / "a" / "b"))
    old = os.umask(0)
    try:
        path = compiler.cache_dir()
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o700


@needs_root
def test_cache_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    monkeypatch.setenv("MLX_PRECISE_CACHE", str(theirs))
    with pytest.raises(compiler.InsecureCacheError, match=f"uid {NOBODY}"):
        compiler.cache_dir()


@needs_root
def test_cache_reached_through_another_users_link_is_refused(tmp_path, monkeypatch):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    os.lchown(link, NOBODY, NOBODY)
    monkeypatch.setenv("MLX_PRECISE_CACHE", str(link))
    with pytest.raises(compiler.InsecureCacheError, match="link"):
        compiler.cache_dir()


# ---- the libraries ----------------------------------------------------------------------


def test_a_library_is_reused_only_when_verified(cache):
    first = compiler.build(_GOOD, "verified", [SHIM_DIR])
    assert compiler.build(_GOOD, "verified", [SHIM_DIR]) == first  # reused, not rebuilt
    assert first.stat().st_mode & 0o777 == 0o600
    record = first.with_name(first.name.split(".")[0] + ".json")
    assert record.is_file() and record.stat().st_mode & 0o777 == 0o600


def _plant_and_rebuild(cache, tmp_path, plant):
    """Build a library, let ``plant`` tamper with the cache, build again: return the
    library the second build gives and the marker an attacker's constructor leaves."""
    marker = tmp_path / "pwned"
    evil = _evil_library(tmp_path, marker)
    compiler.build(_GOOD, "victim", [SHIM_DIR])
    plant(_only_library(cache), evil)
    lib = compiler.build(_GOOD, "victim", [SHIM_DIR])
    return lib, marker


def _check_not_run(lib, marker):
    assert ctypes.CDLL(str(lib)).answer() == 42
    assert not marker.exists(), "the planted library ran"


def test_same_owner_altered_library_is_rebuilt_not_loaded(cache, tmp_path):
    def alter(lib, evil):
        lib.write_bytes(evil)  # same owner, same mode, other content

    _check_not_run(*_plant_and_rebuild(cache, tmp_path, alter))


def test_altered_record_and_library_are_rebuilt_not_loaded(cache, tmp_path):
    """A record edited to name the planted library's digest is for another key... or
    claims this key with the digest of foreign bytes: either way the library's bytes
    must hash to a digest this build recorded."""
    import hashlib
    import json

    def swap(lib, evil):
        digest = hashlib.sha256(evil).hexdigest()
        stem = lib.name.split(".")[0]
        (cache / f"{stem}.{digest}.so").write_bytes(evil)
        rec = cache / f"{stem}.json"
        meta = json.loads(rec.read_text())
        rec.write_text(json.dumps({**meta, "sha256": digest, "key": "other"}))

    _check_not_run(*_plant_and_rebuild(cache, tmp_path, swap))


@needs_root
def test_foreign_owned_library_is_rebuilt_not_loaded(cache, tmp_path):
    """The attack that worked: another user replaces the cached library (and, since
    the digest is theirs to compute, its record) with their own."""
    import hashlib
    import json

    def replace(lib, evil):
        digest = hashlib.sha256(evil).hexdigest()
        stem = lib.name.split(".")[0]
        rec = cache / f"{stem}.json"
        key = json.loads(rec.read_text())["key"]
        lib.unlink()
        planted = cache / f"{stem}.{digest}.so"
        planted.write_bytes(evil)
        rec.write_text(json.dumps({"key": key, "sha256": digest}))
        for f in (planted, rec):
            os.chown(f, NOBODY, NOBODY)

    _check_not_run(*_plant_and_rebuild(cache, tmp_path, replace))


def test_a_kernel_never_runs_a_planted_library(tmp_path):
    """End to end: a kernel launched in a new process after its cached library was
    replaced computes the right result and the planted constructor never runs."""
    cache = tmp_path / "cache"
    marker = tmp_path / "pwned"
    script = textwrap.dedent("""
        import sys
        import mlx.core as mx
        from mlx_precise.emulator import metal_kernel
        k = metal_kernel(name="planted_victim", input_names=["x"], output_names=["o"],
                         source="uint i = thread_position_in_grid.x; o[i] = x[i] * 3.0f;")
        (o,) = k(inputs=[mx.arange(4, dtype=mx.float32)], grid=(4, 1, 1),
                 threadgroup=(4, 1, 1), output_shapes=[(4,)], output_dtypes=[mx.float32])
        print(o.tolist())
    """)
    env = dict(os.environ, MLX_PRECISE_CACHE=str(cache))

    def run():
        return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True)

    assert run().stdout.strip() == "[0.0, 3.0, 6.0, 9.0]"
    _only_library(cache).write_bytes(_evil_library(tmp_path, marker))
    second = run()
    assert not marker.exists(), "the planted library ran"
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "[0.0, 3.0, 6.0, 9.0]"
