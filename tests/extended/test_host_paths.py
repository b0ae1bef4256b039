"""The kernel backends' short host paths give the general paths' bits.

The dispatcher's fused fast path of elementwise ops (float32 arrays and Python
scalars straight to the fused program), the norms' chains of engine steps with
deferred launches, and the GEMM's cached launch plans must each compute what the
general path computes: the same words, bit for bit, special values included. The
general path is taken by passing ``stream=`` (the dispatcher tries a fast path only
without keyword arguments) or by running the decomposition's ops through the flow.
"""

import math

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.extended import low_word
from mlx_precise.extended.rules import fast as fast_rules
from mlx_precise.extended.rules import reductions

from flow_helpers import rng_f32, value64

SPECIAL = np.array([np.inf, -np.inf, np.nan, 3.0e38, -3.0e38, 1e-30, 0.0, -0.0],
                   np.float32)


def _data(shape, seed):
    a = rng_f32(shape, seed)
    flat = a.reshape(-1)
    flat[:SPECIAL.size] = SPECIAL[:flat.size]  # special values in the first row(s)
    return mx.array(a)


def _words(a) -> tuple[np.ndarray, np.ndarray]:
    """The high and low words' bit patterns (a NaN is a NaN whatever its bits)."""
    hi = np.array(a)
    lo = low_word(a)
    lo = np.zeros_like(hi) if lo is None else np.array(lo)
    out = []
    for w in (hi, lo):
        bits = w.view(np.uint32).copy()
        bits[np.isnan(w)] = 0x7FC00000
        out.append(bits)
    return tuple(out)


def _same(a, b):
    for x, y in zip(_words(a), _words(b)):
        np.testing.assert_array_equal(x, y)


@pytest.fixture
def kernels():
    with mp.use_backend("emulate"):
        yield


OPS = {
    "x * y": (lambda x, y: x * y, lambda x, y, s: mx.multiply(x, y, stream=s)),
    "x + y": (lambda x, y: x + y, lambda x, y, s: mx.add(x, y, stream=s)),
    "x - y": (lambda x, y: x - y, lambda x, y, s: mx.subtract(x, y, stream=s)),
    "x / y": (lambda x, y: x / y, lambda x, y, s: mx.divide(x, y, stream=s)),
    "x * x": (lambda x, y: x * x, lambda x, y, s: mx.multiply(x, x, stream=s)),
    "square": (lambda x, y: mx.square(x), lambda x, y, s: mx.square(x, stream=s)),
    "x + 0.1": (lambda x, y: x + 0.1, lambda x, y, s: mx.add(x, 0.1, stream=s)),
    "0.1 - x": (lambda x, y: 0.1 - x, lambda x, y, s: mx.subtract(0.1, x, stream=s)),
    "x / 3": (lambda x, y: x / 3, lambda x, y, s: mx.divide(x, 3, stream=s)),
    "x * 1e39": (lambda x, y: x * 1e39, lambda x, y, s: mx.multiply(x, 1e39, stream=s)),
    "maximum": (lambda x, y: mx.maximum(x, y), lambda x, y, s: mx.maximum(x, y, stream=s)),
    "minimum(x, 0.1)": (lambda x, y: mx.minimum(x, 0.1),
                        lambda x, y, s: mx.minimum(x, 0.1, stream=s)),
    "maximum(0.2 x, x)": (lambda x, y: mx.maximum(0.2 * x, x),
                          lambda x, y, s: mx.maximum(0.2 * x, x, stream=s)),
    "x ** 2": (lambda x, y: x ** 2, lambda x, y, s: mx.power(x, 2, stream=s)),
    "x ** 2.0": (lambda x, y: x ** 2.0, lambda x, y, s: mx.power(x, 2.0, stream=s)),
    "-x": (lambda x, y: -x, lambda x, y, s: mx.negative(x, stream=s)),
    "abs": (lambda x, y: mx.abs(x), lambda x, y, s: mx.abs(x, stream=s)),
    "abs(-x)": (lambda x, y: abs(-x), lambda x, y, s: mx.abs(mx.negative(x, stream=s),
                                                            stream=s)),
    "exp": (lambda x, y: mx.exp(x), lambda x, y, s: mx.exp(x, stream=s)),
    "rsqrt": (lambda x, y: mx.rsqrt(x), lambda x, y, s: mx.rsqrt(x, stream=s)),
    "erf": (lambda x, y: mx.erf(x), lambda x, y, s: mx.erf(x, stream=s)),
}


