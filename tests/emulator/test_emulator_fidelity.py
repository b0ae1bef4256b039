"""The emulator on constructs of real kernels: reads past the end of a buffer (poison
and a warning, or an error in checked mode), writes past the end (always an error),
``__FAST_MATH__`` under ``math_mode="fast"``. Every kernel here is written for this
test."""

import warnings

import mlx.core as mx
import numpy as np
import pytest

from mlx_precise.emulator import OutOfBoundsReadWarning, metal_kernel

# Each thread reads its right neighbour, also past the end, and keeps it only where
# it exists (a select), as stencil and sampling kernels do.
NEIGHBOUR_SELECT = """
uint i = thread_position_in_grid.x;
float right = x[i + 1];
y[i] = x[i] + (i + 1 < n ? right : 0.0f);
"""
# The same with a multiplication by zero instead of a select: NaN * 0 is NaN.
NEIGHBOUR_MULTIPLY = """
uint i = thread_position_in_grid.x;
float right = x[i + 1];
y[i] = x[i] + right * float(i + 1 < n);
"""


def run(source, checked, x, name="neighbour"):
    k = metal_kernel(name, ["x", "n"], ["y"], source, checked=checked)
    n = mx.array(x.size, dtype=mx.uint32)
    (y,) = k(inputs=[x, n], grid=(x.size, 1, 1), threadgroup=(32, 1, 1),
             output_shapes=[x.shape], output_dtypes=[x.dtype])
    return np.array(y)


@pytest.mark.parametrize("size", [13, 1024])  # past the end: in the slack, in the guard page
def test_read_past_the_end_then_selected_away(size):
    # (the compiler may also sink the load into the branch that keeps it)
    x = mx.arange(size, dtype=mx.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OutOfBoundsReadWarning)
        y = run(NEIGHBOUR_SELECT, False, x)
    ref = np.arange(size, dtype=np.float32)
    ref[:-1] += ref[1:]
    np.testing.assert_array_equal(y, ref)


@pytest.mark.parametrize("size", [13, 1024])
def test_poison_shows_in_a_product_with_zero_and_warns_once(size):
    x = mx.arange(size, dtype=mx.float32)
    k = metal_kernel("neighbour", ["x", "n"], ["y"], NEIGHBOUR_MULTIPLY, checked=False)
    n = mx.array(size, dtype=mx.uint32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            (y,) = k(inputs=[x, n], grid=(size, 1, 1), threadgroup=(32, 1, 1),
                     output_shapes=[x.shape], output_dtypes=[x.dtype])
    y = np.array(y)
    assert np.isnan(y[-1]) and np.all(np.isfinite(y[:-1]))
    reads = [w for w in caught if issubclass(w.category, OutOfBoundsReadWarning)]
    if size % 4 == 0:  # the read lands in the guard page: one warning for two launches
        assert len(reads) == 1
        msg = str(reads[0].message)
        assert f"input 'x' at element {size} (valid: 0..{size - 1})" in msg
        assert f"thread ({size - 1},0,0)" in msg
    else:  # inside the 16-byte alignment slack: poison without a fault, so no warning
        assert not reads


def test_checked_mode_raises_on_the_read():
    x = mx.arange(1024, dtype=mx.float32)
    with pytest.raises(RuntimeError, match=r"out-of-bounds read of input 'x' at element 1024 "
                       r"\(valid: 0\.\.1023\) by thread \(1023,0,0\)"):
        run(NEIGHBOUR_MULTIPLY, True, x)


@pytest.mark.parametrize("checked", [False, True])
def test_write_past_the_end_raises_always(checked):
    src = "uint i = thread_position_in_grid.x; y[i + 1] = x[i];"
    x = mx.arange(1024, dtype=mx.float32)
    with pytest.raises(RuntimeError, match=r"out-of-bounds write of output 'y' at element 1024"):
        run(src, checked, x, name="shift")


def test_integer_reads_past_the_end_are_minus_one():
    src = "uint i = thread_position_in_grid.x; y[i] = x[i + 1024];"
    x = mx.arange(1024, dtype=mx.int32)
    with pytest.warns(OutOfBoundsReadWarning):
        y = run(src, False, x, name="far")
    assert np.all(y == -1)


@pytest.mark.parametrize("mode,expected", [("safe", 0.0), ("relaxed", 0.0), ("fast", 1.0)])
def test_fast_math_macro(mode, expected):
    src = """
    uint i = thread_position_in_grid.x;
#if defined(__FAST_MATH__)
    y[i] = 1.0f;
#else
    y[i] = 0.0f;
#endif
    """
    k = metal_kernel("fastflag", ["x"], ["y"], src, compile_options={"math_mode": mode})
    x = mx.zeros((8,))
    (y,) = k(inputs=[x], grid=(8, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(8,)],
             output_dtypes=[mx.float32])
    assert np.all(np.array(y) == expected)


# The constructs of MLX's steel header trees (steel/utils/type_traits.h,
# integral_constant.h, gemm/mma.h), in a header of our own.
STEEL_LIKE_HEADER = """
#include <metal_stdlib>
using namespace metal;
namespace metal {
template <typename... Ts> struct make_void { typedef void type; };
template <typename... Ts> using void_t = typename make_void<Ts...>::type;
template <typename T> struct pointer_element {};
template <typename T> struct pointer_element<thread T*> { using type = remove_cv_t<T>; };
template <typename T> struct pointer_element<device T*> { using type = remove_cv_t<T>; };
template <typename T> struct pointer_element<constant T*> { using type = remove_cv_t<T>; };
template <typename T> struct pointer_element<threadgroup T*> { using type = remove_cv_t<T>; };
template <typename T> using pointer_element_t = typename pointer_element<remove_cv_t<T>>::type;
}  // namespace metal
template <bool B> struct Flag : metal::bool_constant<B> {};
struct Accumulator {
  // running total per threadgroup
  float total;
  template <typename Ptr, typename = metal::void_t<metal::pointer_element_t<Ptr>>>
  METAL_FUNC void add(Ptr p, int n) thread {
    using U = metal::pointer_element_t<Ptr>;
    for (int k = 0; k < n; ++k) total += static_cast<float>(static_cast<U>(p[k]));
  }
};
template <typename T>
[[kernel]] void unused_steel_style(device T* out [[buffer(0)]],
                                   threadgroup T* scratch [[threadgroup(0)]],
                                   uint lid [[thread_index_in_threadgroup]]) {
  scratch[lid] = out[lid];
}
"""
STEEL_LIKE_SOURCE = """
uint i = thread_position_in_grid.x;
Accumulator acc{0.0f};
acc.add(x + i, 2);
metal::remove_addrspace_t<decltype(acc.total)> t = acc.total;
y[i] = Flag<true>::value ? t : 0.0f;
"""


def test_steel_like_header_runs_and_passes_the_check():
    from mlx_precise.emulator import check_source

    x = mx.arange(10, dtype=mx.float32)
    k = metal_kernel("steel_like", ["x"], ["y"], STEEL_LIKE_SOURCE, header=STEEL_LIKE_HEADER)
    (y,) = k(inputs=[x], grid=(9, 1, 1), threadgroup=(9, 1, 1), output_shapes=[(9,)],
             output_dtypes=[mx.float32])
    ref = np.arange(9, dtype=np.float32) * 2 + 1
    np.testing.assert_array_equal(np.array(y), ref)
    check_source("steel_like", ["x"], ["y"], STEEL_LIKE_SOURCE, inputs=[x],
                 output_dtypes=[mx.float32], header=STEEL_LIKE_HEADER)
