"""Complex double-word operations that act on each part alike (x + y, x - y, -x, a
product or quotient by a real factor) run as real dw_fused programs over the float32
view of the words (mlx_precise/doubleword/fusion.py): on emulate they give exactly the
bits of the cdw_ops / dw_ops kernels part by part (special values included), and the
values mpmath gives to the kernels' bounds; on the metal path (lazy stand-in) such a
chain is one launch with no split into parts nor join."""

import mlx.core as mx
import mpmath
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.doubleword import DoubleWord, fusion
from mlx_precise.doubleword.arithmetic import operate
from mlx_precise.doubleword.kernel_engine import arith_kernels
from mlx_precise.extended import low_word
from mlx_precise.testing import graph_counts, lazy_metal_executor

mpmath.mp.prec = 200
U = 2.0**-24
SPECIAL = [np.inf, -np.inf, np.nan, 0.0, -0.0, 3e38, 1e-39]


def _parts(rng, n, special: bool):
    a = rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))
    if special:
        k = min(n, len(SPECIAL))
        a[:k] = SPECIAL[:k]
        rng.shuffle(a)
    return a


def _dw(rng, shape, complex_: bool, special: bool = True) -> DoubleWord:
    """A normalised DoubleWord (hi = RN(v), lo = RN(v - hi) of float64 v)."""
    n = int(np.prod(shape))
    vals = [_parts(rng, n, special) for _ in range(2 if complex_ else 1)]
    words = []
    for v in vals:
        with np.errstate(invalid="ignore", over="ignore"):
            hi = v.astype(np.float32)
            lo = np.where(np.isfinite(hi), v - hi.astype(np.float64), 0).astype(np.float32)
        words.append((hi.reshape(shape), lo.reshape(shape)))
    if complex_:
        (rh, rl), (ih, il) = words
        def join(re, im):  # bit for bit (re + 1j * im would make inf * 0 = NaN)
            return mx.array(np.stack([re, im], axis=-1).view(np.complex64)[..., 0])

        return DoubleWord(join(rh, ih), join(rl, il))
    return DoubleWord(mx.array(words[0][0]), mx.array(words[0][1]))


def _bits(a: mx.array) -> np.ndarray:
    f = np.array(a).view(np.float32)
    return np.where(np.isnan(f), np.float32(np.nan), f).view(np.uint32)  # one NaN


CASES = [("mul", True, True), ("add", True, True), ("sub", True, True), ("add", True, False),
         ("add", False, True), ("sub", False, True), ("mul", True, False),
         ("mul", False, True), ("div", True, False)]


@pytest.mark.parametrize("op, cx, cy", CASES)
def test_partwise_op_has_the_kernels_bits(op, cx, cy):
    rng = np.random.default_rng(7)
    x = _dw(rng, (64,), cx)
    y = _dw(rng, (4, 1) if not cy else (64,), cy)  # a broadcast real factor too
    with mp.use_backend("emulate"):
        z = operate(op, x, y, "emulate")
        assert fusion.expression(z) is None and z.is_complex
        ref = arith_kernels("add" if op == "sub" else op, x, -y if op == "sub" else y,
                            "emulate", None)
        for a, b in ((z.hi, ref.hi), (z.lo, ref.lo)):
            assert a.shape == b.shape
            assert np.array_equal(_bits(a), _bits(b))


BOUND = {"add": 3 * U**2 + 13 * U**3, "mul": 4 * U**2, "div": 9.8 * U**2}


@pytest.mark.parametrize("op, cx, cy", [("add", True, True), ("add", True, False),
                                        ("mul", True, False), ("div", True, False)])
