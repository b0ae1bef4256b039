"""Integer and bool array operands next to float32 ones inside a block.

MLX promotes the integer array to float32 (``mx.arange(1, 6) ** 0.5``, ``0.9 **
step`` with an integer step, ``mx.arctan2(i, x)``, ``x @ counts``, a bool mask in a
matmul or an einsum); the flow takes integers exactly (their two words), as its
arithmetic does. Before: on the kernel backends ``power`` and ``arctan2`` passed
the integer array itself to the double-word kernels, which read float32 words only
(the block raised where MLX computes), and the products declined such operands on
every backend (MLX's float32 product, its rounding reported as "plain" only).
Oracles: mpmath at 80 bits, and exact sums of exact float64 products (math.fsum).
"""

import math

import mlx.core as mx
import mpmath
import numpy as np
import pytest

import mlx_precise as mp

from flow_helpers import value64

mpmath.mp.prec = 80

# small, negative, and above 2^24 (not a float32 value: the low word holds the rest)
INTS = np.array([1, 2, 3, 7, 100, 2**24 + 1, 2**30 + 3, 123456789], np.int32)
SIGNED = np.array([-5, -1, 0, 1, 3, 2**24 + 1, -(2**30 + 3), 123456789], np.int32)
FLOATS = np.array([0.5, -1.25, 3.0, 0.1, 2.5, -7.0, 1e-3, 0.3], np.float32)


def _check(y, ref, bound=2.0 ** -44):
    """The carried value within ``bound`` (relative) of the oracle, the high word
    its float32 rounding (no oracle value lies that close to a tie here)."""
    ref = np.array([float(r) for r in ref])
    got = value64(y)
    np.testing.assert_array_less(np.abs(got - ref), bound * np.abs(ref) + 1e-300)
    np.testing.assert_array_equal(np.array(y), ref.astype(np.float32))


def _block(fn, *args):
    with mp.extended_precision(strict=True) as report:
        y = fn(*args)
        mx.eval(y)
    assert y.dtype == mx.float32
    assert sum(report.extended.values()) >= 1 and not report.float32 and not report.plain
    return y


@pytest.mark.parametrize("exponent", [0.5, 2.0, -1.5, 1 / 3])
def test_integer_array_to_float_power(backend, exponent):
    y = _block(lambda a: a ** exponent, mx.array(INTS))
    _check(y, [mpmath.mpf(int(i)) ** mpmath.mpf(exponent) for i in INTS])


@pytest.mark.parametrize("base", [0.9, 0.999, 2.0])
def test_float_to_integer_array_power(backend, base):
    steps = np.array([1, 2, 3, 10, 57, 100, 0, 4], np.int32)
    y = _block(lambda t: base ** t, mx.array(steps))
    _check(y, [mpmath.mpf(base) ** int(t) for t in steps])


def test_power_of_integer_and_float32_arrays(backend):
    i, x = mx.array(INTS[:5]), mx.array(FLOATS[:5])
    _check(_block(mx.power, i, x),
           [mpmath.mpf(int(a)) ** mpmath.mpf(float(b)) for a, b in zip(INTS[:5], FLOATS[:5])])
    k = np.array([1, 2, 3, 7, 30], np.int32)  # (2.5 ** 30: no overflow)
    _check(_block(mx.power, mx.abs(x), mx.array(k)),
           [abs(mpmath.mpf(float(b))) ** int(a) for a, b in zip(k, FLOATS[:5])])


def test_bool_array_power(backend):
    b = np.array([True, False, True, False])
    y = _block(lambda t: 0.5 ** t, mx.array(b))
    np.testing.assert_array_equal(value64(y), np.where(b, 0.5, 1.0))


def test_arctan2_integer_operand(backend):
    i, x = mx.array(SIGNED), mx.array(FLOATS)
    _check(_block(mx.arctan2, i, x),
           [mpmath.atan2(int(a), float(b)) for a, b in zip(SIGNED, FLOATS)])
    _check(_block(mx.arctan2, x, i),
           [mpmath.atan2(float(b), int(a)) for a, b in zip(SIGNED, FLOATS)])


