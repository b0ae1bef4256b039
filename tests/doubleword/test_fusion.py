"""Fused elementwise chains (mlx_precise.doubleword.fusion): on emulate (the Metal
kernel dw_fused run by the emulator) every fused chain gives exactly the bits of the
same chain run one operation at a time, and the value the mpmath oracle gives to the
chain's bound; on the metal path (lazy stand-in: counts only) a chain launches once,
broadcast operands and float32 operands are read as they are."""

import math

import mlx.core as mx
import mlx.nn as nn
import mpmath
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.doubleword import DoubleWord, fusion
from mlx_precise.extended import low_word
from mlx_precise.testing import graph_counts

mpmath.mp.prec = 200


def _f32(rng, shape, scale=1.0):
    return mx.array((rng.standard_normal(shape) * scale).astype(np.float32))


def _words(y):
    """The exact value of a flow result (high + low word) in float64 (exact: the
    low word is below 2^-24 of the high word)."""
    lo = low_word(y)
    hi = np.array(y).astype(np.float64)
    return hi if lo is None else hi + np.array(lo).astype(np.float64)


def _run(fn, args, fused: bool):
    """fn(*args) in a block on emulate, fused or one operation at a time; the
    result's words."""
    with mp.use_backend("emulate"), mp.extended_precision() as rep:
        if fused:
            y = fn(*args)
        else:
            with fusion._unfused():
                y = fn(*args)
        assert not rep.float32, rep.float32
        mx.eval(y)
        return np.array(y), np.array(low_word(y)), _words(y)


def _mp(f):
    """An elementwise mpmath function of float64 arrays (values exact in binary)."""
    return np.vectorize(lambda *v: float(f(*(mpmath.mpf(float(a)) for a in v))))


ERF = _mp(lambda v: mpmath.erf(v))
SIN = _mp(lambda v: mpmath.sin(v))
EXP = _mp(lambda v: mpmath.exp(v))


def _gelu(x):
    return x * 0.5 * (1 + mx.erf(x / math.sqrt(2)))


# (name, function, operand shapes, float64 oracle of the exact inputs, relative bound)
CHAINS = {
    "gelu (nn.gelu, one operand, constants)": (
        nn.gelu, [(4, 33)],
        lambda x: x * 0.5 * (1 + ERF(x / math.sqrt(2))), 2.0**-44),
    "broadcast row and 0-d operand": (
        lambda a, b, c: (a * b + c) / (a - 0.1), [(5, 16), (16,), ()],
        lambda a, b, c: (a * b + c) / (a - 0.1), 2.0**-40),
    "functions and arithmetic": (
        lambda x, y: mx.exp(x) * mx.sin(y) - x / 3, [(64,), (64,)],
        lambda x, y: EXP(x) * SIN(y) - x / 3, 2.0**-40),
    "a value read twice": (
        lambda x: x * x + x, [(3, 7)], lambda x: x * x + x, 2.0**-44),
    "fewer than 8 elements": (
        lambda x, y: (x + y) * y - 1.5, [(3,), (1, 3)], lambda x, y: (x + y) * y - 1.5,
        2.0**-44),
    "broadcast middle axis and leading axes": (
        lambda a, b, c: (a - b) * c + a, [(2, 5, 1, 9), (5, 4, 9), (9,)],
        lambda a, b, c: (a - b) * c + a, 2.0**-40),
    "0-d operands": (
        lambda x, y: x / y + x * y, [(), ()], lambda x, y: x / y + x * y, 2.0**-44),
}


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_fused_chain_has_the_unfused_bits_and_the_oracle_value(name):
    fn, shapes, oracle, bound = CHAINS[name]
    rng = np.random.default_rng(sorted(CHAINS).index(name))
    with mp.extended_precision():  # operands that carry low words (x / 3 ...)
        args = [_f32(rng, s) / 3 for s in shapes]
        inputs = [_words(a) for a in args]
    hi, lo, value = _run(fn, args, fused=True)
    hi0, lo0, _ = _run(fn, args, fused=False)
    assert np.array_equal(hi.view(np.uint32), hi0.view(np.uint32))
    assert np.array_equal(lo.view(np.uint32), lo0.view(np.uint32))
    ref = oracle(*inputs)
    assert np.all(np.abs(value - ref) <= bound * np.abs(ref)), np.max(np.abs(value / ref - 1))


