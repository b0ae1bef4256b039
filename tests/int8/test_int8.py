"""W8A8 int8: quantize_int8, scaled_mm with the four CUTLASS / vLLM epilogues, the
azp_adj helper, Int8Linear and the model conversion helper.

scaled_mm oracles (independent of the code under test):

* the published formula: the exact product (numpy int64 matmul, integer zero-point
  corrections in int64), the epilogue evaluated in float64 in the published order,
  rounded once to out_dtype by integer rounding (tests/oracle.py: round_to);
* a stricter one: the exact rational value of the epilogue (tests/oracle.py: Exact)
  rounded once.

Asserted on every case: >= 99.9% of outputs equal to the float64 oracle and every
output within 1 ulp of out_dtype of it; the fraction equal to the exact rounding is
printed (``pytest -s``) and asserted >= 99.9% too. Shapes follow vLLM's tests
(M in {1, 16, 33, 64, 100}, N and K up to 1023, not multiples of 16) on the Metal
emulator and the cpu backend, with per-tensor, per-token and per-channel scales
(negative ones too), bias on and off, both zero-point modes, operands at the int8
limits, double-rounding traps, overflow and non-finite scales.
"""

import itertools

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from oracle import Exact, exact_f64, round_to, ulp_distance

import mlx_precise
from mlx_precise.int8 import compute_azp_adj, quantize_int8, scaled_mm
from mlx_precise.int8.checks import selftest_checks
from mlx_precise.nn.int8 import Int8Linear, convert_linear_to_int8

BACKEND = "emulate"
FMT = {mx.float32: "float32", mx.float16: "float16", mx.bfloat16: "bfloat16"}
OUT = (mx.float32, mx.float16, mx.bfloat16)
KINDS = ("scaled", "bias", "azp", "azp_per_token")


# ---- oracles ------------------------------------------------------------------------


def exact_acc(a, b):
    return np.matmul(a.astype(np.int64), b.astype(np.int64))


def oracle(x, s_a, s_b, bias, fmt):
    """(float64-epilogue oracle, exact oracle) for the integer part ``x`` ([M, N]
    int64), float32 scales ([M, 1] or [1, 1], [1, N] or [1, 1]) and bias ([N] or None)."""
    y = s_a.astype(np.float64) * (s_b.astype(np.float64) * x.astype(np.float64))
    if bias is not None:
        y = y + bias.astype(np.float64)[None, :]
    want64 = round_to(exact_f64(y), fmt)
    ex = Exact.f32(s_a) * (Exact.f32(s_b) * Exact(x.astype(object), 0))
    if bias is not None:
        ex = ex + Exact.f32(bias[None, :])
    return want64, round_to(ex, fmt)


def compare(got, want64, want_exact, fmt, label=""):
    """Assert the accuracy claim; return (fraction equal to the float64 oracle,
    fraction equal to the exact rounding, max ulp distance)."""
    g = np.array(got.astype(mx.float32), dtype=np.float64)
    assert g.shape == want64.shape
    eq64 = float(np.mean(g == want64))
    eqx = float(np.mean(g == want_exact))
    ulps = int(ulp_distance(g, want64, fmt).max()) if g.size else 0
    print(f"\n{label} {fmt}: {100 * eq64:.3f}% = float64 oracle, {100 * eqx:.3f}% = exact "
          f"rounding, max {ulps} ulp")
    assert eq64 >= 0.999, f"{label}: only {eq64:.5f} equal to the float64 oracle"
    assert eqx >= 0.999, f"{label}: only {eqx:.5f} equal to the exact rounding"
    assert ulps <= 1, f"{label}: {ulps} ulps from the float64 oracle"
    return eq64, eqx, ulps


def test_oracle_rounding_cross_checks():
    """round_to / exact_f64 / ulp_distance (tests/oracle.py) against independent
    roundings: numpy's float64 -> float32 and -> float16 conversions (correctly
    rounded), and for bfloat16 the nearest of the two bfloat16 neighbours found from
    the float32 bits, compared as exact Fractions (ties to the even significand)."""
    from fractions import Fraction

    rng = np.random.default_rng(77)
    y = rng.standard_normal(3000) * 2.0 ** rng.integers(-140, 130, 3000)
    y[:4] = [2049.0, 2049.0 + 2.0**-30, 65519.99, 65520.0]
    y[4:8] = [2.0**-149, 2.0**-150, 3 * 2.0**-151, -(2.0**-25)]
    ex = exact_f64(y)
    with np.errstate(over="ignore"):
        assert np.array_equal(round_to(ex, "float32"), y.astype(np.float32).astype(np.float64))
        assert np.array_equal(round_to(ex, "float16"), y.astype(np.float16).astype(np.float64))
    got = round_to(ex, "bfloat16")
    for v, g in zip(y[np.abs(y) < 3e38], got[np.abs(y) < 3e38]):
        t = int(np.float32(v).view(np.uint32))  # RN32(v); truncated: one step back
        lo = (t - (1 if abs(np.float32(v)) > abs(v) else 0)) >> 16  # bf16 truncation
        cands = [np.uint32((c & 0xFFFF) << 16).view(np.float32) for c in (lo, lo + 1)]
        best = min(cands, key=lambda c: (abs(Fraction(float(c)) - Fraction(float(v))),
                                         int(np.float32(c).view(np.uint32) >> 16) & 1))
        assert g == float(best), v
    a, b = np.array([1.0, 0.0, -0.0, 1.0]), np.array([1.0 + 2.0**-7, -0.0, 2.0**-133, 1.0])
    assert list(ulp_distance(a, b, "bfloat16")) == [1, 0, 1, 0]


