"""``mx.vmap`` inside ``extended_precision()``: the function runs once per slice
through the flow, so its values are double-word on every backend and keep their
low words (before: on cpu the vmapped function ran on MLX's tracer arrays and its
results came back rounded without a word in the report, a carried input was
reported, and on the kernel backends it raised TransformUnsupportedError). Oracles:
numpy float64 on the inputs' values; gradients written out by hand."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from flow_helpers import rng_f32, value64

X, W, V = rng_f32((5, 3), 0), rng_f32((3,), 1), rng_f32((5,), 2)
X64, W64, V64 = (a.astype(np.float64) for a in (X, W, V))


def _err(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("carried", [False, True], ids=["float32", "carried"])
def test_vmapped_function_is_double_word(backend, carried):
    f = mx.vmap(lambda v: mx.sin(v * 0.1) * 3)
    x = mx.array(X)
    with mp.use_backend(backend), mp.extended_precision(strict=True) as report:
        a = (x * 3) / 3 if carried else x
        y = f(a)
        got = value64(y)
    assert not report.float32 and report.extended["vmap"] == 1
    assert y.shape == (5, 3)
    assert _err(got, np.sin(X64 * 0.1) * 3) < 1e-13


def test_axes_trees_and_unmapped_inputs(backend):
    """in_axes with None and a non-zero axis, a tuple of outputs with out_axes
    (1, 0): MLX's vmap semantics, each output at its axis."""
    f = mx.vmap(lambda a, b: (a * b / 3, (a / 3).sum()), in_axes=(1, None), out_axes=(1, 0))
    with mp.use_backend(backend), mp.extended_precision(strict=True):
        p, s = f(mx.array(X), mx.array(V))
        got_p, got_s = value64(p), value64(s)
    assert p.shape == (5, 3) and s.shape == (3,)
    assert _err(got_p, X64 * V64[:, None] / 3) < 1e-13
    assert _err(got_s, (X64 / 3).sum(axis=0)) < 1e-13
    # the same as MLX's own vmap, outside the block, to float32 rounding
    p32, s32 = f(mx.array(X), mx.array(V))
    assert np.allclose(np.array(p32), got_p, rtol=1e-6) and np.allclose(np.array(s32), got_s,
                                                                        rtol=1e-6)


def test_unmapped_output_is_the_first_slices(backend):
    """out_axes None: the output is not mapped (the first call's, as the loop
    gives it on every backend; MLX 0.32's own vmap broadcasts it instead)."""
    f = mx.vmap(lambda a, b: (a * 2, b / 3), in_axes=(0, None), out_axes=(0, None))
    with mp.use_backend(backend), mp.extended_precision(strict=True):
        p, q = f(mx.array(X), mx.array(V))
        got = value64(q)
    assert p.shape == (5, 3) and q.shape == (5,)
    assert _err(got, V64 / 3) < 1e-13


def test_per_example_gradients(backend):
    """vmap of grad: one double-word gradient per example, every entry exactly
    rounded against the float64 formula."""
    def loss(w, x):
        return mx.sum(mx.tanh(x * w / 3))

    with mp.use_backend(backend), mp.extended_precision(strict=True):
        g = mx.vmap(mx.grad(loss), in_axes=(None, 0))(mx.array(W), mx.array(X))
        got = value64(g)
    t = np.tanh(X64 * W64 / 3)
    want = (1 - t ** 2) * X64 / 3
    assert g.shape == (5, 3)
    assert _err(got, want) < 1e-13
    assert (np.array(g) == want.astype(np.float32)).all()


def test_gradient_through_a_vmapped_function(backend):
    def f(w, x):
        return mx.vmap(lambda w, x: mx.sum(x * w) ** 2, in_axes=(None, 0))(w, x).sum()

    with mp.use_backend(backend), mp.extended_precision(strict=True):
        g = mx.grad(f)(mx.array(W), mx.array(X))
        got = value64(g)
    want = (2 * (X64 @ W64)[:, None] * X64).sum(axis=0)
    assert _err(got, want) < 1e-13


def test_inconsistent_sizes_raise(backend):
    f = mx.vmap(lambda a, b: a + b)
    with pytest.raises(ValueError, match="Inconsistent axis sizes"):
        with mp.use_backend(backend), mp.extended_precision():
            f(mx.array(X), mx.array(V[:4]))


def test_compiled_function_with_empty_state_is_not_a_vmap(backend):
    """MLX's compiled and vmapped functions share a type; one compiled with empty
    state lists keeps no int among them, unlike a vmap's axes: it runs its Python
    function through the flow."""
    f = mx.compile(lambda x: x * 3, inputs=[], outputs=[])
    with mp.use_backend(backend), mp.extended_precision(strict=True) as report:
        got = value64(f(mx.array(X) / 7))
    assert report.extended["vmap"] == 0
    assert _err(got, X64 * 3 / 7) < 1e-13


def test_cpu_traces_once_where_it_can(backend):
    """On cpu MLX's own vmap maps the float64 trace (the function runs twice: the
    first slice, which gives the output structure, and the trace), values as the
    loop's; on emulate, and on cpu where the trace meets an op computed on the host
    (the FFT: numpy), the loop runs once per slice."""
    calls = []

    def f(v):
        calls.append(1)
        return mx.sin(v * 0.1) * 3

    def g(v):
        calls.append(1)
        return mx.abs(mx.fft.rfft(v))

    x = mx.array(rng_f32((50, 8), 3))
    with mp.use_backend(backend), mp.extended_precision(strict=True):
        y = value64(mx.vmap(f)(x / 7))
        n_f = len(calls)
        z = value64(mx.vmap(g)(x))
    assert n_f == (2 if backend == "cpu" else 50)
    assert len(calls) - n_f >= 50  # the FFT's trace declined: the loop
    x64 = rng_f32((50, 8), 3).astype(np.float64)
    assert _err(y, np.sin(x64 / 70) * 3) < 1e-13
    assert _err(z, np.abs(np.fft.rfft(x64))) < 1e-13


def test_words_without_a_float64_value_enter_once(backend):
    """Integers above 2^24 converted in the block carry their exact value in words
    alone (no float64 value on cpu): the vmapped function reads that value once (on
    cpu the float64 trace read the high word plus the low word with the flow on,
    which counted the low word twice: 2 (2^24 + 1) gave 2^25 + 4)."""
    ints = np.array([[3, 2**24 + 1], [123456789, -(2**30 + 3)]], np.int32)
    with mp.use_backend(backend), mp.extended_precision(strict=True):
        a = mx.array(ints).astype(mx.float32)
        got = value64(mx.vmap(lambda r: r * 2.0)(a))
    assert np.array_equal(got, 2.0 * ints.astype(np.float64))