@pytest.mark.parametrize("name", OPS)
def test_fused_fast_path_bits(kernels, name):
    """Each op once on operands with low words (a chain's results, fused into the
    op's program) and once on plain float32 arrays, by the fast path and by the
    rule: the same words."""
    fast, general = OPS[name]
    x, y = _data((4, 33), 0), _data((33,), 1)
    s = mx.default_stream(mx.default_device())
    with mp.extended_precision() as report:
        pairs = [(fast(u, v), general(u, v, s)) for u, v in ((x, y), (x * 0.7 + y, y / 3.0 - x))]
        mx.eval(pairs)
    for a, b in pairs:
        _same(a, b)
    assert not report.float32 and report.extended


def test_fused_fast_path_reports_and_declines(kernels):
    """The fast path counts its op as extended, and leaves what it does not take
    to the rule: float16 operands (MLX's op, reported as plain), numpy scalars,
    shapes that do not broadcast (MLX's error)."""
    x = mx.array(rng_f32((8,), 2))
    with mp.extended_precision() as report:
        z = x * 2.0
        h = x.astype(mx.float16) * 2.0
        n = x * np.float32(0.1)
        with pytest.raises(ValueError):
            x + mx.ones((3,))
        mx.eval(z, h, n)
    assert report.extended["__mul__"] >= 2
    assert h.dtype == mx.float16
    np.testing.assert_array_equal(value64(z), np.array(x).astype(np.float64) * 2.0)
    np.testing.assert_array_equal(
        value64(n), np.array(x).astype(np.float64) * np.float64(np.float32(0.1)))


CX = {
    "c + d": (lambda c, d, x: c + d, lambda c, d, x, s: mx.add(c, d, stream=s)),
    "c - 1.5": (lambda c, d, x: c - 1.5, lambda c, d, x, s: mx.subtract(c, 1.5, stream=s)),
    "1j * x": (lambda c, d, x: 1j * x, lambda c, d, x, s: mx.multiply(1j, x, stream=s)),
    "x + 0.25j": (lambda c, d, x: x + 0.25j, lambda c, d, x, s: mx.add(x, 0.25j, stream=s)),
    "c * x": (lambda c, d, x: c * x, lambda c, d, x, s: mx.multiply(c, x, stream=s)),
    "x * c": (lambda c, d, x: x * c, lambda c, d, x, s: mx.multiply(x, c, stream=s)),
    "c * d": (lambda c, d, x: c * d, lambda c, d, x, s: mx.multiply(c, d, stream=s)),
    "c * c": (lambda c, d, x: c * c, lambda c, d, x, s: mx.multiply(c, c, stream=s)),
    "c / x": (lambda c, d, x: c / x, lambda c, d, x, s: mx.divide(c, x, stream=s)),
    "c / d": (lambda c, d, x: c / d, lambda c, d, x, s: mx.divide(c, d, stream=s)),
    "c / 3": (lambda c, d, x: c / 3, lambda c, d, x, s: mx.divide(c, 3, stream=s)),
}


@pytest.mark.parametrize("name", CX)
def test_complex_fast_path_bits(kernels, name):
    """Complex operands by the fast path (the partwise programs) and by the rule:
    the same words, on exact and on carried operands."""
    fast, general = CX[name]
    x = _data((5, 16), 15)
    c = (x + 1j * _data((5, 16), 16)).astype(mx.complex64)
    d = (_data((16,), 17) - 0.5j).astype(mx.complex64)
    s = mx.default_stream(mx.default_device())
    with mp.extended_precision() as report:
        pairs = []
        for u, v, w in ((c, d, x), (c * 1.1 + d, d / 3.0 - c, x * 0.3 + 1.0)):
            pairs.append((fast(u, v, w), general(u, v, w, s)))
        mx.eval(pairs)
    for a, b in pairs:
        for p in (mx.real, mx.imag):
            np.testing.assert_array_equal(*(np.array(p(t)).view(np.uint32) for t in (a, b)))
            la, lb = low_word(a), low_word(b)
            np.testing.assert_array_equal(*(np.array(p(t)).view(np.uint32) for t in (la, lb)))
    assert not report.float32 and report.extended


def _low(a) -> np.ndarray:
    """The low word of ``a`` (zeros where exact: none is carried)."""
    lo = low_word(a)
    return np.zeros(a.shape, np.dtype(str(a.dtype).split(".")[-1])) if lo is None else np.array(lo)