def test_strided_and_float32_operands_are_read_in_place():
    """Transposed and stepped views, and float32 operands (no low word), as leaves:
    the same bits as the unfused chain, and exact where the oracle is exact."""
    rng = np.random.default_rng(7)
    a, b = _f32(rng, (6, 8)), _f32(rng, (8, 12))

    def fn(a, b):
        return a.T * b[:, ::2] + b[:, 1::2] / 7

    hi, lo, value = _run(fn, (a, b), fused=True)
    hi0, lo0, _ = _run(fn, (a, b), fused=False)
    assert np.array_equal(hi.view(np.uint32), hi0.view(np.uint32))
    assert np.array_equal(lo.view(np.uint32), lo0.view(np.uint32))
    a64, b64 = np.array(a).astype(np.longdouble), np.array(b).astype(np.longdouble)
    ref = a64.T * b64[:, ::2] + b64[:, 1::2] / 7
    size = np.abs(a64.T * b64[:, ::2]) + np.abs(b64[:, 1::2] / 7)  # (a sum may cancel)
    assert np.all(np.abs(value - ref) <= 2.0**-44 * size)


def test_chains_beyond_the_bounds_are_cut():
    """More leaves than slots and more operations than a program holds: operands
    enter as leaves where the expression would not fit; the bits stay the unfused
    chain's."""
    rng = np.random.default_rng(8)
    xs = [_f32(rng, (16,)) for _ in range(fusion.LIMITS.slots + 3)]

    def fn(*xs):
        s = xs[0] / 3
        for k, x in enumerate(xs[1:]):
            s = s * 0.75 + x / (k + 3)
        return s

    hi, lo, value = _run(fn, xs, fused=True)
    hi0, lo0, _ = _run(fn, xs, fused=False)
    assert np.array_equal(hi.view(np.uint32), hi0.view(np.uint32))
    assert np.array_equal(lo.view(np.uint32), lo0.view(np.uint32))
    ref = np.array(xs[0]).astype(np.longdouble) / 3
    for k, x in enumerate(xs[1:]):
        ref = ref * 0.75 + np.array(x).astype(np.longdouble) / (k + 3)
    assert np.all(np.abs(value - ref) <= 2.0**-40 * np.abs(ref))


def test_program_registers_are_reused():
    """A long chain fits the register file: an operand's register is free once it
    has been read for the last time."""
    x = fusion.Expr.leaf(mx.ones((8,)), mx.zeros((8,)))
    e = x
    for _ in range(20):
        e = fusion._compose(fusion.OP["mul"], 0, [e, x])
    layout = ((), (8,), (0,), 1, ((1, 0), (1, 0)), 8, (0, 0))
    prog, math_ = fusion.program(e.key, layout)
    words = np.array(prog)
    count, out = words[fusion.LIMITS.prog_count], words[fusion.LIMITS.prog_out]
    instrs = words[fusion.LIMITS.header:].reshape(-1, fusion.LIMITS.instr)
    assert count == len(e.code) == 21 and not math_
    assert set(instrs[:, 1]) == {0, 1} and out == instrs[-1, 1]


def test_in_place_updates_are_not_read_through_an_old_expression():
    """``y += 1`` (and an update outside the block) change y's value: the next
    operation reads y, not the expression y had."""
    rng = np.random.default_rng(9)
    x = _f32(rng, (10,))
    x64 = np.array(x).astype(np.longdouble)
    with mp.use_backend("emulate"), mp.extended_precision():
        y = x * 3
        y += 1
        z = y / 7
    assert np.all(np.abs(_words(z) - (x64 * 3 + 1) / 7) <= 2.0**-44 * np.abs(_words(z)))
    y[0] = 5.0  # outside: MLX's update, the low word dropped
    with mp.use_backend("emulate"), mp.extended_precision():
        w = y * 2
    assert _words(w)[0] == 10.0


