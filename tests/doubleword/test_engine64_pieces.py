"""softmax64, logsumexp64 and erf on cpu run large inputs in pieces of whole rows (their
float64 temporaries piece-size): the same bits as in one piece, and float64-accurate
against numpy."""

import mlx.core as mx
import numpy as np
import pytest

from mlx_precise.doubleword import engine64
from mlx_precise.doubleword.types import DoubleWord

SHAPE = (3, 7, 50, 80)  # 84,000 elements: pieced (PIECE = 2^15), rows not a multiple


def _value(d: DoubleWord) -> np.ndarray:
    return np.array(d.wide[0])


def _both(monkeypatch, fn):
    pieced = fn()
    monkeypatch.setattr(engine64, "PIECE", 1 << 40)  # one piece
    return pieced, fn()


@pytest.mark.parametrize("axes", [(3,), (2, 3), (1,), (0, 1, 2, 3)])
def test_softmax_pieces_same_bits(monkeypatch, axes):
    x = np.random.default_rng(0).standard_normal(SHAPE) * 30
    special = x.copy()
    special[0, 0, 0, :5] = [np.inf, -np.inf, np.nan, 700, -800]
    results = []
    with mx.stream(mx.cpu):
        for a in (x, special):
            w = engine64.from64(mx.array(a, dtype=mx.float64))
            pieced, whole = _both(monkeypatch, lambda: _value(engine64.softmax64(w, axes)))
            monkeypatch.undo()
            assert pieced.tobytes() == whole.tobytes()
            results.append(pieced)
    pieced = results[0]
    e = np.exp(x - x.max(axis=axes, keepdims=True))
    ref = e / e.sum(axis=axes, keepdims=True)
    np.testing.assert_allclose(pieced, ref, rtol=1e-13, atol=1e-300)


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axes", [(3,), (2, 3), (0,)])
def test_logsumexp_pieces_same_bits(monkeypatch, axes, keepdims):
    x = np.random.default_rng(1).standard_normal(SHAPE) * 30
    with mx.stream(mx.cpu):
        w = engine64.from64(mx.array(x, dtype=mx.float64))
        pieced, whole = _both(monkeypatch,
                              lambda: _value(engine64.logsumexp64(w, axes, keepdims)))
    assert pieced.tobytes() == whole.tobytes()
    m = x.max(axis=axes, keepdims=True)
    ref = np.log(np.exp(x - m).sum(axis=axes, keepdims=True)) + m
    ref = ref if keepdims else np.squeeze(ref, axis=axes)
    np.testing.assert_allclose(pieced, ref, rtol=1e-14, atol=1e-14 * np.abs(ref).max())


def test_erf_pieces_same_bits(monkeypatch):
    import math

    from mlx_precise.doubleword import functions

    x = np.random.default_rng(2).standard_normal(SHAPE) * 3
    x.flat[:4] = [np.nan, np.inf, -0.0, 7.0]
    with mx.stream(mx.cpu):
        v = mx.array(x, dtype=mx.float64)
        pieced, whole = _both(monkeypatch, lambda: np.array(functions._erf64(v)))
    assert pieced.tobytes() == whole.tobytes()
    ref = np.vectorize(math.erf)(x)
    np.testing.assert_allclose(pieced, ref, rtol=4e-16, atol=0)


