"""Double-word FFTs (fft, ifft, rfft, irfft) against a long double / mpmath oracle,
on the emulate (Metal kernels) and cpu (native float64) backends."""

import importlib

import mlx.core as mx
import numpy as np
import pytest
from oracle import (
    LONGDOUBLE_FFT,
    exact_value,
    fft_reference,
    fraction_exactly_rounded,
    normwise_error,
)

import mlx_precise
from mlx_precise import DoubleWord, extended_precision

# The module itself, even if the package exports a function named fft.
mpfft = importlib.import_module("mlx_precise.fft")
fftengine = importlib.import_module("mlx_precise.fft.engine")
fftchecks = importlib.import_module("mlx_precise.fft.checks")
fft_extended, ifft_extended = mpfft.fft_extended, mpfft.ifft_extended
rfft_extended, irfft_extended = mpfft.rfft_extended, mpfft.irfft_extended

BACKENDS = ("emulate", "cpu")
EXTENDED = {"fft": fft_extended, "ifft": ifft_extended, "rfft": rfft_extended,
            "irfft": irfft_extended}
PLAIN = {"fft": mx.fft.fft, "ifft": mx.fft.ifft, "rfft": mx.fft.rfft, "irfft": mx.fft.irfft}
BOUND = 1e-13  # normwise, unrounded DoubleWord results (the bound docs/fft.md states)


def signal(shape, kind, seed):
    """complex64 for fft/ifft/irfft, float32 for rfft: N(0,1) parts."""
    rng = np.random.default_rng(seed)
    if kind == "rfft":
        return rng.standard_normal(shape).astype(np.float32)
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)


def reference(x, kind, n=None, axis=-1):
    ref = fft_reference(x, kind, n=n, axis=axis)
    if ref is None:
        pytest.skip("no 64-bit long double here and the mpmath DFT would be too slow")
    return ref


def words(d: DoubleWord):
    return np.array(d.hi), np.array(d.lo)


def test_oracle_agrees_with_mpmath():
    """The long double FFT oracle against an independent O(n^2) mpmath DFT."""
    if not LONGDOUBLE_FFT:
        pytest.skip("the long double oracle is not used here")
    import oracle

    x = signal((2, 24), "fft", 0)
    for kind, n in (("fft", 24), ("ifft", 17), ("rfft", 24), ("irfft", 30)):
        data = x.real.copy() if kind == "rfft" else x
        ld = fft_reference(data, kind, n=n)
        oracle.LONGDOUBLE_FFT = False
        try:
            mp = fft_reference(data, kind, n=n)
        finally:
            oracle.LONGDOUBLE_FFT = True
        assert normwise_error(mp, ld) < 1e-16, kind  # mpmath values pass through float64


SIZES = [2, 4, 32, 512, 2048, 2**16]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["fft", "ifft", "rfft", "irfft"])
def test_powers_of_two(backend, kind):
    """Normwise error <= 1e-13 of the unrounded result up to 2^16 (batch 2 below
    2^16), the rounded output against the exactly rounded reference, and plain
    float32 mx.fft on the same data for contrast.

    Outputs at multiples of n/4 are exact sums of the float32 inputs and can sit
    exactly on a float32 rounding midpoint, where no inexact method rounds
    reliably; at small n they are a large share of the outputs, so the
    exactly-rounded fraction is asserted from n = 512 on."""
    for n in SIZES:
        batch = 1 if n == 2**16 else 2
        m = n // 2 + 1 if kind == "irfft" else n
        x = signal((batch, m), kind, seed=n)
        ref = reference(x, kind, n=n)
        d = EXTENDED[kind](mx.array(x), n=n, round_output=False, backend=backend)
        assert isinstance(d, DoubleWord) and d.shape == ref.shape
        err = normwise_error(words(d), ref)
        y = np.array(EXTENDED[kind](mx.array(x), n=n, backend=backend))
        assert y.dtype == (np.float32 if kind == "irfft" else np.complex64)
        exact = fraction_exactly_rounded(y, ref)
        plain = np.array(PLAIN[kind](mx.array(x), n=n))
        print(f"{backend} {kind} n={n}: normwise {err:.2e}, exactly rounded "
              f"{100 * exact:.4f}% | plain mx.fft normwise {normwise_error(plain, ref):.2e}, "
              f"exactly rounded {100 * fraction_exactly_rounded(plain, ref):.1f}%")
        assert err <= BOUND, (kind, n)
        if n >= 512:  # enough generic outputs for the statistic (small n: printed)
            assert exact >= 0.9999, (kind, n)
            assert normwise_error(plain, ref) > 1000 * err  # the contrast is real