# ---- building cases -----------------------------------------------------------------


def make_case(seed, m, n, k, kind, *, per_token_a, per_channel_b, bias_on, negative):
    """Random int8 operands and epilogue arguments; returns (kwargs, x, s_a, s_b, bias)
    with x the exact integer part of the epilogue."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    if m > 2 and n > 2:  # saturated rows / columns: the int8 limits
        a[0, :] = -128
        a[1, :] = 127
        b[:, 0] = -128
        b[:, 1] = 127
    lo = -0.05 if negative else 0.001
    s_a = rng.uniform(lo, 0.05, (m, 1) if per_token_a else (1, 1)).astype(np.float32)
    s_b = rng.uniform(lo, 0.05, (1, n) if per_channel_b else (1, 1)).astype(np.float32)
    bias = rng.normal(0, 10, n).astype(np.float32) if bias_on else None
    x = exact_acc(a, b)
    kw = {}
    if kind == "azp":
        z = int(rng.integers(-128, 128))
        adj = z * b.astype(np.int64).sum(axis=0)
        kw["azp_adj"] = mx.array(adj.astype(np.int32))
        x = x - adj[None, :]
    elif kind == "azp_per_token":
        azp = rng.integers(-128, 128, m).astype(np.int32)
        adj = b.astype(np.int64).sum(axis=0)
        kw["azp_adj"] = mx.array(adj.astype(np.int32))
        kw["azp"] = mx.array(azp)
        x = x - azp.astype(np.int64)[:, None] * adj[None, :]
    if bias is not None:
        kw["bias"] = mx.array(bias)
    kw.update(a=mx.array(a), b=mx.array(b), scale_a=mx.array(s_a), scale_b=mx.array(s_b))
    return kw, x, s_a, s_b, bias


# vLLM-like shapes: N and K up to 1023, none a multiple of 16.
SHAPES = {1: (1023, 1021), 16: (79, 1001), 33: (1000, 83), 64: (513, 257), 100: (1021, 1023)}


def _cases():
    """Each M with each epilogue; output dtype, scale granularity, sign and bias
    rotate so that every combination of each pair of options occurs."""
    out = []
    for i, (m, kind) in enumerate(itertools.product(SHAPES, KINDS)):
        n, k = SHAPES[m]
        out.append(dict(
            m=m, n=n, k=k, kind=kind, out_dtype=OUT[i % 3], per_token_a=bool(i % 2),
            per_channel_b=bool((i // 2) % 2), negative=bool((i // 3) % 2),
            bias_on=kind == "bias" or (kind.startswith("azp") and bool((i // 4) % 2)),
        ))
    return out


CASES = _cases()


@pytest.mark.parametrize("backend", [BACKEND, "cpu"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['m']}x{c['n']}x{c['k']}-{c['kind']}-"
                         f"{FMT[c['out_dtype']]}")
def test_scaled_mm_accuracy(backend, case):
    c = dict(case)
    out_dtype = c.pop("out_dtype")
    m, n, k, kind = c.pop("m"), c.pop("n"), c.pop("k"), c.pop("kind")
    kw, x, s_a, s_b, bias = make_case(m * 1000 + n + k, m, n, k, kind, **c)
    got = scaled_mm(**kw, out_dtype=out_dtype, backend=backend)
    assert got.dtype == out_dtype and got.shape == (m, n)
    fmt = FMT[out_dtype]
    compare(got, *oracle(x, s_a, s_b, bias, fmt), fmt, f"{backend} {m}x{n}x{k} {kind}")


def test_all_epilogue_dtype_pairs():
    """Every epilogue with every output dtype, on a partial-tile shape."""
    for i, (kind, out_dtype) in enumerate(itertools.product(KINDS, OUT)):
        kw, x, s_a, s_b, bias = make_case(i, 37, 45, 77, kind, per_token_a=True,
                                          per_channel_b=True, negative=True,
                                          bias_on=kind != "scaled")
        got = scaled_mm(**kw, out_dtype=out_dtype, backend=BACKEND)
        fmt = FMT[out_dtype]
        compare(got, *oracle(x, s_a, s_b, bias, fmt), fmt, f"{kind}")


def _run(backend, a, b, s_a, s_b, out_dtype, **kw):
    return scaled_mm(mx.array(a), mx.array(b), mx.array(np.float32(s_a).reshape(-1, 1)[:1]),
                     mx.array(np.float32(s_b).reshape(1, -1)[:, :1]), out_dtype=out_dtype,
                     backend=backend, **{k: mx.array(v) for k, v in kw.items()})


@pytest.mark.parametrize("backend", [BACKEND, "cpu"])
def test_double_rounding_traps(backend):
    """Exact values just above a tie of the output format (tie + 2^-20): rounding
    first to float32 would land on the tie and then round to even, the wrong way.
    acc = 2049 is a float16 tie (2048 | 2050), 257 a bfloat16 tie (256 | 258), and
    2^24 + 1 a float32 tie, reached with K = 1025 operands at the int8 limits."""
    for acc, out_dtype, up, down in ((2049, mx.float16, 2050.0, 2048.0),
                                     (257, mx.bfloat16, 258.0, 256.0),
                                     (2**24 + 1, mx.float32, 2.0**24 + 2, 2.0**24)):
        if acc < 2**24:
            a, b = np.ones((1, acc), np.int8), np.ones((acc, 1), np.int8)
        else:
            a = np.full((1, 1025), -128, np.int8)
            a[0, -1] = 1
            b = a.T.copy()
        for sign in (1.0, -1.0):
            for tiny, want in ((2.0**-20, up), (-(2.0**-20), down), (0.0, None)):
                got = _run(backend, a, b, sign, 1.0, out_dtype,
                           bias=np.float32([sign * tiny]))
                # the ties themselves go to the even neighbour, `down` in all three
                expect = sign * (want if want is not None else down)
                assert float(got.astype(mx.float32)[0, 0]) == expect, (acc, sign, tiny)


@pytest.mark.parametrize("backend", [BACKEND, "cpu"])
def test_overflow_and_non_finite_scales(backend):
    rng = np.random.default_rng(5)
    a = rng.integers(-128, 128, (3, 40), dtype=np.int8)
    b = rng.integers(-128, 128, (40, 5), dtype=np.int8)
    a[2, :] = 0  # acc = 0 row: inf * 0 = NaN
    x = exact_acc(a, b)
    for s_a, s_b, out_dtype in ((1e30, 1e10, mx.float32), (1e30, 1e10, mx.bfloat16),
                                (60.0, 1.0, mx.float16), (np.inf, 1.0, mx.float32),
                                (np.nan, 1.0, mx.float16), (1.0, -np.inf, mx.bfloat16)):
        got = np.array(_run(backend, a, b, s_a, s_b, out_dtype).astype(mx.float32))
        with np.errstate(over="ignore", invalid="ignore"):
            y = np.float64(np.float32(s_a)) * (np.float64(np.float32(s_b)) * x)
        fin = np.isfinite(y)
        want = np.where(fin, 0.0, y)
        want[fin] = round_to(exact_f64(y[fin]), FMT[out_dtype])
        assert np.array_equal(np.isnan(got), np.isnan(want)), (s_a, s_b)
        ok = ~np.isnan(want)
        assert np.array_equal(got[ok], want[ok]), (s_a, s_b, out_dtype)
    # float16's largest finite is 65504; 65519 rounds to it, 65520 to inf
    ones = np.ones((1, 1), np.int8)
    for v, want in ((65519.0, 65504.0), (65520.0, np.inf), (-65520.0, -np.inf)):
        got = _run(backend, ones, ones, 1.0, v, mx.float16)
        assert float(got.astype(mx.float32)[0, 0]) == want


@pytest.mark.parametrize("backend", [BACKEND, "cpu"])
def test_large_zero_points_exact_integer_part(backend):
    """Zero points far outside int8 (asymmetric quantization of a row that does not
    contain 0) make azp * azp_adj overflow int32; the integer part is formed in 64
    bits, so the result is still the correctly rounded value."""
    rng = np.random.default_rng(9)
    m, n, k = 5, 9, 300
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = np.full((k, n), 127, dtype=np.int8)
    azp = np.array([2**20, -(2**20), 123456, 0, -128], dtype=np.int32)
    adj = b.astype(np.int64).sum(axis=0)
    x = exact_acc(a, b) - azp.astype(np.int64)[:, None] * adj[None, :]
    assert np.abs(x).max() > 2**31
    s_a = np.float32([[1e-6]])
    s_b = rng.uniform(-1, 1, (1, n)).astype(np.float32)
    got = scaled_mm(mx.array(a), mx.array(b), mx.array(s_a), mx.array(s_b),
                    azp_adj=mx.array(adj.astype(np.int32)), azp=mx.array(azp),
                    backend=backend)
    compare(got, *oracle(x, s_a, s_b, None, "float32"), "float32", "large azp")
    # Arbitrary int32 azp_adj: |x| up to ~2^62, past the 2^48 of an exact double-word.
    adj = np.array([2**31 - 1, -(2**31), 2**30 + 12345, 7, -3, 2**24 + 1, 0, 1, -1], np.int32)
    azp = np.array([2**31 - 1, -(2**31), 2**29 + 3, -5, 2**20], dtype=np.int32)
    x = exact_acc(a, b) - azp.astype(np.int64)[:, None] * adj.astype(np.int64)[None, :]
    assert np.abs(x).max() > 2**61
    got = scaled_mm(mx.array(a), mx.array(b), mx.array(s_a), mx.array(s_b),
                    azp_adj=mx.array(adj), azp=mx.array(azp), backend=backend)
    compare(got, *oracle(x, s_a, s_b, None, "float32"), "float32", "huge azp * azp_adj")


@pytest.mark.parametrize("backend", [BACKEND, "cpu"])
def test_empty_and_k0(backend):
    bias = mx.array(np.float32([1.5, -2.0, 0.25]))
    d = scaled_mm(mx.zeros((2, 0), mx.int8), mx.zeros((0, 3), mx.int8), mx.array([2.0]),
                  mx.array([3.0]), bias=bias, out_dtype=mx.float16, backend=backend)
    assert np.array_equal(np.array(d.astype(mx.float32)), np.tile(np.array(bias), (2, 1)))
    d = scaled_mm(mx.zeros((0, 4), mx.int8), mx.zeros((4, 3), mx.int8), mx.array([2.0]),
                  mx.array([3.0]), backend=backend)
    assert d.shape == (0, 3) and d.dtype == mx.float32


def test_bad_input():
    a = mx.zeros((4, 8), mx.int8)
    b = mx.zeros((8, 3), mx.int8)
    s1 = mx.array([1.0])
    ok = dict(scale_a=s1, scale_b=s1)
    with pytest.raises(TypeError, match="a must have dtype int8"):
        scaled_mm(a.astype(mx.float32), b, **ok)
    with pytest.raises(TypeError, match="b must be an mx.array or array-like"):
        scaled_mm(a, "b", **ok)
    with pytest.raises(ValueError, match="K differs"):
        scaled_mm(a, mx.zeros((7, 3), mx.int8), **ok)
    with pytest.raises(ValueError, match="b must be 2-D"):
        scaled_mm(a, mx.zeros((1, 8, 3), mx.int8), **ok)
    with pytest.raises(TypeError, match="scale_a must have dtype float32"):
        scaled_mm(a, b, scale_a=mx.array([1.0], mx.float16), scale_b=s1)
    with pytest.raises(ValueError, match=r"scale_a must have one element .* \(4, 1\)"):
        scaled_mm(a, b, scale_a=mx.ones((4,)), scale_b=s1)
    with pytest.raises(ValueError, match=r"scale_b must have one element .* \(1, 3\)"):
        scaled_mm(a, b, scale_a=s1, scale_b=mx.ones((3, 1)))
    with pytest.raises(ValueError, match="bias must have shape"):
        scaled_mm(a, b, **ok, bias=mx.zeros((4,)))
    with pytest.raises(TypeError, match="bias must have dtype"):
        scaled_mm(a, b, **ok, bias=mx.zeros((3,), mx.int32))
    with pytest.raises(ValueError, match="azp .* needs azp_adj"):
        scaled_mm(a, b, **ok, azp=mx.zeros((4,), mx.int32))
    with pytest.raises(TypeError, match="azp_adj must have dtype int32"):
        scaled_mm(a, b, **ok, azp_adj=mx.zeros((3,), mx.int64))
    with pytest.raises(ValueError, match="azp must have shape"):
        scaled_mm(a, b, **ok, azp_adj=mx.zeros((3,), mx.int32), azp=mx.zeros((3,), mx.int32))
    with pytest.raises(ValueError, match="out_dtype must be"):
        scaled_mm(a, b, **ok, out_dtype=mx.int32)
    with pytest.raises(ValueError, match="K = 131072 is too large"):
        scaled_mm(mx.zeros((1, 131072), mx.int8), mx.zeros((131072, 1), mx.int8), **ok)


# ---- azp_adj --------------------------------------------------------------------------


def test_compute_azp_adj():
    rng = np.random.default_rng(4)
    b = rng.integers(-128, 128, (300, 7), dtype=np.int8)
    b[:, 0] = -128
    sums = b.astype(np.int64).sum(axis=0)
    got = compute_azp_adj(mx.array(b))
    assert got.dtype == mx.int32 and np.array_equal(np.array(got), sums)
    assert np.array_equal(np.array(compute_azp_adj(mx.array(b), -77)), -77 * sums)
    assert np.array_equal(np.array(compute_azp_adj(mx.array(b), mx.array([5], mx.int32))),
                          5 * sums)
    with pytest.raises(ValueError, match="overflows int32"):
        compute_azp_adj(mx.array(b), 2**30)
    with pytest.raises(TypeError, match="b must be an int8"):
        compute_azp_adj(mx.array(b.astype(np.int32)))
    with pytest.raises(ValueError, match=r"b must be \[K, N\]"):
        compute_azp_adj(mx.array(b[0]))
    with pytest.raises(TypeError, match="azp must be int32"):
        compute_azp_adj(mx.array(b), mx.array([1.0]))
    with pytest.raises(ValueError, match="one element"):
        compute_azp_adj(mx.array(b), mx.array([1, 2], mx.int32))


# ---- quantize_int8 --------------------------------------------------------------------


def _f32(v):
    return np.float32(v)


def ref_dynamic_symmetric(x):
    """vLLM's float32 formula, in numpy float32 (IEEE, correctly rounded ops)."""
    x = x.astype(np.float32)
    absmax = np.max(np.abs(x), axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = _f32(127) / absmax
        v = x * inv
    q = np.clip(np.rint(np.nan_to_num(v, nan=0.0)), -128, 127).astype(np.int8)
    return q, absmax / _f32(127)


def ref_dynamic_asymmetric(x):
    x = x.astype(np.float32)
    hi = np.max(x, axis=-1, keepdims=True)
    lo = np.min(x, axis=-1, keepdims=True)
    const = hi == lo
    hi = np.where(const, np.maximum(hi, 0), hi).astype(np.float32)
    lo = np.where(const, np.minimum(lo, 0), lo).astype(np.float32)
    s = (hi - lo) / _f32(255)
    s = np.where(s == 0, _f32(1), s).astype(np.float32)
    zp = np.rint(_f32(-128) - lo / s).astype(np.int64)
    q = np.clip(np.rint(x / s).astype(np.int64) + zp, -128, 127).astype(np.int8)
    return q, s, zp


def test_quantize_dynamic_symmetric():
    rng = np.random.default_rng(21)
    x = (rng.standard_normal((9, 300)) * rng.uniform(0.01, 100, (9, 1))).astype(np.float32)
    x[3] = 0.0  # all-zero row: scale 0, q 0
    x[4, :5] = [127.0, 2.5, 3.5, -2.5, -0.5]  # absmax 127: ties of rint
    x[4, 5:] = 0.0
    q, s, zp = quantize_int8(mx.array(x))
    assert zp is None and q.dtype == mx.int8 and s.dtype == mx.float32 and s.shape == (9, 1)
    rq, rs = ref_dynamic_symmetric(x)
    assert np.array_equal(np.array(q), rq) and np.array_equal(np.array(s), rs)
    assert list(np.array(q)[4, :5]) == [127, 2, 4, -2, 0]  # half to even
    assert not np.any(np.array(q)[3]) and float(s[3, 0]) == 0.0
    # meaning: |x - s q| <= s (1/2 + 2^-14) (rounding of x * (127/absmax) and of s)
    s64, q64 = np.array(s, dtype=np.float64), np.array(q, dtype=np.float64)
    assert np.all(np.abs(x - s64 * q64) <= s64 * (0.5 + 2.0**-14))
    # float16 / bfloat16 inputs are converted exactly first; 3-D works per row
    x16 = x.reshape(3, 3, 300).astype(np.float16)
    q16, s16, _ = quantize_int8(mx.array(x16))
    rq16, rs16 = ref_dynamic_symmetric(x16.astype(np.float32))
    assert q16.shape == (3, 3, 300) and s16.shape == (3, 3, 1)
    assert np.array_equal(np.array(q16), rq16) and np.array_equal(np.array(s16), rs16)
    xb = mx.array(x).astype(mx.bfloat16)
    qb, _, _ = quantize_int8(xb)
    assert np.array_equal(np.array(qb), ref_dynamic_symmetric(np.array(xb.astype(mx.float32)))[0])


def test_quantize_dynamic_asymmetric():
    rng = np.random.default_rng(22)
    x = rng.standard_normal((8, 257)).astype(np.float32) * 3 + 1
    x[1] += 50.0  # min > 0: zero point outside int8
    x[2] = 4.0  # constant rows
    x[3] = -4.0
    x[4] = 0.0
    q, s, zp = quantize_int8(mx.array(x), symmetric=False)
    rq, rs, rzp = ref_dynamic_asymmetric(x)
    assert zp.dtype == mx.int32 and zp.shape == (8, 1)
    assert np.array_equal(np.array(q), rq)
    assert np.array_equal(np.array(s), rs)
    assert np.array_equal(np.array(zp), rzp)
    assert int(np.array(zp)[1, 0]) < -128
    # x ~ s (q - zp): where q is not saturated, q - zp = rint(RN(x / s)), so the
    # error is at most s/2 + u|x| (u = 2^-24); saturation costs at most one more
    # step. Constant rows reproduce their value.
    deq = np.array(s, np.float64) * (np.array(q, np.float64) - np.array(zp, np.float64))
    s64 = np.broadcast_to(np.array(s, np.float64), x.shape)
    err = np.abs(x - deq)
    sat = (np.array(q) == 127) | (np.array(q) == -128)
    assert np.all((err <= s64 / 2 + 2.0**-24 * np.abs(x))[~sat])
    assert np.all(err <= 1.5 * s64)
    assert np.allclose(deq[2:5], x[2:5], rtol=1e-6, atol=0)


def test_quantize_static():
    x = np.float32([[1.0, -1.0, 2.5, 3.5, 1000.0, -1000.0, 1e30, -1e30, np.inf, -np.inf]])
    q, s, zp = quantize_int8(mx.array(x), scale=1.0)
    assert zp is None and float(s) == 1.0
    assert list(np.array(q)[0]) == [1, -1, 2, 4, 127, -128, 127, -128, 127, -128]
    q, _, zp = quantize_int8(mx.array(x), scale=mx.array([0.5]), azp=mx.array([-100], mx.int32))
    # sat8(sat32(rint(x / 0.5)) - 100)
    assert list(np.array(q)[0]) == [-98, -102, -95, -93, 127, -128, 127, -128, 127, -128]
    # per-row static scale and zero point
    x2 = np.float32([[1.0, 2.0], [3.0, 4.0]])
    q, _, _ = quantize_int8(mx.array(x2), scale=mx.array([[1.0], [0.5]]),
                            azp=mx.array([[1], [-1]], mx.int32))
    assert np.array_equal(np.array(q), [[2, 3], [5, 7]])
    # x / scale is one float32 division (as vLLM), not x * (1 / scale): here
    # x / s = 90.5 exactly (a tie, to even: 90) while x * RN(1 / s) rounds to 90.50001
    xv, sv = np.float32(66.05829), np.float32(0.7299258)
    assert xv / sv == np.float32(90.5) and np.rint(xv * (np.float32(1) / sv)) == 91
    q, _, _ = quantize_int8(mx.array(np.array([xv])), scale=mx.array(np.array([sv])))
    assert int(np.array(q)[0]) == 90


_NONFINITE_X = np.float32([[0.5, -1.0, 2.0, 0.25], [1.0, np.nan, 3.0, -2.0],
                           [1.0, 2.0, 3.0, 4.0], [-np.inf, 2.0, 3.0, 4.0]])
_MODES = ({}, {"symmetric": False}, {"scale": 0.5},
          {"scale": 0.5, "azp": mx.array([3], mx.int32)},
          {"scale": mx.array([[0.5], [1.0], [0.25], [2.0]])})


def _check_nan_rows(x, kw, q, s, zp):
    """Rows with a NaN (dynamic: NaN or Inf) have scale NaN and codes 0, so every
    dequantized value is NaN; the other rows are what quantizing them alone gives."""
    dynamic = "scale" not in kw
    bad = ~np.isfinite(x).all(axis=-1) if dynamic else np.isnan(x).any(axis=-1)
    s_np, q_np = np.array(s), np.array(q)
    assert s_np.shape == x.shape[:-1] + (1,)
    assert np.isnan(s_np[bad]).all() and not np.isnan(s_np[~bad]).any()
    assert not q_np[bad].any()
    z = 0 if zp is None else np.array(zp, np.float64)
    deq = s_np.astype(np.float64) * (q_np - z)
    assert np.isnan(deq[bad]).all() and np.isfinite(deq[~bad]).all()
    kw_good = dict(kw)
    if isinstance(kw.get("scale"), mx.array) and kw["scale"].size > 1:
        kw_good["scale"] = kw["scale"][mx.array(np.flatnonzero(~bad))]
    gq, gs, _ = quantize_int8(mx.array(x[~bad]), **kw_good)
    assert np.array_equal(q_np[~bad], np.array(gq))
    assert np.array_equal(s_np[~bad], np.broadcast_to(np.array(gs), s_np[~bad].shape))
    return bad


@pytest.mark.parametrize("backend", ["cpu", BACKEND])
def test_quantize_non_finite_rows_get_nan_scale(backend):
    """int8 has no code for NaN: the row's scale carries it. A row with a NaN (with a
    dynamic scale, also an Inf) gets scale NaN and codes 0, so every dequantized
    value and every output of that row of scaled_mm / Int8Linear is NaN: exactly
    the rows float32 x @ W makes NaN (Inf: non-finite). It used to raise eagerly
    and refuse mx.compile, which broke compiled Int8Linear forward passes."""
    x = _NONFINITE_X
    rng = np.random.default_rng(5)
    w = mx.array(rng.integers(-127, 128, (4, 6)).astype(np.int8))
    with mlx_precise.use_backend(backend):
        for kw in _MODES:
            q, s, zp = quantize_int8(mx.array(x), **kw)
            bad = _check_nan_rows(x, kw, q, s, zp)
            extra = ({} if zp is None or "scale" in kw
                     else {"azp_adj": compute_azp_adj(w), "azp": zp})
            if "azp" in kw:
                extra = {"azp_adj": compute_azp_adj(w, kw["azp"])}
            for out_dtype in (mx.float32, mx.float16, mx.bfloat16):
                y = scaled_mm(q, w, s, mx.full((1, 6), 0.5), bias=mx.ones((6,)),
                              out_dtype=out_dtype, **extra)
                y = np.array(y.astype(mx.float32))
                assert np.isnan(y[bad]).all() and np.isfinite(y[~bad]).all(), (kw, out_dtype)
        # Int8Linear against nn.Linear: the same non-finite rows (its input) and
        # columns (a NaN in a weight row, an output channel)
        lin = nn.Linear(4, 3)
        for symmetric in (True, False):
            layer = Int8Linear.from_linear(lin, symmetric=symmetric)
            for dtype in (mx.float32, mx.float16):
                xd = mx.array(x).astype(dtype)
                ref = ~np.isfinite(np.array(lin(xd).astype(mx.float32)))
                got = np.array(layer(xd).astype(mx.float32))
                assert np.array_equal(np.isnan(got), ref.all(axis=-1, keepdims=True)
                                      .repeat(3, -1)) and ref.any(axis=-1).tolist() == [
                    False, True, False, True]
        wn = np.array(lin.weight)
        wn[1, 2] = np.nan
        layer = Int8Linear.from_linear(_linear_with(wn))
        got = np.array(layer(mx.array(x[[0, 2]])))
        assert np.isnan(got[:, 1]).all() and np.isfinite(got[:, [0, 2]]).all()


def _linear_with(w):
    lin = nn.Linear(w.shape[1], w.shape[0])
    lin.weight = mx.array(w)
    return lin


def test_quantize_non_finite_under_compile_and_vmap():
    """The NaN rows are pure MLX operations: mx.compile and mx.vmap give the eager
    result (it used to raise TransformUnsupportedError: the check read values).
    A traced static scale that is zero or not finite cannot raise: every row gets
    scale NaN instead."""
    x = mx.array(_NONFINITE_X)
    for kw in _MODES:
        eager = quantize_int8(x, **kw)
        for traced in (mx.compile(lambda v: quantize_int8(v, **kw))(x),):
            for e, t in zip(eager, traced):
                assert (e is None) == (t is None)
                if e is not None:
                    assert np.array_equal(np.array(e), np.array(t), equal_nan=True), kw
    vm = mx.vmap(lambda v: quantize_int8(v)[1])(x)
    assert np.array_equal(np.array(vm), np.array(quantize_int8(x)[1]), equal_nan=True)
    with pytest.raises(ValueError, match="scale must be nonzero and finite"):
        quantize_int8(x, scale=0.0)
    s = mx.compile(lambda v, sc: quantize_int8(v, scale=sc)[1])(x, mx.array([0.0]))
    assert np.isnan(np.array(s)).all()
    s = mx.vmap(lambda v, sc: quantize_int8(v, scale=sc)[1])(x, mx.array([0.5, 1, 0, 2]))
    assert np.isnan(np.array(s)).ravel().tolist() == [False, True, True, False]


def test_compiled_int8_linear_traces_on_metal(lazy_metal):
    """mx.compile of an Int8Linear forward pass (quantize, then the fused scaled_mm)
    traces on the metal backend (here MLX's lazy stand-in for the Metal kernels)."""
    lin = nn.Linear(32, 8)
    with mlx_precise.use_backend("metal"):
        for symmetric in (True, False):
            layer = Int8Linear.from_linear(lin, symmetric=symmetric)
            out = mx.compile(layer)(mx.array(np.random.default_rng(1).standard_normal(
                (4, 32)).astype(np.float32)))
            mx.eval(out)
            assert out.shape == (4, 8)


def test_quantize_bad_input():
    x = mx.zeros((2, 3))
    with pytest.raises(TypeError, match="x must be float32"):
        quantize_int8(mx.zeros((2, 3), mx.int32))
    with pytest.raises(TypeError, match="x must be an mx.array or array-like"):
        quantize_int8(object())
    with pytest.raises(ValueError, match="at least one dimension"):
        quantize_int8(mx.array(1.0))
    with pytest.raises(ValueError, match="empty rows"):
        quantize_int8(mx.zeros((2, 0)))
    with pytest.raises(ValueError, match="azp given without scale"):
        quantize_int8(x, azp=mx.array([0], mx.int32))
    with pytest.raises(ValueError, match=r"one element or shape \(2, 1\)"):
        quantize_int8(x, scale=mx.ones((3,)))
    with pytest.raises(TypeError, match="scale must have dtype"):
        quantize_int8(x, scale=mx.ones((1,), mx.float16))
    with pytest.raises(ValueError, match="nonzero and finite"):
        quantize_int8(x, scale=0.0)
    with pytest.raises(TypeError, match="azp must have dtype"):
        quantize_int8(x, scale=1.0, azp=mx.array([1.0]))
    with pytest.raises(ValueError, match="symmetric=False"):
        quantize_int8(x, scale=1.0, symmetric=False)


# ---- Int8Linear -----------------------------------------------------------------------


def _mlp(seed):
    mx.random.seed(seed)
    return nn.Sequential(nn.Linear(96, 200), nn.ReLU(), nn.Linear(200, 120, bias=False),
                         nn.ReLU(), nn.Linear(120, 40))


def _layer_bound(layer: Int8Linear, h: np.ndarray, w: np.ndarray) -> np.ndarray:
    """A priori error bound of one Int8Linear on input rows ``h`` (float64 copy of
    what the layer is given) against the exact ``h W^T + b``:
    ``(s_x/2 + s_x 2^-14) |W| 1  +  (s_w/2 + s_w 2^-14) |x8| 1`` per output, with
    s_x, x8 the row's activation scale and dequantized activations (the rounding
    of rint moves x by at most s_x/2; float32 steps add < 2^-14 s_x, see
    test_quantize_dynamic_symmetric; asymmetric rows may saturate one step: s_x),
    and the same for the weights."""
    q, s, zp = quantize_int8(mx.array(h.astype(np.float32)), symmetric=layer.symmetric)
    s = np.array(s, np.float64)
    x8 = s * (np.array(q, np.float64) - (0 if zp is None else np.array(zp, np.float64)))
    ex = s * ((0.5 if layer.symmetric else 1.5) + 2.0**-14)
    sw = np.array(layer.weight_scale, np.float64)  # [1, N]
    ew = sw * (0.5 + 2.0**-14)
    return ex * np.abs(w).sum(axis=1)[None, :] + ew * np.abs(x8).sum(axis=1, keepdims=True)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("backend", [BACKEND, "cpu"])
def test_int8_mlp_within_quantization_bound(symmetric, backend):
    """The converted MLP against the float model computed in float64. Stated bound,
    per output, propagated through the layers (ReLU is 1-Lipschitz):
    e_0 = 0, e_l = |W_l| e_(l-1) + B_l(h8_(l-1)) + 2^-23 |h8_l|, with B_l the a
    priori one-layer bound of _layer_bound on the int8 model's own hidden values
    h8 and the last term the output rounding. Asserted elementwise."""
    model = _mlp(7)
    weights = [np.array(l.weight, np.float64) for l in model.layers[::2]]
    biases = [np.array(l.bias, np.float64) if "bias" in l else 0.0 for l in model.layers[::2]]
    rng = np.random.default_rng(30)
    x = rng.standard_normal((33, 96)).astype(np.float32)
    x[0] *= 100.0  # a row with a large scale
    x[1, :50] = 0.0
    ref = x.astype(np.float64)
    for i, (w, b) in enumerate(zip(weights, biases)):
        ref = ref @ w.T + b
        if i < 2:
            ref = np.maximum(ref, 0)
    convert_linear_to_int8(model, symmetric=symmetric)
    assert all(isinstance(l, Int8Linear) for l in model.layers[::2])
    h8 = x.astype(np.float64)
    err = np.zeros_like(h8)
    with mlx_precise.use_backend(backend):
        for i, (layer, w) in enumerate(zip(model.layers[::2], weights)):
            bound = _layer_bound(layer, h8, w)
            out = np.array(layer(mx.array(h8.astype(np.float32))), np.float64)
            err = err @ np.abs(w).T + bound + 2.0**-23 * np.abs(out)
            h8 = np.maximum(out, 0) if i < 2 else out
        y8 = np.array(model(mx.array(x)), np.float64)
    assert np.array_equal(y8, h8)  # the model is the chain of its layers
    ratio = np.abs(y8 - ref) / err
    rel = np.linalg.norm(y8 - ref) / np.linalg.norm(ref)
    print(f"\nint8 MLP ({'symmetric' if symmetric else 'asymmetric'}, {backend}): "
          f"relative error {rel:.2e}, max |error| / bound {ratio.max():.3f}")
    assert np.all(np.abs(y8 - ref) <= err)
    assert rel < 0.03


@pytest.mark.parametrize("symmetric", [True, False])
def test_int8_linear_error_matches_rounding_model(symmetric):
    """Expected (not worst-case) error of one layer: modelling the rounding errors of
    activations and weights as independent and uniform on [-s/2, s/2] (variance
    s^2/12), the error of output n of a row has variance
    s_x^2/12 sum_k W[n,k]^2 + s_w[n]^2/12 sum_k x8_k^2. The measured RMS error over
    64 x 300 outputs must be within 7% of the model's (measured: within 1.5%)."""
    mx.random.seed(12)
    lin = nn.Linear(256, 300)
    layer = Int8Linear.from_linear(lin, symmetric=symmetric)
    x = np.random.default_rng(12).standard_normal((64, 256)).astype(np.float32)
    w = np.array(lin.weight, np.float64)
    ref = x.astype(np.float64) @ w.T + np.array(lin.bias, np.float64)
    with mlx_precise.use_backend(BACKEND):
        y = np.array(layer(mx.array(x)), np.float64)
    q, s, zp = quantize_int8(mx.array(x), symmetric=symmetric)
    s = np.array(s, np.float64)
    x8 = s * (np.array(q, np.float64) - (0 if zp is None else np.array(zp, np.float64)))
    sw = np.array(layer.weight_scale, np.float64)
    var = ((s**2 / 12) * (w**2).sum(axis=1)[None, :]
           + (sw**2 / 12) * (x8**2).sum(axis=1, keepdims=True))
    ratio = np.sqrt(np.mean((y - ref) ** 2) / np.mean(var))
    print(f"\nInt8Linear 256 -> 300 ({'symmetric' if symmetric else 'asymmetric'}): "
          f"RMS error / rounding model {ratio:.4f}")
    assert 0.93 <= ratio <= 1.07


def test_int8_linear_layer():
    mx.random.seed(1)
    lin = nn.Linear(70, 50)
    layer = Int8Linear.from_linear(lin)
    assert layer.qweight.shape == (70, 50) and layer.qweight.dtype == mx.int8
    assert layer.weight_scale.shape == (1, 50) and layer.trainable_parameters() == {}
    w = np.array(lin.weight)
    q, s = ref_dynamic_symmetric(w)
    assert np.array_equal(np.array(layer.qweight), q.T)
    assert np.array_equal(np.array(layer.weight_scale), s.T)
    assert np.array_equal(np.array(layer.azp_adj), q.T.astype(np.int64).sum(axis=0))
    x = mx.random.normal((2, 3, 70))
    with mlx_precise.use_backend(BACKEND):
        y = layer(x)
        y16 = layer(x.astype(mx.float16))
        yb = layer(x.astype(mx.bfloat16))
    assert y.shape == (2, 3, 50) and y.dtype == mx.float32
    assert y16.dtype == mx.float16 and yb.dtype == mx.bfloat16
    ref = np.array(x, np.float64) @ w.T.astype(np.float64) + np.array(lin.bias, np.float64)
    assert np.max(np.abs(np.array(y) - ref)) < 0.02 * np.max(np.abs(ref))
    with mlx_precise.use_backend("cpu"):
        assert np.array_equal(np.array(layer(x)), np.array(y))  # backends agree
    nobias = Int8Linear.from_linear(nn.Linear(70, 5, bias=False), symmetric=False)
    assert "bias" not in nobias and "symmetric=False" in repr(nobias)
    with pytest.raises(ValueError, match=r"expects \[\.\.\., 70\]"):
        layer(mx.zeros((2, 71)))
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        layer(mx.zeros((2, 70), mx.int32))
    with pytest.raises(TypeError, match="mlx.nn.Linear"):
        Int8Linear.from_linear(nn.ReLU())
    with pytest.raises(ValueError, match="input_dims must be a positive int"):
        Int8Linear(0, 3)


def test_convert_with_predicate():
    model = _mlp(2)
    convert_linear_to_int8(model, class_predicate=lambda path, m: path != "layers.4")
    kinds = [type(l).__name__ for l in model.layers]
    assert kinds == ["Int8Linear", "ReLU", "Int8Linear", "ReLU", "Linear"]
    with pytest.raises(TypeError, match="mlx.nn.Module"):
        convert_linear_to_int8([nn.Linear(2, 2)])


@pytest.mark.parametrize("backend", [BACKEND, "cpu"])
def test_selftest_checks(backend):
    checks = selftest_checks(backend)
    assert len(checks) == 6 and all(c.passed for c in checks), [c.line() for c in checks]


@pytest.mark.parametrize("backend", [BACKEND, "cpu"])
@pytest.mark.parametrize("kind", KINDS)
def test_scaled_mm_gradients_in_scales_and_bias(backend, kind):
    """mx.grad of a weighted sum of scaled_mm's output with respect to the scales
    and the bias, against numpy float64 sums of the exact integer part: within
    float32 accuracy on both backends (before: zeros on cpu, whose host round trip
    MLX differentiated as a constant, and MLX's "Not implemented for CustomKernel"
    on the kernel backends)."""
    m, n, k = 6, 5, 40
    for per_token, per_channel in ((True, True), (False, False)):
        kw, x, s_a, s_b, bias = make_case(7, m, n, k, kind, per_token_a=per_token,
                                          per_channel_b=per_channel, bias_on=kind != "scaled",
                                          negative=True)
        G = np.random.default_rng(8).standard_normal((m, n)).astype(np.float32)
        names = ["scale_a", "scale_b"] + (["bias"] if bias is not None else [])

        def loss(*floats):
            args = dict(kw, **dict(zip(names, floats)))
            return (scaled_mm(**args, backend=backend) * mx.array(G)).sum()

        got = mx.grad(loss, argnums=tuple(range(len(names))))(*(kw[v] for v in names))
        G64, X = G.astype(np.float64), x.astype(np.float64)
        sa64, sb64 = s_a.astype(np.float64).reshape(-1, 1), s_b.astype(np.float64).reshape(1, -1)
        want = [(G64 * X * sb64).sum(axis=1, keepdims=True),
                (G64 * X * sa64).sum(axis=0, keepdims=True)]
        want = [w if w.size == s.size else w.sum().reshape(s.shape)
                for w, s in zip(want, (s_a, s_b))]
        if bias is not None:
            want.append(G64.sum(axis=0))
        for name, g, w in zip(names, got, want):
            g = np.array(g).astype(np.float64)
            assert g.shape == w.shape, name
            assert np.abs(g - w).max() <= 1e-5 * np.abs(w).max() + 1e-30, (name, g, w)
