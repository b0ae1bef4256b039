"""Special values (Inf, NaN, overflow) on every backend: a double-word operation
gives what the float32 operation on the high words gives whenever that is not
finite (metal/include/doubleword.h, "Special values"), and the elementwise ops give
what plain float32 MLX gives. The oracle is numpy / MLX float32 arithmetic."""

import warnings

import mlx.core as mx
import numpy as np
import pytest
from helpers import run_cdw, run_dw

from mlx_precise import (
    complex_multiply_extended,
    depthwise3_extended,
    depthwise_conv_extended,
    fft_scale_extended,
)

BACKENDS = ("emulate", "cpu")
INF, NAN, BIG = np.float32(np.inf), np.float32(np.nan), np.float32(3e38)
MAXF = np.finfo(np.float32).max
SPECIALS = np.array([INF, -INF, NAN, BIG, -BIG, MAXF, 2.0**127, 1.0, -2.5, 0.0, -0.0,
                     1e-30, 2.0**-126], np.float32)


def same(got, want) -> bool:
    """Equal as IEEE values, NaN matching NaN (any payload/sign)."""
    got, want = np.asarray(got), np.asarray(want)
    return bool(np.all((got == want) | (np.isnan(got) & np.isnan(want))))


def pairs():
    x, y = np.meshgrid(SPECIALS, SPECIALS)
    return x.ravel().astype(np.float32), y.ravel().astype(np.float32)


# float32 reference of each dw_ops operation on the high words
F32_OPS = {0: np.add, 1: np.add, 2: np.multiply, 3: np.add, 4: np.add, 5: np.multiply,
           6: np.multiply, 7: np.divide}


@pytest.mark.parametrize("op", sorted(F32_OPS))
def test_doubleword_ops_follow_float32_on_special_values(op):
    """Every pair of special/huge operands: where the float32 result is not finite,
    the double-word result is exactly it, with a zero low word (so rounding gives
    it back); where it is finite, so is the double-word one."""
    x, y = pairs()
    if op == 1:  # Fast2Sum needs |x| >= |y|
        x, y = np.where(np.abs(x) >= np.abs(y), x, y), np.where(np.abs(x) >= np.abs(y), y, x)
    z = np.zeros_like(x)
    zh, zl = run_dw(op, x, z, y, z)
    with np.errstate(all="ignore"):
        want = F32_OPS[op](x, y).astype(np.float32)
    special = ~np.isfinite(want)
    assert special.sum() >= 40
    assert same(zh[special], want[special]), [
        (a, b, g, w) for a, b, g, w in zip(x[special], y[special], zh[special], want[special])
        if not same(g, w)][:5]
    assert np.all(zl[special] == 0)
    # finite float32 results stay finite (no spurious NaN from a residual)
    assert np.isfinite(zh[~special]).all() and np.isfinite(zl[~special]).all()


def test_doubleword_overflow_of_low_terms_gives_signed_inf():
    """A double-word sum whose exact value rounds past the float32 range gives the
    correctly signed Inf, although its high words alone do not overflow."""
    h, q = np.float32(MAXF), np.float32(2.0**102)  # ulp(MAXF) = 2^104
    # (MAXF, 2^102) + (2^102, 0) = MAXF + 2^103: a tie, rounded to even, i.e. to 2^128
    zh, zl = run_dw(4, np.array([h, -h], np.float32), np.array([q, -q], np.float32),
                    np.array([q, -q], np.float32), np.zeros(2, np.float32))
    assert zh.tolist() == [np.inf, -np.inf] and zl.tolist() == [0.0, 0.0]


def test_complex_ops_follow_float32_formula():
    """cdw_ops multiply: each component as the float32 formula (ac - bd, ad + bc)."""
    rng = np.random.default_rng(1)
    vals = SPECIALS
    a, b, c, d = (rng.choice(vals, 4000).astype(np.float32) for _ in range(4))
    z = np.zeros_like(a)
    rh, rl, ih, il = run_cdw(1, (a, z, b, z), (c, z, d, z))
    with np.errstate(all="ignore"):
        re = (a * c - b * d).astype(np.float32)
        im = (a * d + b * c).astype(np.float32)
    for got, low, want in ((rh, rl, re), (ih, il, im)):
        special = ~np.isfinite(want)
        assert special.sum() > 500
        assert same(got[special], want[special]) and np.all(low[special] == 0)


def complex_parts(re, im):
    z = np.empty(re.shape, np.complex64)
    z.real, z.imag = re, im
    return z