@pytest.mark.parametrize("backend", BACKENDS)
def test_other_sizes_bluestein(backend):
    """Sizes that are not powers of two (Bluestein on the kernels), every kind."""
    for n in (3, 5, 6, 12, 100, 1000, 3 * 2**10):
        for kind in EXTENDED:
            m = n // 2 + 1 if kind == "irfft" else n
            x = signal((2, m), kind, seed=n + len(kind))
            ref = reference(x, kind, n=n)
            d = EXTENDED[kind](mx.array(x), n=n, round_output=False, backend=backend)
            err = normwise_error(words(d), ref)
            exact = fraction_exactly_rounded(
                np.array(EXTENDED[kind](mx.array(x), n=n, backend=backend)), ref)
            print(f"{backend} {kind} n={n}: normwise {err:.2e}, exactly rounded {100 * exact:.3f}%")
            assert err <= BOUND, (kind, n)
            if n >= 100:
                assert exact >= 0.99, (kind, n)


@pytest.mark.parametrize("backend", BACKENDS)
def test_axes_padding_truncation_and_input_types(backend):
    """Any axis (negative too), batches over the other axes, n padding and
    truncation, DoubleWord inputs carrying low words, float32 into fft."""
    rng = np.random.default_rng(7)
    x64 = rng.standard_normal((3, 16, 5)) + 1j * rng.standard_normal((3, 16, 5))
    xd = DoubleWord.from_float64(x64)  # lo words are nonzero
    r64 = rng.standard_normal((4, 3, 24))
    rd = DoubleWord.from_float64(r64)
    xf = rng.standard_normal((6, 20)).astype(np.float32)
    cases = [
        ("fft", xd, (xd.hi, xd.lo), dict(axis=1)),
        ("fft", xd, (xd.hi, xd.lo), dict(axis=-3, n=8)),  # pad 3 -> 8
        ("ifft", xd, (xd.hi, xd.lo), dict(axis=1, n=10)),  # truncate 16 -> 10 (Bluestein)
        ("ifft", xd, (xd.hi, xd.lo), dict(axis=0)),  # n = 3
        ("rfft", rd, (rd.hi, rd.lo), dict(axis=2, n=32)),
        ("rfft", rd, (rd.hi, rd.lo), dict(axis=0, n=5)),
        ("irfft", xd, (xd.hi, xd.lo), dict(axis=1)),  # default n = 30
        ("irfft", xd, (xd.hi, xd.lo), dict(axis=-1, n=16)),  # pad 5 -> 9 points
        ("irfft", xd, (xd.hi, xd.lo), dict(axis=1, n=7)),  # truncate to 4 points, odd n
        ("fft", mx.array(xf), xf, dict(axis=0)),
        ("fft", mx.array(xf), xf, dict(n=64)),
        ("irfft", mx.array(xf), xf, dict(n=38)),  # real input to irfft
    ]
    for kind, x, exact_in, kw in cases:
        ref = reference(tuple(np.array(a) for a in exact_in)
                        if isinstance(exact_in, tuple) else exact_in, kind, **kw)
        d = EXTENDED[kind](x, round_output=False, backend=backend, **kw)
        assert d.shape == ref.shape, (kind, kw)
        err = normwise_error(words(d), ref)
        assert err <= BOUND, (kind, kw, err)
        y = EXTENDED[kind](x, backend=backend, **kw)
        # Small transforms: many outputs are exact sums of inputs, which can tie.
        assert y.shape == ref.shape and fraction_exactly_rounded(np.array(y), ref) >= 0.9


