"""Finding a C++ compiler, compiling generated kernel sources, and the on-disk
library cache.

The compiler is ``$MLX_PRECISE_CXX`` if set, else ``clang++`` on PATH, else the clang
shipped in the ``ziglang`` package (``python -m ziglang c++``, the ``emulate``
extra), else ``g++`` on PATH. clang and GCC >= 12 are supported; any other compiler
is refused up front, since the flags below are what make the C++ compute as the GPU
does. Libraries are cached under ``$MLX_PRECISE_CACHE`` (default
``~/.cache/mlx_precise/emulator``) keyed by a hash of the full source, the flags and
the compiler's identity. The cache is code this process runs, so it is private: the
folder is created 0700, a folder another user owns or can write is refused
(:class:`InsecureCacheError`), and a library is loaded only if this user owns it,
nobody else can write it and its content hashes to the digest recorded when it was
built (anything else is rebuilt). A build writes to a private temporary folder and
renames the library and its record into place, so two processes building the same
kernel at once both end up with a complete, consistent pair. A failed build keeps
its source and full compiler output under ``failed/`` in the cache and reports the
first diagnostics.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from .private import unsafe_folder, unsafe_status


class CompilerNotFoundError(RuntimeError):
    """No C++ compiler for the emulator."""


class UnsupportedCompilerError(CompilerNotFoundError):
    """``$MLX_PRECISE_CXX`` names a compiler the emulator cannot drive."""


class KernelCompileError(RuntimeError):
    """The generated kernel source did not compile; the message shows the first
    diagnostics and the path of the full log."""


class CacheDirError(RuntimeError):
    """The kernel library cache directory cannot be created or written."""


_CXX_ENV = "MLX_PRECISE_CXX"
_CACHE_ENV = "MLX_PRECISE_CACHE"
_MIN_GCC = 12  # first GCC with _Float16 (Metal's half) in C++ on x86-64
# ziglang (what the `emulate` extra names) by its own name: mlx-precise is not on
# the package index yet, so its extras do not resolve there.
_INSTALL_HINT = ("clang++ on PATH, `pip install ziglang` (its clang; the `emulate` "
                 f"extra of a checkout: `pip install -e \".[emulate]\"`), or g++ >= {_MIN_GCC}")


# Metal semantics the flags enforce: IEEE float32 with no contraction of a*b+c into
# fma (contraction would change roundings; TwoProd uses an explicit fma) and no fast
# math (which lets the compiler cancel (a + b) - a and kills TwoSum).
_BASE_FLAGS = [
    "-std=c++17",
    "-O2",
    "-fPIC",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-fno-strict-aliasing",
    "-fwrapv",  # signed overflow wraps, as on the GPU
    "-g0",
    # No C++ runtime in kernel libraries (no exceptions, RTTI or static guards), so
    # they link with -nostdlib: zig's clang then never builds libc++ or glibc stubs
    # (minutes on a fresh machine); libc/libm symbols resolve from the process.
    "-fno-exceptions",
    "-fno-rtti",
    "-fno-threadsafe-statics",
    "-w",
    # Large stack frames touch their pages in order, so a thread whose local
    # arrays outgrow its fiber stack hits the guard page below it (a reported
    # fault) rather than another fiber's stack.
    "-fstack-clash-protection",
    # -ffloat16-excess-precision / -fexcess-precision: see _family_flags.
]


@functools.lru_cache(maxsize=None)
def _x86_features() -> frozenset:
    """CPU feature flags of an x86-64 Linux host (empty elsewhere)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return frozenset()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return frozenset(line.split(":", 1)[-1].split())


@functools.lru_cache(maxsize=None)
def find_compiler() -> tuple[str, ...]:
    """Return the command prefix of the C++ compiler the emulator uses.

    Raises:
        CompilerNotFoundError: no compiler found.
        UnsupportedCompilerError: ``$MLX_PRECISE_CXX`` is neither clang nor GCC >= 12.
    """
    env = os.environ.get(_CXX_ENV)
    if env:
        cmd = tuple(env.split())
        _family(cmd)  # refuse an unusable compiler here, not at the first build
        return cmd
    clang = shutil.which("clang++")
    if clang:
        return (clang,)
    try:
        import ziglang

        # `python -m ziglang` execs this binary: calling it directly saves starting
        # a Python per compile and per link.
        zig = Path(ziglang.__file__).resolve().parent / "zig"
        if os.name == "posix" and zig.is_file() and os.access(zig, os.X_OK):
            return (str(zig), "c++")
        return (sys.executable, "-m", "ziglang", "c++")
    except ImportError:
        pass
    gxx = shutil.which("g++")
    if gxx and _family((gxx,), quiet=True):
        return (gxx,)
    raise CompilerNotFoundError(f"the Metal emulator needs a C++ compiler: {_INSTALL_HINT}, "
                                f"or set {_CXX_ENV}")


