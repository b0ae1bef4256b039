"""Rules found missing by running public model code (mlx-lm architectures)
unmodified inside a block, and the ops that had none: each against an independent
float64 oracle (numpy), on both host backends, with an empty report."""

from __future__ import annotations

import math
from fractions import Fraction

import mlx.core as mx
import mpmath
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.extended import carry
from flow_helpers import rng_f32, share, value64
from oracle import round_f32_fraction


def exact(x) -> np.ndarray:
    """The value ``x`` carries in float64: the cpu backend's float64 value where it
    keeps one, else its two words joined."""
    wide = carry.wide_value(x)
    return value64(x) if wide is None else np.array(wide[0])


def _carried(shape, seed=0, scale=3.0):
    """A float32 array carrying a low word (x / 3) and the value it carries, in
    float64 (the oracle's input)."""
    a = rng_f32(shape, seed)
    with mp.extended_precision():
        x = mx.array(a) / scale
    return x, exact(x)


# ---- linalg.norm: double-word on every backend, and its derivative ---------------------

_NORMS = [
    ({}, lambda x: x / np.linalg.norm(x)),
    ({"axis": -1}, lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)),
    ({"ord": 1, "axis": -1}, lambda x: np.sign(x)),
    ({"ord": np.inf, "axis": 1},
     lambda x: np.sign(x) * (np.abs(x) == np.abs(x).max(1, keepdims=True))),
    ({"ord": 3, "axis": 0},
     lambda x: np.sign(x) * x ** 2 / np.linalg.norm(x, 3, axis=0) ** 2),
    ({"ord": "fro"}, lambda x: x / np.linalg.norm(x)),
    ({"ord": 1},  # the matrix 1-norm: the largest column sum of |x|
     lambda x: np.sign(x) * (np.abs(x).sum(0) == np.abs(x).sum(0).max())),
    ({"axis": -1, "keepdims": True}, lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)),
]


@pytest.mark.parametrize("kw, derivative", _NORMS, ids=[str(k) for k, _ in _NORMS])
def test_linalg_norm_value_and_gradient(backend, kw, derivative):
    """rwkv7's ``x / max(norm(x, axis=-1), eps)`` under nn.value_and_grad: the
    norm's derivative was MLX's float32 VJP (reported) on cpu, and the norm itself
    a float32 op on emulate."""
    x, X = _carried((4, 6), seed=1)
    with mp.extended_precision() as report:
        value, grad = mx.value_and_grad(lambda v: mx.linalg.norm(v, **kw).sum())(x)
        got, g = value64(value), value64(grad)
    assert not report.float32, report
    ref = np.sum(np.linalg.norm(X, ord=kw.get("ord"), axis=kw.get("axis"),
                                keepdims=kw.get("keepdims", False)) if kw.get("ord") or
                 kw.get("axis") is not None else np.linalg.norm(X.ravel()))
    assert abs(got - ref) <= 2 ** -44 * abs(ref)
    gref = derivative(X)
    assert np.max(np.abs(g - gref)) <= 2 ** -44 * np.max(np.abs(gref))
    assert share(grad, gref) == 1.0


# ---- scaled_dot_product_attention with sinks (gpt-oss) -------------------------------


