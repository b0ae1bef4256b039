"""The int8 GEMM engine (metal/include/int8_gemm.h) through the Metal emulator.

int8 x int8 -> int32 products must be exact: every output is compared with numpy's
int64 matrix product (an independent integer computation), 100% equality asserted.
Shapes cover partial tiles in every direction, M = 1, K = 1, K = 0, batches, all
operands at the int8 limits up to the largest exact K (131071, |sum| = 2^31 - 2^14),
another tile shape, and the accumulating epilogue through a kernel written here.
"""

import mlx.core as mx
import numpy as np
import pytest

from mlx_precise.int8.checks import gemm_checks as selftest_checks
from mlx_precise.int8.engine import MAX_K, gemm_grid, int8_matmul
from mlx_precise.core.kernels import Kernel

BACKEND = "emulate"


def rand_int8(rng, shape):
    return rng.integers(-128, 128, shape, dtype=np.int8)


def exact(a, b):
    return np.matmul(a.astype(np.int64), b.astype(np.int64))


@pytest.mark.parametrize("backend", [BACKEND, "cpu"])
@pytest.mark.parametrize(
    "m,n,k",
    [(1, 1, 1), (1, 5, 3), (33, 47, 70), (32, 32, 32), (64, 96, 64), (100, 301, 257),
     (7, 1000, 1023), (130, 17, 5)],
)
def test_exact_random(backend, m, n, k):
    rng = np.random.default_rng(m * 7919 + n * 31 + k)
    a, b = rand_int8(rng, (m, k)), rand_int8(rng, (k, n))
    c = int8_matmul(mx.array(a), mx.array(b), backend=backend)
    assert c.dtype == mx.int32 and c.shape == (m, n)
    assert np.array_equal(np.array(c).astype(np.int64), exact(a, b))


@pytest.mark.parametrize("backend", [BACKEND, "cpu"])
def test_int8_limits_at_largest_k(backend):
    """(-128)(-128) summed MAX_K times is 2^31 - 2^14: still exact in int32;
    mixed signs reach -(2^31 - 2^14) + ... through -128 * 127."""
    k = MAX_K
    a = np.full((2, k), -128, dtype=np.int8)
    a[1, ::2] = 127
    b = np.full((k, 3), -128, dtype=np.int8)
    b[:, 1] = 127
    b[::3, 2] = 1
    c = np.array(int8_matmul(mx.array(a), mx.array(b), backend=backend)).astype(np.int64)
    assert c[0, 0] == k * 2**14 == 2**31 - 2**14
    assert np.array_equal(c, exact(a, b))


@pytest.mark.parametrize("backend", [BACKEND, "cpu"])
def test_batched(backend):
    rng = np.random.default_rng(3)
    a, b = rand_int8(rng, (3, 17, 40)), rand_int8(rng, (3, 40, 33))
    b2 = rand_int8(rng, (40, 33))
    got = np.array(int8_matmul(mx.array(a), mx.array(b), backend=backend))
    assert got.shape == (3, 17, 33)
    assert np.array_equal(got.astype(np.int64), exact(a, b))
    got = np.array(int8_matmul(mx.array(a), mx.array(b2), backend=backend))  # shared B
    assert np.array_equal(got.astype(np.int64), exact(a, b2))
    got = np.array(int8_matmul(mx.array(a[0]), mx.array(b), backend=backend))  # shared A
    assert np.array_equal(got.astype(np.int64), exact(a[0], b))


@pytest.mark.parametrize("backend", [BACKEND, "cpu"])
def test_empty(backend):
    z = int8_matmul(mx.zeros((4, 0), mx.int8), mx.zeros((0, 6), mx.int8), backend=backend)
    assert z.shape == (4, 6) and not np.any(np.array(z))
    assert int8_matmul(mx.zeros((0, 3), mx.int8), mx.zeros((3, 6), mx.int8),
                       backend=backend).shape == (0, 6)
    assert int8_matmul(mx.zeros((2, 3), mx.int8), mx.zeros((3, 0), mx.int8),
                       backend=backend).shape == (2, 0)


def test_bad_input():
    a8 = mx.zeros((2, 3), mx.int8)
    with pytest.raises(TypeError, match="a must have dtype int8"):
        int8_matmul(mx.zeros((2, 3), mx.int16), a8.T)
    with pytest.raises(TypeError, match="b must be an mx.array or array-like"):
        int8_matmul(a8, None)
    assert int8_matmul(a8, np.zeros((3, 2), np.int8)).tolist() == [[0, 0], [0, 0]]
    with pytest.raises(ValueError, match="inner dimensions differ"):
        int8_matmul(a8, mx.zeros((4, 2), mx.int8))
    with pytest.raises(ValueError, match=r"\[M, K\]"):
        int8_matmul(mx.zeros((3,), mx.int8), a8)
    with pytest.raises(ValueError, match="batch counts differ"):
        int8_matmul(mx.zeros((2, 2, 3), mx.int8), mx.zeros((3, 3, 2), mx.int8))
    with pytest.raises(ValueError, match="K = 131072 is too large"):
        int8_matmul(mx.zeros((1, MAX_K + 1), mx.int8), mx.zeros((MAX_K + 1, 1), mx.int8))
    with pytest.raises(ValueError, match="unknown backend"):
        int8_matmul(a8, a8.T, backend="gpu")


# A kernel written against the engine's documented interface, as its other users
# do: another tile shape (16 x 64 outputs, K steps of 8, 1 x 4 per thread, 256
# threads) and the accumulating epilogue on an output initialised to 5.
_ACCUMULATE_BODY = """
threadgroup int8_t As[16 * 8];
threadgroup int8_t Bs[8 * 64];
const int M = p[0], N = p[1], K = p[2];
Int8GemmAccumulateI32 ep = {c, N};
int8_gemm_tile<16, 64, 8, 1, 4>(a, K, b, N, M, N, K, As, Bs,
                                int(threadgroup_position_in_grid.y) * 16,
                                int(threadgroup_position_in_grid.x) * 64,
                                thread_index_in_threadgroup, ep);
"""


def test_other_tile_shape_and_accumulating_epilogue(tmp_path):
    body = tmp_path / "int8_gemm_test_accumulate.metal"
    body.write_text(_ACCUMULATE_BODY)
    kernel = Kernel(name="int8_gemm_test_accumulate", body=str(body),
                    headers=("int8_gemm.h",), inputs=("a", "b", "p"), outputs=("c",),
                    extended=False)
    rng = np.random.default_rng(11)
    m, n, k = 37, 70, 29
    a, b = rand_int8(rng, (m, k)), rand_int8(rng, (k, n))
    (c,) = kernel(inputs=[mx.array(a.ravel()), mx.array(b.ravel()),
                          mx.array([m, n, k, 0, 0, 0, 0, 0], dtype=mx.int32)],
                  grid=(-(-n // 64) * 256, -(-m // 16), 1), threadgroup=(256, 1, 1),
                  output_shapes=[(m, n)], output_dtypes=[mx.int32], init_value=5,
                  backend=BACKEND)
    assert np.array_equal(np.array(c).astype(np.int64), exact(a, b) + 5)


def test_grid_rule():
    assert gemm_grid(33, 47) == ((2 * 256, 2, 1), (256, 1, 1))
    assert gemm_grid(1, 1, 4) == ((256, 1, 4), (256, 1, 1))


@pytest.mark.parametrize("backend", [BACKEND, "cpu"])
def test_selftest_checks(backend):
    checks = selftest_checks(backend)
    assert checks and all(c.passed for c in checks), [c.line() for c in checks]
