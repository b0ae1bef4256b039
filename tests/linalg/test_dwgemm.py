"""The double-word matrix product (mlx_precise.linalg.gemm) against exact rationals.

Every product of two float32 words is an exact integer multiple of a power of two,
so the oracle (tests/oracle.py: Python integers) computes A B + D exactly; the
computed double-word C is checked entrywise against the stated bound
``|C - C_exact| <= (T + 12) u^2 (|D| + |A| |B|)``, T terms per output (K, or 2K for
each part of a complex x complex product), decided exactly in integers, on the cpu
backend (float64) and the Metal kernel run by the emulator."""

import mlx.core as mx
import numpy as np
import pytest
from oracle import U2, Exact, is_normalised, rel_le, rel_u2

from mlx_precise.linalg import gemm as dwgemm
from mlx_precise.doubleword import DoubleWord

BACKENDS = ("cpu", "emulate")


# ---- helpers -------------------------------------------------------------------------

def dw(x) -> DoubleWord:
    """float64 / complex128 numpy data split into a DoubleWord."""
    return DoubleWord.from_float64(np.asarray(x))


def rand(rng, shape, phi=1.0, cplx=False):
    """Entries (U(0,1) - 0.5) exp(phi N(0,1)) (the DGEMM-emulation test matrices),
    float64, so both words are used; complex with independent parts."""
    def one():
        return (rng.random(shape) - 0.5) * np.exp(phi * rng.standard_normal(shape))
    return one() + 1j * one() if cplx else one()


def parts(x: DoubleWord):
    """(re, im) Exact values of a DoubleWord (im None when real); 0-d as 1-D."""
    h, lo = np.atleast_1d(np.array(x.hi)), np.atleast_1d(np.array(x.lo))
    if not x.is_complex:
        return Exact.dw(h, lo), None
    return (Exact.dw(np.ascontiguousarray(h.real), np.ascontiguousarray(lo.real)),
            Exact.dw(np.ascontiguousarray(h.imag), np.ascontiguousarray(lo.imag)))


def emm(x: Exact, y: Exact) -> Exact:
    return Exact(np.matmul(x.n, y.n), x.k + y.k)


def eabs(x: Exact) -> Exact:
    return Exact(np.abs(x.n), x.k)


def exact_product(a, b, bias=None):
    """[(exact part, scale |D| + |A||B| of that part, terms per output)] for the real
    (and imaginary) part of bias + a @ b."""
    (ar, ai), (br, bi) = parts(a), parts(b)
    k = a.shape[-1]
    terms = []  # per part: list of (sign, x, y)
    if ai is None and bi is None:
        terms = [[(1, ar, br)]]
    elif ai is None:
        terms = [[(1, ar, br)], [(1, ar, bi)]]
    elif bi is None:
        terms = [[(1, ar, br)], [(1, ai, br)]]
    else:
        terms = [[(1, ar, br), (-1, ai, bi)], [(1, ar, bi), (1, ai, br)]]
    dparts = parts(bias) if bias is not None else (None, None)
    out = []
    for q, part in enumerate(terms):
        val = scale = None
        for sign, x, y in part:
            p, s = emm(x, y), emm(eabs(x), eabs(y))
            p = p if sign > 0 else -p
            val = p if val is None else val + p
            scale = s if scale is None else scale + s
        d = dparts[q] if q < 2 else None
        if d is not None:
            val, scale = val + d, scale + eabs(d)
        out.append((val, scale, k * len(part)))
    if len(out) == 1 and bias is not None and bias.is_complex:
        out.append((dparts[1], eabs(dparts[1]), 0))  # real product, complex bias
    return out