@pytest.mark.parametrize("backend", BACKENDS)
def test_exact_cases(backend):
    """Impulses, constants, zeros and n = 1 have exact transforms; a power-of-two
    scaling of the input scales every double-word operation exactly."""
    n = 64
    imp = np.zeros(n, np.complex64)
    imp[0] = 3 - 2j
    assert (np.array(fft_extended(mx.array(imp), backend=backend)) == imp[0]).all()
    const = np.full(n, 1.5, np.float32)
    y = np.array(rfft_extended(mx.array(const), backend=backend))
    assert y[0] == 1.5 * n and (y[1:] == 0).all()
    z = np.array(ifft_extended(mx.array(np.zeros((2, 12), np.complex64)), backend=backend))
    assert (z == 0).all()
    one = mx.array(np.complex64([[2 - 1j], [4j]]))
    assert np.array(fft_extended(one, backend=backend)).tolist() == [[2 - 1j], [4j]]
    assert np.array(irfft_extended(one, n=1, backend=backend)).tolist() == [[2.0], [0.0]]
    # Shifted impulse: X_k = w^(3k), exactly rounded, except that components
    # whose exact value is 0 come out within the normwise error of 0.
    imp = np.zeros(n, np.complex64)
    imp[3] = 1
    ref = np.exp(-2j * np.pi * 3 * np.arange(n, dtype=np.longdouble) / n)
    y = np.array(fft_extended(mx.array(imp), backend=backend))
    zero = (np.arange(n) * 3 * 4) % n == 0  # quarter turns: a component is 0
    assert fraction_exactly_rounded(y[~zero], ref[~zero]) == 1
    assert np.abs(y[zero] - np.round(ref[zero].astype(np.complex128))).max() < 1e-15
    if backend == "emulate":
        x = signal((4, 256), "fft", 3)
        a = words(fft_extended(mx.array(x), round_output=False, backend=backend))
        b = words(fft_extended(mx.array(x * np.float32(2.0**-40)), round_output=False,
                               backend=backend))
        assert all((u * np.float32(2.0**-40) == v).all() for u, v in zip(a, b))
        # The documented range: full accuracy for data from 2^-75 to 2^100 (low
        # words flush to zero below 2^-126: smaller data lose double-word accuracy).
        for scale in (2.0**-75, 2.0**100):
            xs = (x * np.float32(scale)).astype(np.complex64)
            d = fft_extended(mx.array(xs), round_output=False, backend=backend)
            assert normwise_error(words(d), reference(xs, "fft")) <= BOUND, scale


@pytest.mark.parametrize("backend", BACKENDS)
def test_adversarial_data(backend):
    """Wide dynamic range (1e-20 ... 1e20 in one transform), heavy cancellation
    (a float32 pure tone: all outputs but two are ~1e-8 of the peak, what is left
    of sums of n terms of size 1), and a Hermitian-inconsistent irfft input: the
    normwise bound still holds."""
    rng = np.random.default_rng(11)
    n = 4096
    wide = (rng.standard_normal(n) * 10.0 ** rng.uniform(-20, 20, n)).astype(np.float32)
    t = np.arange(n)
    tone = np.cos(2 * np.pi * 37 * t / n).astype(np.float32)
    bad = signal(33, "irfft", 12)  # imaginary parts at 0 and Nyquist are ignored
    for kind, x in (("rfft", wide), ("fft", wide.astype(np.complex64)), ("rfft", tone),
                    ("irfft", bad)):
        ref = reference(x, kind)
        err = normwise_error(words(EXTENDED[kind](mx.array(x), round_output=False,
                                                  backend=backend)), ref)
        print(f"{backend} {kind} adversarial: normwise {err:.2e}")
        assert err <= BOUND