def test_complex_parts_bits(kernels):
    """z.real, z.imag, mx.real, mx.imag of complex words (exact, carried, a
    kernel's words read as written): numpy's parts of the high and of the low
    words, bit for bit, special values included (no low word lost)."""
    x = _data((5, 16), 18)
    c = (x + 1j * _data((5, 16), 19)).astype(mx.complex64)
    with mp.extended_precision() as report:
        zs = [c, c * 1.1 + 0.3j, mx.exp(c * 0.01)]
        parts = [(z, (z.real, z.imag, mx.real(z), mx.imag(z))) for z in zs]
        mx.eval(parts)
    carried = 0
    for z, (re, im, re_, im_) in parts:
        hi, lo = np.array(z), _low(z)
        for got, take in ((re, np.real), (im, np.imag), (re_, np.real), (im_, np.imag)):
            assert got.dtype == mx.float32
            for a, b in ((np.array(got), hi), (_low(got), lo)):
                np.testing.assert_array_equal(a.view(np.uint32),
                                              np.ascontiguousarray(take(b)).view(np.uint32))
            carried += int(np.count_nonzero(take(lo)))
    assert carried > 0
    assert not report.float32


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("affine", [False, True])
def test_norm_chain_bits(kernels, norm, affine):
    """mx.fast.layer_norm / rms_norm (the chain of engine steps, launched where
    read) against their decompositions run op by op through the flow: the same
    words, for exact inputs, carried inputs and special values."""
    x = _data((3, 5, 48), 3)
    w = _data((48,), 4) if affine else None
    b = _data((48,), 5) if affine else None
    pairs = []
    with mp.extended_precision() as report:
        for u in (x, x * 1.25 + 0.1):
            if norm == "layer_norm":
                pairs.append((mx.fast.layer_norm(u, w, b, 1e-5),
                              fast_rules._layer_norm(u, w, b, 1e-5)))
            else:
                pairs.append((mx.fast.rms_norm(u, w, 1e-6), fast_rules._rms_norm(u, w, 1e-6)))
        mx.eval(pairs)
    for a, ref in pairs:
        _same(a, ref)
    assert report.extended[f"fast.{norm}"] == 2
    assert not report.float32


def test_norm_chain_against_float64(kernels):
    """The chain's layer norm is the exactly rounded value of float64's on
    ordinary rows (an independent oracle, numpy float64)."""
    x = mx.array(rng_f32((16, 64), 6))
    w, b = mx.array(rng_f32((64,), 7)), mx.array(rng_f32((64,), 8))
    with mp.extended_precision():
        y = mx.fast.layer_norm(x, w, b, 1e-5)
        mx.eval(y)
    x64 = np.array(x).astype(np.float64)
    d = x64 - x64.mean(-1, keepdims=True)
    ref = d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * np.array(w).astype(
        np.float64) + np.array(b).astype(np.float64)
    assert np.mean(np.array(y) == ref.astype(np.float32)) > 0.999
    assert np.max(np.abs(value64(y) - ref) / np.abs(ref).max()) < 2.0 ** -40


def test_gemm_plans_follow_the_operands(kernels):
    """One product shape with operands that store low words or not, a bias or
    not: each call gets its own launch plan (a cached plan never serves another
    kind of operand), against float64 products."""
    a, b = mx.array(rng_f32((2, 7, 5), 9)), mx.array(rng_f32((6, 5), 10))
    c = mx.array(rng_f32((6,), 11))
    with mp.extended_precision():
        a2 = a * 1.1  # carries a low word
        outs = [a @ b.T, a2 @ b.T, mx.addmm(c, a, b.T), mx.addmm(c, a2, b.T), a @ b.T]
        mx.eval(outs)
        vals = [value64(o) for o in outs]
    A, B, C = (np.array(v).astype(np.float64) for v in (a, b, c))
    A2 = value64(a2)
    refs = [A @ B.T, A2 @ B.T, A @ B.T + C, A2 @ B.T + C, A @ B.T]
    for v, r in zip(vals, refs):
        assert np.max(np.abs(v - r)) < 1e-12 * max(1.0, np.abs(r).max())
    np.testing.assert_array_equal(vals[0], vals[4])
    assert not math.isclose(float(np.abs(vals[0] - vals[1]).max()), 0.0)


