"""Q1.15 / Q1.31 conversions (mlx_precise.fixedpoint): Metal kernels through the
emulator and the cpu backend, bit for bit against independent references.

References: closed forms for the tie points, and otherwise ``tests/oracle.py``'s
``fixed_reference``, which works on float32 bit patterns in integer arithmetic only
(itself cross-checked against :mod:`fractions` below). Asserted, for each rounding
mode (half_even, half_away, truncate) and both formats:

* every float32 tie point of Q1.15 in [-1, 1] ((k + 1/2) / 2^15, 65536 values) and of
  Q1.31 (+-(j + 1/2) / 2^31 for all j < 2^23: all 2^24 of them) converts exactly;
* 2^24 structured bit patterns (both signs, all 256 exponents, the 7 top and 7 bottom
  mantissa bits in every combination with the 9 middle bits all 0 or all 1:
  zeros, subnormals, Inf, NaNs, mantissa extremes) give the exact codes and
  simulated values; one kernel launch per rounding mode and format;
* specials (+-0, subnormals, +-Inf, NaN, +-threshold, +-1, huge values) give the
  documented values, written out by hand;
* float16 and bfloat16 inputs (all 65536 bit patterns each), bf16/f16 storage,
  any shape, and clear errors for bad arguments.
"""

from fractions import Fraction

import mlx.core as mx
import numpy as np
import pytest
from oracle import Exact, fixed_reference, fixed_reference_modes, fixed_values, round_f32

import mlx_precise.fixedpoint.qformat as fp
from mlx_precise.fixedpoint import checks as fp_checks
from mlx_precise.core.backends import BackendUnavailableError

BACKENDS = ("emulate", "cpu")
MODES = fp.ROUNDING_MODES
T15 = np.float32(0.999)  # the reference's threshold as float32
CPU_STRIDE = 7  # 2^24-element sweeps: the cpu backend (float64 MLX ops) takes every 7th


# ---- helpers -------------------------------------------------------------------


def codes(bits, x, backend, threshold=None, rounding="half_even"):
    f = fp.float_to_q115 if bits == 15 else fp.float_to_q131
    t = threshold if threshold is not None else (fp.Q115_THRESHOLD if bits == 15 else 1.0)
    q = f(x if isinstance(x, mx.array) else mx.array(x), t, rounding, backend=backend)
    assert q.dtype == (mx.int16 if bits == 15 else mx.int32)
    return np.array(q).reshape(-1)


def simulated(bits, x, backend, threshold=None, rounding="half_even", storage=None):
    f = fp.simulate_q115 if bits == 15 else fp.simulate_q131
    t = threshold if threshold is not None else (fp.Q115_THRESHOLD if bits == 15 else 1.0)
    y = f(x if isinstance(x, mx.array) else mx.array(x), t, rounding, storage, backend=backend)
    return y if storage is not None else np.array(y).reshape(-1)


def assert_same_floats(got, want, what):
    """Bitwise equality of float32 arrays, NaN matching any NaN."""
    got = np.asarray(got, np.float32).reshape(-1)
    want = np.asarray(want, np.float32).reshape(-1)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    bad = np.flatnonzero(~same)
    assert bad.size == 0, (
        f"{what}: {bad.size} of {got.size} differ, e.g. index {bad[:3]}: "
        f"got {got[bad[:3]]}, want {want[bad[:3]]}")


def assert_same_codes(got, want, what):
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (
        f"{what}: {bad.size} of {got.size} codes differ, e.g. index {bad[:3]}: "
        f"got {got[bad[:3]]}, want {want[bad[:3]]}")


def tie_codes(k, rounding):
    """Closed form for the ties k + 1/2 (k: integer array)."""
    if rounding == "half_even":
        return np.where(k % 2 == 0, k, k + 1)
    if rounding == "half_away":
        return np.where(k >= 0, k + 1, k)
    return np.where(k >= 0, k, k + 1)


