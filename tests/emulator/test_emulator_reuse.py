"""What the emulator keeps between launches: the generated source of each
instantiation (generated once, regenerated for anything that changes MLX's
signature) and the mappings of freed buffers (reused with their guards intact)."""

import warnings

import mlx.core as mx
import numpy as np
import pytest

from mlx_precise.emulator import (OutOfBoundsReadWarning, compiler, memory, metal_kernel,
                                  signature)

SCALE = """
uint i = thread_position_in_grid.x;
y[i] = x[i] * float(K);
"""


def _call(k, x, template, verbose=False):
    (y,) = k(inputs=[x], grid=(max(x.size, 1), 1, 1), threadgroup=(32, 1, 1),
             output_shapes=[(max(x.size, 1),)], output_dtypes=[mx.float32],
             template=template, verbose=verbose)
    return np.array(y)


def test_source_generated_once_per_instantiation(monkeypatch, capsys):
    calls = []
    real = signature.generate
    monkeypatch.setattr(signature, "generate",
                        lambda *a, **kw: calls.append(a) or real(*a, **kw))
    k = metal_kernel("reuse_scale", ["x"], ["y"], SCALE)
    # Each case changes the signature MLX writes: device (>= 8 elements), constant
    # (< 8), another dtype, a bool instead of an int template value (same printed
    # value, other parameter kind), another value.
    cases = [
        (mx.arange(16, dtype=mx.float32), [("K", 2)]),
        (mx.arange(4, dtype=mx.float32), [("K", 2)]),
        (mx.arange(16, dtype=mx.float16), [("K", 2)]),
        (mx.arange(16, dtype=mx.float32), [("K", True)]),
        (mx.arange(16, dtype=mx.float32), [("K", 3)]),
    ]
    for x, template in cases:
        before = len(calls)
        # Other sizes of the same form share the instantiation.
        same_form = [x, x[::-1], mx.arange(x.size + 3, dtype=x.dtype) if x.size >= 8 else x]
        for x2 in same_form:
            got = _call(k, x2, template, verbose=True)
            expected = np.array(x2.astype(mx.float32)).reshape(-1) * float(template[0][1])
            np.testing.assert_array_equal(got, expected)
        assert len(calls) == before + 1, (x, template)
        # What verbose=True prints is still the text generated for these inputs.
        printed = capsys.readouterr().out
        for x2 in same_form:
            assert k.generate([x2], [mx.float32], template)[2] in printed
    kinds = {k.generate([x], [mx.float32], t)[2].split("\n")[0] for x, t in cases[::3]}
    assert kinds == {"template <bool K>", "template <int K>"}


def test_scalar_and_one_element_inputs_are_other_instantiations(tmp_path, monkeypatch):
    """A 0-d input is a reference (``const constant float& x``), one of 1 element a
    pointer: the body ``x * 2.0f`` compiles for the first only, so a launch with
    the second must not reuse the first's library."""
    monkeypatch.setenv("MLX_PRECISE_CACHE", str(tmp_path))
    k = metal_kernel("reuse_scalar", ["x"], ["y"],
                     "y[thread_position_in_grid.x] = x * 2.0f;")
    args = dict(grid=(1, 1, 1), threadgroup=(1, 1, 1), output_shapes=[(1,)],
                output_dtypes=[mx.float32])
    for _ in range(2):
        (y,) = k(inputs=[mx.array(3.0)], **args)
        assert np.array(y).tolist() == [6.0]
    with pytest.raises(compiler.KernelCompileError, match="custom_kernel_reuse_scalar_floatc_float"):
        k(inputs=[mx.array([3.0])], **args)