def test_multi_pass_plans_and_any_threadgroup_size(monkeypatch):
    """Radix caps that force 3 and 4 passes (odd and even radices), and
    threadgroups smaller than a pass's butterflies (the kernel loops)."""
    x = signal((3, 256), "fft", 5)
    ref = reference(x, "fft")
    for log_tg, threads in ((2, 256), (3, 256), (10, 7), (10, 1)):
        monkeypatch.setattr(fftengine, "_LOG_TG", log_tg)
        monkeypatch.setattr(fftengine, "_THREADS", threads)
        d = fft_extended(mx.array(x), round_output=False, backend="emulate")
        assert normwise_error(words(d), ref) <= BOUND, (log_tg, threads)
    assert fftengine._plan(20) == [10, 10] and fftengine._plan(21) == [7, 7, 7]


def test_two_to_the_20_on_cpu():
    """2^20 on the cpu path; the kernels' 2^20 runs in benchmarks/bench_fft.py."""
    n = 2**20
    x = signal((1, n), "fft", 20)
    ref = reference(x, "fft")
    y = fft_extended(mx.array(x), round_output=False, backend="cpu")
    assert normwise_error(words(y), ref) <= BOUND


def test_bad_input():
    c = mx.array(np.ones((2, 8), np.complex64))
    # float64 data enters as a DoubleWord (docs/api.md, "Inputs"); rfft of complex
    # float64 data is refused
    assert fft_extended(mx.ones(8, mx.float64), backend="cpu").dtype == mx.complex64
    with pytest.raises(TypeError, match="a has dtype numpy complex128, expected float32"):
        rfft_extended(np.ones(8, np.complex128), backend="cpu")
    with pytest.raises(TypeError, match="a has dtype mlx.core.int32"):
        fft_extended(mx.ones(8, mx.int32), backend="emulate")
    with pytest.raises(TypeError, match="a has dtype mlx.core.complex64, expected float32"):
        rfft_extended(c, backend="emulate")
    with pytest.raises(TypeError, match=r"a has dtype mlx.core.complex64 \(a DoubleWord\), "
                                        "expected float32"):
        rfft_extended(DoubleWord.from_complex64(c), backend="cpu")
    with pytest.raises(TypeError, match="a must be an mx.array or array-like"):
        fft_extended("1, 2", backend="cpu")
    assert fft_extended([1.0, 2.0], backend="cpu").tolist() == [3 + 0j, -1 + 0j]
    with pytest.raises(ValueError, match="axis 2 is out of range for a with 2"):
        fft_extended(c, axis=2, backend="emulate")
    with pytest.raises(ValueError, match="axis -3 is out of range"):
        ifft_extended(c, axis=-3, backend="cpu")
    with pytest.raises(TypeError, match="axis must be an int"):
        fft_extended(c, axis=1.0, backend="cpu")
    for bad in (0, -4, 2.0, True):
        with pytest.raises(ValueError, match="n must be an integer >= 1"):
            fft_extended(c, n=bad, backend="emulate")
    with pytest.raises(ValueError, match="default n = 0"):
        irfft_extended(mx.array(np.ones(1, np.complex64)), backend="emulate")
    with pytest.raises(ValueError, match="at least one dimension"):
        fft_extended(mx.array(np.complex64(1)), backend="cpu")
    with pytest.raises(ValueError, match="2\\^30 points"):
        fft_extended(mx.zeros((2**11, 2**20), mx.complex64), backend="emulate")


def test_empty_batch():
    x = mx.zeros((0, 8), mx.complex64)
    assert fft_extended(x, backend="emulate").shape == (0, 8)
    assert irfft_extended(x, backend="emulate").shape == (0, 14)