@pytest.mark.parametrize("carried", [False, True])
def test_addmm_steps_bits(kernels, carried):
    """mx.addmm (nn.Linear: the matmul rule and the fused sum called directly)
    against its decomposition through the flow, a @ b.T + c: the same words."""
    a, w, c = _data((2, 9, 12), 12), _data((7, 12), 13), _data((7,), 14)
    with mp.extended_precision() as report:
        u = a * 1.5 - 0.25 if carried else a
        pairs = [(mx.addmm(c, u, w.T), u @ w.T + c), (mx.addmm(c * 3.0, u, w.T),
                                                       u @ w.T + c * 3.0)]
        mx.eval(pairs)
    for x, y in pairs:
        _same(x, y)
    assert report.extended["addmm"] == 2 and not report.float32


@pytest.mark.parametrize("backend_name", ["cpu", "emulate"])
@pytest.mark.parametrize("value", [0, 0.1, -2])
def test_complex_pad_words(backend_name, value):
    """mx.pad of carried complex words with a real constant: the data's words where
    they were, the constant's two words (numpy float64 split) in the real part and
    +0 in the imaginary part of the padding."""
    x = _data((3, 4), 18)
    with mp.use_backend(backend_name), mp.extended_precision():
        c = (x + 1j * _data((3, 4), 19)) * (1.0 + 0.1j)  # carried complex words
        y = mx.pad(c, [(1, 2), (0, 1)], constant_values=value)
        mx.eval(y, c)
    hi = np.float32(value)
    lo = np.float32(value - np.float64(hi))
    for words, fill in ((np.array(y), hi), (np.array(low_word(y)), lo)):
        src = np.array(c) if fill is hi else np.array(low_word(c))
        ref = np.pad(src, [(1, 2), (0, 1)], constant_values=fill)
        for p in (np.real, np.imag):
            np.testing.assert_array_equal(p(words).view(np.uint32), p(ref).view(np.uint32))


@pytest.mark.parametrize("backend_name", ["cpu", "emulate"])
def test_getitem_fast_path(backend_name):
    """x[index] of an array without a low word is MLX's slice (the fast path); of a
    carried one, the slice of both words (the rule); of a float16 array, MLX's op
    counted as plain."""
    x = _data((6, 10), 20)
    with mp.use_backend(backend_name), mp.extended_precision() as report:
        a = x[1:4, ::3]
        c = x * 1.1
        b = c[1:4, ::3]
        h = x.astype(mx.float16)[2]
        mx.eval(a, b, c, h)
    _same(a, mx.array(np.array(x)[1:4, ::3]))
    assert low_word(a) is None
    np.testing.assert_array_equal(value64(b), value64(c)[1:4, ::3])
    assert report.plain["__getitem__"] == 1 and h.dtype == mx.float16


MOVES = {  # name -> (the fast path's call, the rule's: a keyword argument)
    "reshape": (lambda x: x.reshape(3, 2, 11), lambda x, s: x.reshape(3, 2, 11, stream=s)),
    "mx.reshape": (lambda x: mx.reshape(x, (66,)), lambda x, s: mx.reshape(x, (66,), stream=s)),
    "expand_dims": (lambda x: mx.expand_dims(x, 1),
                    lambda x, s: mx.expand_dims(x, 1, stream=s)),
    "squeeze": (lambda x: x[None].squeeze(0), lambda x, s: x[None].squeeze(0, stream=s)),
    "flatten": (lambda x: x.flatten(), lambda x, s: x.flatten(stream=s)),
    "transpose": (lambda x: x.reshape(3, 2, 11).transpose(0, 2, 1)[:, 1],
                  lambda x, s: x.reshape(3, 2, 11).transpose(0, 2, 1, stream=s)[:, 1]),
    "swapaxes": (lambda x: mx.swapaxes(x[None], 0, 1),
                 lambda x, s: mx.swapaxes(x[None], 0, 1, stream=s)),
    "swapaxes of the last two, into a GEMM": (
        lambda x: x @ mx.swapaxes(x, 0, 1), lambda x, s: x @ mx.swapaxes(x, 0, 1, stream=s)),
    "transpose of the last two, into a GEMM": (
        lambda x: x.T.reshape(1, 11, 6).transpose(0, 2, 1)[0] @ x.T,
        lambda x, s: x.T.reshape(1, 11, 6).transpose(0, 2, 1, stream=s)[0] @ x.T),
    "split": (lambda x: mx.split(x, 2, 0)[1], lambda x, s: mx.split(x, 2, 0, stream=s)[1]),
    "split along 1": (lambda x: mx.split(x, [4, 7], 1)[2],
                      lambda x, s: mx.split(x, [4, 7], 1, stream=s)[2]),
}  # (x[index] takes no keyword: test_getitem_fast_path checks its values)


