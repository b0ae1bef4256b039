"""mlx_precise.fft reads like mx.fft: every mx.fft transform with MLX's
argument names and defaults, precision-aware with a *_extended twin, numpy's s / axes
semantics, MLX's error types, and the double-word accuracy of every N-D function on
the emulate (Metal kernels) and cpu (float64) backends.

Oracles: numpy's FFTs of the exact input in long double (tests/oracle.py; checked
here against DFT matrices from mpmath), MLX's own mx.fft for signatures, shapes,
dtypes and error types."""

import importlib
import inspect
import itertools
import warnings

import mlx.core as mx
import numpy as np
import pytest
from oracle import LONGDOUBLE_FFT, exact_value, fraction_exactly_rounded, normwise_error

import mlx_precise as mp
from mlx_precise import DoubleWord, extended_precision
from mlx_precise.core.plain import plain as mlx_plain

mpfft = importlib.import_module("mlx_precise.fft")

BACKENDS = ("emulate", "cpu")
BOUND = 1e-13  # normwise, unrounded DoubleWord results, as tests/fft/test_fft.py
NAMES = ("fft", "ifft", "rfft", "irfft", "fft2", "ifft2", "rfft2", "irfft2", "fftn",
         "ifftn", "rfftn", "irfftn")
NORMS = ("backward", "ortho", "forward")

pytestmark = pytest.mark.skipif(not LONGDOUBLE_FFT, reason="needs a 64-bit long double")


def _mlx_signature(name: str) -> inspect.Signature:
    """MLX's Python signature, from the first line of its docstring (nanobind
    functions have no inspect signature): the defaults evaluated, the annotations
    not."""
    fn = getattr(mlx_plain.fft, name, None) or getattr(mx.fft, name)  # not the dispatcher
    line = fn.__doc__.split("\n")[0]
    src = "from __future__ import annotations\ndef " + line.split(" -> ")[0] + ": pass"
    ns: dict = {}
    exec(src, ns)  # noqa: S102 (MLX's own docstring)
    return inspect.signature(ns[name])


def _kind(name: str) -> str:
    return name.rstrip("2n")  # fft2, fftn -> fft


def _data(kind: str, shape, seed: int, dtype=np.complex64):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if kind == "rfft":
        return x.astype(np.float32 if dtype == np.complex64 else np.float64)
    return (x + 1j * rng.standard_normal(shape)).astype(dtype)


def _reference(name: str, x, **kw):
    """numpy.fft.<name> of the exact input in long double (s without axes: numpy's
    own rule, the last len(s) axes, passed explicitly: numpy 2 warns otherwise)."""
    v = exact_value(x)
    if kw.get("s") is not None and kw.get("axes") is None and name.endswith("n"):
        kw = dict(kw, axes=tuple(range(v.ndim - len(kw["s"]), v.ndim)))
    return getattr(np.fft, name)(v, **kw)


# ---- the surface: names, arguments, defaults --------------------------------------


@pytest.mark.parametrize("name", NAMES + ("fftshift", "ifftshift"))
def test_signatures_are_mlx_signatures(name):
    """a, n / s, axis / axes, norm with MLX's defaults, in MLX's order; stream a
    keyword (MLX's is positional too); the extended twin adds round_output and
    backend (keyword-only)."""
    want = _mlx_signature(name)
    fn = getattr(mpfft, name)
    assert fn.__name__ == name and name in mpfft.__all__
    twins = [fn] if "shift" in name else [fn, getattr(mpfft, f"{name}_extended"), fn.plain]
    for f in twins:
        got = inspect.signature(f).parameters
        extra = [p for p in got if p not in want.parameters]
        assert extra in ([], ["round_output", "backend"]), (f, extra)
        assert list(want.parameters) == [p for p in got if p not in extra], f
        for p in want.parameters.values():
            q = got[p.name]
            default = list(q.default) if isinstance(q.default, tuple) else q.default
            assert default == p.default, (f, p.name)  # MLX's [-2, -1]: a tuple here
            kind = inspect.Parameter.KEYWORD_ONLY if p.name == "stream" else p.kind
            assert q.kind == kind, (f, p.name)
    if "shift" not in name:
        assert mp.precision_aware_functions()[name] is fn  # the public one, registered