@pytest.mark.parametrize("backend", BACKENDS)
def test_complex_multiply_specials(backend):
    """Each component as the formula (ac - bd, ad + bc) gives it: in float32 on the
    kernel path (what MLX's Metal complex64 multiply computes), in float64 rounded
    once on the cpu backend (where no intermediate overflows)."""
    x, y = pairs()
    rng = np.random.default_rng(2)
    a_re, a_im, b_re, b_im = x, rng.permutation(x), y, rng.permutation(y)
    a, b = complex_parts(a_re, a_im), complex_parts(b_re, b_im)
    t = np.float32 if backend != "cpu" else np.float64
    with np.errstate(all="ignore"):
        ar, ai, br, bi = (v.astype(t) for v in (a_re, a_im, b_re, b_im))
        want = complex_parts((ar * br - ai * bi).astype(np.float32),
                             (ar * bi + ai * br).astype(np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy RuntimeWarning leaks from the cpu path
        got = np.array(complex_multiply_extended(mx.array(a), mx.array(b), backend=backend))
    for g, w in ((got.real, want.real), (got.imag, want.imag)):
        special = ~np.isfinite(w)
        assert special.sum() > 20
        assert same(g[special], w[special])
        assert np.isfinite(g[~special]).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [1, 3, 4, 1000])
def test_fft_scale_specials(backend, n):
    x = SPECIALS.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = np.array(fft_scale_extended(mx.array(x), n, backend=backend))
    want = (x.astype(np.float64) / n).astype(np.float32)
    special = ~np.isfinite(want)
    assert special.sum() == 3
    assert same(got[special], want[special]) and np.isfinite(got[~special]).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_depthwise_overflow_and_inf(backend):
    """Overflow of the exact sum gives the signed Inf (plain MLX gives Inf too);
    an Inf input gives Inf, Inf - Inf NaN, as float32 convolution does."""
    x = mx.full((1, 1, 4), 2e38)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = np.array(depthwise3_extended(x, mx.ones((1, 3)), backend=backend)).ravel()
    assert y[0] == np.float32(2e38) and np.all(y[1:] == np.inf)
    y = np.array(depthwise3_extended(-x, mx.ones((1, 3)), backend=backend)).ravel()
    assert np.all(y[1:] == -np.inf)
    xs = mx.array(np.array([[[1.0, np.inf, -np.inf, 2.0, 3.0, 4.0, 5.0, 6.0]]], np.float32))
    w = mx.array(np.array([[1.0, 1.0]], np.float32))
    y = np.array(depthwise_conv_extended(xs, w, backend=backend)).ravel()
    assert same(y, [1.0, np.inf, np.nan, -np.inf, 5.0, 7.0, 9.0, 11.0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_softmax_and_divmod_specials(backend):
    """Inside a block: softmax of rows holding +-Inf or NaN is what MLX's float32
    softmax gives (a row holding +Inf is NaN throughout: it gave 0 beside the NaN),
    logsumexp too; floor_divide and remainder of special values are MLX's."""
    import mlx_precise as mp

    rows = np.array([[INF, 1, 2, 3], [-INF] * 4, [NAN, 1, 2, 3], [INF, INF, 0, 0],
                     [-INF, 0, 1, 2], [INF, -INF, 1, 2], [BIG, -BIG, 0, 1]], np.float32)
    x, y = pairs()
    want = [mx.softmax(mx.array(rows), axis=-1), mx.logsumexp(mx.array(rows), axis=-1),
            mx.floor_divide(mx.array(x), mx.array(y)), mx.remainder(mx.array(x), mx.array(y))]
    with mp.use_backend(backend), mp.extended_precision():
        r = mx.array(rows) * 1.0
        got = [mx.softmax(r, axis=-1), mx.logsumexp(r, axis=-1)]
        a, b = mx.array(x) * 1.0, mx.array(y) * 1.0
        got += [mx.floor_divide(a, b), mx.remainder(a, b)]
        got = [np.array(g) for g in got]
    finite = np.isfinite(x) & np.isfinite(y) & (y != 0)
    for k, (g, w) in enumerate(zip(got, want)):
        w = np.array(w)
        if k >= 2:  # (divmod of finite values: exact there, MLX's elsewhere)
            g, w = g[~finite], w[~finite]
        assert same(g, w), (k, g, w)


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_gradients_of_decomposed_functions(backend):
    """The gradients of sinh, cosh, arcsinh and erfinv inside a block at special
    and extreme arguments are their derivatives (cosh, sinh, 1 / sqrt(1 + x^2),
    sqrt(pi)/2 e^(erfinv(x)^2)) at the exact values: +Inf where float32's is +Inf
    (sinh' was NaN: 0 times an infinite branch), NaN where it is NaN (arcsinh'(NaN)
    and erfinv' beyond +-1 were 0), sinh(1e-30) for cosh' (0: the difference of
    two cotangents cancelled). Oracle: mpmath; special values as MLX's float32."""
    import mpmath
    import mlx_precise as mp

    xs = np.array([0.0, 1e-30, -2e-20, 0.5, -3.0, 40.0, 1e30, 3e38, INF, -INF, NAN], np.float32)
    us = np.array([0.0, 1e-30, 0.5, -0.9, 1.0, -1.0, 3.0, NAN], np.float32)
    cases = {"sinh": (xs, mpmath.cosh), "cosh": (xs, mpmath.sinh),
             "arcsinh": (xs, lambda v: 1 / mpmath.sqrt(1 + v * v)),
             "erfinv": (us, lambda v: mpmath.sqrt(mpmath.pi) / 2
                        * mpmath.exp(mpmath.erfinv(v) ** 2))}
    for name, (x, d) in cases.items():
        f = getattr(mx, name)
        with mp.use_backend(backend), mp.extended_precision(strict=True):
            got = np.array(mx.grad(lambda v: f(v).sum())(mx.array(x)))
        want = np.array(mx.grad(lambda v: f(v).sum())(mx.array(x)))
        for k, v in enumerate(x.tolist()):
            if not np.isfinite(v) or not np.isfinite(want[k]) or abs(v) >= 1 and name == "erfinv":
                assert same(got[k], want[k]), (name, v, got[k], want[k])
                continue
            ref = d(mpmath.mpf(v))
            if abs(ref) > MAXF:
                assert got[k] == np.sign(float(ref)) * INF, (name, v, got[k])
            elif abs(ref) > 1e-37:
                assert got[k] == np.float32(float(ref)), (name, v, got[k], float(ref))


_GRAD_SPECIALS = np.array([0.0, -0.0, 1.0, -1.0, 0.5, 3.0, -2.5, 0.9999999, -0.9999999,
                           1.0000001, INF, -INF, NAN], np.float32)


def _grad_cases():
    import mlx.nn as nn

    return {
        **{name: getattr(mx, name) for name in ("arcsin", "arccos", "arctanh", "arccosh")},
        **{name: getattr(nn, name) for name in ("leaky_relu", "celu", "relu6", "hard_tanh",
                                                 "elu", "softplus", "silu")},
        "huber": lambda x: nn.losses.huber_loss(x, mx.zeros_like(x), reduction="none"),
        "maximum": lambda x: mx.maximum(x, 0.5), "minimum": lambda x: mx.minimum(0.5, x),
        "maximum tie": lambda x: mx.maximum(x, x), "power": lambda x: mx.power(x, 2.5),
        "power of": lambda x: mx.power(2.0, x), "x ** x": lambda x: x ** x,
        "remainder": lambda x: mx.remainder(x, 0.75), "remainder of": lambda x: 0.75 % x,
        "floor_divide": lambda x: x // 0.75,
        "arctan2": lambda x: mx.arctan2(x, 0.5), "logaddexp": lambda x: mx.logaddexp(x, 1.0),
    }


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(_grad_cases()))
def test_block_gradient_specials_are_mlx(backend, name):
    """The gradient in a block has MLX float32's special values (Inf, NaN, zero, sign)
    at +-0, +-1, the edges of the inverse functions' domains, +-Inf and NaN. Cases
    that failed before: arcsin' / arccos' / arctanh' / arccosh' were NaN at +-1
    (float32: +-Inf), maximum / minimum gave a NaN operand's cotangent to y and
    dropped a NaN cotangent (leaky_relu'(NaN) 1, celu'(NaN) and huber'(NaN) 0),
    remainder's gradient raised on a Python divisor and was 0 at Inf / NaN (MLX:
    1), x ** x' was NaN where x^y underflows to 0 (the y-term)."""
    import mlx_precise as mp

    f = _grad_cases()[name]
    want = np.array(mx.grad(lambda v: f(v).sum())(mx.array(_GRAD_SPECIALS)))
    with mp.use_backend(backend), mp.extended_precision():
        got = np.array(mx.grad(lambda v: f(v).sum())(mx.array(_GRAD_SPECIALS) * 1.0))
    kind = (lambda a: np.where(np.isnan(a), 9, np.where(np.isinf(a), 5 * np.sign(a),
                                                          np.sign(a))))
    assert np.array_equal(kind(got), kind(want)), (got, want)