def structured_patterns() -> np.ndarray:
    """2^24 float32 bit patterns: sign x all 256 exponents x mantissa = 7 top bits
    (all) | 9 middle bits (all 0 or all 1) | 7 bottom bits (all)."""
    sign = np.arange(2, dtype=np.uint32) << 31
    exp = np.arange(256, dtype=np.uint32) << 23
    top = np.arange(128, dtype=np.uint32) << 16
    mid = np.array([0, 0x1FF], np.uint32) << 7
    low = np.arange(128, dtype=np.uint32)
    u = (sign[:, None, None, None, None] | exp[None, :, None, None, None]
         | top[None, None, :, None, None] | mid[None, None, None, :, None]
         | low[None, None, None, None, :])
    return u.reshape(-1).view(np.float32)


# ---- the oracle itself ----------------------------------------------------------


def fraction_code(x: float, t: float, rounding: str, bits: int) -> int:
    """Textbook reference with Fraction: clamp, scale, round, saturate; NaN -> 0."""
    if x != x:
        return 0
    tf = Fraction(float(np.float32(t)))
    v = tf if x == np.inf else -tf if x == -np.inf else Fraction(x)
    y = min(max(v, -tf), tf) * 2**bits
    lo = y.numerator // y.denominator  # floor
    d = y - lo
    if rounding == "truncate":
        q = lo if y >= 0 or d == 0 else lo + 1
    elif d != Fraction(1, 2):
        q = lo + (1 if d > Fraction(1, 2) else 0)
    elif rounding == "half_even":
        q = lo if lo % 2 == 0 else lo + 1
    else:
        q = lo + 1 if y > 0 else lo
    return min(max(q, -(2**bits)), 2**bits - 1)


def test_oracle_matches_fractions():
    rng = np.random.default_rng(1)
    x = np.concatenate([
        rng.integers(0, 2**32, 1500, dtype=np.uint64).astype(np.uint32).view(np.float32),
        ((rng.integers(-(2**15), 2**15, 300) + 0.5) / 2**15).astype(np.float32),
        ((rng.integers(-(2**23), 2**23, 300) * 2 + 1) / 2.0**32).astype(np.float32),
        rng.uniform(-1.2, 1.2, 300).astype(np.float32),
        np.float32([0, -0.0, 1, -1, np.inf, -np.inf, np.nan, T15, -T15, 2.0**-149, 3e38]),
    ])
    checked = 0
    for bits in (15, 31):
        for t in (0.999, 1.0, 0.3, 2.0**-20):
            for rounding in MODES:
                q, v = fixed_reference(x, bits, t, rounding)
                want = np.array([fraction_code(float(a), t, rounding, bits) for a in x])
                assert_same_codes(q, want, f"oracle Q1.{bits} t={t} {rounding}")
                checked += x.size
    # fixed_values against the shared rounding oracle (round_f32 of exact values).
    qs = np.concatenate([rng.integers(-(2**31), 2**31, 3000), [2**31 - 1, -(2**31), 0, 1, -1,
                         2**24 + 1, 2**24 + 3, 2**25 + 2, -(2**24 + 1)]])
    want = round_f32(Exact(qs.astype(object), 31))
    assert_same_floats(fixed_values(qs, 31), want, "fixed_values vs round_f32")
    assert checked > 50000


# ---- tie points -------------------------------------------------------------------


@pytest.mark.parametrize("rounding", MODES)
def test_q115_every_tie_point(rounding):
    k = np.arange(-(2**15), 2**15, dtype=np.int64)
    x = ((k + 0.5) / 2**15).astype(np.float32)
    assert np.all((x.astype(np.float64) * 2**15 - k) == 0.5)  # all exact float32 ties
    want_t1 = np.minimum(tie_codes(k, rounding), 2**15 - 1)  # threshold 1: no clamp
    # Default threshold: ties above 0.999 clamp to the code of 0.999f (32735.23 ->
    # 32735 in every mode: not a tie).
    want_def = np.where(np.abs(x) > T15, np.sign(k + 0.5).astype(np.int64) * 32735,
                        tie_codes(k, rounding))
    for backend in BACKENDS:
        for t, want in ((1.0, want_t1), (0.999, want_def)):
            what = f"Q1.15 ties {rounding} t={t} [{backend}]"
            assert_same_codes(codes(15, x, backend, t, rounding), want, what)
            assert_same_floats(simulated(15, x, backend, t, rounding),
                               (want / 2**15).astype(np.float32), what)


