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
    "-shared",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-fno-strict-aliasing",
    "-fwrapv",  # signed overflow wraps, as on the GPU
    "-g0",
    "-w",
    # half arithmetic rounds after every operation, as on the GPU (clang's default
    # keeps half expressions in float until the end of the expression).
    "-Xclang",
    "-ffloat16-excess-precision=none",
]


def _has_cpu_fma() -> bool:
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " fma" in flags


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


def flags(shared: bool = True) -> list[str]:
    """Compiler flags (``shared=False`` for a standalone program)."""
    f = [x for x in _BASE_FLAGS if shared or x not in ("-shared", "-fPIC")]
    # Hardware fma keeps metal::fma a single rounding and subject to the
    # flush-to-zero mode; libm's software fma ignores MXCSR.
    if _has_cpu_fma():
        f.append("-mfma")
    return f


def cache_dir() -> Path:
    base = os.environ.get("MLX_PRECISE_CACHE")
    path = Path(base) if base else Path.home() / ".cache" / "mlx_precise" / "emulator"
    path.mkdir(parents=True, exist_ok=True)
    return path


def numbered(source: str) -> str:
    return "\n".join(f"{i:5d} | {line}" for i, line in enumerate(source.splitlines(), 1))


def build(source: str, name: str, include_dirs: list[Path], label: str | None = None) -> Path:
    """Compile ``source`` into a shared library (cached) and return its path.

    ``name`` names the library file; ``label`` (default ``name``) names the kernel
    in error messages."""
    cmd = find_compiler()
    fl = flags() + [f"-I{d}" for d in include_dirs]
    key = hashlib.sha256(
        "\0".join([source, " ".join(fl), compiler_identity(), platform.machine()]).encode()
    ).hexdigest()[:32]
    lib = cache_dir() / f"{name[:80]}-{key}.so"
    if lib.exists():
        return lib
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        src = Path(tmp) / "kernel.cpp"
        src.write_text(source)
        out = Path(tmp) / "kernel.so"
        proc = subprocess.run([*cmd, *fl, str(src), "-o", str(out)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise KernelCompileError(
                f"kernel {label or name!r} failed to compile.\n\nGenerated source:\n{numbered(source)}"
                f"\n\nCompiler ({' '.join(cmd)}) said:\n{proc.stderr.strip()}"
            )
        os.replace(out, lib)  # atomic: concurrent builders each install a whole file
    return lib