def test_reused_mapping_is_rewritten_and_keeps_its_guards():
    memory.release_pool()
    a = memory.Guarded("a", "input", 40, 4, slack=memory.POISON)
    a.array[:] = 7
    base = a.base
    a.free()
    b = memory.Guarded("b", "output", 36, 4, slack=memory.CANARY)
    assert b.base == base  # same data pages: the mapping is reused
    whole = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * (b.hi - b.lo)).from_address(b.lo))
    start = b.ptr - b.lo
    # The slack around the data is the new buffer's filler, not the old bytes.
    assert np.all(whole[:start] == memory.CANARY)
    assert np.all(whole[start + 36:] == memory.CANARY)
    assert b.slack_write() is None
    b.tainted = True  # a poisoned read opened a guard page: unmapped, not kept
    b.free()
    assert not memory._pool.get(b.data_pages)
    memory.release_pool()


def test_outputs_do_not_alias_reused_memory():
    k = metal_kernel("reuse_scale", ["x"], ["y"], SCALE)
    x = mx.arange(64, dtype=mx.float32)
    first = mx.array(_call(k, x, [("K", 2)]))
    ys = [k(inputs=[x], grid=(64, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(64,)],
            output_dtypes=[mx.float32], template=[("K", v)])[0] for v in (1, 2, 3)]
    for v, y in zip((1, 2, 3), ys):
        np.testing.assert_array_equal(np.array(y), np.arange(64, dtype=np.float32) * v)
    np.testing.assert_array_equal(np.array(first), np.arange(64, dtype=np.float32) * 2)


NEIGHBOUR = """
uint i = thread_position_in_grid.x;
y[i] = x[i] + x[i + 1] * 0.0f;
"""


@pytest.mark.parametrize("repeat", range(3))
def test_guards_hold_on_reused_mappings(repeat):
    """The same sizes again and again (mappings come from the pool): a read past the
    end still returns poison with a warning (each new kernel warns once), or raises
    in checked mode; a write past the end still raises."""
    x = mx.arange(1024, dtype=mx.float32)
    for _ in range(2):
        k = metal_kernel("reuse_neighbour", ["x"], ["y"], NEIGHBOUR, checked=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            (y,) = k(inputs=[x], grid=(1024, 1, 1), threadgroup=(32, 1, 1),
                     output_shapes=[(1024,)], output_dtypes=[mx.float32])
        y = np.array(y)
        assert np.isnan(y[-1]) and np.all(y[:-1] == np.arange(1023))
        assert any(issubclass(w.category, OutOfBoundsReadWarning) for w in caught)
        checked = metal_kernel("reuse_neighbour", ["x"], ["y"], NEIGHBOUR, checked=True)
        with pytest.raises(RuntimeError, match=r"out-of-bounds read of input 'x' at element 1024"):
            checked(inputs=[x], grid=(1024, 1, 1), threadgroup=(32, 1, 1),
                    output_shapes=[(1024,)], output_dtypes=[mx.float32])
        shift = metal_kernel("reuse_shift", ["x"], ["y"],
                             "uint i = thread_position_in_grid.x; y[i + 1] = x[i];")
        with pytest.raises(RuntimeError, match=r"out-of-bounds write of output 'y' at element 1024"):
            shift(inputs=[x], grid=(1024, 1, 1), threadgroup=(32, 1, 1),
                  output_shapes=[(1024,)], output_dtypes=[mx.float32])


COPY = """
uint i = thread_position_in_grid.x;
y[i] = x[i];
"""


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16, mx.int16, mx.complex64])
def test_strided_inputs_are_staged_row_contiguous(dtype):
    """Transposed, reversed and broadcast views reach a row-contiguous kernel in
    row order (numpy writes them straight into the guarded buffer)."""
    k = metal_kernel("reuse_copy", ["x"], ["y"], COPY)
    base = mx.arange(24).reshape(4, 6).astype(dtype)
    views = [base.T, base[::-1, ::2], mx.broadcast_to(base[:1], (4, 6)), base[1:3]]
    for v in views:
        (y,) = k(inputs=[v], grid=(v.size, 1, 1), threadgroup=(32, 1, 1),
                 output_shapes=[(v.size,)], output_dtypes=[dtype])
        assert y.dtype == dtype
        np.testing.assert_array_equal(np.array(y.astype(mx.float32) if dtype == mx.bfloat16 else y),
                                      np.array(v.astype(mx.float32) if dtype == mx.bfloat16 else v).reshape(-1))