def test_an_updated_leaf_is_read_as_it_was():
    """An expression reads its leaves as they were when it was made: updating a leaf
    in place afterwards (MLX replaces the array's data) changes neither the value
    of what was computed from it nor of what is computed from that later, inside
    a block (float32 and carried leaves) and with DoubleWord's operators."""
    x0 = np.arange(10, dtype=np.float32)
    with mp.use_backend("emulate"), mp.extended_precision():
        x = mx.array(x0)
        y = x * 2
        x[0] = 100.0
        z = y + 1  # reads y = 2 x0, not 2 x
        c = mx.array(x0) / 3
        d = c * 3
        c += 5
        e = d - c  # d from the old c, c the new one
    assert np.array_equal(_words(z), 2 * x0.astype(np.float64) + 1)
    ref = np.arange(10, dtype=np.longdouble) / 3 * 3 - (np.arange(10, dtype=np.longdouble) / 3 + 5)
    assert np.all(np.abs(_words(e) - ref) <= 2.0**-44 * 6)
    h = mx.array(x0)
    A = DoubleWord(h, mx.zeros_like(h))
    with mp.use_backend("emulate"):
        B = A * 2
        h[0] = 100.0
        C = B + A  # 2 x0 + the updated h
    assert np.array_equal(C.to_float64(), 3 * x0.astype(np.float64) + np.eye(10)[0] * 100)


def test_dw_api_operators_launch_once_each():
    """Outside blocks DoubleWord's operators run one fused-kernel launch each (nothing
    would see an in-place update of a result's words, so no expression is kept), with
    the bits of the single-operation kernels."""
    rng = np.random.default_rng(10)
    a, b = rng.standard_normal((4, 9)), rng.standard_normal((9,))
    A, B = DoubleWord.from_float64(a), DoubleWord.from_float64(b)
    start = len(fusion._table)
    with mp.use_backend("emulate"):
        z = (A * B - 0.25) / (A + B)
        with fusion._unfused():
            z0 = (A * B - 0.25) / (A + B)
    assert np.array_equal(np.array(z.hi), np.array(z0.hi))
    assert np.array_equal(np.array(z.lo), np.array(z0.lo))
    assert len(fusion._table) == start
    ref = (a.astype(np.longdouble) * b - 0.25) / (a.astype(np.longdouble) + b)
    assert np.all(np.abs(z.to_float64() - ref) <= 2.0**-40 * np.abs(ref))


# ---- the metal path: the graph (lazy stand-in for the kernels) ---------------------------

def test_a_chain_launches_once_on_metal(lazy_metal):
    """gelu of a carried value, a broadcast bias, a scalar: one launch, nothing
    else dispatched (no zero low word, no expanded operand, no copy)."""
    x, b = mx.ones((4, 32)), mx.ones((32,))
    mx.eval(x, b)
    with mp.use_backend("metal"), mp.extended_precision():
        h = x / 3
        mx.eval(h, low_word(h))
        y = nn.gelu(h + b) * 0.5 - b
        counts = graph_counts(y, low_word(y))
    assert counts["launches"] == 1 and counts["glue"] == 0, counts


def test_mlx_gradient_outside_the_block_on_metal(lazy_metal):
    """A function that opens a block, differentiated by MLX from outside: the fused
    chain is a custom function of its leaves whose VJP is the unfused chain's
    (float32 derivatives of the high words), and the GEMM a custom function of its
    operands: here the plain float32 gradient (it reads only the operands, not the
    stand-in's kernel outputs), to float32's accuracy (a leaf read twice in a chain
    sums its cotangents inside the chain first, another order than MLX's graph)."""
    rng = np.random.default_rng(11)
    x, w, W = _f32(rng, (5, 6)), _f32(rng, (6,)), _f32(rng, (6, 6))

    def plain(x):
        return ((mx.exp(x) * w - x) * 3 + (x @ W) * w).sum()

    def f(x):
        with mp.use_backend("metal"), mp.extended_precision():
            return plain(x)

    got, ref = np.array(mx.grad(f)(x)), np.array(mx.grad(plain)(x))
    x64, w64, W64 = (np.array(v).astype(np.float64) for v in (x, w, W))
    exact = (np.exp(x64) * w64 - 1) * 3 + w64 @ W64.T  # d/dx of the sum
    scale = np.abs(np.exp(x64) * w64 * 3) + 3 + np.abs(w64) @ np.abs(W64.T)
    assert np.all(np.abs(got - ref) <= 2.0**-21 * scale)
    assert np.all(np.abs(got - exact) <= 2.0**-20 * scale)