def _products(x: np.ndarray, k: np.ndarray) -> np.ndarray:
    """x @ k rounded once from the exact sums (float32 times integers below 2^20:
    each product exact in float64, fsum correctly rounded)."""
    x, k = x.astype(np.float64), k.astype(np.float64)
    return np.array([[math.fsum(x[r] * k[:, c]) for c in range(k.shape[1])]
                     for r in range(x.shape[0])])


PRODUCTS = {
    "x @ k": lambda x, k: x @ k,
    "k.T @ x.T": lambda x, k: (mx.swapaxes(k, 0, 1) @ mx.swapaxes(x, 0, 1)).T,
    "matmul": lambda x, k: mx.matmul(x, k),
    "einsum": lambda x, k: mx.einsum("ij,jk->ik", x, k),
    "tensordot": lambda x, k: mx.tensordot(x, k, axes=1),
    "addmm": lambda x, k: mx.addmm(mx.zeros((x.shape[0], k.shape[1])), x, k),
}


@pytest.mark.parametrize("name", sorted(PRODUCTS))
@pytest.mark.parametrize("dtype", ["int32", "bool", "uint8"])
def test_products_with_integer_operands(backend, name, dtype):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 24)).astype(np.float32)
    k = (rng.integers(-(2**19), 2**19, (24, 5)) if dtype == "int32" else
         rng.integers(0, 2, (24, 5)) if dtype == "bool" else rng.integers(0, 256, (24, 5)))
    k = k.astype(dtype)
    ref = _products(x, k)
    fn = PRODUCTS[name]
    with mp.extended_precision(strict=True) as report:
        y = fn(mx.array(x), mx.array(k))
        mx.eval(y)
    assert y.dtype == mx.float32 and not report.float32
    assert "matmul" not in report.plain and "__matmul__" not in report.plain
    assert "einsum" not in report.plain
    np.testing.assert_array_less(np.abs(value64(y) - ref), 2.0 ** -44 * np.abs(ref).max())
    np.testing.assert_array_equal(np.array(y), ref.astype(np.float32))


def test_product_gradient_with_integer_operand(backend):
    """MLX's autodiff through ``x @ k`` in a block: d sum(x @ k) / dx = the row
    sums of k, broadcast (exact)."""
    k = np.arange(12, dtype=np.int32).reshape(4, 3) - 5
    x = mx.array(np.ones((2, 4), np.float32))
    with mp.extended_precision():
        g = mx.grad(lambda t: (t @ mx.array(k)).sum())(x)
        mx.eval(g)
    np.testing.assert_array_equal(np.array(g), np.broadcast_to(k.sum(1), (2, 4)))


SELECTIONS = {
    "where(b, 0.1, i)": (lambda b, i: mx.where(b, 0.1, i),
                         lambda b, i: [mpmath.mpf(0.1) if c else int(v) for c, v in zip(b, i)]),
    "where(b, i, -2.3)": (lambda b, i: mx.where(b, i, -2.3),
                          lambda b, i: [int(v) if c else mpmath.mpf(-2.3) for c, v in zip(b, i)]),
    "maximum(i, 0.1)": (lambda b, i: mx.maximum(i, 0.1),
                        lambda b, i: [max(mpmath.mpf(int(v)), mpmath.mpf(0.1)) for v in i]),
    "minimum(0.7, i)": (lambda b, i: mx.minimum(0.7, i),
                        lambda b, i: [min(mpmath.mpf(int(v)), mpmath.mpf(0.7)) for v in i]),
}