def test_partwise_op_against_mpmath(op, cx, cy):
    rng = np.random.default_rng(11)
    x, y = _dw(rng, (200,), cx, special=False), _dw(rng, (200,), cy, special=False)
    with mp.use_backend("emulate"):
        z = operate(op, x, y, "emulate")

    def parts(w):
        h, l = np.array(w.hi), np.array(w.lo)
        if not np.iscomplexobj(h):
            return [(h, l)]
        return [(h.real, l.real), (h.imag, l.imag)]

    def mpv(h, l, i):
        return mpmath.mpf(float(h[i])) + mpmath.mpf(float(l[i]))

    ys = parts(y)
    if len(ys) == 1:  # a real y: the factor of both parts, or added to the real part
        zero = np.zeros_like(ys[0][0])
        ys = ys * 2 if op != "add" else [ys[0], (zero, zero)]
    f = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b}[op]
    worst = 0.0
    for (zh, zl), (xh, xl), (yh, yl) in zip(parts(z), parts(x), ys):
        for i in range(200):
            exact = f(mpv(xh, xl, i), mpv(yh, yl, i))
            if exact != 0:
                worst = max(worst, float(abs(mpv(zh, zl, i) - exact) / abs(exact)))
    assert worst <= BOUND[op]


def _chain(c, d, r):
    return -(c * r + d) / 3.0 - 1.0 + d * 0.5


def test_chain_in_a_block_fused_has_the_unfused_bits():
    rng = np.random.default_rng(5)
    c, d = (_dw(rng, (8, 16), True).hi for _ in range(2))
    r = _dw(rng, (16,), False).hi
    out = []
    for fused in (True, False):
        with mp.use_backend("emulate"), mp.extended_precision():
            if fused:
                y = _chain(c, d, r)
            else:
                with fusion._unfused():
                    y = _chain(c, d, r)
            mx.eval(y)
            out.append([np.array(a).view(np.float32) for a in (y, low_word(y))])
    plain = np.array(_chain(c, d, r)).view(np.float32)  # MLX float32
    for k, (a, b) in enumerate(zip(*out)):
        differ = a.view(np.uint32) != b.view(np.uint32)
        # only NaN payloads and the sign of a zero part may differ: x - 1.0 keeps
        # x's -0 imaginary part as float32 does (the kernels' path added +0 to it)
        nan = np.isnan(a[differ]) & np.isnan(b[differ])
        zero = (a[differ] == 0) & (b[differ] == 0)
        assert np.all(nan | zero)
        if k == 0:
            assert np.array_equal(np.signbit(a[differ][zero]), np.signbit(plain[differ][zero]))


def test_chain_on_metal_is_one_launch():
    rng = np.random.default_rng(5)
    c, d = (_dw(rng, (8, 16), True).hi for _ in range(2))
    r = _dw(rng, (16,), False).hi
    mx.eval(c, d, r)
    with lazy_metal_executor():
        with mp.use_backend("metal"), mp.extended_precision():
            y = _chain(c, d, r)
        g = graph_counts(y, low_word(y))
    assert g["launches"] == 1
    assert not {"Real", "Imag", "Concatenate", "Full"} & set(g["by_primitive"])
    # each complex leaf's word enters as (8, 16, 2) parts (a Reshape and a View); the
    # launch writes (8, 32), whose complex view is a word of the result (a View, no
    # Reshape)
    assert g["by_primitive"]["Reshape"] == g["by_primitive"]["View"] - 2, g


def _sum(*cs):
    s = cs[0]
    for c in cs[1:]:
        s = s + c * 0.75
    return s