def _special_words():
    """Carried values with ties in the high word (low words decide), signed zeros,
    infinities, NaN, and subnormal low words."""
    hi = np.array([1.0, 1.0, 0.0, -0.0, np.inf, -np.inf, np.nan, 2.0, -3.0, 1e-30,
                   0.5, -0.5, 7.0, 1.0, np.nan, 0.0], np.float32)
    lo = np.array([2**-30, -(2**-30), 0.0, 0.0, 0.0, 0.0, 0.0, 2**-25, -(2**-26), 1e-38,
                   0.0, 2**-27, 0.0, 2**-28, 0.0, 0.0], np.float32)
    return hi, lo


@pytest.mark.parametrize("op", ["maximum", "minimum", "abs", "leaky_relu", "relu"])
def test_exact_word_operations_keep_their_words(op):
    """max / min / |x| in a fused chain: the words of the flow's word operations
    (MLX's maximum of the high words, NaN first, the low words on a tie), including
    signed zeros, infinities, NaN and subnormal low words."""
    hi, lo = _special_words()
    x = mx.array(hi)
    y = mx.array(np.roll(hi, 3))
    from mlx_precise.extended.carry import attach

    attach(x, mx.array(lo))
    attach(y, mx.array(np.roll(lo, 5)))
    fns = {"maximum": lambda x, y: mx.maximum(x * 1.0, y), "minimum": lambda x, y: mx.minimum(x, y * 1.0),
           "abs": lambda x, y: mx.abs(x * 1.0) + y, "leaky_relu": lambda x, y: nn.leaky_relu(x, 0.1),
           "relu": lambda x, y: mx.maximum(x / 3, 0.0)}
    hi1, lo1, _ = _run(fns[op], (x, y), fused=True)
    hi0, lo0, _ = _run(fns[op], (x, y), fused=False)
    assert np.array_equal(hi1.view(np.uint32), hi0.view(np.uint32))
    assert np.array_equal(lo1.view(np.uint32), lo0.view(np.uint32))


def test_leaky_relu_launches_once_on_metal(lazy_metal):
    x = mx.ones((4, 32))
    mx.eval(x)
    with mp.use_backend("metal"), mp.extended_precision():
        h = x / 3
        mx.eval(h, low_word(h))
        y = nn.leaky_relu(h, 0.2) + mx.abs(h)
        counts = graph_counts(y, low_word(y))
    assert counts["launches"] == 1 and counts["glue"] == 0, counts


def test_gemm_reads_no_zero_low_words():
    """A float32 operand of the double-word GEMM (and a missing bias) stores no low
    word: the same bits as with explicit zero words, and the product is exact
    where the oracle says (small integers)."""
    from mlx_precise.linalg import matmul

    rng = np.random.default_rng(12)
    a = mx.array(rng.integers(-50, 50, (3, 5, 7)).astype(np.float32))
    b = DoubleWord.from_float64(rng.standard_normal((7, 4)))
    bias = mx.array(rng.standard_normal((4,)).astype(np.float32))
    with mp.use_backend("emulate"):
        for d in (None, bias):
            got = matmul(DoubleWord.exact(a), b, bias=None if d is None else DoubleWord.exact(d))
            ref = matmul(DoubleWord.from_float32(a), b,
                         bias=None if d is None else DoubleWord.from_float32(d))
            assert np.array_equal(np.array(got.hi), np.array(ref.hi))
            assert np.array_equal(np.array(got.lo), np.array(ref.lo))
    ints = DoubleWord.exact(mx.array(rng.integers(-9, 9, (4, 6)).astype(np.float32)))
    with mp.use_backend("emulate"):
        c = matmul(ints, DoubleWord.exact(mx.array(np.eye(6, dtype=np.float32) * 3)))
    assert np.array_equal(np.array(c.hi), np.array(ints.hi) * 3)
    assert not np.array(c.lo).any()