@functools.lru_cache(maxsize=None)
def _version_text(cmd: tuple[str, ...]) -> str:
    """``cmd --version`` (stdout), or "" when it cannot run."""
    try:
        out = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=120)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


@functools.lru_cache(maxsize=None)
def _family(cmd: tuple[str, ...], quiet: bool = False) -> str | None:
    """``"clang"`` or ``"gcc"``: the compilers whose flags (``_family_flags``) give
    the GPU's semantics. Anything else raises (or, ``quiet``, returns None)."""
    text = _version_text(cmd)
    first = text.splitlines()[0] if text else ""
    family = None
    why = f"{first!r} is neither clang nor GCC" if text else "it did not answer --version"
    if "clang" in text:
        family = "clang"
    elif "Free Software Foundation" in text:
        family = "gcc" if _gcc_major(cmd) >= _MIN_GCC else None
        why = f"{first!r} is older than GCC {_MIN_GCC}"
    if family is None and not quiet:
        raise UnsupportedCompilerError(
            f"{_CXX_ENV}={' '.join(cmd)!r} cannot build the Metal emulator's kernels: {why}; "
            f"use {_INSTALL_HINT}")
    return family


@functools.lru_cache(maxsize=None)
def _gcc_major(cmd: tuple[str, ...]) -> int:
    """GCC's major version (0 when ``-dumpversion`` says nothing usable)."""
    try:
        out = subprocess.run([*cmd, "-dumpversion"], capture_output=True, text=True, timeout=120)
        return int(out.stdout.split(".")[0])
    except (OSError, subprocess.SubprocessError, ValueError):
        return 0


def compiler_identity() -> str:
    cmd = find_compiler()
    return _version_text(cmd) or " ".join(cmd)


def link_flags() -> list[str]:
    """Flags that link one object into a kernel library."""
    if platform.system() == "Darwin":
        return ["-shared", "-undefined", "dynamic_lookup", "-nostdlib"]
    return ["-shared", "-nostdlib"]


def link_libs() -> list[str]:
    """Libraries linked after the object (a static library only supplies symbols
    that objects before it need)."""
    if _family(find_compiler()) == "gcc":
        # GCC's manual (Link Options, -nostdlib): code GCC generates may call
        # libgcc's helpers (e.g. __truncdfhf2, double -> _Float16), so link libgcc.a.
        return ["-lgcc"]
    return []


def _family_flags(family: str) -> list[str]:
    """Half arithmetic rounds after every operation, as on the GPU; by default both
    compilers may keep a _Float16 expression in float to its end."""
    if family == "clang":
        # clang's Language Extensions manual, "Half-Precision Floating Point".
        return ["-Xclang", "-ffloat16-excess-precision=none"]
    # GCC's manual, Optimize Options (-fexcess-precision=16, since GCC 12; GCC 13
    # made =standard, excess precision, the default for ISO C++).
    return ["-fexcess-precision=16"]


def flags() -> list[str]:
    """Compile flags."""
    f = list(_BASE_FLAGS) + _family_flags(_family(find_compiler()))
    # Hardware fma keeps metal::fma a single rounding and subject to the
    # flush-to-zero mode (libm's software fma ignores MXCSR); F16C converts half
    # in instructions (otherwise the compiler calls compiler-rt, which kernel
    # libraries do not link).
    cpu = _x86_features()
    f += [flag for feature, flag in (("fma", "-mfma"), ("f16c", "-mf16c")) if feature in cpu]
    return f


class InsecureCacheError(CacheDirError):
    """The kernel cache folder (or one above it) can be written by another user, or
    belongs to one: the emulator loads and runs the libraries it finds there, so it
    refuses, as ssh refuses a key file others can read."""


def _default_cache() -> Path:
    return Path.home() / ".cache" / "mlx_precise" / "emulator"