@pytest.fixture(scope="module")
def q131_ties():
    """All 2^24 float32 Q1.31 tie points (k + 1/2) / 2^31, k in [-2^23, 2^23)."""
    j = np.arange(2**23, dtype=np.int32)
    k = np.concatenate([j, -j - 1])
    # Odd integers below 2^24 are float32s, and scaling by 2^-32 is exact.
    x = (2 * k + 1).astype(np.float32) * np.float32(2.0**-32)
    sample = slice(None, None, 997)
    assert x.size == 2**24 and np.all(
        x[sample].astype(np.float64) * 2**31 - k[sample] == 0.5)
    return mx.array(x), x, k


@pytest.mark.parametrize("rounding", MODES)
def test_q131_every_tie_point(q131_ties, rounding):
    xa, x, k = q131_ties
    want = tie_codes(k, rounding)
    for backend, sel in (("emulate", slice(None)), ("cpu", slice(None, None, CPU_STRIDE))):
        what = f"Q1.31 ties {rounding} [{backend}]"
        x_in = xa if backend == "emulate" else x[sel]
        assert_same_codes(codes(31, x_in, backend, 1.0, rounding), want[sel], what)
        # |code| <= 2^23: the value code / 2^31 is an exact float32.
        assert_same_floats(simulated(31, x_in, backend, 1.0, rounding),
                           want[sel].astype(np.float32) * np.float32(2.0**-31), what)


# ---- 2^24 structured bit patterns ------------------------------------------------------

@pytest.fixture(scope="module")
def sweep():
    """The patterns and, per format, the references for all three modes (computed
    once, on first use)."""
    x = structured_patterns()
    xa = mx.array(x)
    refs = {}

    def get(bits):
        if bits not in refs:
            refs.clear()  # one format at a time: 384 MB of references
            t = fp.Q115_THRESHOLD if bits == 15 else fp.Q131_THRESHOLD
            refs[bits] = fixed_reference_modes(x, bits, t)
        return refs[bits]

    return xa, x, get


@pytest.mark.parametrize("rounding", MODES)
@pytest.mark.parametrize("bits", (15, 31))
def test_structured_bit_patterns(sweep, bits, rounding):
    """One emulated kernel launch per function, rounding mode and format."""
    xa, x, get = sweep
    assert x.size == 2**24
    want_q, want_v = get(bits)[rounding]
    t = fp.Q115_THRESHOLD if bits == 15 else fp.Q131_THRESHOLD
    for backend, sel in (("emulate", slice(None)), ("cpu", slice(None, None, CPU_STRIDE))):
        what = f"Q1.{bits} {rounding} structured [{backend}]"
        x_in = xa if backend == "emulate" else x[sel]
        assert_same_codes(codes(bits, x_in, backend, t, rounding), want_q[sel], what)
        assert_same_floats(simulated(bits, x_in, backend, t, rounding), want_v[sel], what)


# ---- specials, by hand ----------------------------------------------------------------

