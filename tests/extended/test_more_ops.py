"""Ops the flow runs as decompositions into ops with double-word rules: sinh, cosh,
tan, arctan, arcsin, arccos, arctanh, arcsinh, arccosh; and clip, tril, triu (exact
on the words).

Oracle: mpmath at 120 bits on the float32 inputs (the function), numpy float64 of
the carried words (the exact ops). Special values against MLX's float32 result."""

import math

import mlx.core as mx
import mpmath
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.extended import low_word
from flow_helpers import f64, rng_f32, share

mpmath.mp.prec = 120
_rng = np.random.default_rng(31)
CASES = {  # name: (mpmath function, float32 inputs)
    "sinh": (mpmath.sinh, np.concatenate([_rng.uniform(-88, 88, 200), _rng.uniform(-1, 1, 100),
                                          [1e-6, -3e-30, 0.999, 1.0, 89.0, -89.3]])),
    "cosh": (mpmath.cosh, np.concatenate([_rng.uniform(-88, 88, 200), [1e-6, 89.0, -89.3]])),
    "tan": (mpmath.tan, np.concatenate([_rng.uniform(-10, 10, 200), [1.5707964, 1e-20]])),
    "arctan": (mpmath.atan, _rng.standard_normal(200) * 10.0 ** _rng.integers(-6, 7, 200)),
    "arcsin": (mpmath.asin, np.concatenate([_rng.uniform(-1, 1, 200), [0.99999994, -1.0]])),
    "arccos": (mpmath.acos, np.concatenate([_rng.uniform(-1, 1, 200), [0.99999994, -1.0]])),
    "arctanh": (mpmath.atanh, np.concatenate([_rng.uniform(-0.999, 0.999, 200),
                                              [0.99999994, -1e-7]])),
    "arcsinh": (mpmath.asinh, np.concatenate([
        _rng.standard_normal(200) * 10.0 ** _rng.integers(-8, 30, 200),
        [2.0**26, -(2.0**26) * 1.0000001, 6.7e7, 3e38, -1e-30]])),
    "arccosh": (mpmath.acosh, np.concatenate([
        1 + _rng.uniform(0, 1, 100) * 10.0 ** _rng.integers(-7, 1, 100),
        10.0 ** _rng.uniform(0, 38, 100), [1.0, 1.0000001, 2.0**26, 6.7e7, 3e38]])),
}
# Measured maxima of the carried value's relative error: cpu 2^-48, emulate
# 2^-43.1 (arctanh: a quotient and log1p), 2^-46.7 or better for the others.
BOUND = {"cpu": 2.0**-47, "emulate": 2.0**-42}


@pytest.mark.parametrize("name", sorted(CASES))
def test_functions_against_mpmath(backend, name):
    f, xs = CASES[name]
    x = xs.astype(np.float32)
    with mp.extended_precision() as rep:
        y = getattr(mx, name)(mx.array(x))
        value = f64(y) + f64(low_word(y))
    assert not rep.float32 and rep.extended[name] == 1
    ref = np.array([float(f(mpmath.mpf(float(t)))) for t in x])
    finite = np.isfinite(ref) & (ref != 0)
    rel = np.abs(value - ref)[finite] / np.abs(ref[finite])
    assert rel.max() <= BOUND[backend], f"{name}: 2^{math.log2(rel.max()):.1f}"
    assert share(y, ref) >= 0.99


SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 2.0, -2.0, 1.0, -1.0, 100.0],
                    np.float32)


@pytest.mark.parametrize("name", sorted(CASES))
def test_special_values_follow_float32(backend, name):
    """Inf, NaN, signed zeros, out-of-domain arguments (NaN), arctanh(+-1) and
    overflow (Inf): where MLX's float32 function gives a zero or a non-finite value,
    the same value with the same sign. (Finite results are checked against mpmath
    above: MLX's float32 functions are not correctly rounded.)"""
    x = mx.array(SPECIALS)
    want = np.array(getattr(mx, name)(x))
    with mp.extended_precision():
        got = np.array(getattr(mx, name)(x * 1))
    check = ~np.isfinite(want) | (want == 0)
    assert check.sum() >= 3
    same = (got == want) & (np.signbit(got) == np.signbit(want)) | (np.isnan(got) & np.isnan(want))
    assert same[check].all(), (SPECIALS[check & ~same], got[check & ~same], want[check & ~same])