@pytest.mark.parametrize("name", MOVES)
def test_movement_fast_path_bits(name):
    """A movement op of a carried value by its fast path and by its rule: the same
    words on emulate, and on metal (the lazy stand-in) the same graph for the op
    and for a program that reads its result (the moved packed words it records),
    the special values included."""
    from mlx_precise.testing import graph_counts, lazy_metal_executor

    fast, general = MOVES[name]
    x = _data((6, 11), 30)
    s = mx.default_stream(mx.default_device())
    with mp.use_backend("emulate"), mp.extended_precision() as report:
        c = x * 1.3 + 0.25
        a, b = fast(c), general(c, s)
        pair = (a * 3.0, b * 3.0)
        mx.eval(a, b, pair)
    _same(a, b)
    _same(*pair)
    assert not report.float32
    with lazy_metal_executor():
        with mp.use_backend("metal"), mp.extended_precision():
            c = x * 1.3 + 0.25
            got = [graph_counts(f(c) * 3.0)["by_primitive"] for f in (fast, lambda c: general(
                c, s))]
    assert got[0] == got[1]


def test_exact_transpose_fast_path_is_noted():
    """The transpose of the last two axes of an exact array (a weight) by the fast
    path and by the rule: the GEMM that reads it builds the same graph on metal
    (the lazy stand-in: it reads the weight with swapped strides) and the same
    words on emulate."""
    from mlx_precise.testing import graph_counts, lazy_metal_executor

    x, w = _data((6, 11), 31), _data((5, 11), 32)
    s = mx.default_stream(mx.default_device())
    calls = (lambda c: c @ mx.swapaxes(w, 0, 1), lambda c: c @ mx.swapaxes(w, 0, 1, stream=s))
    with mp.use_backend("emulate"), mp.extended_precision(strict=True) as report:
        c = x * 1.3 + 0.25
        a, b = (f(c) for f in calls)
        mx.eval(a, b)
    _same(a, b)
    assert report.extended["swapaxes"] == 2 and not report.float32
    with lazy_metal_executor():
        with mp.use_backend("metal"), mp.extended_precision(strict=True):
            c = x * 1.3 + 0.25
            got = [graph_counts(f(c))["by_primitive"] for f in calls]
    assert got[0] == got[1] and "Transpose" not in got[0], got


def _same_as_decomposition(op, run, decomposition, inputs):
    """``run(*args)`` (the op through the flow) and ``decomposition(*args)`` (its
    decomposition, op by op through the flow) give the same words for each tuple
    of ``inputs``; the op counted as extended, nothing reported as float32."""
    with mp.extended_precision() as report:
        pairs = [(run(*args), decomposition(*args)) for args in inputs]
        mx.eval(pairs)
    for a, ref in pairs:
        assert a.shape == ref.shape
        _same(a, ref)
    assert report.extended[op] == len(inputs)
    assert not report.float32


ROPES = {  # name -> (dims, keyword arguments of mx.fast.rope)
    "plain": (8, dict(traditional=False, base=10000.0, scale=1.0, offset=0)),
    "traditional": (8, dict(traditional=True, base=10000.0, scale=1.0, offset=3)),
    "partial dims": (4, dict(traditional=False, base=500.0, scale=0.5, offset=7)),
    "partial traditional": (6, dict(traditional=True, base=10000.0, scale=1.0, offset=0)),
    "offset array": (8, dict(traditional=False, base=10000.0, scale=1.0,
                             offset=mx.array(5))),
    "offset per batch": (8, dict(traditional=False, base=10000.0, scale=2.0,
                                 offset=mx.array([0, 9]))),
    "freqs": (8, dict(traditional=False, base=None, scale=1.0, offset=2,
                      freqs=mx.array([1.0, 3.5, 20.0, 700.0]))),
    "freqs traditional": (6, dict(traditional=True, base=None, scale=1.0, offset=1,
                                  freqs=mx.array([1.0, 0.3, 11.0]) * 1.1)),
}