def test_gemm_launches_alone_on_metal(lazy_metal):
    """x @ w + the flow's bias: the kernel and nothing else dispatched."""
    x, w = mx.ones((4, 8)), mx.ones((8, 16))
    mx.eval(x, w)
    with mp.use_backend("metal"), mp.extended_precision():
        y = x @ w
        counts = graph_counts(y, low_word(y))
    assert counts["launches"] == 1 and counts["glue"] == 0, counts


@pytest.mark.parametrize("case", [
    ("sum", (6, 37), -1), ("sum", (3, 4, 5), (0, 2)), ("mean", (2, 1000), 1),
    ("prod", (5, 9), -1), ("sum", (3,), None), ("sum", (4, 1), -1), ("sum", (2, 4097), -1),
    ("mean", (64, 3), 0)])
def test_reductions_have_the_tree_bits(case):
    """Sums, means and products in one launch over the expression they reduce: the
    bits of the pairwise tree of launches, and the oracle's value; rows longer than
    the kernel takes run the tree."""
    kind, shape, axis = case
    rng = np.random.default_rng(13)
    x = _f32(rng, shape)
    fn = (lambda x: getattr(mx, kind)((x / 3 - 0.25) * x, axis=axis))
    hi, lo, value = _run(fn, (x,), fused=True)
    hi0, lo0, _ = _run(fn, (x,), fused=False)
    assert np.array_equal(hi.view(np.uint32), hi0.view(np.uint32))
    assert np.array_equal(lo.view(np.uint32), lo0.view(np.uint32))
    x64 = np.array(x).astype(np.longdouble)
    terms = (x64 / 3 - 0.25) * x64
    ref = getattr(np, kind)(terms, axis=axis)
    size = (np.prod(np.abs(terms), axis=axis) if kind == "prod"
            else getattr(np, kind)(np.abs(terms), axis=axis))
    assert np.all(np.abs(value - ref) <= 2.0**-40 * size)


def _leaf_sum(*xs):
    """x0 / 3 + x1 + ... + exp(x_(k-1) / 8) (x0 / 3 where k is 1): a program over the
    k float32 arrays, one slot each."""
    s = xs[0] / 3
    for x in xs[1:-1]:
        s = s + x
    return s + mx.exp(xs[-1] / 8) if len(xs) > 1 else s


@pytest.mark.parametrize("k", [1, 4, 5, 8, 9, 12])
def test_each_slot_count_has_the_unfused_bits(k):
    """A program over k word arrays launches the kernel with the fewest slots
    that hold them (4, 8, 12; with the elementary functions where it calls one):
    the bits of the unfused chain and the oracle's value, and so for the sum of its
    rows (dw_reduce of the same slot count)."""
    rng = np.random.default_rng(20 + k)
    xs = [_f32(rng, (6, 16)) for _ in range(k)]
    for fn in (_leaf_sum, lambda *xs: mx.sum(_leaf_sum(*xs), axis=-1)):
        hi, lo, value = _run(fn, xs, fused=True)
        hi0, lo0, _ = _run(fn, xs, fused=False)
        assert np.array_equal(hi.view(np.uint32), hi0.view(np.uint32))
        assert np.array_equal(lo.view(np.uint32), lo0.view(np.uint32))
    x64 = [np.array(x).astype(np.longdouble) for x in xs]
    last = np.exp(x64[-1] / 8) if k > 1 else 0
    terms = [x64[0] / 3] + x64[1:-1] + ([last] if k > 1 else [])
    ref = np.sum(sum(terms), axis=-1)
    assert np.all(np.abs(value - ref) <= 2.0**-40 * np.sum(sum(np.abs(t) for t in terms), -1))
    from mlx_precise.testing import lazy_metal_executor

    record = []
    with lazy_metal_executor(record), mp.use_backend("metal"), mp.extended_precision():
        _leaf_sum(*xs)
        mx.sum(_leaf_sum(*xs), axis=-1)
    slots = next(n for n in (4, 8, 12) if n >= k)
    suffix = ("" if slots == 12 else str(slots)) + ("_math" if k > 1 else "")
    assert record[-1].name == "dw_reduce" + suffix
    assert len(record[-1].inputs) == slots + 1
    last_fused = [r.name for r in record[:-1] if r.name.startswith("dw_fused")][-1]
    assert last_fused == "dw_fused" + suffix


