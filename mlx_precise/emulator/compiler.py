"""Finding clang, compiling generated kernel sources, and the on-disk library cache.

The compiler is ``clang++`` on PATH (or ``$MLX_PRECISE_CXX``), else the clang shipped
in the ``ziglang`` package (``python -m ziglang c++``). Libraries are cached under
``$MLX_PRECISE_CACHE`` (default ``~/.cache/mlx_precise/emulator``) keyed by a hash of
the full source, the flags and the compiler's identity; a build writes to a private
temporary file and renames it into place, so two processes building the same kernel
at once both end up with a complete library.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


class CompilerNotFoundError(RuntimeError):
    """No C++ compiler for the emulator."""


class KernelCompileError(RuntimeError):
    """The generated kernel source did not compile; the message shows both."""


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
    # half arithmetic rounds after every operation, as on the GPU (clang's default
    # keeps half expressions in float until the end of the expression).
    "-Xclang",
    "-ffloat16-excess-precision=none",
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
    """Return the command prefix of the C++ compiler the emulator uses."""
    env = os.environ.get("MLX_PRECISE_CXX")
    if env:
        return tuple(env.split())
    clang = shutil.which("clang++")
    if clang:
        return (clang,)
    try:
        import ziglang  # noqa: F401

        return (sys.executable, "-m", "ziglang", "c++")
    except ImportError:
        pass
    raise CompilerNotFoundError(
        "the Metal emulator needs clang: install clang++ on PATH, or "
        "`pip install ziglang` (included in mlx-precise[test]), or set MLX_PRECISE_CXX"
    )


@functools.lru_cache(maxsize=None)
def compiler_identity() -> str:
    cmd = find_compiler()
    try:
        out = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=120)
        return out.stdout.strip() or " ".join(cmd)
    except (OSError, subprocess.SubprocessError):
        return " ".join(cmd)


def link_flags() -> list[str]:
    """Flags that link one object into a kernel library."""
    if platform.system() == "Darwin":
        return ["-shared", "-undefined", "dynamic_lookup", "-nostdlib"]
    return ["-shared", "-nostdlib"]


def flags() -> list[str]:
    """Compile flags."""
    f = list(_BASE_FLAGS)
    # Hardware fma keeps metal::fma a single rounding and subject to the
    # flush-to-zero mode (libm's software fma ignores MXCSR); F16C converts half
    # in instructions (otherwise the compiler calls compiler-rt, which kernel
    # libraries do not link).
    cpu = _x86_features()
    f += [flag for feature, flag in (("fma", "-mfma"), ("f16c", "-mf16c")) if feature in cpu]
    return f


def cache_dir() -> Path:
    base = os.environ.get("MLX_PRECISE_CACHE")
    path = Path(base) if base else Path.home() / ".cache" / "mlx_precise" / "emulator"
    path.mkdir(parents=True, exist_ok=True)
    return path


def numbered(source: str) -> str:
    return "\n".join(f"{i:5d} | {line}" for i, line in enumerate(source.splitlines(), 1))


def _headers_digest(include_dirs: tuple) -> str:
    """Hash of every file in the include directories: a library built against other
    shim headers (another version of this package) is never reused."""
    h = hashlib.sha256()
    for d in include_dirs:
        for f in sorted(Path(d).rglob("*")):
            if f.is_file():
                h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def build(source: str, name: str, include_dirs: list[Path], label: str | None = None) -> Path:
    """Compile ``source`` into a shared library (cached) and return its path.

    ``name`` names the library file; ``label`` (default ``name``) names the kernel
    in error messages."""
    cmd = find_compiler()
    fl = flags() + [f"-I{d}" for d in include_dirs]
    key = hashlib.sha256(
        "\0".join([source, " ".join(fl + link_flags()), compiler_identity(),
                   platform.machine(), _headers_digest(tuple(include_dirs))]).encode()
    ).hexdigest()[:32]
    lib = cache_dir() / f"{name[:80]}-{key}.so"
    if lib.exists():
        return lib
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        src = Path(tmp) / "kernel.cpp"
        src.write_text(source)
        obj, out = Path(tmp) / "kernel.o", Path(tmp) / "kernel.so"
        proc = subprocess.run([*cmd, *fl, "-c", str(src), "-o", str(obj)], capture_output=True, text=True)
        if proc.returncode == 0:
            proc = subprocess.run([*cmd, *link_flags(), str(obj), "-o", str(out)],
                                  capture_output=True, text=True)
        if proc.returncode != 0:
            raise KernelCompileError(
                f"kernel {label or name!r} failed to compile.\n\nGenerated source:\n{numbered(source)}"
                f"\n\nCompiler ({' '.join(cmd)}) said:\n{proc.stderr.strip()}"
            )
        os.replace(out, lib)  # atomic: concurrent builders each install a whole file
    return lib