@pytest.mark.parametrize("name", ROPES)
def test_rope_chain_bits(kernels, name):
    """mx.fast.rope (its chain of engine steps, launched where read) against its
    decomposition run op by op through the flow: the same words, for exact and
    carried inputs (special values in the first row) and each variant."""
    dims, kw = ROPES[name]
    x = _data((2, 3, 5, 8), 12)
    ref_kw = dict(kw)
    if isinstance(kw["offset"], mx.array) and kw["offset"].size == 1:
        ref_kw["offset"] = kw["offset"].reshape(())
    _same_as_decomposition("fast.rope", lambda u: mx.fast.rope(u, dims, **kw),
                           lambda u: fast_rules._rope(u, dims, **ref_kw),
                           [(x,), (x * 1.25 + 0.1,)])


def test_rope_chain_against_float64(kernels):
    """The chain's rotation against numpy float64 (an independent oracle): within
    double-word accuracy of the exact rotation of the float32 input."""
    x = mx.array(rng_f32((1, 2, 40, 8), 13))
    with mp.extended_precision():
        y = mx.fast.rope(x, 8, traditional=False, base=10000.0, scale=1.0, offset=4)
        mx.eval(y)
    theta = (np.arange(40)[:, None] + 4) * np.exp(-np.arange(4) * (math.log(10000.0) / 4))
    c, s = np.cos(theta), np.sin(theta)
    x64 = np.array(x).astype(np.float64)
    ref = np.concatenate([x64[..., :4] * c - x64[..., 4:] * s,
                          x64[..., :4] * s + x64[..., 4:] * c], axis=-1)
    assert np.max(np.abs(value64(y) - ref)) < 2.0 ** -40 * np.abs(ref).max()


def _rows(shape, seed):
    """Data whose first rows along the last axis hold -inf only, a NaN, +inf,
    +inf and -inf, and float32's extremes (the cases of the shift by the maximum)."""
    a = rng_f32(shape, seed)
    rows = a.reshape(-1, shape[-1])
    rows[0] = -np.inf
    rows[1, 2] = np.nan
    rows[2, 1] = np.inf
    rows[3, :2] = (np.inf, -np.inf)
    rows[4, :3] = (3.0e38, -3.0e38, 1e-30)
    return mx.array(a)


@pytest.mark.parametrize("axis", [-1, 0, 1, (0, 2), None])
@pytest.mark.parametrize("op", ["softmax", "softmax precise", "logsumexp",
                                "logsumexp keepdims"])
def test_softmax_chain_bits(kernels, op, axis):
    """mx.softmax / mx.logsumexp (their chains of engine steps) against their
    decompositions run op by op through the flow: the same words, special rows
    included, over one axis, several and all."""
    x = _rows((6, 5, 7), 14)
    if op.startswith("softmax"):
        kw = dict(precise=True) if "precise" in op else {}
        run, ref = (lambda u: mx.softmax(u, axis=axis, **kw),
                    lambda u: reductions._softmax(u, axis=axis, **kw))
    else:
        keep = "keepdims" in op
        run, ref = (lambda u: mx.logsumexp(u, axis=axis, keepdims=keep),
                    lambda u: reductions._logsumexp(u, axis=axis, keepdims=keep))
    _same_as_decomposition(op.split()[0], run, ref, [(x,), (x * 1.25 + 0.1,)])


def test_softmax_chain_against_float64(kernels):
    """The chain's softmax and logsumexp against numpy float64 (an independent
    oracle) on ordinary rows: within double-word accuracy."""
    x = mx.array(rng_f32((8, 300), 15) * 10)
    with mp.extended_precision():
        y, z = mx.softmax(x, axis=-1), mx.logsumexp(x, axis=-1)
        mx.eval(y, z)
    x64 = np.array(x).astype(np.float64)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    ref = e / e.sum(-1, keepdims=True)
    lse = np.log(e.sum(-1)) + x64.max(-1)
    assert np.max(np.abs(value64(y) - ref) / ref) < 2.0 ** -40
    assert np.max(np.abs(value64(z) - lse) / np.abs(lse)) < 2.0 ** -40


def _masks(L, S):
    rng = np.random.default_rng(16)
    return {"none": None, "causal": "causal",
            "bool": mx.array(rng.random((L, S)) < 0.7),
            "additive": mx.array(rng_f32((1, 1, L, S), 17)),
            "additive -inf": mx.array(np.where(rng.random((L, S)) < 0.3, -np.inf, 0.0)
                                      .astype(np.float32))}