def check(c: DoubleWord, a, b, bias=None, slack=12):
    """Assert the bound on every output; return the worst error in units of
    K u^2 (|D| + |A||B|)."""
    want = exact_product(a, b, bias)
    got = parts(c)
    assert c.is_complex == (len(want) == 2)
    worst = 0.0
    for (val, scale, t), g in zip(want, got):
        # the oracle broadcast to the output shape, all flattened (0-d included)
        val, scale = (Exact(np.broadcast_to(np.array(x.n, dtype=object), c.shape).reshape(-1),
                            x.k) for x in (val, scale))
        err = Exact(g.n.reshape(-1), g.k) - val
        ok = rel_le(err, scale, (t + slack) * U2)
        assert ok.all(), (
            f"{int((~ok).sum())} outputs over (T + {slack}) u^2 S, T = {t}: worst "
            f"{rel_u2(err, scale).max():.3g} u^2 S")
        worst = max(worst, float(rel_u2(err, scale).max()) / max(t, 1))
    h, lo = np.array(c.hi), np.array(c.lo)
    for f in ((lambda v: v.real), (lambda v: v.imag)) if c.is_complex else ((lambda v: v),):
        assert is_normalised(f(h), f(lo)).all()
    return worst


def window_columns(x: np.ndarray, taps: int, rows: int, s: int, d: int, lo: int) -> np.ndarray:
    """numpy im2col of a 1-D signal x (L, C) float64: (rows, taps C), row m tap t
    holding x[m s + t d - lo] (zeros outside the signal)."""
    L, C = x.shape
    cols = np.zeros((rows, taps, C))
    for m in range(rows):
        for t in range(taps):
            if 0 <= m * s + t * d - lo < L:
                cols[m, t] = x[m * s + t * d - lo]
    return cols.reshape(rows, taps * C)


# (L, C, taps, rows, (s, d, lo)): a convolution's window (padding, stride, dilation),
# a transposed one's (a step back), a filter longer than the signal
WINDOWS = [(20, 3, 3, 20, (1, 1, 1)), (40, 17, 5, 12, (3, 2, 4)), (9, 8, 2, 10, (1, -1, 0)),
           (3, 2, 7, 4, (1, 1, 4))]


@pytest.mark.parametrize("L,C,T,M,win", WINDOWS)
def test_window_matmul_reads_the_window(L, C, T, M, win):
    """gemm.window_matmul (dw_gemm with WIN = 1, on the emulator) against the exact
    product of the gathered columns, batched over two signals: the bound, and the
    bits of matmul of those columns (the same sums)."""
    rng = np.random.default_rng(L + C)
    n_out, batch = 5, 2
    x = rand(rng, (batch, L, C))
    w = rand(rng, (n_out, T, C))  # (out, tap, channel): B(t C + c, o) = w[o, t, c]
    X, W = dw(x), dw(w)
    c = dwgemm.window_matmul(
        X, W, taps=T, channels=C, rows=M, cols=n_out, window=(*win, L), a_strides=(C, 1),
        b_strides=(C, 1, T * C), c_strides=(n_out, 1),
        dims=[dict(size=batch, sa=L * C, sb=0, sc=M * n_out)], shape=(batch, M, n_out),
        backend="emulate")
    # the columns of both words, gathered in numpy (zero padding: zero words)
    hi, lo = (np.stack([window_columns(v, T, M, *win) for v in np.array(word, np.float64)])
              for word in (X.hi, X.lo))
    cols = DoubleWord(mx.array(hi.astype(np.float32)), mx.array(lo.astype(np.float32)))
    wt = DoubleWord(*(mx.array(np.array(v).reshape(n_out, T * C).T) for v in (W.hi, W.lo)))
    check(c, cols, wt)
    ref = dwgemm.matmul(cols, wt, backend="emulate")
    for got, want in ((c.hi, ref.hi), (c.lo, ref.lo)):
        np.testing.assert_array_equal(np.array(got).view(np.uint32),
                                      np.array(want).view(np.uint32))


# ---- accuracy ------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (5, 3, 7), (33, 70, 17), (64, 128, 64)])
def test_random_real(backend, m, k, n):
    rng = np.random.default_rng(m * 1000 + k + n)
    a, b = dw(rand(rng, (m, k))), dw(rand(rng, (k, n)))
    c = dwgemm.matmul(a, b, backend=backend)
    assert c.shape == (m, n) and c.dtype == mx.float32
    check(c, a, b)