SPECIALS = np.float32([
    0.0, -0.0, 2.0**-149, -(2.0**-149), 2.0**-126 - 2.0**-149,  # zeros, subnormals
    np.inf, -np.inf, np.nan, -np.nan,
    T15, -T15, np.nextafter(T15, np.float32(2)), 1.0, -1.0,
    np.finfo(np.float32).max, -np.finfo(np.float32).max, 2.0**-16, -(2.0**-16),
    2.0**-32, -(2.0**-32), 3 * 2.0**-32,
])
NAN = np.nan
# (format, threshold, rounding) -> expected codes of SPECIALS; simulated values are
# code / 2^bits in float32 except NaN -> NaN.
_C99 = 32735  # 0.999f * 2^15 = 32735.232...
_CASES = {
    (15, 0.999, "half_even"): [0, 0, 0, 0, 0, _C99, -_C99, 0, 0, _C99, -_C99, _C99, _C99, -_C99,
                               _C99, -_C99, 0, 0, 0, 0, 0],
    (15, 1.0, "half_even"): [0, 0, 0, 0, 0, 32767, -32768, 0, 0, _C99, -_C99, _C99, 32767,
                             -32768, 32767, -32768, 0, 0, 0, 0, 0],
    (15, 1.0, "half_away"): [0, 0, 0, 0, 0, 32767, -32768, 0, 0, _C99, -_C99, _C99, 32767,
                             -32768, 32767, -32768, 1, -1, 0, 0, 0],
    (15, 1.0, "truncate"): [0, 0, 0, 0, 0, 32767, -32768, 0, 0, _C99, -_C99, _C99, 32767,
                            -32768, 32767, -32768, 0, 0, 0, 0, 0],
    (31, 1.0, "half_even"): [0, 0, 0, 0, 0, 2**31 - 1, -(2**31), 0, 0, 2145336192, -2145336192,
                             2145336320, 2**31 - 1, -(2**31), 2**31 - 1, -(2**31), 2**15,
                             -(2**15), 0, 0, 2],
    (31, 1.0, "half_away"): [0, 0, 0, 0, 0, 2**31 - 1, -(2**31), 0, 0, 2145336192, -2145336192,
                             2145336320, 2**31 - 1, -(2**31), 2**31 - 1, -(2**31), 2**15,
                             -(2**15), 1, -1, 2],
    (31, 1.0, "truncate"): [0, 0, 0, 0, 0, 2**31 - 1, -(2**31), 0, 0, 2145336192, -2145336192,
                            2145336320, 2**31 - 1, -(2**31), 2**31 - 1, -(2**31), 2**15,
                            -(2**15), 0, 0, 1],
    (31, 0.999, "half_even"): [0, 0, 0, 0, 0, 2145336192, -2145336192, 0, 0, 2145336192,
                               -2145336192, 2145336192, 2145336192, -2145336192, 2145336192,
                               -2145336192, 2**15, -(2**15), 0, 0, 2],
}


@pytest.mark.parametrize("case", sorted(_CASES), ids=lambda c: f"Q1.{c[0]}-t{c[1]}-{c[2]}")
def test_specials(case):
    bits, t, rounding = case
    want = np.array(_CASES[case], np.int64)
    assert np.float32(0.999) * np.float64(2**31) == 2145336192.0  # 0.999f on the Q1.31 grid
    # The hand table agrees with the oracle too.
    assert_same_codes(fixed_reference(SPECIALS, bits, t, rounding)[0], want, "oracle")
    want_v = np.array([int(q) / 2**bits for q in want]).astype(np.float32)
    want_v[np.isnan(SPECIALS)] = NAN
    for backend in BACKENDS:
        what = f"specials Q1.{bits} t={t} {rounding} [{backend}]"
        assert_same_codes(codes(bits, SPECIALS, backend, t, rounding), want, what)
        got_v = simulated(bits, SPECIALS, backend, t, rounding)
        assert_same_floats(got_v, want_v, what)
        # Zero codes read back as +0, also from -0 and negative tiny inputs.
        assert not np.any(np.signbit(got_v[want == 0]) & ~np.isnan(got_v[want == 0]))
    # Q1.31: the largest code reads as 1.0 (2^31 - 1 rounds up in float32).
    if bits == 31 and t == 1.0:
        assert simulated(31, SPECIALS, "emulate")[12] == 1.0


def test_random_thresholds():
    """Thresholds other than the defaults, on random bit patterns and values near them."""
    rng = np.random.default_rng(3)
    for t in (0.5, 0.75, 1e-3, 0.999999, 2.0**-15 * 0.75):
        tf = np.float32(t)
        x = np.concatenate([
            rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32),
            rng.uniform(-2 * t, 2 * t, 20000).astype(np.float32),
            np.float32([tf, -tf, np.nextafter(tf, np.float32(2)), np.nextafter(tf, np.float32(0))]),
        ])
        for bits in (15, 31):
            for rounding in MODES:
                want_q, want_v = fixed_reference(x, bits, t, rounding)
                for backend in BACKENDS:
                    what = f"Q1.{bits} t={t} {rounding} [{backend}]"
                    assert_same_codes(codes(bits, x, backend, t, rounding), want_q, what)
                    assert_same_floats(simulated(bits, x, backend, t, rounding), want_v, what)


# ---- other input dtypes, storage, codes -> float ------------------------------------