def test_precision_aware_twins_follow_the_context():
    x = signal((2, 64), "fft", 9)
    xr = np.ascontiguousarray(x.real)
    for kind, data in (("fft", x), ("ifft", x), ("rfft", xr), ("irfft", x)):
        twin = getattr(mpfft, kind)
        plain = np.array(twin(mx.array(data), n=48, axis=-1))
        assert (plain == np.array(PLAIN[kind](mx.array(data), n=48))).all()
        with mlx_precise.use_backend("emulate"), extended_precision():
            ext = np.array(twin(mx.array(data), n=48))
        assert (ext == np.array(EXTENDED[kind](mx.array(data), n=48, backend="emulate"))).all()
        assert normwise_error(ext, reference(data, kind, n=48)) < 1e-7
    assert set(mpfft.__dict__) >= {"fft", "ifft", "rfft", "irfft"}
    assert {"fft", "ifft", "rfft", "irfft"} <= set(mlx_precise.precision_aware_functions())


@pytest.mark.parametrize("backend", BACKENDS)
def test_selftest_checks(backend):
    checks = fftchecks.selftest_checks(backend)
    for c in checks:
        print(c.line())
    assert checks and all(c.passed for c in checks)


def test_exact_value_of_doublewords():
    """The oracle takes the exact hi + lo of double-words (64-bit long double)."""
    if not LONGDOUBLE_FFT:
        pytest.skip("needs a 64-bit long double")
    hi = np.float32([1.0, -3.0])
    lo = np.float32([2.0**-40, 2.0**-30])
    v = exact_value((hi, lo))
    assert v[0] - 1 == np.longdouble(2.0) ** -40 and v[1] + 3 == np.longdouble(2.0) ** -30


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_finite_inputs_stay_in_their_row(backend):
    """A NaN or Inf poisons its own transform (as in numpy) and nothing else."""
    x = signal((3, 64), "fft", 13)
    x[0, 5] = np.nan
    x[2, 9] = np.inf
    y = np.array(fft_extended(mx.array(x), backend=backend))
    assert np.isnan(y[0]).all() and not np.isfinite(y[2]).all()
    ref = reference(x[1:2], "fft")
    assert normwise_error(y[1:2], ref) < 1e-7 and fraction_exactly_rounded(y[1:2], ref) > 0.99


def test_params_layouts_are_generated_into_fft_h():
    """The params buffers of fft_pass / fft_real: one definition by name in
    engine.py, generated into fft.h (checked here), packed by name, read by name."""
    from mlx_precise.core.kernels import METAL_DIR
    from mlx_precise.fft import engine

    assert engine.codes_source() in (METAL_DIR / "include" / "fft.h").read_text()
    for layout, body in ((engine.FFT_PASS_PARAMS, "fft_pass.metal"),
                         (engine.FFT_REAL_PARAMS, "fft_real.metal")):
        src = (METAL_DIR / "kernels" / body).read_text()
        assert "params[" in src and not __import__("re").search(r"params\[\d", src)
        for name in layout.names:
            assert f"params[{layout.metal_name(name)}]" in src
    p = engine.FFT_REAL_PARAMS.pack(n_half=4, rows=3, pre=True, lo_in=False, lo_out=True,
                                    lo_at=0, out_lo_at=24, scaled=False, scale_hi=7, scale_lo=-1, rs_in=False,
                                    rs_out=True, rs_per_part=False, rs_growth=11)
    assert np.array(p)[engine.FFT_REAL_PARAMS.index("rows")] == 3
    assert np.array(p)[engine.FFT_REAL_PARAMS.index("scale_lo")] == -1
    assert np.array(p)[engine.FFT_REAL_PARAMS.index("rs_growth")] == 11
    assert np.array(p)[engine.FFT_REAL_PARAMS.index("out_lo_at")] == 24