@pytest.mark.parametrize("backend", BACKENDS)
def test_k_from_1_to_several_hundred(backend):
    rng = np.random.default_rng(1)
    for k in (1, 2, 15, 16, 17, 31, 33, 100, 257, 400):
        a, b = dw(rand(rng, (3, k), phi=2)), dw(rand(rng, (k, 4), phi=2))
        check(dwgemm.matmul(a, b, backend=backend), a, b)


def cancelling(rng, m, k, n, rel=2.0**-30):
    """Rows of A and columns of B whose dot products cancel to ~rel of their
    magnitude: A = [X, X], B = [Y; -Y + E] with |E| ~ rel |Y|, so A B = X E while
    |A| |B| ~ 2 |X| |Y|."""
    x, y = rand(rng, (m, k)), rand(rng, (k, n))
    e = rel * rand(rng, (k, n))
    return dw(np.concatenate([x, x], 1)), dw(np.concatenate([y, -y + e], 0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_cancellation(backend):
    rng = np.random.default_rng(2)
    a, b = cancelling(rng, 20, 60, 9)
    c = dwgemm.matmul(a, b, backend=backend)
    check(c, a, b)
    # relative to |C| itself (~2^-30 of |A||B|): still ~2^-18 or better, where
    # float32 arithmetic loses every digit
    exact = a.to_float64() @ b.to_float64()
    rel = np.abs(c.to_float64() - exact).max() / np.abs(exact).max()
    f32 = np.array(mx.matmul(a.round(), b.round()), dtype=np.float64)
    assert rel < 2.0**-16 < np.abs(f32 - exact).max() / np.abs(exact).max()


@pytest.mark.parametrize("backend", BACKENDS)
def test_far_better_than_float32(backend):
    rng = np.random.default_rng(3)
    a, b = dw(rand(rng, (16, 200))), dw(rand(rng, (200, 16)))
    exact = a.to_float64() @ b.to_float64()
    err = np.abs(dwgemm.matmul(a, b, backend=backend).to_float64() - exact).max()
    err32 = np.abs(np.array(mx.matmul(a.round(), b.round()), np.float64) - exact).max()
    assert err * 2.0**16 < err32


@pytest.mark.parametrize("backend", BACKENDS)
def test_bias(backend):
    rng = np.random.default_rng(4)
    a, b = dw(rand(rng, (6, 40))), dw(rand(rng, (40, 35)))
    for shape in [(35,), (6, 35), (6, 1), (1, 35), ()]:
        d = dw(rand(rng, shape, phi=3))
        c = dwgemm.matmul(a, b, backend=backend, bias=d)
        assert c.shape == (6, 35)
        check(c, a, b, d)


@pytest.mark.parametrize("backend", BACKENDS)
def test_batched_broadcast(backend):
    rng = np.random.default_rng(5)
    cases = [((2, 1, 5, 7), (3, 7, 4), (4,)), ((3, 9, 33), (33, 2), (3, 1, 2)),
             ((9, 33), (2, 33, 2), None), ((1, 4, 6), (5, 6, 3), (5, 4, 3))]
    for sa, sb, sd in cases:
        a, b = dw(rand(rng, sa)), dw(rand(rng, sb))
        d = dw(rand(rng, sd)) if sd else None
        c = dwgemm.matmul(a, b, backend=backend, bias=d)
        want = mx.matmul(mx.zeros(sa), mx.zeros(sb)).shape
        assert c.shape == tuple(want)
        check(c, a, b, d)


@pytest.mark.parametrize("backend", BACKENDS)
def test_vectors(backend):
    rng = np.random.default_rng(6)
    for sa, sb in [((7,), (7,)), ((7,), (7, 5)), ((3, 7), (7,)), ((2, 3, 7), (7,)),
                   ((7,), (2, 7, 4))]:
        a, b = dw(rand(rng, sa)), dw(rand(rng, sb))
        c = dwgemm.matmul(a, b, backend=backend)
        assert c.shape == tuple(mx.matmul(mx.zeros(sa), mx.zeros(sb)).shape)
        check(c, a, b)
    a, b, d = dw(rand(rng, (7,))), dw(rand(rng, (7, 5))), dw(rand(rng, (5,)))
    check(dwgemm.matmul(a, b, backend=backend, bias=d), a, b, d)


@pytest.mark.parametrize("backend", BACKENDS)
def test_complex(backend):
    rng = np.random.default_rng(7)
    m, k, n = 9, 37, 34
    ac, bc = dw(rand(rng, (m, k), cplx=True)), dw(rand(rng, (k, n), cplx=True))
    ar, br = dw(rand(rng, (m, k))), dw(rand(rng, (k, n)))
    dc, dr = dw(rand(rng, (n,), cplx=True)), dw(rand(rng, (m, 1)))
    for a, b, d in [(ac, bc, None), (ac, bc, dc), (ac, bc, dr), (ar, bc, None), (ac, br, dc),
                    (ar, bc, dr), (ar, br, dc)]:
        c = dwgemm.matmul(a, b, backend=backend, bias=d)
        assert c.dtype == mx.complex64 and c.shape == (m, n)
        check(c, a, b, d)


@pytest.mark.parametrize("backend", BACKENDS)
def test_complex_batched_and_cancelling(backend):
    rng = np.random.default_rng(8)
    a = dw(rand(rng, (2, 1, 5, 20), cplx=True))
    b = dw(rand(rng, (3, 20, 6), cplx=True))
    check(dwgemm.matmul(a, b, backend=backend), a, b)
    # (x + iy)(x - iy)-like rows: real parts cancel |x|^2 - |y|^2 ~ 0
    x = rand(rng, (4, 30))
    ac = dw(x + 1j * x)
    bc = dw((x + 1j * x * (1 + 2.0**-25)).T)
    check(dwgemm.matmul(ac, bc, backend=backend), ac, bc)


# ---- special values ------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_inf_nan_like_float32(backend):
    """NaN in, NaN out; Inf * 0 and Inf - Inf give NaN; Inf * finite gives Inf; the
    other outputs keep the bound. The reference is IEEE float64 arithmetic on the
    high words, product by product (no BLAS), which float32 arithmetic matches."""
    rng = np.random.default_rng(9)
    m, k, n = 6, 20, 5
    a, b = rand(rng, (m, k)), rand(rng, (k, n))
    inf, nan = np.inf, np.nan
    a[0, 3] = nan
    a[1, 4] = inf
    b[4, 0] = 0.0  # (1, 0): Inf * 0
    a[2, 5], a[2, 6] = inf, inf
    b[5, 1], b[6, 1] = 1.0, -1.0  # (2, 1): Inf - Inf; (2, others): +-Inf or NaN
    a[3, 7] = -inf
    b[2, 3] = nan  # column 3 all NaN
    ad = DoubleWord(*(mx.array(w) for w in _split_keep(a)))
    bd = DoubleWord(*(mx.array(w) for w in _split_keep(b)))
    d = np.zeros((n,))
    d[4] = inf
    dd = DoubleWord(*(mx.array(w) for w in _split_keep(d)))
    c = dwgemm.matmul(ad, bd, backend=backend, bias=dd)
    with np.errstate(invalid="ignore"):
        ref = (np.array(ad.hi, np.float64)[:, :, None] * np.array(bd.hi, np.float64)[None]
               ).sum(axis=1) + np.array(dd.hi, np.float64)
    hi, lo = np.array(c.hi), np.array(c.lo)
    special = ~np.isfinite(ref)
    assert special.sum() > 10
    np.testing.assert_array_equal(np.isnan(hi), np.isnan(ref))
    np.testing.assert_array_equal(hi[np.isinf(ref)], ref[np.isinf(ref)])
    assert (lo[special] == 0).all()
    # the finite outputs: within the bound (their rows and columns hold no special
    # value; a float64 product of the float64 operands errs by ~2^-53 here)
    fin = ~special
    af, bf = (np.where(np.isfinite(x), x, 0.0) for x in (ad.to_float64(), bd.to_float64()))
    err = np.abs(c.to_float64() - af @ bf)[fin]
    assert (err <= (k + 13) * 2.0**-48 * (np.abs(af) @ np.abs(bf))[fin]).all()


def _split_keep(x):
    """float64 -> (hi, lo) float32, non-finite values kept (lo 0)."""
    hi = x.astype(np.float32)
    with np.errstate(invalid="ignore"):
        lo = np.where(np.isfinite(x), x - hi.astype(np.float64), 0.0).astype(np.float32)
    return hi, lo


@pytest.mark.parametrize("backend", BACKENDS)
def test_overflow_gives_inf(backend):
    a = dw(np.full((2, 3), 2.0**100))
    c = dwgemm.matmul(a, dw(np.full((3, 2), 2.0**100)), backend=backend)
    assert np.array_equal(np.array(c.hi), np.full((2, 2), np.inf, np.float32))
    assert (np.array(c.lo) == 0).all()


# ---- empty operands, K = 0 -----------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_and_k0(backend):
    rng = np.random.default_rng(10)
    for sa, sb in [((0, 3), (3, 5)), ((4, 3), (3, 0)), ((0, 4, 3), (3, 2)), ((2, 0), (0, 3)),
                   ((0,), (0,)), ((2, 2, 0), (0, 5))]:
        a, b = dw(rand(rng, sa)), dw(rand(rng, sb))
        c = dwgemm.matmul(a, b, backend=backend)
        want = mx.matmul(mx.zeros(sa), mx.zeros(sb)).shape
        assert c.shape == tuple(want) and c.dtype == mx.float32
        assert (np.array(c.hi) == 0).all() and (np.array(c.lo) == 0).all()
    d = dw(rand(rng, (3,)))
    c = dwgemm.matmul(dw(np.zeros((2, 0))), dw(np.zeros((0, 3))), backend=backend, bias=d)
    np.testing.assert_array_equal(c.to_float64(), np.broadcast_to(d.to_float64(), (2, 3)))
    dc = dw(rand(rng, (3,), cplx=True))
    c = dwgemm.matmul(dw(np.zeros((2, 0))), dw(np.zeros((0, 3), complex)), backend=backend,
                      bias=dc)
    assert c.dtype == mx.complex64
    np.testing.assert_array_equal(c.to_float64(), np.broadcast_to(dc.to_float64(), (2, 3)))


# ---- errors --------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_shape_errors_named_like_mlx(backend):
    z = lambda *s: dw(np.zeros(s))  # noqa: E731
    cases = [
        ((z(2, 3), z(4, 5)), r"\[matmul\] Last dimension of first input with shape \(2,3\)"),
        ((z(), z(3)), r"\[matmul\] Got 0 dimension input"),
        ((z(3), z(4)), r"shape \(1,3\) must match .* shape \(4,1\)"),
        ((z(2, 2, 3), z(3, 3, 5)), r"\[broadcast_shapes\] Shapes"),
    ]
    for (a, b), msg in cases:
        with pytest.raises(ValueError, match=msg):
            dwgemm.matmul(a, b, backend=backend)
    with pytest.raises(dwgemm.MatmulShapeError, match=r"\[addmm\] bias with shape \(3\)"):
        dwgemm.matmul(z(2, 3), z(3, 5), backend=backend, bias=z(3))
    with pytest.raises(ValueError, match=r"\[addmm\] bias with shape \(2,5\) must broadcast"):
        dwgemm.matmul(z(3), z(3, 5), backend=backend, bias=z(2, 5))
    with pytest.raises(TypeError, match="b must be a DoubleWord"):
        dwgemm.matmul(z(2, 3), mx.zeros((3, 5)), backend=backend)
    with pytest.raises(ValueError, match="unknown backend"):
        dwgemm.matmul(z(2, 3), z(3, 5), backend="gpu")


@pytest.mark.parametrize("backend", BACKENDS)
def test_options_are_keyword_only(backend):
    """backend, stream and bias are keyword-only, as everywhere in the package; the
    old positional form still works, bit for bit, with a DeprecationWarning."""
    rng = np.random.default_rng(12)
    a, b, d = dw(rand(rng, (3, 4))), dw(rand(rng, (4, 2))), dw(rand(rng, (2,)))
    want = dwgemm.matmul(a, b, backend=backend, bias=d)
    with pytest.warns(DeprecationWarning, match="passing backend, stream, bias positionally"):
        old = dwgemm.matmul(a, b, backend, None, d)
    for got in (old, dwgemm.matmul(a, b, backend=backend, bias=d, stream=mx.cpu)):
        np.testing.assert_array_equal(np.array(got.hi), np.array(want.hi))
        np.testing.assert_array_equal(np.array(got.lo), np.array(want.lo))
    with pytest.raises(TypeError, match="takes 2 positional arguments"):
        dwgemm.matmul(a, b, backend, None, d, 1)
    with pytest.raises(TypeError, match="multiple values for argument 'backend'"):
        dwgemm.matmul(a, b, backend, backend=backend)
    with pytest.raises(TypeError, match="stream must be an mx.Stream"):
        dwgemm.matmul(a, b, backend=backend, stream="cpu")


@pytest.mark.parametrize("case", ["real", "complex", "mixed", "bias", "vector"])
def test_metal_glue_is_lazy(lazy_metal, case):
    """No evaluation in the glue on the metal path: it traces under mx.compile."""
    rng = np.random.default_rng(11)
    cx = case in ("complex", "mixed")
    a = dw(rand(rng, (2, 5, 6) if case != "vector" else (6,), cplx=cx))
    b = dw(rand(rng, (6, 3), cplx=case == "complex"))
    d = dw(rand(rng, (3,))) if case == "bias" else None

    def f(*words):
        x = DoubleWord(*words[:2])
        y = DoubleWord(*words[2:4])
        bias = DoubleWord(*words[4:]) if len(words) > 4 else None
        c = dwgemm.matmul(x, y, backend="metal", bias=bias)
        return c.hi, c.lo

    words = [a.hi, a.lo, b.hi, b.lo] + ([d.hi, d.lo] if d is not None else [])
    mx.eval(mx.compile(f)(*words))


def test_kernel_is_declared_for_the_strict_check():
    from mlx_precise.tools import kernel_check

    found = kernel_check.registry()
    for kernel in (dwgemm.DW_GEMM, *dwgemm._UNBIASED.values()):
        assert found[kernel.name] is kernel
        assert kernel.coverage_gaps() == []
        assert len(kernel_check.instances(kernel)) == 4  # CPLX 0 and 1, WIN 0 and 1


@pytest.mark.parametrize("a_lo,b_lo", [(False, False), (True, False), (False, True), (True, True)])
def test_launch_passes_each_word_once(a_lo, b_lo):
    """Without a bias a launch's inputs are the stored words and p, none twice (a
    float32 operand stores no low word, no placeholder stands for it)."""
    from mlx_precise.testing import lazy_metal_executor

    rng = np.random.default_rng(12)
    a, b = dw(rand(rng, (4, 6))), dw(rand(rng, (6, 3)))
    a = a if a_lo else DoubleWord.exact(a.hi)
    b = b if b_lo else DoubleWord.exact(b.hi)
    record = []
    with lazy_metal_executor(record):
        dwgemm.matmul(a, b, backend="metal")
    (launch,) = record
    assert launch.name == dwgemm._UNBIASED[a_lo, b_lo].name
    assert len(launch.inputs) == 3 + a_lo + b_lo
    assert len({id(x) for x in launch.inputs}) == len(launch.inputs)