def _make_private(path: Path) -> None:
    """Create ``path`` and any missing parents with mode 0700 whatever the umask
    (``mkdir(mode=)`` is masked by it; ``chmod`` is not)."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:  # another process made it meanwhile; checked below
            continue
        os.chmod(p, 0o700)


def _check_private(path: Path, where: str) -> None:
    """Refuse a cache folder another user could plant code in: the folder itself must
    be ours and private to us (no group or other write), each folder above it ours or
    root's and not writable by others (unless sticky), no link on the way another
    user could repoint (:func:`.private.unsafe_folder`)."""
    found = unsafe_folder(path)
    if found is None:
        return
    p, why = found
    if "link" in why:
        raise InsecureCacheError(
            f"the Metal emulator's kernel cache {where} is reached through the link "
            f"{str(p)!r}: {why}; set {_CACHE_ENV} to a folder of your own")
    fix = (f"chmod go-w {str(p)!r}" if "can write" in why
           else f"set {_CACHE_ENV} to a folder of your own")
    raise InsecureCacheError(
        f"the Metal emulator's kernel cache {where} is not private: {str(p)!r} "
        f"is unsafe because {why}; the emulator runs the libraries it caches, "
        f"so another user could run code as you. Fix: {fix} "
        f"(or set {_CACHE_ENV} to a folder only you can write)")


def cache_dir() -> Path:
    """The library cache, created private (0700) if absent.

    Raises:
        InsecureCacheError: the folder, or one above it, can be written by another
            user or belongs to one (see docs/emulator.md, "The cache is code").
            The default folder, when it is ours, is tightened to 0700 instead
            (an older version may have created it under a permissive umask; every
            library in it is verified before it is loaded anyway).
        CacheDirError: it cannot be created or written (no fallback elsewhere: a
            cache in an unexpected place would go unnoticed and fill a disk).
    """
    base = os.environ.get(_CACHE_ENV)
    path = Path(base) if base else _default_cache()
    where = f"{_CACHE_ENV}={base!r}" if base else f"the default {str(path)!r}"
    try:
        _make_private(path)
        if not base and path.stat().st_uid == os.geteuid():
            os.chmod(path, 0o700)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError("not writable")
    except OSError as e:
        raise CacheDirError(
            f"the Metal emulator's kernel cache {where} cannot be used "
            f"({type(e).__name__}: {e.strerror or e}); set {_CACHE_ENV} to a writable "
            "directory") from None
    _check_private(path, where)
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _trusted_file(path: Path) -> bool:
    """A regular file (not a link) that this user owns and nobody else can write."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and unsafe_status(st, os.geteuid(), owner_only=True) is None


def _cached(folder: Path, stem: str, key: str, suffix: str = ".so") -> Path | None:
    """The verified library for ``key``, or None (absent, or not to be trusted).

    The record ``<stem>.json`` names the digest of the library this user's
    compiler produced for ``key``; the library is ``<stem>.<digest>.so``. Both must
    be regular files this user owns and nobody else can write, the record must be
    for ``key``, and the library's content must hash to the recorded digest:
    anything else (planted, altered, truncated) is rebuilt, never loaded."""
    record = folder / f"{stem}.json"
    if not _trusted_file(record):
        return None
    try:
        meta = json.loads(record.read_text())
        lib = folder / f"{stem}.{meta['sha256']}{suffix}"
        if meta.get("key") != key or not _trusted_file(lib) or _digest(lib) != meta["sha256"]:
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return lib


def _install(built: Path, folder: Path, stem: str, key: str, suffix: str = ".so") -> Path:
    """Move a fresh library into the cache under its digest and write its record.
    Both land by ``os.replace`` (atomic), so concurrent builders of one kernel each
    leave a consistent pair: a record only ever names a library with that digest."""
    digest = _digest(built)
    os.chmod(built, 0o600)
    lib = folder / f"{stem}.{digest}{suffix}"
    os.replace(built, lib)
    tmp = built.with_suffix(".json")
    tmp.write_text(json.dumps({"key": key, "sha256": digest}))
    os.chmod(tmp, 0o600)
    os.replace(tmp, folder / f"{stem}.json")
    return lib


def numbered(source: str) -> str:
    return "\n".join(f"{i:5d} | {line}" for i, line in enumerate(source.splitlines(), 1))


_DIAGNOSTIC_LINES = 30  # of the compiler's output in the exception; the rest in the log


def _trimmed(output: str) -> str:
    """The compiler's output from its first error on (what precedes, such as "In
    file included from" chains, is context), at most _DIAGNOSTIC_LINES lines."""
    lines = output.strip().splitlines()
    first = next((i for i, ln in enumerate(lines) if "error" in ln), 0)
    lines = lines[first:]
    if len(lines) > _DIAGNOSTIC_LINES:
        lines = lines[:_DIAGNOSTIC_LINES] + [f"... ({len(lines) - _DIAGNOSTIC_LINES} more lines)"]
    return "\n".join(lines)