@pytest.mark.parametrize("name", sorted(SELECTIONS))
def test_selection_of_integer_array_and_python_float(backend, name):
    """An integer array and a Python float select to float32 (MLX's promotion): the
    float enters in two words, as in ``i * 0.1`` (before: MLX's op on the float32
    rounding of 0.1, reported as plain only)."""
    fn, oracle = SELECTIONS[name]
    i = np.array([-3, 0, 1, 2, 2**24 + 1, 5], np.int32)
    b = i % 2 == 0
    y = _block(fn, mx.array(b), mx.array(i))
    ref = np.array([float(v) for v in oracle(b, i)])
    assert np.all(np.abs(value64(y) - ref) <= 2.0 ** -46 * np.abs(ref))  # (0 exactly)
    np.testing.assert_array_equal(np.array(y), np.array(fn(mx.array(b), mx.array(i))))


def test_selection_gradient_with_integer_operand(backend):
    """d sum(where(b, 0.1, i) * x) / dx inside a block, by MLX's autodiff: the
    selected values (0.1's float32 rounding in the high word)."""
    i = np.array([4, 5, 6, 7], np.int32)
    b = np.array([True, False, True, False])
    x = mx.array(np.ones(4, np.float32))
    with mp.extended_precision():
        g = mx.grad(lambda t: (mx.where(mx.array(b), 0.1, mx.array(i)) * t).sum())(x)
        mx.eval(g)
    np.testing.assert_array_equal(np.array(g), np.where(b, np.float32(0.1), i).astype(np.float32))


@pytest.mark.parametrize("strict", [False, True], ids=["report", "strict"])
@pytest.mark.parametrize("case", ["i / n", "n / i", "i / j", "bool / n", "u32 / i64"])
def test_true_division_of_integers(backend, case, strict):
    """``mx.arange(n) / n`` and other true divisions of integers (MLX gives float32)
    were MLX's float32 quotients, reported as plain only: the quotient is now
    double-word, rounded once (positional encodings divide positions so)."""
    i = mx.array(SIGNED)
    j = mx.array(INTS[::-1].copy())
    fn, num, den = {
        "i / n": (lambda: i / 7, SIGNED, [7] * 8),
        "n / i": (lambda: 3 / j, [3] * 8, INTS[::-1]),
        "i / j": (lambda: i / j, SIGNED, INTS[::-1]),
        "bool / n": (lambda: mx.array([True, False, True]) / 3, [1, 0, 1], [3] * 3),
        "u32 / i64": (lambda: mx.array(INTS.astype(np.uint32)) / mx.array(np.arange(1, 9)),
                      INTS, np.arange(1, 9)),
    }[case]
    with mp.extended_precision(strict=strict) as report:
        y = fn()
        mx.eval(y)
    assert not report.float32 and not report.plain and report.extended, report
    assert y.dtype == mx.float32
    want = [mpmath.mpf(int(a)) / int(b) for a, b in zip(num, den)]
    np.testing.assert_array_equal(np.array(y), np.array([float(w) for w in want], np.float32))
    for got, w in zip(value64(y), want):
        assert abs(mpmath.mpf(float(got)) - w) <= abs(w) * mpmath.mpf(2) ** -47, (got, w)


# ---- functions of integer and bool arrays alone -----------------------------------------
# MLX's results are float32 (mx.exp(i), mx.mean(i), mx.arctan2(i, j)): before, the
# flow left them to MLX (the integers rounded to float32 above 2^24, the function's
# value rounded again, reported as "plain" only); now they are double-word.