def test_layer_norm_launches_three_times_on_metal(lazy_metal):
    """mean, variance of the centred values, the normalised affine output: three
    launches, no other dispatch."""
    x, w, b = mx.ones((4, 64)), mx.ones((64,)), mx.ones((64,))
    mx.eval(x, w, b)
    with mp.use_backend("metal"), mp.extended_precision():
        y = mx.fast.layer_norm(x, w, b, 1e-5)
        counts = graph_counts(y, low_word(y))
    assert counts["launches"] == 3 and counts["glue"] == 0, counts


def test_a_block_drops_its_expressions():
    """Expressions do not outlive their block: a result of one block is a leaf in the
    next (its own launch, or its evaluated data), and nothing the block made keeps
    its leaves alive."""
    x = mx.array(np.arange(12, dtype=np.float32))
    start = len(fusion._table)
    with mp.use_backend("emulate"), mp.extended_precision():
        y = x / 3 + 1
        assert len(fusion.expression(DoubleWord(y, low_word(y))).code) == 5
    assert len(fusion._table) == start
    with mp.use_backend("emulate"), mp.extended_precision():
        e = fusion.expression(DoubleWord(y, low_word(y)))
        assert len(e.code) == 1 and e.leaves[0].shape == y.shape
        z = y * 3
    ref = (np.arange(12, dtype=np.longdouble) / 3 + 1) * 3
    assert np.all(np.abs(_words(z) - ref) <= 2.0**-44 * ref)


def test_only_the_consumed_result_runs_on_metal():
    """Each operation of a chain launches (its result is an array the code may
    read), but evaluating the end of the chain runs only its own launch."""
    from mlx_precise.testing import lazy_metal_executor

    x = mx.ones((4, 16))
    mx.eval(x)
    record = []
    with lazy_metal_executor(record):
        with mp.use_backend("metal"), mp.extended_precision():
            y = mx.exp(x / 3 + 1) * 2
        mx.eval(y)
    # four slots hold x's words; exp makes the last two programs call a function
    assert [k.name for k in record] == ["dw_fused4"] * 2 + ["dw_fused4_math"] * 2
    assert [k.ran() for k in record] == [False, False, False, True]


def test_a_block_closed_in_another_thread_keeps_no_expression():
    """A generator suspended inside its block and closed from another thread leaves
    the caller's context naming the block; its scope is closed all the same, so no
    expression is kept after it (nothing would see an in-place update)."""
    import threading

    def gen():
        with mp.extended_precision() as rep:
            yield rep

    g = gen()
    next(g)
    t = threading.Thread(target=g.close)
    t.start()
    t.join()
    start = len(fusion._table)
    A = DoubleWord.from_float64(np.arange(9.0) / 7)
    with mp.use_backend("emulate"):
        B = A * 2
    assert len(fusion._table) == start and B.shape == (9,)


def test_constants_zero_signs_kept_apart():
    """A program holds each constant by its bits: ``x + (-0.0)`` and ``x + 0.0`` in
    one block (programs cached by the constant's value) keep the sign of a zero
    result as float32 does (-0 + -0 = -0, -0 + 0 = +0)."""
    x = mx.array(np.array([-0.0, 1.5], np.float32))
    with mp.use_backend("emulate"), mp.extended_precision():
        a, b = x + 0.0, x + (-0.0)
        c, d = x * 0.0, x * (-0.0)
        mx.eval(a, b, c, d)
    xs = np.array([-0.0, 1.5], np.float32)
    for got, want in ((a, xs + np.float32(0.0)), (b, xs + np.float32(-0.0)),
                      (c, xs * np.float32(0.0)), (d, xs * np.float32(-0.0))):
        assert np.array_equal(np.signbit(np.array(got)), np.signbit(want))
        assert np.array_equal(np.array(got), want)