@pytest.mark.parametrize("dtype", (mx.float16, mx.bfloat16))
def test_half_precision_inputs(dtype):
    """All 65536 bit patterns of float16 / bfloat16 (widened exactly to float32 for
    the reference)."""
    u16 = np.arange(2**16, dtype=np.uint32)
    if dtype == mx.float16:
        x32 = u16.astype(np.uint16).view(np.float16).astype(np.float32)
    else:
        x32 = (u16 << 16).view(np.float32)
    x = mx.array(u16.astype(np.uint16)).view(dtype)
    for backend in BACKENDS:
        for rounding in MODES:
            want_q, want_v = fixed_reference(x32, 15, 0.999, rounding)
            got_q = np.array(fp.float_to_q115(x, rounding=rounding, backend=backend))
            assert got_q.dtype == np.int16
            assert_same_codes(got_q, want_q, f"{dtype} Q1.15 [{backend}]")
            got_v = fp.simulate_q115(x, rounding=rounding, backend=backend)
            assert got_v.dtype == mx.float32
            assert_same_floats(np.array(got_v), want_v, f"{dtype} Q1.15 sim [{backend}]")
            want_q, want_v = fixed_reference(x32, 31, 1.0, rounding)
            got_v = np.array(fp.simulate_q131(x, rounding=rounding, backend=backend))
            assert_same_floats(got_v, want_v, f"{dtype} Q1.31 sim [{backend}]")


@pytest.mark.parametrize("storage", (mx.bfloat16, mx.float16))
def test_storage_dtype(storage):
    """The simulated float32 value rounded once more to the storage type; the
    reference rounding is MLX's own CPU conversion of the exact simulated value."""
    rng = np.random.default_rng(4)
    x = np.concatenate([rng.uniform(-1.1, 1.1, 30000), rng.standard_normal(30000) * 1e-3,
                        ((np.arange(-(2**15), 2**15) + 0.5) / 2**15),
                        [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0]]).astype(np.float32)
    for bits in (15, 31):
        t = fp.Q115_THRESHOLD if bits == 15 else 1.0
        _, want_v = fixed_reference(x, bits, t, "half_even")
        with mx.stream(mx.cpu):
            want = np.array(mx.array(want_v).astype(storage).astype(mx.float32))
        for backend in BACKENDS:
            y = simulated(bits, x, backend, t, "half_even", storage)
            assert y.dtype == storage and y.shape == (x.size,)
            assert_same_floats(np.array(y.astype(mx.float32)), want,
                               f"Q1.{bits} storage {storage} [{backend}]")
    if storage == mx.bfloat16:  # bf16 storage can leave the threshold: 32735/2^15 -> 1.0
        y = fp.simulate_q115(mx.array(np.float32([0.9995])), storage_dtype=storage, backend="cpu")
        assert y.item() == 1.0


def test_codes_to_float():
    """q115_to_float on every int16 code; q131_to_float on extremes, all powers of two
    and their neighbours, and random codes; round trips through the conversions."""
    q16 = np.arange(-(2**15), 2**15, dtype=np.int64)
    p = 2 ** np.arange(31, dtype=np.int64)
    rng = np.random.default_rng(5)
    q32 = np.unique(np.concatenate([p, p - 1, p + 1, -p, -p - 1, -p + 1, [-(2**31), 0],
                                    rng.integers(-(2**31), 2**31, 200000)]))
    q32 = q32[(q32 >= -(2**31)) & (q32 < 2**31)]
    for backend in BACKENDS:
        v16 = fp.q115_to_float(mx.array(q16.astype(np.int16)), backend=backend)
        assert v16.dtype == mx.float32
        assert_same_floats(np.array(v16), q16 / 2.0**15, f"q115_to_float [{backend}]")
        back = codes(15, np.array(v16), backend, 1.0)
        assert_same_codes(back, q16, f"Q1.15 round trip [{backend}]")
        v32 = fp.q131_to_float(mx.array(q32.astype(np.int32)), backend=backend)
        assert_same_floats(np.array(v32), fixed_values(q32, 31), f"q131_to_float [{backend}]")
        small = q32[np.abs(q32) < 2**24]  # exact, so they round-trip
        back = codes(31, np.array(v32)[np.abs(q32) < 2**24], backend, 1.0)
        assert_same_codes(back, small, f"Q1.31 round trip [{backend}]")


# ---- shapes -------------------------------------------------------------------------


