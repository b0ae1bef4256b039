"""Helpers that test modules in several folders share (importable as ``helpers``:
pyproject.toml puts ``tests/`` on ``sys.path``). Oracles live in ``oracle.py``,
fixtures in ``conftest.py``; a test module never imports another test module.

* kernel runners of the double-word self-check kernels (``run_dw``, ``run_cdw``);
* the Ozaki test matrices (``PHIS``, ``phi_matrix``) and MLX's native float64
  product (``native``);
* float64 gradients of the Hyena convolution (``float64_gradients``).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from mlx_precise.doubleword.dw_kernels import CDW_OPS, DW_OPS

# ---- the double-word self-check kernels (metal/kernels/dw_ops.metal, cdw_ops.metal) ----


def run_dw(op, xh, xl, yh, yl, backend="emulate"):
    """dw_ops kernel ``op`` on float32 numpy arrays; returns (zh, zl) as numpy."""
    n = xh.size
    zh, zl = DW_OPS(
        inputs=[mx.array(np.ascontiguousarray(a, dtype=np.float32)) for a in (xh, xl, yh, yl)],
        template={"OP": op}, output_shapes=[(n,), (n,)],
        output_dtypes=[mx.float32, mx.float32], backend=backend,
    )
    return np.array(zh), np.array(zl)


def run_cdw(op, x, y, backend="emulate"):
    """cdw_ops kernel ``op``; x, y: tuples (rh, rl, ih, il) of float32 arrays."""
    n = x[0].size
    outs = CDW_OPS(
        inputs=[mx.array(np.ascontiguousarray(a, dtype=np.float32)) for a in (*x, *y)],
        template={"OP": op}, output_shapes=[(n,)] * 4,
        output_dtypes=[mx.float32] * 4, backend=backend,
    )
    return tuple(np.array(o) for o in outs)


# ---- Ozaki / ESC test matrices -------------------------------------------------------

PHIS = (-1, 0, 0.5, 1, 2, 4)


def phi_matrix(phi, shape, rng):
    """The field's test matrices; phi = -1 stands for plain N(0, 1)."""
    if phi == -1:
        return rng.standard_normal(shape)
    return (rng.uniform(size=shape) - 0.5) * np.exp(phi * rng.standard_normal(shape))


def native(A, B):
    """MLX's own float64 matrix product (cpu stream), as numpy."""
    return np.array(mx.matmul(mx.array(A, dtype=mx.float64), mx.array(B, dtype=mx.float64),
                              stream=mx.cpu))


# ---- Hyena convolution -----------------------------------------------------------------


def float64_gradients(u, k, D, g):
    """Direct float64 sums: du[s] = sum_t g[t] k[t-s] + D g[s],
    dk[j] = sum_{b,t} g[t] u[t-j], dD = sum_{b,t} g u."""
    u, k, D, g = (a.astype(np.float64) for a in (u, k, D, g))
    L, Lk = u.shape[-1], k.shape[-1]
    du = D[None, :, None] * g
    dk = np.zeros(k.shape)
    for j in range(Lk):
        du[..., :L - j] += k[None, :, j, None] * g[..., j:]
        dk[:, j] = (g[..., j:] * u[..., :L - j]).sum(axis=(0, 2))
    return du, dk, (g * u).sum(axis=(0, 2))