@pytest.mark.parametrize("dtype,value", [(mx.float32, 0.1), (mx.float16, 0.1), (mx.bfloat16, 0.1),
                                         (mx.int32, -7), (mx.uint8, 200), (mx.bool_, True),
                                         (mx.complex64, 2.5)])
def test_init_value_fills_every_element_as_mlx_converts_it(dtype, value):
    k = metal_kernel("reuse_untouched", ["x"], ["y"], "uint i = thread_position_in_grid.x; (void)x; (void)i;")
    (y,) = k(inputs=[mx.zeros((4,))], grid=(4, 1, 1), threadgroup=(4, 1, 1),
             output_shapes=[(3, 5)], output_dtypes=[dtype], init_value=value)
    expected = mx.full((3, 5), value, dtype=dtype).astype(dtype)  # (complex: see _new_output)
    assert y.dtype == dtype and y.shape == expected.shape
    def bits(a):
        return np.array(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a).tobytes()

    assert bits(y) == bits(expected)



# One kernel and one signature throughout (its launch plan, kernel._Plan, is
# reused): the offsets `r` and `w` are inputs, so they move the accesses without
# changing the signature.
OFFSET = """
uint i = thread_position_in_grid.x;
y[i + w[0]] = x[i + r[0]];
"""


def _offset_call(k, x, r, w):
    (y,) = k(inputs=[x, mx.array([r], dtype=mx.int32), mx.array([w], dtype=mx.int32)],
             grid=(x.size, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(x.size,)],
             output_dtypes=[mx.float32])
    return np.array(y)


def test_guards_hold_on_a_reused_launch_plan(monkeypatch):
    x = mx.arange(1024, dtype=mx.float32)
    made = []
    real = memory.Guarded.__init__
    monkeypatch.setattr(memory.Guarded, "__init__",
                        lambda self, *a, **kw: made.append(a[0]) or real(self, *a, **kw))
    poisoned = metal_kernel("reuse_plan", ["x", "r", "w"], ["y"], OFFSET, checked=False)
    checked = metal_kernel("reuse_plan", ["x", "r", "w"], ["y"], OFFSET, checked=True)
    for k in (poisoned, checked):
        for _ in range(3):
            np.testing.assert_array_equal(_offset_call(k, x, 0, 0), np.arange(1024))
    # The buffers of each kernel are made once; the later launches reuse them.
    assert made == ["x", "r", "w", "y"] * 2
    warned = []
    for _ in range(2):  # each time after clean launches of the same signature
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = _offset_call(poisoned, x, 1, 0)  # thread 1023 reads x[1024]
        warned.append(sum(issubclass(w.category, OutOfBoundsReadWarning) for w in caught))
        assert np.isnan(y[-1]) and np.all(y[:-1] == np.arange(1, 1024))
        np.testing.assert_array_equal(_offset_call(poisoned, x, 0, 0), np.arange(1024))
        with pytest.raises(RuntimeError, match=r"out-of-bounds read of input 'x' at element 1024"):
            _offset_call(checked, x, 1, 0)
        np.testing.assert_array_equal(_offset_call(checked, x, 0, 0), np.arange(1024))
        for k in (poisoned, checked):
            with pytest.raises(RuntimeError, match=r"out-of-bounds write of output 'y' at element 1024"):
                _offset_call(k, x, 0, 1)
            np.testing.assert_array_equal(_offset_call(k, x, 0, 0), np.arange(1024))
    assert warned == [1, 0]  # one warning per kernel and buffer, as with new buffers


# `y` has 3 floats: y[3] is in the alignment slack before the guard page (no fault).
SLACK = """
if (thread_position_in_grid.x == 0) {
  if (mode[0] == 1) { y[3] = 42.0f; } else { z[0] = y[3]; }
}
"""


