"""The kernel backends' short host paths of the FFTs and einsum give the general
paths' bits.

The FFT's launches are planned once per key (sizes, options, which low words are
stored, the row scaling: ``mlx_precise.fft.engine._PLANS``) and a call's checks once
per shape (``mlx_precise.fft.nd``); a cached plan must compute what the first,
uncached call computes, and never serve another kind of operand (a key missing a
field would, e.g., ignore a carried low word). Bluestein's complex products launch
``ext_cmul`` straight, as ``complex_multiply_extended`` launches it. einsum runs as
one op of the words (``rules.linear._einsum_words``) where the decomposition ran a
rule per transpose and reshape. Oracles: numpy's complex128 FFT and float64 einsum
of the operands' values, and the general paths' words.
"""

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.core import backends
from mlx_precise.doubleword import DoubleWord
from mlx_precise.doubleword.elementwise import complex_multiply_extended
from mlx_precise.extended import low_word
from mlx_precise.core.plain import FFT_NAMES
from mlx_precise.extended.rules import linear
from mlx_precise.extended.rules.fft import RULES
from mlx_precise.fft import engine, nd

SPECIAL = np.array([np.inf, -np.inf, np.nan, 3.0e38, -3.0e38, 1e-30, 0.0, -0.0],
                   np.float32)


@pytest.fixture
def kernels():
    with mp.use_backend("emulate"):
        yield


def _data(shape, seed, cx=False, special=False):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape).astype(np.float32)
    if cx:
        a = (a + 1j * rng.standard_normal(shape)).astype(np.complex64)
    if special:
        a.reshape(-1)[:SPECIAL.size] = SPECIAL
    return mx.array(a)


def _bits(a) -> list[np.ndarray]:
    """Bit patterns of the high and low words (float32 parts; a NaN is a NaN)."""
    lo = low_word(a)
    out = []
    for w in (a, mx.zeros_like(a) if lo is None else lo):
        w = np.ascontiguousarray(np.array(w))
        f = w.view(np.float32) if w.dtype == np.complex64 else w
        bits = f.view(np.uint32).copy()
        bits[np.isnan(f)] = 0x7FC00000
        out.append(bits)
    return out


def _same(a, b):
    for x, y in zip(_bits(a), _bits(b)):
        np.testing.assert_array_equal(x, y)


def _value(a) -> np.ndarray:
    """The carried value, high + low words, in complex128 / float64."""
    lo = low_word(a)
    wide = np.complex128 if a.dtype == mx.complex64 else np.float64
    v = np.array(a).astype(wide)
    return v if lo is None else v + np.array(lo).astype(wide)


def _forget_plans():
    for name in FFT_NAMES:
        RULES[f"fft.{name}"].planned.clear()
    engine._PLANS.clear()
    nd._CHECKED.clear()
    nd._chain_plan.cache_clear()


# (name, the call, input shape, complex input, numpy's transform)
CASES = [
    ("rfft pow2 last", lambda a, nm: mx.fft.rfft(a, norm=nm), (3, 64), False,
     lambda v, nm: np.fft.rfft(v, norm=nm)),
    ("rfft padded axis 0", lambda a, nm: mx.fft.rfft(a, n=32, axis=0, norm=nm), (20, 3), False,
     lambda v, nm: np.fft.rfft(v, n=32, axis=0, norm=nm)),
    ("rfft Bluestein", lambda a, nm: mx.fft.rfft(a, norm=nm), (2, 24), False,
     lambda v, nm: np.fft.rfft(v, norm=nm)),
    ("rfft odd", lambda a, nm: mx.fft.rfft(a, norm=nm), (2, 15), False,
     lambda v, nm: np.fft.rfft(v, norm=nm)),
    ("irfft pow2", lambda a, nm: mx.fft.irfft(a, n=64, norm=nm), (3, 33), True,
     lambda v, nm: np.fft.irfft(v, n=64, norm=nm)),
    ("irfft Bluestein axis 1", lambda a, nm: mx.fft.irfft(a, n=24, axis=1, norm=nm), (2, 13, 2),
     True, lambda v, nm: np.fft.irfft(v, n=24, axis=1, norm=nm)),
    ("fft two passes", lambda a, nm: mx.fft.fft(a, norm=nm), (2, 2048), True,
     lambda v, nm: np.fft.fft(v, norm=nm)),
    ("ifft Bluestein", lambda a, nm: mx.fft.ifft(a, norm=nm), (3, 12), True,
     lambda v, nm: np.fft.ifft(v, norm=nm)),
    ("rfft2", lambda a, nm: mx.fft.rfft2(a, axes=(1, 2), norm=nm), (2, 8, 16, 3), False,
     lambda v, nm: np.fft.rfft2(v, axes=(1, 2), norm=nm)),
    ("irfft2", lambda a, nm: mx.fft.irfft2(a, s=(8, 16), axes=(1, 2), norm=nm), (2, 8, 9, 3),
     True, lambda v, nm: np.fft.irfft2(v, s=(8, 16), axes=(1, 2), norm=nm)),
]