@pytest.mark.parametrize("mask", ["none", "causal", "bool", "additive", "additive -inf"])
@pytest.mark.parametrize("shape", ["square", "more keys", "more queries", "grouped", "sinks"])
def test_sdpa_chain_bits(kernels, mask, shape):
    """mx.fast.scaled_dot_product_attention (the engine steps on the words, the
    GEMMs and the softmax's kernel form) against its decomposition run op by op
    through the flow: the same words, for exact and carried inputs (special values
    in the first rows), each mask, grouped-query heads and sinks."""
    L, S = {"more keys": (5, 9), "more queries": (9, 5)}.get(shape, (6, 6))
    heads, kv = (4, 2) if shape == "grouped" else (2, 2)
    q, k, v = _data((2, heads, L, 8), 18), _data((2, kv, S, 8), 19), _data((2, kv, S, 8), 20)
    m = _masks(L, S)[mask]
    sinks = mx.array(rng_f32((heads,), 21)) if shape == "sinks" else None
    kw = dict(scale=0.35, mask=m, **({} if sinks is None else dict(sinks=sinks)))
    _same_as_decomposition(
        "fast.scaled_dot_product_attention",
        lambda *a: mx.fast.scaled_dot_product_attention(*a, **kw),
        lambda *a: fast_rules._sdpa(*a, **kw),
        [(q, k, v), (q * 1.25 + 0.1, k * 0.75 - 0.2, v * 1.5 + 0.3)])


