"""Matrix norms with LAPACK semantics (xLANGE / xLANTR / xLANSY / xLANHE).

* :mod:`.api`: :func:`norm`, the public function;
* :mod:`.engine`: the tile kernels and the float64 cpu paths;
* :mod:`.distributed`: a matrix spread over an ``mx.distributed`` group
  (:class:`Layout`, :func:`block_rows`, :func:`block_cols`, :func:`block_cyclic`);
* :mod:`.checks`: the self-test's checks.
"""

from . import checks  # noqa: F401  (registers the self-test checks)
from .api import norm
from .distributed import Layout, block_cols, block_cyclic, block_rows

__all__ = ["Layout", "block_cols", "block_cyclic", "block_rows", "norm"]