@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fft_cached_plans(kernels, case, norm):
    """Each transform on a plain input, then on one that carries a low word, then
    both again, all from empty plan caches: the repeated calls (cached plans) give
    the first calls' words, and every result is numpy's complex128 transform of
    the input's value (a plan of the plain input serving the carried one would
    drop its low word: an error ~1e-8)."""
    _, call, shape, cx, ref = case
    x = _data(shape, 1, cx)
    _forget_plans()
    with mp.extended_precision() as report:
        carried = x * 1.1 + 0.1
        first = [call(x, norm), call(carried, norm)]
        again = [call(x, norm), call(carried, norm)]
        mx.eval(first, again)
    assert not report.float32
    for a, b in zip(first, again):
        _same(a, b)
    for y, v in zip(first, (x, carried)):
        r = ref(_value(v), norm)
        err = np.linalg.norm(_value(y) - r) / np.linalg.norm(r)
        assert err < 1e-12, err
    assert np.linalg.norm(_value(carried) - np.array(carried)) > 0  # a low word


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fft_cached_plans_special_values(kernels, case):
    """Inf, NaN, huge and tiny inputs (the row scaling's cases) from empty plan
    caches and again: the same words."""
    _, call, shape, cx, _ = case
    x = _data(shape, 2, cx, special=True)
    _forget_plans()
    with mp.extended_precision():
        carried = x * 1.1
        first = [call(x, "backward"), call(carried, "ortho")]
        again = [call(x, "backward"), call(carried, "ortho")]
        mx.eval(first, again)
    for a, b in zip(first, again):
        _same(a, b)
    assert all(np.isnan(np.array(y)).any() for y in first)


@pytest.mark.parametrize("round_output", [True, False])
def test_bluestein_products_as_complex_multiply(kernels, round_output):
    """The rows-times-chirp product of Bluestein's algorithm (the launch straight)
    against complex_multiply_extended of the same words: the same bits, special
    values included."""
    hi = _data((3, 10), 3, cx=True, special=True)
    h = np.array(hi)
    with np.errstate(invalid="ignore"):  # (Inf * (2^-30 + 0i): a NaN part, replaced)
        lo = mx.array(np.where(np.isfinite(h), h * np.float32(2.0**-30), 0).astype(np.complex64))
    c = engine._chirp(10, False, 3)
    y_hi, y_lo = engine._times_row(hi, lo, c, round_output, backends.resolve("emulate"), None)
    ref = complex_multiply_extended(DoubleWord(hi, lo), c, round_output=round_output)
    pairs = [(y_hi, ref)] if round_output else [(y_hi, ref.hi), (y_lo, ref.lo)]
    for a, b in pairs:  # (plain arrays: _bits' high words are theirs)
        np.testing.assert_array_equal(_bits(a)[0], _bits(b)[0])
    assert (y_lo is None) == round_output


EINSUMS = [
    ("hn,hnl->hl", (4, 6), (4, 6, 10), True, True),
    ("bxyi,ioxy->bxyo", (2, 3, 3, 4), (4, 5, 3, 3), True, True),
    ("ij,jk->ik", (5, 7), (7, 3), False, False),
    ("ij,kj->ik", (5, 7), (3, 7), False, True),
    ("bij,jk->bik", (2, 3, 4), (4, 5), True, False),
    ("i,i->", (9,), (9,), False, False),
    ("abc,cb->ab", (2, 3, 4), (4, 3), False, False),
    ("ik,jk->kji", (3, 4), (5, 4), False, False),
]


@pytest.mark.parametrize("special", [False, True])
@pytest.mark.parametrize("case", EINSUMS, ids=[c[0] for c in EINSUMS])
def test_einsum_words_bits(kernels, case, special):
    """mx.einsum (one op of the words) against its decomposition run op by op
    through the flow (transposes, reshapes, the batched matmul): the same words,
    for plain and carried operands, real and complex, special values included;
    and numpy's float64 einsum of the values for finite operands."""
    spec, sa, sb, ca, cb = case
    a, b = _data(sa, 4, ca, special), _data(sb, 5, cb)
    pairs = []
    with mp.extended_precision() as report:
        for u, v in ((a, b), (a * 1.1, b - 0.3)):
            pairs.append((u, v, mx.einsum(spec, u, v), linear._einsum(spec, u, v)))
        mx.eval([p[2:] for p in pairs])
    assert report.extended["einsum"] == 2 and not report.float32
    for u, v, y, ref in pairs:
        _same(y, ref)
        if not special:
            r = np.einsum(spec, _value(u), _value(v))
            assert np.max(np.abs(_value(y) - r)) <= 1e-12 * max(1.0, np.abs(r).max())


