"""MLX functions bound to local names before a block opens (``f = mx.exp`` in a
function, and closures over such names) are extended inside the block and are
MLX's own again after it."""

from __future__ import annotations

import mlx.core as mx
import mpmath
import numpy as np

import mlx_precise as mp
from mlx_precise.extended import low_word


def _carried():
    """x * 3 in a block for 64 values in [0.1, 1.4]: exact products that need a
    low word."""
    return mx.array(np.linspace(0.1, 1.4, 64, dtype=np.float32)) * 3.0


def _exp_oracle(x_hi, x_lo):
    """exp of the exact double-word value hi + lo, correctly rounded to float32."""
    with mpmath.workprec(200):
        return np.array([np.float32(float(mpmath.exp(mpmath.mpf(float(h)) + mpmath.mpf(float(l)))))
                         for h, l in zip(np.array(x_hi), np.array(x_lo))], dtype=np.float32)


def _exp_of_carried(f):
    """(f(x), its oracle) for x = _carried(), inside a block."""
    x = _carried()
    return f(x), _exp_oracle(x, low_word(x))


def _assert_extended(report, y, expected):
    assert report.extended["exp"] == 1 and not report.float32
    np.testing.assert_array_equal(np.array(y), expected)


def test_local_name_bound_before_the_block_is_extended_and_restored():
    f = mx.exp
    with mp.extended_precision(strict=True) as report:
        x = _carried()
        y = f(x)
        lo = low_word(x)
        assert lo is not None and np.any(np.array(lo) != 0)
        expected = _exp_oracle(x, lo)
    assert report.extended["exp"] == 1 and not report.float32
    np.testing.assert_array_equal(np.array(y), expected)
    assert f is mx.exp and type(f).__name__ == type(mx.add).__name__  # MLX's own again


def test_closure_over_a_local_is_extended():
    g = mx.exp

    def inner(v):
        return g(v)

    with mp.extended_precision(strict=True) as report:
        y, expected = _exp_of_carried(inner)
    _assert_extended(report, y, expected)
    assert g is mx.exp


def test_without_the_rebinding_the_local_drops(monkeypatch):
    """The tests above can fail: without the rebinding, MLX's own exp consumes the
    carried value in float32, unseen: the results are not all correctly rounded."""
    from mlx_precise.extended import holders

    monkeypatch.setattr(holders, "rebind_locals", lambda every: None)
    f = mx.exp
    with mp.extended_precision() as report:
        x = _carried()
        y = f(x)
        expected = _exp_oracle(x, low_word(x))
    assert not report.extended["exp"]
    assert np.any(np.array(y) != expected)


def test_a_name_rebound_inside_the_block_is_kept():
    f = mx.exp
    with mp.extended_precision():
        f = mx.sin  # the user's own assignment stands (the block's stand-in for sin)
    x = mx.array([0.5, 2.0])
    assert f is not mx.exp
    np.testing.assert_array_equal(np.array(f(x)), np.array(mx.sin(x)))


def _open_block():
    """A helper that opens a block by hand and returns it open (its caller runs
    the block's body)."""
    block = mp.extended_precision()
    return block, block.__enter__()


def test_a_local_of_the_caller_of_a_helper_that_opens_the_block():
    """The frame that entered the block (by a call of ``__enter__``, not a ``with``
    statement) returns while the block is open: the locals of the frames that
    called it are rebound too (default mode), and MLX's own again after it."""
    import contextlib

    f = mx.exp
    block, report = _open_block()
    try:
        y, expected = _exp_of_carried(f)
    finally:
        block.__exit__(None, None, None)
    _assert_extended(report, y, expected)
    assert f is mx.exp
    with contextlib.ExitStack() as stack:  # (enter_context calls __enter__ too)
        report = stack.enter_context(mp.extended_precision())
        y, expected = _exp_of_carried(f)
    _assert_extended(report, y, expected)
    assert f is mx.exp


def test_a_decorated_function_is_extended():
    """A function decorated with ``@extended_precision()`` runs its body in its own
    frame (the package's decorator frame runs the ``with``, where the walk over the
    calling frames stops): extended inside, MLX's own after."""
    f = mx.exp

    @mp.extended_precision()
    def body(v):
        return mx.exp(v * 3.0)

    x = mx.array(np.linspace(0.1, 1.4, 64, dtype=np.float32))
    y = body(x)
    with mpmath.workprec(200):
        want = [np.float32(float(mpmath.exp(mpmath.mpf(float(v)) * 3))) for v in np.array(x)]
    np.testing.assert_array_equal(np.array(y), np.array(want, dtype=np.float32))
    assert f is mx.exp
