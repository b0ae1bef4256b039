"""Compatibility re-exports: the names other packages import from
``mlx_precise.doubleword.words``. The code lives in modules by concern:
:mod:`.types` (DoubleWord, :func:`~.types.read_input`, split), :mod:`.hostsplit`
(host split / join), :mod:`.engine64` (the cpu float64 engine), :mod:`.kernel_engine`
(the metal / emulate engine), :mod:`.dw_kernels` (the dw_ops / cdw_ops kernels and
their codes) and :mod:`.arithmetic` (the operators and the dispatch between the
engines)."""

from .arithmetic import arith, operate
from .dw_kernels import CDW_OPS, DW_OPS
from .engine64 import from64, from_float64_result, to64
from .hostsplit import complex_from_parts, join, low_from_wide
from .types import DoubleWord, as_complex, combine, real_imag, split

binary = operate  # the name mlx_precise.extended.arith calls
negate = DoubleWord.__neg__  # likewise: -x, exact

__all__ = ["CDW_OPS", "DW_OPS", "DoubleWord", "arith", "as_complex", "binary",
           "combine", "complex_from_parts", "from64", "from_float64_result", "join",
           "low_from_wide", "negate", "operate", "real_imag", "split", "to64"]