# inputs whose casts the direct route must keep: a real input of fft (complex words
# made from it), a complex input of rfft (its real part), a 3-axis fftn with sizes
ROUTE_CASES = CASES + [
    ("fft of real", lambda a, nm: mx.fft.fft(a, norm=nm), (3, 16), False,
     lambda v, nm: np.fft.fft(v, norm=nm)),
    ("rfft of complex", lambda a, nm: mx.fft.rfft(a, norm=nm), (2, 16), True,
     lambda v, nm: np.fft.rfft(v.real, norm=nm)),
    ("fftn sized", lambda a, nm: mx.fft.fftn(a, s=(4, 6, 8), axes=(0, 1, 2), norm=nm), (3, 5, 8), True,
     lambda v, nm: np.fft.fftn(v, s=(4, 6, 8), axes=(0, 1, 2), norm=nm)),
]


@pytest.mark.parametrize("special", [False, True])
@pytest.mark.parametrize("case", ROUTE_CASES, ids=[c[0] for c in ROUTE_CASES])
def test_fft_rule_direct_route(kernels, monkeypatch, case, special):
    """The rules' direct route to the N-D engine on the kernel backends
    (``spectral.transform`` -> ``nd.kernel_words``) against the general one
    (``words_op`` -> ``nd.transform``, taken where MLX's autodiff traces), on a plain
    and a carried input, each norm: the same words; without special values, numpy's
    complex128 transform of the input's value to 1e-12."""
    from mlx_precise.extended import spectral

    _, call, shape, cx, ref = case
    x = _data(shape, 3, cx, special=special)

    def run():
        with mp.extended_precision():
            carried = x * 1.1 + 0.1
            out = [call(v, nm) for v in (x, carried) for nm in ("backward", "ortho", "forward")]
            mx.eval(out)
        return carried, out

    carried, direct = run()
    with monkeypatch.context() as m:
        m.setattr(spectral, "differentiating", lambda: True)  # the general route
        _, general = run()
    for a, b in zip(direct, general):
        _same(a, b)
    if special:
        assert all(np.isnan(np.array(y)).any() for y in direct)
        return
    for i, y in enumerate(direct):
        r = ref(_value((x, carried)[i // 3]), ("backward", "ortho", "forward")[i % 3])
        err = np.linalg.norm(_value(y) - r) / np.linalg.norm(r)
        assert err < 1e-12, err


@pytest.mark.parametrize("backend", ["cpu", "emulate"])
def test_rfft_of_complex_keeps_low_word(backend):
    """rfft of a complex input transforms its real part (MLX's cast): a carried low
    word is that of the real part, kept (a float32 cast of the input would drop it:
    an error ~1e-8); numpy's complex128 rfft of the real part of the value."""
    x = _data((3, 32), 4, cx=True)
    with mp.use_backend(backend), mp.extended_precision() as report:
        carried = x * 1.1 + 0.1
        y = mx.fft.rfft(carried, norm="ortho")
        mx.eval(y)
    assert not report.float32
    r = np.fft.rfft(_value(carried).real, norm="ortho")
    err = np.linalg.norm(_value(y) - r) / np.linalg.norm(r)
    assert err < 1e-12, err


def test_fft_rule_plans_keep_mlx_errors(kernels):
    """A call form planned by the rule (its reference op skipped) serves only calls
    of the same argument types: after rfft(x, n=16), MLX's own errors for n=16.0, a
    bad axis and a bad norm are still raised, and n=16 by position or name gives the
    first call's words."""
    x = _data((3, 16), 5)
    _forget_plans()
    with mp.extended_precision():
        first = mx.fft.rfft(x, n=16, axis=-1)
        for bad in (dict(n=16.0, axis=-1), dict(n=16, axis=2), dict(n=16, norm="bad")):
            with pytest.raises((TypeError, ValueError, IndexError)):
                mx.fft.rfft(x, **bad)
        again = [mx.fft.rfft(x, n=16, axis=-1), mx.fft.rfft(x, 16, -1), mx.fft.rfft(x, 16)]
        mx.eval(first, again)
    assert any(RULES["fft.rfft"].planned)
    for y in again:
        _same(first, y)
    r = np.fft.rfft(np.array(x).astype(np.float64))
    assert np.abs(_value(first) - r).max() <= 1e-12 * np.abs(r).max()