def _trig_inputs(rng, n: int) -> np.ndarray:
    """n values: most in [-50, 50], some beyond 2^20 (the tan path) and specials."""
    x = rng.uniform(-50, 50, n)
    x[:8] = [np.nan, np.inf, -np.inf, -0.0, 0.0, 2.0**21 + 0.5, -(2.0**30), 1e300]
    x[n // 2:n // 2 + 3] = [3.0e6, -7.5e7, np.pi / 2]  # beyond 2^20 in a later piece
    return x


def _trig_both(monkeypatch, fn):
    pieced = fn()
    monkeypatch.setattr(engine64, "TRIG_PIECE", 1 << 40)  # one piece
    return pieced, fn()


@pytest.mark.parametrize("which", [("sin",), ("cos",), ("sin", "cos")])
def test_sincos_pieces_same_bits(monkeypatch, which):
    n = 5 * engine64.TRIG_PIECE // 2 + 77  # three pieces, the last one short
    x = _trig_inputs(np.random.default_rng(4), n).reshape(1, -1)
    with mx.stream(mx.cpu):
        v = mx.array(x, dtype=mx.float64)
        pieced, whole = _trig_both(
            monkeypatch, lambda: [np.array(y) for y in engine64.sincos64(v, which)])
    for p, w, name in zip(pieced, whole, which):
        assert p.shape == x.shape and p.tobytes() == w.tobytes()
        ok = np.abs(x) <= 2.0**20  # (beyond: the tan path, within a few ulp)
        ref = getattr(np, name)(x[ok])
        assert np.all(np.abs(p[ok] - ref) <= 2 * np.spacing(np.abs(ref)))


def test_cexp_pieces_same_bits(monkeypatch):
    n = 2 * engine64.TRIG_PIECE + 5
    rng = np.random.default_rng(5)
    a = rng.uniform(-30, 30, n)
    a[:5] = [np.nan, np.inf, -np.inf, 800.0, -800.0]
    b = _trig_inputs(rng, n)
    b[8:12] = [0.0, -0.0, 0.0, np.inf]  # b = 0: e^a and b exactly
    with mx.stream(mx.cpu):
        re, im = (engine64.from64(mx.array(v, dtype=mx.float64)) for v in (a, b))
        pieced, whole = _trig_both(
            monkeypatch, lambda: [np.array(y) for y in engine64.cexp64(re, im).wide])
    for p, w in zip(pieced, whole):
        assert p.tobytes() == w.tobytes()
    ok = (np.abs(a) < 700) & (np.abs(b) <= 2.0**20)
    with np.errstate(invalid="ignore", over="ignore"):
        ref = np.exp(a[ok] + 1j * b[ok])
    got = pieced[0][ok] + 1j * pieced[1][ok]
    assert np.all(np.abs(got - ref) <= 4 * np.spacing(np.abs(ref)))
    assert np.array_equal(pieced[1][8:11], b[8:11]) and np.array_equal(
        np.signbit(pieced[1][8:11]), np.signbit(b[8:11]))


@pytest.mark.parametrize("n", [engine64.FUSE_MIN, 2 * engine64.PIECE + 3])
def test_cheap_step_high_word_is_the_rounding(n):
    """A cheap step's high word is the float32 rounding of the exact float64 result,
    below 2 PIECE elements (a kernel of its own) and from there (the result's
    rounding: no high word holding the operands); Inf where it overflows."""
    rng = np.random.default_rng(7)
    a, b = (rng.standard_normal(n) * 1e20 for _ in range(2))
    with mx.stream(mx.cpu):
        x, y = (engine64.from64(mx.array(v, dtype=mx.float64)) for v in (a, b))
        z = engine64.arith64("mul", x, y)
        hi, wide = np.array(z.hi), np.array(z.wide[0])
    exact = a * b  # (products of doubles below 2^1023: numpy's float64 product)
    assert wide.tobytes() == exact.tobytes()
    with np.errstate(over="ignore"):
        assert hi.tobytes() == exact.astype(np.float32).tobytes()
    assert np.isinf(hi).any()


def test_large_cheap_step_of_float32_operands_writes_no_float64_result():
    """A cheap step of two float32 arrays (read as their words, held by the caller
    anyway) of 2^17 elements: its high word comes from its own kernel, one pass
    that writes 4 bytes an element (writing the float64 result and rounding it
    took 12 and was 2.5x slower), and is the rounding of numpy's float64 product."""
    n = 1 << 17
    assert n >= 2 * engine64.PIECE
    rng = np.random.default_rng(11)
    a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    x, y = mx.array(a), mx.array(b)
    mx.eval(x, y)
    with mx.stream(mx.cpu):
        z = engine64.arith64("mul", DoubleWord.exact(x), DoubleWord.exact(y))
        base = mx.get_active_memory()
        mx.reset_peak_memory()
        mx.eval(z.hi)
        peak = mx.get_peak_memory() - base
    assert peak <= 6 * n, peak / n
    exact = a.astype(np.float64) * b.astype(np.float64)
    assert np.array(z.hi).tobytes() == exact.astype(np.float32).tobytes()


def _broadcast_operands(rng):
    """Operands of a broadcast step (the result 16x their total size): a complex
    float64 column (3, 40, 1), a real row (1, 1, 1100) given as two words, and a
    condition (1, 1100)."""
    col = (rng.standard_normal((3, 40, 1)), rng.standard_normal((3, 40, 1)))
    row = rng.standard_normal((1, 1, 1100)).astype(np.float32)
    low = (rng.standard_normal((1, 1, 1100)) * 2.0**-30).astype(np.float32)
    cond = rng.uniform(size=(1, 1100)) < 0.5
    return col, row, low, cond


def _masked_product(c, r, w):
    """where(c, r w, r): a complex result of three kinds of operand."""
    re, im = engine64._mul(r, w)
    return mx.where(c, re, r[0]), mx.where(c, im, 0.0)


@pytest.mark.parametrize("bounds", [(0, 1), (1, 3), (0, 3)])
def test_rows_of_a_broadcast_step_same_bits(bounds):
    """engine64.rows rebuilds rows of a broadcast step's result from its operands'
    rows: bit for bit the rows of the whole result, which equals numpy's float64."""
    col, row, low, cond = _broadcast_operands(np.random.default_rng(8))
    with mx.stream(mx.cpu):
        w = engine64.from64(*(mx.array(v, dtype=mx.float64) for v in col))
        r = DoubleWord(mx.array(row), mx.array(low))
        value = engine64.apply(_masked_product, mx.array(cond), r, w)
        assert id(value[0]) in engine64._RECIPES
        part = engine64.rows(value, *bounds)
        got = [np.array(v) for v in part]
        whole = [np.array(v) for v in value]
    lo, hi = bounds
    for g, v in zip(got, whole):
        assert g.tobytes() == v[lo:hi].tobytes()
    exact_r = row.astype(np.float64) + low.astype(np.float64)
    z = np.where(cond, exact_r * (col[0] + 1j * col[1]), exact_r)
    assert whole[0].tobytes() == z.real.tobytes() and whole[1].tobytes() == z.imag.tobytes()


def test_rows_without_a_recipe_are_slices():
    v = mx.array(np.arange(6.0 * engine64.PIECE).reshape(6, -1), dtype=mx.float64)
    with mx.stream(mx.cpu):
        got = engine64.rows((v, None), 2, 4)
    assert got[1] is None and np.array_equal(np.array(got[0]), np.array(v)[2:4])


def test_in_pieces_lazy_path_same_bits(monkeypatch):
    """Where nothing can be evaluated (inside a function transformation: _settle
    answers False), in_pieces chains its pieces lazily: the same bits as evaluated
    piece by piece, and as whole."""
    from mlx_precise.doubleword import functions

    x = np.random.default_rng(10).uniform(-6, 6, 5 * engine64.PIECE // 4 + 9)
    x[:3] = [np.nan, -0.0, np.inf]
    with mx.stream(mx.cpu):
        v = mx.array(x, dtype=mx.float64)
        settled = np.array(functions.value64("erf", v))
        monkeypatch.setattr(engine64, "_settle", lambda *a: False)
        lazy = np.array(functions.value64("erf", v))
        monkeypatch.setattr(engine64, "PIECE", 1 << 40)  # one piece
        whole = np.array(functions.value64("erf", v))
    assert settled.tobytes() == lazy.tobytes() == whole.tobytes()
    import math

    ref = np.vectorize(math.erf)(x)
    np.testing.assert_allclose(settled, ref, rtol=4e-16, atol=0)


def test_rows_of_parts_from_two_steps():
    """A value whose real part comes from a recorded broadcast step and whose
    imaginary part from elsewhere (or none where the step had one) is sliced, not
    rebuilt from the step."""
    col, row, low, cond = _broadcast_operands(np.random.default_rng(11))
    with mx.stream(mx.cpu):
        w = engine64.from64(*(mx.array(v, dtype=mx.float64) for v in col))
        r = DoubleWord(mx.array(row), mx.array(low))
        re, im = engine64.apply(_masked_product, mx.array(cond), r, w)
        other = mx.array(np.random.default_rng(12).standard_normal(re.shape), dtype=mx.float64)
        for value in ((re, other), (re, None)):
            got = engine64.rows(value, 1, 3)
            for g, v in zip(got, value):
                assert (g is None and v is None) or (
                    np.array(g).tobytes() == np.array(v)[1:3].tobytes())


@pytest.mark.parametrize("whole_pieces, extra", [(4, 0), (2, 7)])
def test_pieces_pair_up_on_a_second_stream(monkeypatch, whole_pieces, extra):
    """Pieces go two at a time, every second one made on the second CPU stream (so
    that MLX runs the pair on two threads): the same bits as whole, for an even and
    an odd count of pieces."""
    from mlx_precise.doubleword import functions

    made_beside = []
    side = engine64._side_stream

    def counted():
        made_beside.append(1)
        return side()

    monkeypatch.setattr(engine64, "_side_stream", counted)
    step = functions._ERF_PIECE
    x = np.random.default_rng(11).uniform(-7, 7, whole_pieces * step + extra)
    x[-3:] = [np.nan, -0.0, -np.inf]
    with mx.stream(mx.cpu):
        v = mx.array(x, dtype=mx.float64)
        pieced = np.array(functions.value64("erf", v))
        assert len(made_beside) == (whole_pieces + (extra > 0)) // 2
        monkeypatch.setattr(engine64, "PIECE", 1 << 40)  # one piece
        whole = np.array(functions.value64("erf", v))
    assert pieced.tobytes() == whole.tobytes()