def _attention_with_sinks(q, k, v, sinks, scale, causal):
    """float64 reference: scores, a sink logit per head as an extra key with no
    value, softmax; also the sink's probability (for the derivative)."""
    heads = q.shape[1]
    k, v = (np.repeat(t, heads // t.shape[1], axis=1) for t in (k, v))
    s = scale * q @ k.swapaxes(-1, -2)
    if causal:
        L, S = s.shape[-2:]
        s = np.where(np.arange(S)[None] <= np.arange(L)[:, None] + (S - L), s,
                     np.finfo(np.float32).min)
    s = np.concatenate([np.broadcast_to(sinks.reshape(1, -1, 1, 1), s.shape[:-1] + (1,)), s],
                       axis=-1)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return p[..., 1:] @ v, p[..., 0]


@pytest.mark.parametrize("causal", [False, True])
def test_attention_sinks(backend, causal):
    """gpt-oss passes ``sinks=`` to every attention layer: it was a float32 op
    (reported), 38% of the model's logits exactly rounded. Value and the sinks'
    derivative (``d out / d sink = -p_sink out``) against float64."""
    q, Q = _carried((2, 4, 5, 8), seed=2)
    k, K = _carried((2, 2, 7, 8), seed=3)
    v, Vv = _carried((2, 2, 7, 8), seed=4)
    sinks, SINKS = _carried((4,), seed=5)
    cot = rng_f32((2, 4, 5, 8), seed=6)
    mask = "causal" if causal else None
    with mp.extended_precision() as report:
        def f(s):
            out = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.35, mask=mask, sinks=s)
            return (out * mx.array(cot)).sum(), out
        (_, out), g = mx.value_and_grad(f)(sinks)
        got, g64 = value64(out), value64(g)
    assert not report.float32, report
    ref, p_sink = _attention_with_sinks(Q, K, Vv, SINKS, 0.35, causal)
    assert share(out, ref) == 1.0
    assert np.max(np.abs(got - ref)) <= 2 ** -44 * np.max(np.abs(ref))
    gref = -np.sum(p_sink * np.sum(ref * cot, axis=-1), axis=(0, 2))
    assert np.max(np.abs(g64 - gref)) <= 2 ** -42 * np.max(np.abs(gref))


# ---- logcumsumexp, hadamard_transform ------------------------------------------------


@pytest.mark.parametrize("kw", [{"axis": 1}, {"axis": 0, "reverse": True},
                                {"axis": -1, "inclusive": False}, {},
                                {"axis": 1, "reverse": True, "inclusive": False}])
def test_logcumsumexp(backend, kw):
    """Against numpy's float64 ``logaddexp.accumulate``; a prefix far below the row's
    maximum (-200 / 3) stays finite. Its gradient (the softmax weights of each
    prefix, summed) against float64."""
    x, X = _carried((3, 9), seed=7)
    with mp.extended_precision():
        x[0, 0] = -200.0 / 3
    X[0, 0] = exact(x)[0, 0]
    axis = kw.get("axis")
    flat = axis is None
    A = X.ravel() if flat else X
    ax = 0 if flat else axis % 2
    if kw.get("reverse"):
        A = np.flip(A, ax)
    ref = np.logaddexp.accumulate(A, axis=ax)
    if not kw.get("inclusive", True):
        ref = np.concatenate([np.full_like(np.take(ref, [0], axis=ax), -np.inf),
                              np.take(ref, range(ref.shape[ax] - 1), axis=ax)], axis=ax)
    if kw.get("reverse"):
        ref = np.flip(ref, ax)
    with mp.extended_precision() as report:
        y = mx.logcumsumexp(x, **kw)
        g = mx.grad(lambda v: mx.logcumsumexp(v, **kw).sum())(x)
        got, g64 = value64(y), value64(g)
    assert not report.float32, report
    assert share(y, ref) == 1.0
    finite = np.isfinite(ref)
    assert np.max(np.abs(got[finite] - ref[finite]) / np.abs(ref[finite])) <= 2 ** -45
    # d/dx_j sum_i y_i = sum over the prefixes i holding j of e^(x_j - y_i)
    n = A.shape[ax]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    rev = bool(kw.get("reverse"))
    holds = (j >= i if rev else j <= i) if kw.get("inclusive", True) else (
        j > i if rev else j < i)
    Xa = np.moveaxis(X.ravel() if flat else X, ax, -1)
    Ya = np.moveaxis(np.asarray(ref).reshape(-1) if flat else ref, ax, -1)
    inv = np.where(np.isfinite(Ya), np.exp(-np.where(np.isfinite(Ya), Ya, 0)), 0)
    gref = np.moveaxis(np.exp(Xa) * (inv @ holds), -1, ax)
    assert np.max(np.abs(g64 - gref.reshape(X.shape)) / np.abs(gref).max()) <= 2 ** -44


def test_logcumsumexp_gradient_of_a_row_starting_at_infinity(backend):
    """A row whose first element is +Inf: every prefix is +Inf, and the gradient of
    their sum is the limit of the finite case, 1 per prefix at the Inf (n in all)
    and 0 elsewhere: the scan's derivative is logaddexp's (MLX's convention at
    (Inf, x): (1, 0)), where MLX's own logcumsumexp VJP gives NaN."""
    x = mx.array([np.inf, 1.0, 2.0, -1.0], dtype=mx.float32)
    with mp.extended_precision(strict=True):
        y = mx.logcumsumexp(x)
        g = mx.grad(lambda v: mx.logcumsumexp(v).sum())(x)
        got, grad = np.array(y), np.array(g)
    assert np.all(got == np.inf)
    np.testing.assert_array_equal(grad, np.array([4.0, 0.0, 0.0, 0.0], np.float32))
    assert np.isnan(np.array(mx.grad(lambda v: mx.logcumsumexp(v).sum())(x))[0])  # MLX's


def _fraction(v) -> Fraction:
    """An mpmath number as the exact rational it is."""
    sign, man, exp, _ = v._mpf_
    return (-1) ** sign * Fraction(int(man)) * Fraction(2) ** int(exp) if man else Fraction(0)


def _midpoint_distance(v: Fraction, r: np.float32) -> Fraction:
    """Distance from v to the nearest midpoint between r (its float32 rounding) and
    a neighbour."""
    below, above = (np.nextafter(r, np.float32(t)) for t in (-np.inf, np.inf))
    return min(abs(v - (Fraction(float(r)) + Fraction(float(n))) / 2) for n in (below, above))


@pytest.mark.parametrize("n", [1, 2, 16, 12, 40, 112])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_hadamard_transform(backend, n, scale):
    """``x @ R`` with R MLX's +-1 matrix (its transform of the identity: Sylvester
    for powers of two, with its order-12 / 20 / 28 factors otherwise), scaled by
    1/sqrt(n) (float64) or the given scale: against exact sums (fractions) times
    the scale (mpmath, 200 bits), rounded once to float32 (ties occur: sums of
    +-x/3 land on float32 midpoints)."""
    x, X = _carried((3, n), seed=n)
    R = np.array(mx.hadamard_transform(mx.eye(n), scale=1.0)).astype(int)
    with mp.extended_precision() as report:
        y = mx.hadamard_transform(x, scale=scale)
        got = value64(y)
    assert not report.float32, report
    with mpmath.workprec(200):
        factor = 1 / mpmath.sqrt(n) if scale is None else mpmath.mpf(scale)
        sums = [[sum(Fraction(float(X[r, k])) * int(R[k, c]) for k in range(n))
                 for c in range(n)] for r in range(3)]
        exact_ref = [[_fraction(mpmath.mpf(s.numerator) / s.denominator * factor)
                      for s in row] for row in sums]
    flat = [v for row in exact_ref for v in row]
    rounded = np.array([round_f32_fraction(v) for v in flat])
    # exactly rounded wherever the error bound (2^-45 relative) cannot reach a
    # float32 midpoint: sums of +-x/3 come within 2^-50 of midpoints
    clear = np.array([_midpoint_distance(v, r) > Fraction(1, 2 ** 45) * abs(v)
                      for v, r in zip(flat, rounded)])
    assert clear.mean() > 0.9
    assert np.array_equal(np.array(y).ravel()[clear], rounded[clear])
    ref = np.array([[float(v) for v in row] for row in exact_ref])
    assert np.max(np.abs(got - ref)) <= 2 ** -46 * np.sqrt(n) * np.max(np.abs(ref))


# ---- block_masked_mm, segmented_mm (the matmul rule), as_strided, depends ---------------


def _matmul_ref(a, b):
    """float64 operands multiplied and summed in long double (64-bit significand)."""
    return (np.asarray(a, np.longdouble) @ np.asarray(b, np.longdouble)).astype(np.float64)


@pytest.mark.parametrize("masks", ["lhs", "rhs", "out", "all"])
def test_block_masked_mm(backend, masks):
    """Boolean masks zero blocks, floating ones scale them (MLX's definition, checked
    against MLX's own op to float32 accuracy); the double-word result against long
    double."""
    bs = 32
    a, A = _carried((2, 70, 40), seed=10)
    b, B = _carried((2, 40, 36), seed=11)
    rng = np.random.default_rng(12)
    lhs = rng.random((2, 3, 2)) > 0.4
    rhs = rng.standard_normal((2, 2, 2)).astype(np.float32)
    out = rng.random((2, 3, 2)) > 0.3
    kw = {"lhs": {"mask_lhs": lhs}, "rhs": {"mask_rhs": rhs}, "out": {"mask_out": out},
          "all": {"mask_lhs": lhs, "mask_rhs": rhs, "mask_out": out}}[masks]
    expand = (lambda m, r, c: np.repeat(np.repeat(m, bs, -2), bs, -1)[..., :r, :c])
    A2 = A * expand(lhs, 70, 40) if "mask_lhs" in kw else A
    B2 = B * expand(rhs, 40, 36) if "mask_rhs" in kw else B
    ref = _matmul_ref(A2, B2) * (expand(out, 70, 36) if "mask_out" in kw else 1)
    mkw = {k: mx.array(v) for k, v in kw.items()}
    plain = np.array(mx.block_masked_mm(mx.array(A.astype(np.float32)),
                                        mx.array(B.astype(np.float32)), bs, **mkw))
    assert np.max(np.abs(plain - ref)) <= 1e-5 * np.max(np.abs(ref))  # MLX's definition
    with mp.extended_precision() as report:
        y = mx.block_masked_mm(a, b, bs, **mkw)
    assert not report.float32, report
    assert share(y, ref) == 1.0


def test_segmented_mm(backend):
    """One product per segment of the inner dimension (an empty one gives zeros)."""
    a, A = _carried((20, 50), seed=13)
    b, B = _carried((50, 12), seed=14)
    segs = [[0, 17], [17, 50], [9, 9], [5, 44]]
    with mp.extended_precision() as report:
        y = mx.segmented_mm(a, b, mx.array(segs, dtype=mx.int32))
    assert not report.float32, report
    ref = np.stack([_matmul_ref(A[:, s:e], B[s:e]) for s, e in segs])
    assert y.shape == (4, 20, 12)
    assert share(y, ref) == 1.0


def test_as_strided_and_depends_keep_the_words(backend):
    """Movement: the carried value's elements, words and all."""
    x, X = _carried((3, 4), seed=15)
    with mp.extended_precision() as report:
        y = mx.as_strided(x, (2, 3), (1, 4), 1)
        z, w = mx.depends([x, x * 2.0], [y])
        got_y, got_z, got_w = exact(y), exact(z), exact(w)
    assert not report.float32, report
    flat = X.ravel()
    assert np.array_equal(got_y, np.array([[flat[1 + i + 4 * j] for j in range(3)]
                                           for i in range(2)]))
    assert np.array_equal(got_z, X) and np.array_equal(got_w, 2 * X)


def test_logaddexp_equal_infinities_and_its_derivative_at_a_tie(backend):
    """``logaddexp(-inf, -inf)`` is -inf and ``(inf, inf)`` inf as in MLX (the flow
    gave NaN: inf - inf); at ``a == b`` each operand's derivative is 1/2 (the
    composition max + log1p(e^-|a-b|) gave 0 and 1), elsewhere sigmoid(a - b)."""
    inf = float("inf")
    a = mx.array([-inf, inf, -inf, 1.0, inf, 0.25])
    b = mx.array([-inf, inf, 2.0, -inf, -inf, 0.25])
    with mp.extended_precision() as report:
        y = mx.logaddexp(a, b)
        p, P = _carried((6,), seed=16)
        q = mx.concatenate([p[:3], p[3:] * 2.0])
        Q = exact(q)
        ga, gb = mx.grad(lambda u, v: mx.logaddexp(u, v).sum(), argnums=(0, 1))(p, q)
        ga, gb = value64(ga), value64(gb)
    assert not report.float32, report
    np.testing.assert_array_equal(np.array(y), np.array(mx.logaddexp(a, b)))
    s = 1 / (1 + np.exp(Q - P))
    np.testing.assert_allclose(ga, s, rtol=2 ** -44)
    np.testing.assert_allclose(gb, 1 - s, rtol=2 ** -44)
    assert np.array_equal(ga[:3], np.full(3, 0.5)) and np.array_equal(gb[:3], np.full(3, 0.5))


def test_equal_carried_values_subtract_to_zero(backend):
    """On cpu a value keeps its float64 bits through indexing and negation: ``x - y``
    of equal values is 0 (indexing and ``-y`` kept only the two words' 48 bits, so
    ``x[:3] - x[:3]`` through two paths gave 2.8e-16)."""
    x, X = _carried((6,), seed=16)
    with mp.extended_precision() as report:
        y = mx.concatenate([x[:3], x[3:]])
        d = exact(x - y)
        e = exact(-x + x[::-1][::-1])
    assert not report.float32
    assert np.array_equal(d, np.zeros(6)) and np.array_equal(e, np.zeros(6))
    assert np.array_equal(exact(x), X)


# ---- mx.random with carried parameters -------------------------------------------------

_BELOW_MINUS_ONE = float(np.nextafter(np.float32(-1), np.float32(0)))


def _uniform_draw(low, high, shape, key):
    """MLX's float32 uniform draw (the bits every sampler transforms), in float64."""
    return np.array(mx.random.uniform(low, high, shape, key=key)).astype(np.float64)


def test_random_samplers_with_carried_parameters(backend):
    """``normal(loc=, scale=)``, ``uniform(low, high)``, ``laplace`` and
    ``truncated_normal`` of carried parameters: MLX's draw (same key, same bits)
    transformed in double-word, against mpmath (erfinv, erf) and float64. They
    were float32 ops, reported."""
    loc, L = _carried((5,), seed=17)
    key = mx.random.key(7)
    with mp.extended_precision() as report:
        normal = mx.random.normal((4, 5), loc=loc, scale=1.7, key=key)
        uniform = mx.random.uniform(loc, 2.0, (4, 5), key=key)
        laplace = mx.random.laplace((4, 5), loc=loc[0], scale=1.3, key=key)
        trunc = mx.random.truncated_normal(loc - 1.0, loc + 1.0, key=key)
        lo, hi = exact(loc - 1.0), exact(loc + 1.0)
    assert not report.float32, report
    sym = _uniform_draw(_BELOW_MINUS_ONE, 1.0, (4, 5), key)
    u01 = _uniform_draw(0.0, 1.0, (4, 5), key)
    with mpmath.workprec(120):
        erfinv = np.vectorize(lambda v: float(mpmath.erfinv(mpmath.mpf(v))))
        assert share(normal, L + 1.7 * math.sqrt(2) * erfinv(sym)) == 1.0
        a = np.vectorize(lambda v: mpmath.erf(mpmath.mpf(v) / mpmath.sqrt(2)), otypes=[object])
        A, B = a(lo), a(hi)
        U = _uniform_draw(0.0, 1.0, (5,), key)
        ref = [float(mpmath.sqrt(2) * mpmath.erfinv(A[i] + (B[i] - A[i]) * mpmath.mpf(U[i])))
               for i in range(5)]
        assert share(trunc, np.clip(ref, lo, hi)) == 1.0
    assert share(uniform, L + (2.0 - L) * u01) == 1.0
    assert share(laplace, L[0] + 1.3 * np.sign(sym) * np.log1p(-np.abs(sym))) == 1.0


def test_random_categorical_and_permutation_of_carried_values(backend):
    """``categorical``: argmax of MLX's Gumbel draw plus the carried logits (exact
    in double-word); ``permutation`` moves whole values."""
    logits, L = _carried((3, 50), seed=18)
    key = mx.random.key(8)
    with mp.extended_precision() as report:
        c = mx.random.categorical(logits, key=key)
        p = mx.random.permutation(logits, axis=1, key=key)
        moved = exact(p)
    assert not report.float32, report
    g = np.array(mx.random.gumbel((3, 50), key=key)).astype(np.float64)
    assert np.array_equal(np.array(c), np.argmax(g + L, axis=-1))
    order = np.array(mx.random.permutation(50, key=key))
    assert np.array_equal(moved, L[:, order])


def test_random_with_python_scalar_parameters_is_mlx():
    """mlx.nn's initialisers (``uniform(-s, s)``, ``normal(scale=0.02)``) inside a
    block: MLX's own samples, bit for bit (no array parameter carries a word)."""
    key = mx.random.key(9)
    plain = [np.array(f()) for f in (lambda: mx.random.uniform(-0.1, 0.1, (64,), key=key),
                                     lambda: mx.random.normal((64,), scale=0.02, key=key))]
    with mp.extended_precision() as report:
        ours = [np.array(mx.random.uniform(-0.1, 0.1, (64,), key=key)),
                np.array(mx.random.normal((64,), scale=0.02, key=key))]
    assert not report.extended and not report.float32
    for a, b in zip(plain, ours):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_random_with_carried_parameters_takes_one_key_as_mlx():
    """Without a key, the sampler takes one key from the global sequence, as MLX's
    own call does: the draws after it are MLX's."""
    loc, _ = _carried((4,), seed=19)
    mx.random.seed(3)
    mx.random.normal((4,))
    after = np.array(mx.random.uniform(shape=(6,)))
    mx.random.seed(3)
    with mp.extended_precision() as report:
        mx.random.normal((4,), loc=loc)
    assert report.extended["random.normal"] == 1
    assert np.array_equal(np.array(mx.random.uniform(shape=(6,))), after)


# ---- linalg.eig / eigvals in float64 -----------------------------------------------------------


def test_eig_in_float64(backend):
    """Eigenvalues of the carried value against mpmath (60 digits), each complex64
    part exactly rounded; eigenvectors: unit norm, residual ``A v - lambda v`` at
    float64 level, MLX's order and signs (its float32 eig of the high words). eig
    and eigvals were float32 ops (reported): on cpu until an earlier release, on
    emulate / metal until this one (MLX runs them on the CPU on every device)."""
    a, A = _carried((2, 6, 6), seed=20)
    with mp.use_backend(backend), mp.extended_precision() as report:
        w, v = mx.linalg.eig(a)
        ev = mx.linalg.eigvals(a)
        W, V = (np.array(carry.wide_value(t)[0]) + 1j * np.array(carry.wide_value(t)[1])
                for t in (w, v))
    assert not report.float32, report
    assert np.array_equal(np.array(ev), np.array(w))
    w32, v32 = (np.array(t) for t in mx.linalg.eig(mx.array(np.array(a)), stream=mx.cpu))
    assert np.max(np.abs(np.array(w) - w32)) < 1e-5 and np.max(np.abs(np.array(v) - v32)) < 1e-4
    with mpmath.workdps(60):
        for b in range(2):
            E = mpmath.eig(mpmath.matrix(A[b].tolist()), left=False, right=False)
            for lam, hi in zip(W[b], np.array(w)[b]):
                exact_lam = min(E, key=lambda e: abs(e - complex(lam)))
                assert np.float32(float(exact_lam.real)) == hi.real
                assert np.float32(float(exact_lam.imag)) == hi.imag
            M = mpmath.matrix(A[b].tolist())
            for j in range(6):
                col = mpmath.matrix([complex(z) for z in V[b][:, j]])
                res = mpmath.norm(M * col - complex(W[b][j]) * col)
                assert res < 1e-14 and abs(mpmath.norm(col) - 1) < 1e-15


def test_searchsorted_of_carried_values_off_cpu(backend):
    """mlx-lm's categorical sampling of one row (the inverse CDF) calls searchsorted:
    on emulate / metal it was a float32 op (reported); now exact comparisons. Values
    that tie in the high word are ordered by their low words."""
    a, A = _carried((64,), seed=21)
    with mp.extended_precision() as report:
        seq = mx.sort(a)
        v = mx.concatenate([seq[::7], seq[::5] + 1e-12, seq[3:9] - 1e-12])
        left, right = (mx.searchsorted(seq, v, side=s) for s in ("left", "right"))
        S, V = exact(seq), exact(v)
    assert not report.float32, report
    assert left.dtype == right.dtype == mx.uint32
    assert np.array_equal(np.array(left), np.searchsorted(S, V, side="left"))
    assert np.array_equal(np.array(right), np.searchsorted(S, V, side="right"))
