"""The Metal emulator: run MLX custom Metal kernels on a CPU.

:func:`metal_kernel` takes the same arguments as ``mx.fast.metal_kernel`` and runs
the same kernel source, compiled as C++ (clang or GCC) through a shim of the Metal
language, with Apple-GPU numerics (float32 subnormals flushed to zero, no
contraction, no fast math) and Metal's grid semantics (threadgroups, barriers,
simdgroups of 32, atomics).

:func:`check_source` (and ``metal_kernel(..., strict=True)``) parses a kernel the
way Metal's front end would, with real address spaces, through clang's C++ for
OpenCL: a Linux-side gate for code that only Apple's compiler would reject.
"""

from .compiler import (
    CacheDirError,
    CompilerNotFoundError,
    KernelCompileError,
    UnsupportedCompilerError,
    find_compiler,
)
from .kernel import MetalKernel, OutOfBoundsReadWarning, TransformNotEmulatedError, metal_kernel
from .signature import Metal4TensorError
from .strict import CheckerNotFoundError, MetalCheckError, check_source

__all__ = [
    "CacheDirError",
    "CheckerNotFoundError",
    "CompilerNotFoundError",
    "MetalCheckError",
    "check_source",
    "KernelCompileError",
    "Metal4TensorError",
    "MetalKernel",
    "OutOfBoundsReadWarning",
    "TransformNotEmulatedError",
    "UnsupportedCompilerError",
    "find_compiler",
    "metal_kernel",
]