@pytest.mark.parametrize("checked", [False, True])
def test_reused_launch_plan_starts_with_fresh_slack(checked):
    """A write into the slack (not reported outside checked mode) does not reach
    the next launch of the same signature: there the slack holds the filler again
    (poison; checked mode's canary, after reporting the write)."""
    k = metal_kernel("reuse_slack", ["mode"], ["y", "z"], SLACK, checked=checked)

    def call(mode):
        _, z = k(inputs=[mx.array([mode], dtype=mx.int32)], grid=(1, 1, 1),
                 threadgroup=(1, 1, 1), output_shapes=[(3,), (1,)],
                 output_dtypes=[mx.float32, mx.float32])
        return np.array(z).view(np.uint32)[0]

    filler = 0xA5A5A5A5 if checked else 0xFFFFFFFF
    assert call(0) == filler
    if checked:
        with pytest.raises(RuntimeError, match=r"out-of-bounds write of output 'y' at byte 12"):
            call(1)
    else:
        call(1)
    assert call(0) == filler


def test_outputs_of_a_reused_launch_plan_are_copies():
    k = metal_kernel("reuse_scale", ["x"], ["y"], SCALE)
    ys = [k(inputs=[mx.full((64,), float(v))], grid=(64, 1, 1), threadgroup=(32, 1, 1),
            output_shapes=[(64,)], output_dtypes=[mx.float32], template=[("K", 2)])[0]
          for v in range(4)]
    for v, y in enumerate(ys):
        np.testing.assert_array_equal(np.array(y), np.full(64, 2.0 * v, np.float32))


def test_a_poisoned_read_never_reaches_the_pool_through_a_kept_plan():
    """A read that opened a guard page taints the buffer: its plan is not kept, so
    the open page never serves a later buffer (here one whose neighbour read would
    then return poison without raising)."""
    from mlx_precise.emulator import kernel as emulated

    emulated.release_plans()
    memory.release_pool()
    x = mx.arange(1024, dtype=mx.float32)  # one data page each: x, r and y
    reads = metal_kernel("reuse_taint", ["x", "r"], ["y"],
                         "uint i = thread_position_in_grid.x; y[i] = x[i + r[0]];",
                         checked=False)

    def call(r):
        (y,) = reads(inputs=[x, mx.array([r], dtype=mx.int32)], grid=(1024, 1, 1),
                     threadgroup=(32, 1, 1), output_shapes=[(1024,)],
                     output_dtypes=[mx.float32])
        return np.array(y)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OutOfBoundsReadWarning)
        assert np.isnan(call(1)[-1])
    np.testing.assert_array_equal(call(0), np.arange(1024))
    emulated.release_plans()  # x, r and y (if kept) to the pool, in this order
    # a, b and c take one-page mappings from the pool last in first out: c gets
    # x's, if it was kept.
    checked = metal_kernel("reuse_taint_checked", ["a", "b", "c"], ["o"],
                           "uint i = thread_position_in_grid.x; o[i] = a[i] + b[i] + c[i + 1];",
                           checked=True)
    with pytest.raises(RuntimeError, match=r"out-of-bounds read of input 'c' at element 1024"):
        checked(inputs=[x, x, x], grid=(1024, 1, 1), threadgroup=(32, 1, 1),
                output_shapes=[(2048,)], output_dtypes=[mx.float32])
    memory.release_pool()


def test_verbose_prints_the_source_before_a_failing_build(tmp_path, monkeypatch, capsys):
    """verbose=True helps read a compile error: the text comes before it."""
    monkeypatch.setenv("MLX_PRECISE_CACHE", str(tmp_path))
    k = metal_kernel("reuse_broken", ["x"], ["y"],
                     "y[thread_position_in_grid.x] = x[0] + undeclared_name;")
    with pytest.raises(compiler.KernelCompileError):
        k(inputs=[mx.zeros((8,))], grid=(1, 1, 1), threadgroup=(1, 1, 1),
          output_shapes=[(1,)], output_dtypes=[mx.float32], verbose=True)
    printed = capsys.readouterr().out
    assert "undeclared_name" in printed and "[[kernel]]" in printed