def test_shapes():
    rng = np.random.default_rng(6)
    base = rng.uniform(-1.5, 1.5, (4, 6, 5)).astype(np.float32)
    for backend in BACKENDS:
        x = mx.array(base)
        for f, dtype in ((fp.float_to_q115, mx.int16), (fp.simulate_q115, mx.float32),
                         (fp.float_to_q131, mx.int32), (fp.simulate_q131, mx.float32)):
            flat = np.array(f(x.reshape(-1), backend=backend))
            y = f(x, backend=backend)
            assert y.shape == (4, 6, 5) and y.dtype == dtype
            assert np.array_equal(np.array(y).reshape(-1), flat)
            # A transposed (non-contiguous) view gives the transposed result.
            yt = f(x.transpose(2, 0, 1), backend=backend)
            assert np.array_equal(np.array(yt), np.array(y).transpose(2, 0, 1))
            e = f(mx.zeros((0, 3)), backend=backend)
            assert e.shape == (0, 3) and e.dtype == dtype
        # 0-d (a kernel input of < 8 elements is a `constant` buffer in MLX).
        s = fp.simulate_q115(mx.array(0.25 + 2.0**-17), backend=backend)
        assert s.shape == () and s.item() == 0.25
        assert fp.q115_to_float(mx.zeros((2, 0), mx.int16), backend=backend).shape == (2, 0)


# ---- bad input ----------------------------------------------------------------------


def test_bad_input():
    x = mx.array([0.5, -0.25])
    with pytest.raises(TypeError, match="x must have dtype float32, float16 or bfloat16, got .*int32"):
        fp.float_to_q115(mx.array([1, 2]))
    with pytest.raises(TypeError, match="float_to_q131: x has dtype mlx float64, which this op would have to round"):
        fp.float_to_q131(mx.array([1.0], mx.float64), backend="cpu")
    # array-likes are accepted as MLX accepts them; other objects are refused
    assert fp.simulate_q115([0.5]).tolist() == fp.simulate_q115(mx.array([0.5])).tolist()
    with pytest.raises(TypeError, match="x must be an mx.array or array-like .*got str"):
        fp.simulate_q115("0.5")
    for t in (0, -0.5, 1.5, float("nan"), float("inf"), 1e-50):
        with pytest.raises(ValueError, match=r"threshold must lie in \(0, 1\]"):
            fp.float_to_q115(x, threshold=t)
    for t in ("0.9", True, None):
        with pytest.raises(TypeError, match="threshold must be a real number"):
            fp.simulate_q131(x, threshold=t)
    with pytest.raises(ValueError, match="rounding must be one of 'half_even', 'half_away', "
                                         "'truncate', got 'nearest'"):
        fp.float_to_q115(x, rounding="nearest")
    with pytest.raises(ValueError, match="storage_dtype must be None, mx.float32"):
        fp.simulate_q115(x, storage_dtype=mx.int8)
    with pytest.raises(TypeError, match=r"q115_to_float: q must have dtype .*int16.*got .*int32"):
        fp.q115_to_float(mx.array([1, 2], mx.int32))
    with pytest.raises(TypeError, match=r"q131_to_float: q must have dtype .*int32.*got .*float32"):
        fp.q131_to_float(x)
    with pytest.raises(ValueError, match="unknown backend 'gpu'"):
        fp.simulate_q115(x, backend="gpu")
    with pytest.raises(BackendUnavailableError):
        fp.simulate_q115(x, backend="metal")


def test_selftest_checks():
    for backend in BACKENDS:
        checks = fp_checks.selftest_checks(backend)
        assert len(checks) == 8
        failed = [c.line() for c in checks if not c.passed]
        assert not failed, failed


@pytest.mark.parametrize("bits", [15, 31])
def test_simulation_gradient_is_the_same_on_every_backend(bits):
    """mx.grad through simulate_q1xx: zero, the derivative of a rounding (what MLX
    gives the cpu path's ops), on the kernel backends too (before: MLX's
    "[Primitive::vjp] Not implemented for CustomKernel" there)."""
    f = fp.simulate_q115 if bits == 15 else fp.simulate_q131
    x = mx.array(np.float32([0.3, -0.7, 1e-6, 2.0]))
    for backend in BACKENDS:
        def loss(v):
            return (f(v * 0.5, backend=backend) * mx.arange(4)).sum()

        g = mx.grad(loss)(x)
        assert np.array(g).tolist() == [0.0, 0.0, 0.0, 0.0], backend