def _keep_failed(source: str, stem: str, command: list[str], output: str,
                 tmp_src: str) -> tuple[str, Path]:
    """Keep a failed build's source and full log under ``failed/`` in the cache
    (the build's temporary directory goes away). Returns the compiler output, naming
    the kept source instead of the temporary one, and the log's path."""
    failed = cache_dir() / "failed"
    failed.mkdir(mode=0o700, exist_ok=True)
    src, log = failed / f"{stem}.cpp", failed / f"{stem}.log"
    output = output.replace(tmp_src, str(src))
    src.write_text(source)
    log.write_text(f"$ {' '.join(command).replace(tmp_src, str(src))}\n\n{output}\n\n"
                   f"Generated source ({src}):\n{numbered(source)}\n")
    return output, log


def _headers_digest(include_dirs: tuple) -> str:
    """Hash of every file in the include directories: a library built against other
    shim headers (another version of this package) is never reused."""
    h = hashlib.sha256()
    for d in include_dirs:
        for f in sorted(Path(d).rglob("*")):
            if f.is_file():
                h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _precompiled(header: Path, cmd: tuple[str, ...], fl: list[str], headers: str,
                 folder: Path) -> Path | None:
    """clang's precompiled ``header`` for these flags (cached and verified as a library
    is: it becomes part of every kernel built with it), or None (not clang, or it
    does not build). A unit that starts by including ``header`` compiles to the same
    object with it, in a fraction of the time: parsing the shim is most of a build."""
    if _family(cmd) != "clang":
        return None
    key = hashlib.sha256("\0".join(["pch", header.name, " ".join(fl), compiler_identity(),
                                    platform.machine(), headers]).encode()).hexdigest()[:32]
    stem = f"pch-{header.name}-{key}"
    pch = _cached(folder, stem, key, ".pch")
    if pch is not None:
        return pch
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        out = Path(tmp) / "header.pch"
        # No timestamps: the key covers the headers' content (a checkout that only
        # touches them keeps the header usable).
        command = [*cmd, *fl, "-Xclang", "-fno-pch-timestamp", "-x", "c++-header", str(header),
                   "-o", str(out)]
        if subprocess.run(command, capture_output=True, text=True).returncode != 0:
            return None
        return _install(out, folder, stem, key, ".pch")


def build(source: str, name: str, include_dirs: list[Path], label: str | None = None,
          precompile: str | None = None) -> Path:
    """Compile ``source`` into a shared library (cached) and return its path.

    ``name`` names the library file; ``label`` (default ``name``) names the kernel
    in error messages. ``precompile``: a header in the first include directory that
    ``source`` includes first, to build through a precompiled header (clang)."""
    cmd = find_compiler()
    fl = flags() + [f"-I{d}" for d in include_dirs]
    headers = _headers_digest(tuple(include_dirs))
    key = hashlib.sha256(
        "\0".join([source, " ".join(fl + link_flags() + link_libs()), compiler_identity(),
                   platform.machine(), headers]).encode()
    ).hexdigest()[:32]
    stem = f"{name[:80]}-{key}"
    folder = cache_dir()
    lib = _cached(folder, stem, key)
    if lib is not None:
        return lib
    pch = (_precompiled(Path(include_dirs[0]) / precompile, cmd, fl, headers, folder)
           if precompile else None)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        src = Path(tmp) / "kernel.cpp"
        src.write_text(source)
        obj, out = Path(tmp) / "kernel.o", Path(tmp) / "kernel.so"
        command = [*cmd, *fl, "-c", str(src), "-o", str(obj)]
        proc = None
        if pch is not None:
            proc = subprocess.run(command[:-4] + ["-include-pch", str(pch)] + command[-4:],
                                  capture_output=True, text=True)
        if proc is None or proc.returncode != 0:
            # Without the precompiled header: diagnostics as always (and a build
            # the precompiled header cannot serve still succeeds).
            proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode == 0:
            command = [*cmd, *link_flags(), str(obj), *link_libs(), "-o", str(out)]
            proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0:
            output, log = _keep_failed(source, stem, command, proc.stderr + proc.stdout, str(src))
            raise KernelCompileError(
                f"kernel {label or name!r} failed to compile ({' '.join(cmd)}):\n"
                f"{_trimmed(output)}\nFull log and generated source: {log}")
        return _install(out, folder, stem, key)