_POS = INTS  # 1 .. 123456789
_SMALL = np.array([-9, -4, -1, 0, 1, 2, 5, 11], np.int32)
_UNIT = np.array([-1, 0, 1, 0, -1, 1, 0, 1], np.int32)
_MP = mpmath.mpf
UNARY_OF_INTEGERS = {  # name: (inputs, oracle, relative bound)
    "exp": (_SMALL, mpmath.exp, 2.0**-44), "expm1": (_SMALL, mpmath.expm1, 2.0**-44),
    "log": (_POS, mpmath.log, 2.0**-44), "log1p": (_POS, mpmath.log1p, 2.0**-44),
    "log2": (_POS, lambda v: mpmath.log(v, 2), 2.0**-44), "log10": (_POS, mpmath.log10, 2.0**-44),
    "sin": (SIGNED, mpmath.sin, 2.0**-42), "cos": (SIGNED, mpmath.cos, 2.0**-42),
    "tan": (_SMALL, mpmath.tan, 2.0**-42), "tanh": (_SMALL, mpmath.tanh, 2.0**-44),
    "sigmoid": (_SMALL, lambda v: 1 / (1 + mpmath.exp(-v)), 2.0**-44),
    "erf": (_SMALL, mpmath.erf, 2.0**-44), "sqrt": (_POS, mpmath.sqrt, 2.0**-44),
    "rsqrt": (_POS, lambda v: 1 / mpmath.sqrt(v), 2.0**-44),
    "reciprocal": (_POS, lambda v: 1 / v, 2.0**-44),
    "sinh": (_SMALL, mpmath.sinh, 2.0**-42), "cosh": (_SMALL, mpmath.cosh, 2.0**-42),
    "arctan": (SIGNED, mpmath.atan, 2.0**-42), "arcsinh": (SIGNED, mpmath.asinh, 2.0**-42),
    "arccosh": (_POS, mpmath.acosh, 2.0**-42), "arcsin": (_UNIT, mpmath.asin, 2.0**-42),
    "arccos": (_UNIT, mpmath.acos, 2.0**-42),
    "degrees": (SIGNED, lambda v: v * 180 / mpmath.pi, 2.0**-44),
    "radians": (SIGNED, lambda v: v * mpmath.pi / 180, 2.0**-44),
}


@pytest.mark.parametrize("name", sorted(UNARY_OF_INTEGERS))
def test_function_of_an_integer_array(backend, name):
    ints, fn, bound = UNARY_OF_INTEGERS[name]
    y = _block(getattr(mx, name), mx.array(ints))
    _check(y, [fn(_MP(int(i))) for i in ints], bound)


@pytest.mark.parametrize("name", ["exp", "sqrt", "erf", "arctan"])
def test_function_of_a_bool_array(backend, name):
    flags = np.array([True, False, True, True])
    y = _block(getattr(mx, name), mx.array(flags))
    fn = {"exp": mpmath.exp, "sqrt": mpmath.sqrt, "erf": mpmath.erf, "arctan": mpmath.atan}[name]
    _check(y, [fn(_MP(int(f))) for f in flags])


def test_binary_functions_of_integer_arrays(backend):
    i, j = mx.array(SIGNED), mx.array(INTS)
    _check(_block(mx.arctan2, i, j), [mpmath.atan2(_MP(int(a)), _MP(int(b)))
                                      for a, b in zip(SIGNED, INTS)], 2.0**-42)
    small = mx.array(_SMALL)
    _check(_block(mx.logaddexp, small, small[::-1]),
           [mpmath.log(mpmath.exp(_MP(int(a))) + mpmath.exp(_MP(int(b))))
            for a, b in zip(_SMALL, _SMALL[::-1])], 2.0**-42)


def test_reductions_of_integer_arrays(backend):
    """mean, var, std (exact rationals: the mean of 2^30 + 3 and 123456789 is not a
    float32 value), logsumexp and logcumsumexp of int32 rows."""
    from fractions import Fraction

    rows = np.stack([INTS, SIGNED])  # (2, 8)
    a = mx.array(rows)
    n = rows.shape[1]
    means = [Fraction(int(r.sum()), n) for r in rows.astype(np.int64)]
    var = [sum((Fraction(int(v)) - m) ** 2 for v in r) / n for r, m in zip(rows, means)]
    _check(_block(lambda x: mx.mean(x, axis=1), a), [_MP(m.numerator) / m.denominator
                                                      for m in means])
    _check(_block(lambda x: mx.var(x, axis=1), a), [_MP(v.numerator) / v.denominator
                                                     for v in var])
    _check(_block(lambda x: mx.std(x, axis=1), a),
           [mpmath.sqrt(_MP(v.numerator) / v.denominator) for v in var])
    small = np.stack([_SMALL, _SMALL[::-1] * 2])
    lse = [mpmath.log(sum(mpmath.exp(_MP(int(v))) for v in r)) for r in small]
    _check(_block(lambda x: mx.logsumexp(x, axis=1), mx.array(small)), lse, 2.0**-42)
    cum = [mpmath.log(sum(mpmath.exp(_MP(int(v))) for v in _SMALL[:k + 1]))
           for k in range(len(_SMALL))]
    _check(_block(lambda x: mx.logcumsumexp(x), mx.array(_SMALL)), cum, 2.0**-42)