def test_gradients_match_float64(backend):
    x0 = np.linspace(-0.9, 0.9, 7).astype(np.float32)
    for name, d in (("sinh", np.cosh), ("arctanh", lambda t: 1 / (1 - t * t)),
                    ("tan", lambda t: 1 / np.cos(t) ** 2),
                    ("arcsinh", lambda t: 1 / np.sqrt(1 + t * t))):
        with mp.extended_precision():
            g = mx.grad(lambda v: getattr(mx, name)(v / 3).sum())(mx.array(x0))
        want = d(x0.astype(np.float64) / 3) / 3
        np.testing.assert_allclose(np.array(g), want, rtol=2e-6)


def test_clip_tril_triu_keep_the_words(backend):
    x = rng_f32((5, 5), 41)
    with mp.extended_precision() as rep:
        a = mx.array(x) / 3
        value = f64(a) + f64(low_word(a))
        c = mx.clip(a, -0.2, 0.1)
        lo_only = mx.clip(a, None, 0.1)
        t, u = mx.tril(a, -1), mx.triu(a, 1)
        words = [f64(v) + f64(low_word(v)) for v in (c, lo_only, t, u)]
        grad = mx.grad(lambda v: mx.clip(v / 3, -0.2, 0.1).sum())(mx.array(x))
    assert not rep.float32
    bound = [np.float64(np.float32(-0.2)) + np.float64(np.float32(-0.2 - np.float64(np.float32(-0.2)))),
             np.float64(np.float32(0.1)) + np.float64(np.float32(0.1 - np.float64(np.float32(0.1))))]
    np.testing.assert_array_equal(words[0], np.clip(value, *bound))
    np.testing.assert_array_equal(words[1], np.minimum(value, bound[1]))
    np.testing.assert_array_equal(words[2], np.tril(value, -1))
    np.testing.assert_array_equal(words[3], np.triu(value, 1))
    inside = (value > bound[0]) & (value < bound[1])
    np.testing.assert_array_equal(np.array(grad), np.where(inside, np.float32(1 / 3), 0))


def test_docs_list_every_op_with_a_rule():
    """docs/port_guide.md's table of ops that run extended names every MLX function
    of the flow's table of rules (and mx.fast's), so the list cannot drift."""
    import re
    from pathlib import Path

    from mlx_precise.extended import rules

    text = (Path(__file__).resolve().parents[2] / "docs" / "port_guide.md").read_text()
    section = text[text.index("### Ops with a double-word rule"):
                   text.index("**Paths around the module attributes.")]
    names = [n.split(".", 1)[-1] for n in rules.TABLE if not n.startswith("array.")]
    missing = [n for n in names if not re.search(r"[`.]" + re.escape(n) + r"\b", section)]
    assert not missing, missing


def _pairs():
    """Carried values whose high words tie but whose values differ, and specials."""
    v = rng_f32(64, 43)
    a = mx.array(v) / 3
    b = a + 1e-12  # same high words (1e-12 is far below their ulp), larger values
    return a, b


@pytest.mark.parametrize("op", ["<", "<=", ">", ">=", "==", "!="])
def test_comparisons_of_carried_values_are_exact(backend, op):
    """Oracle: the same comparison of the values hi + lo in float64 (exact: 48
    significant bits). With high words tied, float32 would call every pair equal."""
    import operator

    f = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
         "==": operator.eq, "!=": operator.ne}[op]
    with mp.extended_precision() as rep:
        a, b = _pairs()
        va, vb = (f64(t) + f64(low_word(t)) for t in (a, b))
        assert np.array_equal(np.array(a), np.array(b))  # the high words tie
        got = [np.array(f(a, b)), np.array(f(b, a)), np.array(f(a, a)),
               np.array(f(a, 1 / 3)), np.array(f(a, mx.array(np.float32(0.25))))]
    want = [f(va, vb), f(vb, va), f(va, va), f(va, 1 / 3), f(va, 0.25)]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert not rep.float32 and sum(rep.extended[n] for n in rep.extended if n.startswith("__")) >= 5
    assert got[0].any() != got[1].any() or op in ("==", "!=")  # the tie was decided