def test_a_cut_complex_chain_reads_its_programs_words():
    """A complex chain longer than a program holds is cut: the cut result enters the
    next program as the float32 words its program wrote (their parts axis split
    off: no view of its complex words), with the bits of the unfused chain."""
    rng = np.random.default_rng(12)
    cs = [_dw(rng, (16,), True, special=False).hi for _ in range(fusion.LIMITS.slots + 2)]
    out = []
    for fused in (True, False):
        with mp.use_backend("emulate"), mp.extended_precision():
            if fused:
                y = _sum(*cs)
            else:
                with fusion._unfused():
                    y = _sum(*cs)
            mx.eval(y)
            out.append([_bits(a) for a in (y, low_word(y))])
    for a, b in zip(*out):
        assert np.array_equal(a, b)
    ref = sum(np.array(c).astype(np.clongdouble) * (0.75 if k else 1)
              for k, c in enumerate(cs))
    got = np.array(y).astype(np.clongdouble) + np.array(low_word(y)).astype(np.clongdouble)
    assert np.all(np.abs(got - ref) <= 2.0**-40 * np.abs(ref))
    with lazy_metal_executor(), mp.use_backend("metal"), mp.extended_precision():
        y = _sum(*cs)
        g = graph_counts(y, low_word(y))
    # one View per leaf (its float32 parts) and one per word of the result; a cut
    # result is read as the program's own packed words, (2 x 16, 2) of its (2 x 32,):
    # one Reshape for both words, as each leaf's parts axis
    assert g["by_primitive"]["View"] == len(cs) + 2, g
    assert g["by_primitive"]["Reshape"] == len(cs) + 1, g


def _with_constants(c):
    return (c - 1.0) * 0.5 + (2.0 - 1j) - 0.25j


def test_constants_enter_complex_programs_as_data():
    """Python constants in a complex chain (a real one added, complex ones) are held
    by the program (each part a constant, selected by the parts axis: no array):
    on metal (lazy stand-in) the chain is one launch whose graph has no Pad,
    ExpandDims, Broadcast, View or Reshape for them (c's own parts: a Reshape and a
    View; the result: two Views); on emulate the bits are those of the unfused
    chain (the single-operation kernels), whose values agree with mpmath."""
    rng = np.random.default_rng(21)
    c = _dw(rng, (4, 8), True, special=False).hi
    mx.eval(c)
    with lazy_metal_executor():
        with mp.use_backend("metal"), mp.extended_precision():
            y = _with_constants(c)
        g = graph_counts(y, low_word(y))
    assert g["launches"] == 1, g
    prims = g["by_primitive"]
    assert not {"Pad", "ExpandDims", "Broadcast"} & set(prims), prims
    assert prims.get("View") == 3 and prims.get("Reshape") == 1, prims
    out = []
    for fused in (True, False):
        with mp.use_backend("emulate"), mp.extended_precision():
            if fused:
                y = _with_constants(c)
            else:
                with fusion._unfused():
                    y = _with_constants(c)
            mx.eval(y, low_word(y))
            out.append([np.array(a).view(np.uint32) for a in (y, low_word(y))])
    for a, b in zip(*out):
        assert np.array_equal(a, b)
    for k, v in enumerate(np.array(c).ravel()):
        z = (mpmath.mpc(complex(v)) - 1) * 0.5 + mpmath.mpc(2, -1) - mpmath.mpc(0, 0.25)
        got = complex(np.array(y).ravel()[k]), complex(np.array(low_word(y)).ravel()[k])
        err = abs(mpmath.mpc(got[0]) + mpmath.mpc(got[1]) - z)
        assert err <= 64 * U * U * abs(z) + 1e-300


def _products(c, d, r):
    """Complex products in a block: two programs' words (read packed), a program's
    words by a complex constant and by i, a real array by a complex constant, and a
    constant's product with a program."""
    p = (c * 1.5 + 0.5) * (d * 0.5 - 1j)
    return p * (0.75 - 2j) + (r * 2.0) * (1j - 0.5) + (1 + 1j) * (c * 0.25) * 1j