def test_functions_of_integers_outside_a_block_are_mlx_own():
    """Outside a block MLX's float32 results, bit for bit (the rules never run)."""
    i = mx.array(INTS)
    for name in ("exp", "log", "sqrt", "mean", "arctan"):
        fn = getattr(mx, name)
        want = fn(i)
        with mp.extended_precision():
            pass
        assert np.array_equal(np.array(fn(i)).view(np.uint32), np.array(want).view(np.uint32))


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint32"])
def test_astype_float32_of_integers_is_exact(backend, dtype):
    """``i.astype(mx.float32)``: the integer's exact value (MLX rounds above 2^24),
    so ``i.astype(float32) - 2^24`` is exact: 1 for 2^24 + 1 (MLX's float32: 0)."""
    ints = np.array([1, 2**24 + 1, 2**30 + 3, 123456789, 2**31 - 1], np.int64)
    if dtype == "int64":
        ints = np.concatenate([ints, [2**40 + 1, -(2**47 - 5)]])
    a = mx.array(ints.astype(dtype))
    y = _block(lambda v: v.astype(mx.float32), a)
    assert np.array_equal(value64(y), ints.astype(np.float64))
    d = _block(lambda v: v.astype(mx.float32) - 2.0**24, a)
    assert np.array_equal(value64(d), ints.astype(np.float64) - 2.0**24)
    with mp.extended_precision(strict=True):
        c = a.astype(mx.complex64)
        re = mx.real(c)
    assert c.dtype == mx.complex64 and np.array_equal(value64(re), ints.astype(np.float64))


@pytest.mark.parametrize("case", ["clip", "//", "%", "rmod", "divmod"])
def test_integer_array_with_python_float_decomposed_ops(backend, case):
    """``mx.clip(i, 0.5, 2.5)``, ``i // 0.375``, ``i % 0.375``, ``0.375 % i``,
    ``mx.divmod(i, 0.375)``: MLX promotes the integers to float32 (above 2^24 it
    rounds them); the flow takes them exactly. Oracle: exact rationals."""
    from fractions import Fraction

    def block(fn):  # (the decomposition's selections of bool masks count as plain)
        with mp.extended_precision(strict=True) as report:
            out = fn(i)
            mx.eval(out)
        assert not report.float32 and report.extended[name] == 1
        return out

    ints = SIGNED[SIGNED != 0]
    d = Fraction(3, 8)  # 0.375: a float32 value, so the oracle is exact
    i = mx.array(ints)
    exact = [Fraction(int(v)) for v in ints]
    name = {"clip": "clip", "//": "__floordiv__", "%": "__mod__", "rmod": "__rmod__",
            "divmod": "divmod"}[case]
    if case == "clip":
        y, ref = block(lambda a: mx.clip(a, 0.5, 2.5)), [min(max(v, Fraction(1, 2)),
                                                             Fraction(5, 2)) for v in exact]
    elif case == "//":
        y, ref = block(lambda a: a // 0.375), [Fraction(math.floor(v / d)) for v in exact]
    elif case == "%":
        y, ref = block(lambda a: a % 0.375), [v - d * math.floor(v / d) for v in exact]
    elif case == "rmod":
        y, ref = block(lambda a: 0.375 % a), [d - v * math.floor(d / v) for v in exact]
    else:
        q, y = block(lambda a: mx.divmod(a, 0.375))
        _check(q, [_MP(math.floor(v / d)) for v in exact])
        ref = [v - d * math.floor(v / d) for v in exact]
    _check(y, [_MP(v.numerator) / v.denominator for v in ref])