def test_comparison_special_values(backend):
    x = mx.array(np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0], np.float32))
    want = {op: np.array(getattr(mx, op)(x, x[::-1])) for op in
            ("less", "less_equal", "greater", "greater_equal", "equal", "not_equal")}
    with mp.extended_precision():
        y = x * 1.0
        z = y / 1.0
        assert low_word(z) is not None
        got = {op: np.array(getattr(mx, op)(z, z[::-1])) for op in want}
    for op in want:
        np.testing.assert_array_equal(got[op], want[op], err_msg=op)


def test_argmax_argmin_decide_high_word_ties(backend):
    with mp.extended_precision() as rep:
        a, b = _pairs()
        c = mx.concatenate([a[:, None], b[:, None], a[:, None]], axis=1)  # (64, 3)
        value = f64(c) + f64(low_word(c))
        got = [np.array(mx.argmax(c, axis=1)), np.array(mx.argmin(c, axis=1)),
               np.array(c.argmax(axis=0, keepdims=True)), np.array(mx.argmax(c)),
               np.array(mx.argmin(c, keepdims=True))]
    assert not rep.float32
    assert (got[0] == 1).all() and (got[1] == 0).all()  # only the low words differ
    np.testing.assert_array_equal(got[2], np.argmax(value, axis=0)[None])
    assert got[3] == np.argmax(value) and got[4].shape == (1, 1)
    assert got[4].item() == np.argmin(value)


def _rope64(x, dims, traditional, base, scale, offset, freqs=None):
    """MLX's definition of RoPE in float64 (numpy)."""
    T, half, x = x.shape[-2], dims // 2, x.astype(np.float64)
    inv = (np.exp(-np.arange(half) * math.log(base) / half) if freqs is None
           else 1 / freqs.astype(np.float64))
    theta = ((np.arange(T) + offset) * scale)[:, None] * inv[None]
    c, s = np.cos(theta), np.sin(theta)
    x1, x2 = (x[..., 0:dims:2], x[..., 1:dims:2]) if traditional else (
        x[..., :half], x[..., half:dims])
    y1, y2 = x1 * c - x2 * s, x1 * s + x2 * c
    y = (np.stack([y1, y2], -1).reshape(*x.shape[:-1], dims) if traditional
         else np.concatenate([y1, y2], -1))
    return np.concatenate([y, x[..., dims:]], -1)


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("dims,offset,freqs", [(16, 0, False), (12, 7, False),
                                               (8, "array", False), (16, 3, True)])