@pytest.mark.parametrize("special", [False, True])
def test_complex_products_in_a_block_have_the_kernels_bits(special):
    """Complex products inside a block (each program forms i y from y's parts
    reversed and the real one negated, constants held by the program): on emulate
    the bits of the unfused chain (the cdw_ops kernels), Inf, NaN, signed zeros,
    overflowing and tiny parts included, and mpmath's value to the chain's bound
    where finite; on the metal path no Conjugate, Broadcast or Pad node."""
    rng = np.random.default_rng(31)
    c, d = (_dw(rng, (8, 16), True, special).hi for _ in range(2))
    r = _dw(rng, (16,), False, special).hi
    mx.eval(c, d, r)
    out = []
    for fused in (True, False):
        with mp.use_backend("emulate"), mp.extended_precision(strict=True) as rep:
            if fused:
                y = _products(c, d, r)
            else:
                with fusion._unfused():
                    y = _products(c, d, r)
            mx.eval(y, low_word(y))
            out.append([_bits(a) for a in (y, low_word(y))])
        assert not rep.float32, rep
    for a, b in zip(*out):
        assert np.array_equal(a, b)
    if not special:
        cs, ds, rs = (np.array(v).ravel() for v in (c, mx.broadcast_to(d, c.shape),
                                                     mx.broadcast_to(r, c.shape)))
        for k in range(0, cs.size, 7):
            C, D, R = mpmath.mpc(complex(cs[k])), mpmath.mpc(complex(ds[k])), mpmath.mpf(
                float(rs[k]))
            z = ((C * 1.5 + 0.5) * (D * 0.5 - 1j) * mpmath.mpc(0.75, -2)
                 + R * 2 * mpmath.mpc(-0.5, 1) + mpmath.mpc(1, 1) * C * 0.25 * 1j)
            got = mpmath.mpc(complex(np.array(y).ravel()[k])) + mpmath.mpc(
                complex(np.array(low_word(y)).ravel()[k]))
            scale = abs(C) * abs(D) * 4 + abs(R) * 3 + abs(C)
            assert abs(got - z) <= 64 * U * U * scale
    with lazy_metal_executor():
        with mp.use_backend("metal"), mp.extended_precision():
            y = _products(c, d, r)
        g = graph_counts(y, low_word(y))
    assert not {"Conjugate", "Broadcast", "Pad"} & set(g["by_primitive"]), g


def test_the_parts_select_replayed_for_autodiff_has_the_kernels_bits():
    """The parts select (i y of y's reversed parts, times a complex constant's parts)
    as MLX's autodiff replays a program (single-operation kernels and an exact
    select over the parts axis): the bits of the dw_fused launch of the same
    program, whose values are numpy's products of the words' sums."""
    rng = np.random.default_rng(41)
    y = _dw(rng, (8, 4), True)
    parts = [mx.view(mx.expand_dims(a, -1), mx.float32) for a in (y.hi, y.lo)]
    r = fusion.Expr.leaf(*(a[..., ::-1] for a in parts))
    c = fusion.lanes(fusion._compose(fusion.OP["neg"], 0, [r]), r)
    k = fusion.lanes(fusion.Expr.constant(0.75, 0.0), fusion.Expr.constant(-2.0, 0.0))
    e = fusion._compose(fusion.OP["mul"], 0, [c, k])
    assert e.shape == (8, 4, 2)
    with mp.use_backend("emulate"):
        launched = fusion._run(e.prog, e.leaves, e.shape, "emulate", None)
        replayed = fusion._replay(e.key, "emulate", None)(*e.leaves)
    for a, b in zip(launched, replayed):
        assert a.shape == b.shape
        assert np.array_equal(_bits(a), _bits(b))
    # part by part: (-y_im * 0.75, y_re * -2), exact products of the words' sums
    v = np.array(y.hi).astype(np.complex128) + np.array(y.lo)
    with np.errstate(all="ignore"):
        want = np.stack([-v.imag * 0.75, v.real * -2.0], axis=-1)
        got = np.array(launched[0]).astype(np.float64) + np.array(launched[1])
    fine = (np.abs(want) > 2.0**-100) & (np.abs(want) < 2.0**127)  # (no flush, no overflow)
    assert fine.sum() > 40
    assert np.all(np.abs(got[fine] - want[fine]) <= 4 * U * U * np.abs(want[fine]))  # dw_mul