def test_input_named_a_and_the_old_keywords_deprecated():
    """mp.fft.fft(a=x) works as mx.fft.fft(a=x) does; x= / X= still work with a
    DeprecationWarning, in and out of the block; positional use is unchanged."""
    x = mx.array(_data("fft", (2, 8), 1))
    for enabled in (False, True):
        with extended_precision(enabled), mp.use_backend("cpu"):
            want = np.array(mp.fft.fft(x))
            assert np.array_equal(np.array(mp.fft.fft(a=x)), want)
            with pytest.warns(DeprecationWarning, match=r"fft\(x=\.\.\.\) is deprecated"):
                assert np.array_equal(np.array(mp.fft.fft(x=x)), want)
            with pytest.warns(DeprecationWarning, match=r"irfft_extended\(X=\.\.\.\)"):
                y = mp.fft.irfft_extended(X=x, n=6, backend="cpu")
            assert np.array_equal(np.array(y), np.array(mp.fft.irfft_extended(x, 6,
                                                                              backend="cpu")))
            with pytest.raises(TypeError, match="got the input twice"):
                mp.fft.rfft(mx.real(x), x=mx.real(x))
    assert np.array_equal(np.array(mp.fft.fft(a=x)), np.array(mx.fft.fft(a=x)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new names warn about nothing
        mp.fft.fft2(a=x, s=(2, 4), axes=(0, 1), norm="ortho", stream=mx.cpu)


# ---- numpy's s / axes rule and MLX's errors -------------------------------------------

X3 = np.zeros((3, 4, 5), np.complex64)
BAD = [  # (name, kwargs, input, MLX's exception type or None where we differ, our match)
    ("fftn", dict(s=(4, 4), axes=(0,)), X3, ValueError, "s and axes must have the same length"),
    ("fftn", dict(axes=(0, 0)), X3, ValueError, "axes must be distinct"),
    ("ifftn", dict(axes=(1, -2)), X3, ValueError, "axes must be distinct"),
    ("fftn", dict(axes=(3,)), X3, IndexError, r"axes\[0\] = 3 is out of range for a with 3"),
    ("rfftn", dict(axes=(0, -4)), X3.real, IndexError, r"axes\[1\] = -4 is out of range"),
    ("fft2", {}, X3[0, 0], IndexError, r"axes\[0\] = -2 is out of range for a with 1"),
    ("fft", dict(axis=3), X3, IndexError, "axis 3 is out of range for a with 3"),
    ("irfft", dict(axis=-4), X3, IndexError, "axis -4 is out of range"),
    ("fft2", dict(s=(0, 4)), X3, ValueError, r"s\[0\] must be >= 1"),
    ("irfft2", dict(s=(3, -1)), X3, ValueError, r"s\[1\] must be >= 1"),
    ("fft", dict(n=0), X3, ValueError, "n must be an integer >= 1"),
    ("fftn", dict(s=4, axes=(0,)), X3, TypeError, "s must be a sequence of ints, got int"),
    ("fftn", dict(axes=1), X3, TypeError, "axes must be a sequence of ints, got int"),
    ("fft2", dict(s=(4.0, 2)), X3, TypeError, r"s\[0\] must be an int, got float"),
    ("fft", dict(axis=1.0), X3, TypeError, "axis must be an int, got float"),
    ("ifft2", dict(norm="bogus"), X3, ValueError, "norm must be one of"),
    ("fftn", {}, X3[0, 0, 0], ValueError, "a must have at least one dimension"),
    ("fft", {}, X3[0, 0, 0], IndexError, "a must have at least one dimension"),
    ("irfftn", {}, X3[:, :, :1], ValueError, r"the default s\[-1\] = 0"),
    ("irfft", {}, X3[:, :, :1], ValueError, "the default n = 0"),
    # Where numpy's rule or the 1-D functions' history is kept (docs/fft.md):
    ("fftn", dict(s=(4, 4, 4, 4)), X3, None, "s has 4 sizes but a has only 3"),
    ("fftn", dict(axes=()), X3, None, "axes must name at least one axis"),
    ("fft", dict(n=2.0), X3, None, "n must be an integer >= 1"),
]


@pytest.mark.parametrize("name,kw,x,mlx_error,match", BAD)
def test_bad_arguments_raise_what_mlx_raises_naming_the_argument(name, kw, x, mlx_error,
                                                                  match):
    """Each bad call to the plain twin, the extended twin and inside the block
    raises one exception naming the argument; where MLX raises too, ours is an
    instance of MLX's type (an out-of-range axis raises numpy's AxisError, a
    ValueError and an IndexError: MLX raises IndexError, numpy AxisError, and the
    1-D functions raised ValueError before)."""
    a = mx.array(x)
    if mlx_error is not None:
        with pytest.raises(mlx_error):
            mx.eval(getattr(mx.fft, name)(a, **kw))
    calls = [lambda: getattr(mp.fft, name)(a, **kw),
             lambda: getattr(mp.fft, f"{name}_extended")(a, backend="cpu", **kw)]
    for call in calls:
        with pytest.raises(mlx_error or Exception, match=match) as info:
            call()
        with extended_precision(), mp.use_backend("cpu"), pytest.raises(type(info.value),
                                                                        match=match):
            call()


def test_shift_errors_as_mlx():
    a = mx.array(X3)
    for fn in ("fftshift", "ifftshift"):
        with pytest.raises(IndexError):
            getattr(mx.fft, fn)(a, axes=(5,))
        with pytest.raises(IndexError, match=r"axes\[0\] = 5 is out of range for a with 3"):
            getattr(mp.fft, fn)(a, axes=(5,))
        with pytest.raises(TypeError, match=r"axes\[0\] must be an int"):
            getattr(mp.fft, fn)(a, axes=(1.5,))


CALLS = [  # (name, input shape, kwargs): every axis form, padding, truncation, 1-point axes
    ("fft2", (3, 5, 4), {}),
    ("fft2", (4, 6), dict(s=(3, 8), norm="ortho")),
    ("ifft2", (3, 2, 5), dict(s=(6, 3), axes=(0, 2))),
    ("rfft2", (4, 6), dict(s=(3, 10), norm="forward")),
    ("irfft2", (4, 3), {}),
    ("irfft2", (5, 4), dict(axes=(1, 0), norm="ortho")),
    ("fftn", (3, 1, 4), {}),
    ("fftn", (2, 3, 5), dict(s=(8,))),  # numpy: the last len(s) axes
    ("ifftn", (4, 3, 5), dict(s=(2, 6), axes=(-1, 0), norm="forward")),
    ("rfftn", (2, 3, 5), {}),
    ("rfftn", (1, 4, 6), dict(s=(1, 3, 12), norm="ortho")),
    ("irfftn", (3, 2, 4), dict(s=(2, 3, 7))),
    ("irfftn", (1, 5), dict(axes=(0, 1), norm="forward")),
    ("fft", (3, 5), dict(n=6, axis=0, norm="ortho")),
    ("irfft", (2, 5), dict(n=9, norm="forward")),
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_transform_against_long_double(backend):
    """The unrounded result within 1e-13 (normwise) of numpy's long double
    transform of the exact input; the rounded result has MLX's shape and dtype and
    is the single rounding of that value for nearly every component (small
    transforms have many exact-midpoint ties); the precision-aware function inside
    the block gives the extended twin's bits, outside it MLX's bits."""
    worst = 0.0
    for i, (name, shape, kw) in enumerate(CALLS):
        kind = _kind(name)
        x = _data(kind, shape, seed=i)
        ref = _reference(name, x, **kw)
        ext = getattr(mp.fft, f"{name}_extended")
        d = ext(mx.array(x), round_output=False, backend=backend, **kw)
        assert isinstance(d, DoubleWord) and d.shape == ref.shape, (name, kw)
        err = normwise_error((np.array(d.hi), np.array(d.lo)), ref)
        worst = max(worst, err)
        assert err <= BOUND, (name, kw, err)
        y = ext(mx.array(x), backend=backend, **kw)
        mlx_kw = dict(kw)
        if "s" in kw and name.endswith("n") and "axes" not in kw:  # MLX wants the axes
            mlx_kw["axes"] = tuple(range(len(shape) - len(kw["s"]), len(shape)))
        mlx_y = getattr(mx.fft, name)(mx.array(x), **mlx_kw)
        assert y.shape == mlx_y.shape and y.dtype == mlx_y.dtype, (name, kw)
        assert fraction_exactly_rounded(np.array(y), ref) >= 0.9, (name, kw)
        with extended_precision(), mp.use_backend(backend):
            assert np.array_equal(np.array(getattr(mp.fft, name)(mx.array(x), **kw)),
                                  np.array(y))
        assert np.array_equal(np.array(getattr(mp.fft, name)(mx.array(x), **kw)),
                              np.array(mlx_y))
    print(f"{backend}: worst normwise error {worst:.1e} over {len(CALLS)} calls")


@pytest.mark.parametrize("backend", BACKENDS)
def test_float64_doubleword_and_real_inputs(backend):
    """float64 / complex128 data enters at full precision (no float32 rounding
    first), a DoubleWord with nonzero low words keeps them, a real array into the
    complex transforms and into irfftn; every norm mode."""
    rng = np.random.default_rng(5)
    r64 = rng.standard_normal((3, 6))
    c128 = r64 + 1j * rng.standard_normal((3, 6))
    dw = DoubleWord.from_float64(c128)
    r32 = r64.astype(np.float32)
    cases = [("fft2", r64, r64), ("ifftn", c128, c128), ("rfft2", r64, r64),
             ("irfftn", c128, c128), ("fftn", dw, (dw.hi, dw.lo)),
             ("irfft2", dw, (dw.hi, dw.lo)), ("fft2", r32, r32), ("irfftn", r32, r32)]
    for (name, x, exact_in), norm in zip(cases, itertools.cycle(NORMS)):
        ref = _reference(name, tuple(np.array(w) for w in exact_in)
                         if isinstance(exact_in, tuple) else exact_in, norm=norm)
        arg = mx.array(x) if x is r32 else x
        d = getattr(mp.fft, f"{name}_extended")(arg, norm=norm, round_output=False,
                                                backend=backend)
        err = normwise_error((np.array(d.hi), np.array(d.lo)), ref)
        assert err <= BOUND, (name, norm, err)
    # float64 data through float32 first would be off by ~1e-8
    y = mp.fft.fft2_extended(r64, round_output=False, backend=backend)
    assert normwise_error((np.array(y.hi), np.array(y.lo)), np.fft.fft2(r64)) < 1e-14


def test_exact_small_cases():
    """Transforms with exact values: an impulse, a constant, 1-point axes."""
    imp = np.zeros((4, 8), np.complex64)
    imp[0, 0] = 3 - 2j
    const = np.full((2, 8), 1.5, np.float32)
    one = np.complex64([[2 - 1j]])
    for b in BACKENDS:
        assert (np.array(mp.fft.fft2_extended(mx.array(imp), backend=b)) == 3 - 2j).all()
        y = np.array(mp.fft.rfftn_extended(mx.array(const), backend=b))
        assert y.shape == (2, 5) and y[0, 0] == 1.5 * 16 and (y.ravel()[1:] == 0).all()
        assert np.array(mp.fft.ifftn_extended(mx.array(one), backend=b)).tolist() == [[2 - 1j]]
        assert np.array(mp.fft.irfft2_extended(mx.array(one), s=(1, 1),
                                               backend=b)).tolist() == [[2.0]]


def test_oracle_agrees_with_mpmath_dft_matrices():
    """The long double N-D oracle (numpy's fftn family in clongdouble) against DFT
    matrices from mpmath at 100 bits, applied axis by axis in clongdouble."""
    import mpmath

    def ld(v):  # an mpf to long double: two float64 words, exact sum in 64 bits
        hi = float(v)
        return np.longdouble(hi) + np.longdouble(float(v - hi))

    def dft(n, sign, scale):
        with mpmath.workprec(100):
            w = [[mpmath.expj(sign * 2 * mpmath.pi * j * k / n) / scale for k in range(n)]
                 for j in range(n)]
            re = np.array([[ld(v.real) for v in row] for row in w])
            im = np.array([[ld(v.imag) for v in row] for row in w])
        return re + 1j * im.astype(np.clongdouble)

    x = exact_value(_data("fft", (3, 4, 5), 7))
    y = x
    for ax in (0, 2):
        n = x.shape[ax]
        y = np.moveaxis(np.tensordot(dft(n, 1, n), np.moveaxis(y, ax, 0), axes=1), 0, ax)
    ref = _reference("ifftn", x, axes=(0, 2))
    err = normwise_error(ref, y)
    print(f"long double ifftn against mpmath DFT matrices: {err:.1e}")
    assert err < 1e-17


# ---- shifts ---------------------------------------------------------------------------


def test_shifts_move_values_as_mlx_does():
    """Arrays as mx.fft.fftshift / ifftshift (bit for bit), DoubleWords with both
    words moved (as numpy moves each), float64 data split first; ifftshift undoes
    fftshift on odd sizes."""
    x = mx.array(_data("fft", (3, 4, 5), 3))
    for axes in (None, 1, (0, 2), (-1,), (0, 0)):
        for fn in ("fftshift", "ifftshift"):
            got = getattr(mp.fft, fn)(x, axes)
            assert np.array_equal(np.array(got), np.array(getattr(mx.fft, fn)(x, axes)))
    d = DoubleWord.from_float64(np.random.default_rng(4).standard_normal((5, 3)))
    s = mp.fft.fftshift(d, axes=(0,))
    assert isinstance(s, DoubleWord)
    for got, w in ((s.hi, d.hi), (s.lo, d.lo)):
        assert np.array_equal(np.array(got), np.fft.fftshift(np.array(w), axes=(0,)))
    back = mp.fft.ifftshift(mp.fft.fftshift(d.to_float64()))
    assert np.array_equal(back.to_float64(), d.to_float64())