def test_rope_exactly_rounded(backend, traditional, dims, offset, freqs):
    """mx.fast.rope (nn.RoPE) inside a block: every output exactly rounded against
    MLX's definition in float64, where MLX's float32 kernel gets 60-80%."""
    x = rng_f32((2, 2, 64, 16), 47)
    f = (10000.0 ** (np.arange(dims // 2) / (dims // 2))).astype(np.float32) if freqs else None
    kw = dict(traditional=traditional, base=None if freqs else 10000.0, scale=0.5,
              offset=mx.array(5) if offset == "array" else offset,
              freqs=None if f is None else mx.array(f))
    ref = _rope64(x, dims, traditional, 10000.0, 0.5, 5 if offset == "array" else offset, f)
    plain = np.array(mx.fast.rope(mx.array(x), dims, **kw))
    assert np.max(np.abs(plain - ref)) < 1e-4  # the same definition as MLX's kernel
    with mp.extended_precision() as rep:
        y = mx.fast.rope(mx.array(x) * 1, dims, **kw)
    assert not rep.float32 and rep.extended["fast.rope"] == 1
    assert share(y, ref) == 1.0 and share(plain, ref) < 0.9


def test_rope_layer_and_gradient(backend):
    import mlx.nn as nn

    x = mx.array(rng_f32((1, 32, 8), 48))
    rope = nn.RoPE(8, base=500.0)
    g_plain = np.array(mx.grad(lambda v: (rope(v) * v).sum())(x))
    with mp.extended_precision() as rep:
        y = rope(x / 3)
        g = np.array(mx.grad(lambda v: (rope(v) * v).sum())(x))
    assert rep.extended["fast.rope"] >= 2 and not rep.float32
    assert share(y, _rope64(np.array(x).astype(np.float64) / 3, 8, False, 500.0, 1.0, 0)) == 1.0
    np.testing.assert_allclose(g, g_plain, rtol=1e-4, atol=1e-5)


def test_prod_and_cumprod(backend):
    """Products and running products of carried values: exactly rounded against
    float64 (all options of cumprod; complex values; an empty axis gives 1). Values
    stay in float32's normal range (the emulator flushes subnormals, as Apple GPUs do)."""
    x = (1 + 0.1 * rng_f32((4, 50), 51)).astype(np.float32)
    z = (rng_f32((3, 20), 52) + 1j * rng_f32((3, 20), 53)).astype(np.complex64)
    v, vz = x.astype(np.float64) / 3, z.astype(np.complex128) / 3
    with mp.extended_precision() as rep:
        a, c = mx.array(x) / 3, mx.array(z) / 3
        got = [mx.prod(a, axis=1), a.prod(), mx.cumprod(a, axis=1),
               mx.cumprod(a, axis=1, reverse=True), mx.cumprod(a, axis=0, inclusive=False),
               mx.cumprod(mx.array(x) / 1.01), mx.prod(c, axis=1), mx.cumprod(c, axis=1),
               mx.prod(a[:, :0], axis=1)]
        got = [np.array(t) for t in got]
    assert not rep.float32
    rev = np.flip(np.cumprod(np.flip(v, 1), 1), 1)
    excl = np.concatenate([np.ones((1, 50)), np.cumprod(v, 0)[:-1]], 0)
    want = [np.prod(v, 1), np.prod(v), np.cumprod(v, 1), rev, excl,
            np.cumprod(x.astype(np.float64).reshape(-1) / 1.01),
            np.prod(vz, 1), np.cumprod(vz, 1), np.ones(4)]
    for i, (g, w) in enumerate(zip(got, want)):
        assert share(g, w) >= 0.99, i
    with mp.extended_precision():
        g = mx.grad(lambda t: mx.prod(t / 3, axis=1).sum())(mx.array(x))
    np.testing.assert_allclose(np.array(g), np.prod(v, 1)[:, None] / v / 3, rtol=1e-5)


def test_cumsum_over_the_flattened_array_keeps_the_low_words(backend):
    """cumsum(a) without an axis flattens both words (it used to flatten the high
    word alone: the low words were dropped, silently)."""
    x = rng_f32((10, 10), 54)
    with mp.extended_precision() as rep:
        y = mx.cumsum(mx.array(x) / 3)
        value = f64(y) + f64(low_word(y))
    ref = np.cumsum(x.astype(np.float64).reshape(-1) / 3)
    assert not rep.float32 and share(y, ref) >= 0.99
    assert np.max(np.abs(value - ref)) < 1e-13


@pytest.mark.parametrize("call", [
    lambda a: mx.sum(a, axis=3), lambda a: mx.mean(a, axis=(0, 0)), lambda a: mx.prod(a, axis=-4),
    lambda a: mx.cumprod(a, axis=3), lambda a: mx.cumsum(a, axis=-5), lambda a: mx.var(a, axis=7),
    lambda a: mx.argmax(a, axis=5), lambda a: mx.max(a, axis=3),
    lambda a: mx.fast.rope(a, 7, traditional=False, base=1e4, scale=1.0, offset=0),
    lambda a: mx.fast.rope(a, 16, traditional=False, base=1e4, scale=1.0, offset=0),
    lambda a: a < mx.ones((3,)), lambda a: mx.clip(a, mx.ones((5,)), None)],
    ids=["sum-axis3", "mean-repeated-axis", "prod-axis-4", "cumprod-axis3", "cumsum-axis-5",
         "var-axis7", "argmax-axis5", "max-axis3", "rope-odd-dims", "rope-dims-over-size",
         "less-unbroadcastable", "clip-unbroadcastable"])
def test_bad_arguments_raise_mlx_errors_in_a_block(backend, call):
    """Invalid axes (out of range or repeated), RoPE dims and shapes raise the
    error MLX raises outside a block (the rules decline; nothing wraps an axis)."""
    x = mx.array(np.ones((2, 4, 8), np.float32))
    with pytest.raises((ValueError, IndexError)) as plain:
        mx.eval(call(x))
    with pytest.raises(type(plain.value), match=None) as extended:
        with mp.extended_precision():
            mx.eval(call(x / 3))
    assert str(extended.value) == str(plain.value)