def test_sdpa_chain_against_float64(kernels):
    """The chain's attention against numpy float64 (an independent oracle) with a
    causal mask and grouped heads: within double-word accuracy."""
    q, k, v = (mx.array(rng_f32(s, n)) for s, n in (((1, 4, 16, 8), 22), ((1, 2, 16, 8), 23),
                                                     ((1, 2, 16, 8), 24)))
    with mp.extended_precision():
        y = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask="causal")
        mx.eval(y)
    Q, K, V = (np.repeat(np.array(t).astype(np.float64), 4 // t.shape[1], axis=1)
               for t in (q, k, v))
    s = Q @ K.transpose(0, 1, 3, 2) * 0.25
    s = np.where(np.tril(np.ones((16, 16), bool)), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    ref = e / e.sum(-1, keepdims=True) @ V
    assert np.max(np.abs(value64(y) - ref)) < 2.0 ** -40 * np.abs(ref).max()


def test_rope_angles_shared_in_a_block(kernels):
    """Calls of mx.fast.rope in one block share the angles of one sequence length
    and one set of options only: lengths, offsets, scales (0.0 and -0.0 apart),
    bases and layouts that differ each get their own, as the decomposition."""
    x = _data((1, 2, 6, 8), 25)
    calls = [(x, dict(offset=0, scale=1.0)), (x, dict(offset=3, scale=1.0)),
             (x[:, :, :4], dict(offset=0, scale=1.0)), (x, dict(offset=0, scale=-0.0)),
             (x, dict(offset=0, scale=0.0)), (x, dict(offset=0, scale=1.0, base=500.0)),
             (x * 3.0, dict(offset=3, scale=1.0, traditional=True))]

    def options(kw):
        return dict(dict(traditional=False, base=10000.0), **kw)

    _same_as_decomposition(
        "fast.rope", lambda u, kw: mx.fast.rope(u, 8, **options(kw)),
        lambda u, kw: fast_rules._rope(u, 8, **options(kw)), calls)


def test_sdpa_causal_masks_in_a_block(kernels):
    """Causal attention of several query / key lengths in one block: each gets
    its own mask (made once per block and shape), as the decomposition."""
    shapes = [(6, 6), (6, 9), (9, 6), (5, 9), (6, 6)]
    inputs = [(_data((1, 2, L, 8), 26 + n), _data((1, 2, S, 8), 36 + n),
               _data((1, 2, S, 8), 46 + n)) for n, (L, S) in enumerate(shapes)]
    _same_as_decomposition(
        "fast.scaled_dot_product_attention",
        lambda *a: mx.fast.scaled_dot_product_attention(*a, scale=0.5, mask="causal"),
        lambda *a: fast_rules._sdpa(*a, scale=0.5, mask="causal"), inputs)


def test_long_chain_past_the_kernel_bounds(kernels):
    """A chain longer than a fused program holds (its expression no longer fits:
    the rule makes the longest operand a leaf) by the fast path and by the rule:
    the same words after 60 steps, against float64 within the chain's bound."""
    x = mx.array(rng_f32((4, 32), 21))
    s = mx.default_stream(mx.default_device())
    with mp.extended_precision():
        a, b = x, x
        for k in range(30):
            a = a * 1.0001 + 0.5
            b = mx.add(mx.multiply(b, 1.0001, stream=s), 0.5, stream=s)
        mx.eval(a, b)
    _same(a, b)
    ref = np.array(x).astype(np.float64)
    for k in range(30):
        ref = ref * 1.0001 + 0.5
    assert np.max(np.abs(value64(a) - ref) / np.abs(ref)) < 2.0 ** -44


def test_kernel_forms_keep_a_float64_carried_value():
    """A value made on the cpu backend carries its float64 value (no low word array
    yet); rope's and grouped attention's kernel forms on emulate move its words as
    the decomposition does: the low word built from it, not dropped (it was, in
    their movements: a silent rounding)."""
    x, k, v = _data((1, 4, 6, 8), 51), _data((1, 2, 6, 8), 52), _data((1, 2, 6, 8), 53)
    with mp.use_backend("cpu"), mp.extended_precision():
        xc, kc, vc = x * 1.1, k * 1.3, v * 0.7
        mx.eval(xc, kc, vc)
    rope = dict(traditional=False, base=10000.0, scale=1.0, offset=2)
    with mp.use_backend("emulate"):
        _same_as_decomposition("fast.rope", lambda a: mx.fast.rope(a, 8, **rope),
                               lambda a: fast_rules._rope(a, 8, **rope), [(xc,)])
        _same_as_decomposition(
            "fast.scaled_dot_product_attention",
            lambda *a: mx.fast.scaled_dot_product_attention(*a, scale=0.5),
            lambda *a: fast_rules._sdpa(*a, scale=0.5), [(xc, kc, vc)])


def test_short_paths_under_strict(kernels):
    """A block of the ops the short paths take (elementwise with scalars, norms,
    softmax, rope, attention, addmm, einsum, an FFT, a slice) in strict mode: no
    value leaves double-word (nothing raised, nothing in float32), every result
    carries a low word, and the report counts the ops as extended."""
    x = _data((1, 2, 8, 16), 60)
    w, c = _data((16, 16), 61), _data((16,), 62)
    with mp.extended_precision(strict=True) as report:
        y = mx.fast.layer_norm(x * 0.5 + 1.0, c, c, 1e-5)
        y = mx.fast.rope(y, 16, traditional=False, base=10000.0, scale=1.0, offset=0)
        y = mx.fast.scaled_dot_product_attention(y, y, y, scale=0.25, mask="causal")
        y = mx.addmm(c, mx.softmax(y, axis=-1), w.T)
        y = mx.einsum("bhtd,de->bhte", y, w) / 3.0
        z = mx.fft.rfft(y[..., :8], axis=-1)
        outs = [y, -mx.abs(y), mx.exp(y[0]), z]
        mx.eval(outs)
    assert not report.float32
    assert all(low_word(o) is not None for o in outs)
    for op in ("fast.layer_norm", "fast.rope", "fast.scaled_dot_product_attention", "addmm",
               "softmax", "einsum", "fft.rfft", "__mul__", "__truediv__", "exp"):
        assert report.extended[op] >= 1, op


RECORDED = {
    "layer_norm": lambda x, w: mx.fast.layer_norm(x, w, w * 0.5, 1e-5),
    "rms_norm": lambda x, w: mx.fast.rms_norm(x, w, 1e-5),
    "softmax": lambda x, w: mx.softmax(x * w, axis=-1),
    "logsumexp": lambda x, w: mx.logsumexp(x, axis=-1),
    "rope": lambda x, w: mx.fast.rope(x[None], 8, traditional=False, base=10000.0, scale=1.0,
                                      offset=1),
    "attention": lambda x, w: mx.fast.scaled_dot_product_attention(
        x[None, None], x[None, None], x[None, None] * w, scale=0.5, mask="causal"),
}


@pytest.mark.parametrize("name", RECORDED)
def test_recorded_composites_keep_their_values(kernels, name):
    """While a gradient records, a composite op is one op of the tape and its value
    is its kernel form's: the bits it has unrecorded, special values included, and
    a gradient of the op's VJP rule."""
    op = RECORDED[name]
    x, w = _data((6, 8), 40), mx.array(rng_f32((8,), 41))
    with mp.extended_precision() as report:
        plain = op(x * 1.25, w)
        value, grad = mx.value_and_grad(lambda a: op(a * 1.25, w).sum())(x)
        traced = []
        mx.grad(lambda a: (traced.append(op(a * 1.25, w)), traced[-1].sum())[1])(x)
        mx.eval(plain, value, grad, traced)
    _same(traced[0], plain)
    assert grad.shape == x.shape and not report.float32
