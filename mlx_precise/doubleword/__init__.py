"""The number system: double-word ("float-float") values and their kernels.

* :mod:`.types`: :class:`DoubleWord`, :func:`~.types.read_input` (the reading of
  every public op's array inputs) and :func:`split`; :mod:`.arithmetic`: its operators and
  :func:`~.arithmetic.arith`, over the engines :mod:`.engine64` (cpu, float64) and
  :mod:`.kernel_engine` (metal / emulate: the ``dw_ops`` / ``cdw_ops`` kernels of
  :mod:`.dw_kernels`); :mod:`.hostsplit`: the host split of float64 data and
  :func:`join`;
* :mod:`.aware`: precision-aware entry points (a plain float32 function and its
  double-word twin, switched by :func:`~mlx_precise.extended_precision`);
* :mod:`.elementwise`: ``complex_multiply``, ``fft_scale``, ``scale_extended``;
* :mod:`.pow2scale`: range scaling by powers of two;
* :mod:`.checks`: the self-test's checks.
"""

from . import checks  # noqa: F401  (registers the self-test checks)
from .aware import precision_aware, precision_aware_functions
from .elementwise import (
    complex_multiply,
    complex_multiply_extended,
    fft_scale,
    fft_scale_extended,
    scale_extended,
)
from . import arithmetic  # noqa: F401  (attaches the operators of DoubleWord)
from .hostsplit import complex_from_parts, join
from .types import DoubleWord, split

__all__ = ["DoubleWord", "complex_from_parts", "complex_multiply", "complex_multiply_extended",
           "fft_scale", "fft_scale_extended", "join", "precision_aware",
           "precision_aware_functions", "scale_extended", "split"]
