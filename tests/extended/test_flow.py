"""Double-word values carried through ``extended_precision()`` (mlx_precise.extended).

Oracles are independent of the code under test: numpy longdouble (64-bit
significand on x86-64) or exact fractions, rounded once to float32.
"""

import gc
from fractions import Fraction

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlx_precise as mp
from flow_helpers import rng_f32, share, value64
from mlx_precise.extended import PrecisionDropError, carried, low_word

LD = np.longdouble


# ---- scalars and arithmetic ---------------------------------------------------------

def _rn32(fr: Fraction) -> np.float32:
    """float32 nearest to a rational, ties to even (candidates around float(fr))."""
    c = np.float32(float(fr))
    best = None
    for v in (np.nextafter(c, np.float32(-np.inf)), c, np.nextafter(c, np.float32(np.inf))):
        d = abs(Fraction(float(v)) - fr)
        if best is None or d < best[0] or (d == best[0] and int(v.view(np.uint32)) % 2 == 0):
            best = (d, v)
    return best[1]


@pytest.mark.parametrize("expr,exact", [
    (lambda x: x * 0.1, lambda f: f * Fraction(0.1)),
    (lambda x: x / 3, lambda f: f / 3),
    (lambda x: x + 1e-3, lambda f: f + Fraction(1e-3)),
    (lambda x: 0.5 * (x + x[::-1]), None),
    (lambda x: (x * 0.1 + 1e-3) / 3, lambda f: (f * Fraction(0.1) + Fraction(1e-3)) / 3),
], ids=["x*0.1", "x/3", "x+1e-3", "0.5*(x+reversed)", "(x*0.1+1e-3)/3"])
def test_scalar_chains_round_once(backend, expr, exact):
    x = rng_f32(2000, seed=1)
    with mp.extended_precision() as rep:
        y = expr(mx.array(x))
    got = np.array(y)
    fx = [Fraction(float(v)) for v in x]
    if exact is None:  # 0.5 (a + b) with b = reversed a
        want = [_rn32(Fraction(1, 2) * (a + b)) for a, b in zip(fx, fx[::-1])]
    else:
        want = [_rn32(exact(f)) for f in fx]
    share = float(np.mean(got == np.array(want, np.float32)))
    assert share >= 0.999, share
    assert not rep.float32
    # plain float32 (the scalar rounded first, then the op) is never better
    plain = float(np.mean(np.array(expr(mx.array(x))) == np.array(want, np.float32)))
    assert plain <= share


def test_low_word_is_the_residual(backend):
    x = mx.array(rng_f32(100, seed=2))
    with mp.extended_precision():
        y = x / 3
    lo = low_word(y)
    assert lo is not None and lo.dtype == mx.float32 and lo.shape == y.shape
    exact = np.array(x).astype(LD) / 3
    err = np.abs(np.array(y).astype(LD) + np.array(lo).astype(LD) - exact) / np.abs(exact)
    assert float(err.max()) < 2.0**-46


def test_complex_arithmetic(backend):
    a = rng_f32((3, 50), 3) + 1j * rng_f32((3, 50), 4)
    b = rng_f32((50,), 5) + 1j * rng_f32((50,), 6)
    A, B = mx.array(a.astype(np.complex64)), mx.array(b.astype(np.complex64))
    with mp.extended_precision() as rep:
        prod = A * B * 0.3
        quot = A / B
        mix = A * mx.real(B) - 2.5j
        s = (A + B).sum(axis=1)
        conj = mx.conj(A) * A
    al, bl = a.astype(np.clongdouble), b.astype(np.clongdouble)
    assert share(prod, al * bl * LD(0.3)) >= 0.99
    assert share(quot, al / bl) >= 0.99
    assert share(mix, al * bl.real - 2.5j) >= 0.99
    assert share(s, (al + bl).sum(axis=1)) == 1.0
    assert share(conj, np.conj(al) * al) == 1.0
    assert not rep.float32


def test_shape_ops_carry_the_low_word(backend):
    x = mx.array(rng_f32((4, 6), 7))
    with mp.extended_precision() as rep:
        y = x / 7
        outs = {
            "reshape": y.reshape(6, 4), "transpose": y.T, "swapaxes": mx.swapaxes(y, 0, 1),
            "moveaxis": mx.moveaxis(y, 0, 1), "expand": mx.expand_dims(y, 0),
            "none": y[None], "squeeze": mx.squeeze(y[None]), "slice": y[1:3, ::2],
            "broadcast": mx.broadcast_to(y, (2, 4, 6)),
            "concat": mx.concatenate([y, y], axis=0), "stack": mx.stack([y, y]),
            "split": mx.split(y, 2, axis=1)[1], "pad": mx.pad(y, [(1, 1), (0, 0)]),
            "take": mx.take(y, mx.array([3, 0]), axis=0),
            "take_along": mx.take_along_axis(y, mx.zeros((4, 1), mx.int32), axis=1),
            "where": mx.where(x > 0, y, -y),
        }
    ref = np.array(x).astype(LD) / 7
    refs = {
        "reshape": ref.reshape(6, 4), "transpose": ref.T, "swapaxes": ref.T,
        "moveaxis": ref.T, "expand": ref[None], "none": ref[None], "squeeze": ref,
        "slice": ref[1:3, ::2], "broadcast": np.broadcast_to(ref, (2, 4, 6)),
        "concat": np.concatenate([ref, ref]), "stack": np.stack([ref, ref]),
        "split": np.split(ref, 2, axis=1)[1], "pad": np.pad(ref, [(1, 1), (0, 0)]),
        "take": ref[[3, 0]], "take_along": ref[:, :1],
        "where": np.where(np.array(x) > 0, ref, -ref),
    }
    for name, v in outs.items():
        lo = low_word(v)
        assert lo is not None, name
        total = np.array(v).astype(LD) + np.array(lo).astype(LD)
        assert np.max(np.abs(total - refs[name])) <= 2.0**-46 * np.max(np.abs(ref)), name
    assert not rep.float32


def test_astype_and_exits(backend):
    x = mx.array(rng_f32(10, 8))
    with mp.extended_precision():
        y = x / 3
        y64 = y.astype(mx.float64)
        yc = y.astype(mx.complex64)
    ref = np.array(x).astype(np.float64) / 3
    assert np.max(np.abs(np.array(y64) - ref) / np.abs(ref)) < 2.0**-46
    assert low_word(yc) is not None and yc.dtype == mx.complex64


def test_maximum_minimum_abs(backend):
    x = mx.array(np.array([1, -2, 3, np.inf, np.nan, -0.0], np.float32))
    with mp.extended_precision():
        a = x / 3
        b = (x + 1e-9) / 3  # equal high words for most, larger low words
        hi = mx.maximum(a, b)
        lo = mx.minimum(a, b)
        ab = mx.abs(-a)
    with np.errstate(invalid="ignore"):
        ref_a = np.array(x).astype(LD) / 3
        ref_b = (np.array(x).astype(LD) + LD(1e-9)) / 3
        want_hi, want_lo = np.maximum(ref_a, ref_b), np.minimum(ref_a, ref_b)
    np.testing.assert_array_equal(np.array(hi), want_hi.astype(np.float32))
    np.testing.assert_array_equal(np.array(lo), want_lo.astype(np.float32))
    np.testing.assert_array_equal(np.array(ab), np.abs(ref_a).astype(np.float32))


def test_special_values_like_float32(backend):
    big = np.float32(2.0**127)
    x = mx.array(np.array([big, -big, np.inf, -np.inf, np.nan, 0.0, 3e38], np.float32))
    with mp.extended_precision():
        y = x * 4.0
        z = x / 0.5
        w = x + 1e38
    with np.errstate(over="ignore", invalid="ignore"):
        xs = np.array(x)
        for got, want in ((y, xs * np.float32(4)), (z, xs / np.float32(0.5)),
                          (w, (xs.astype(np.float64) + 1e38).astype(np.float32))):
            np.testing.assert_array_equal(np.array(got), want)


# ---- FFT pipelines written in plain MLX --------------------------------------------

def _causal_oracle(u, k, D=None):
    """Direct causal convolution in longdouble."""
    ul, kl = u.astype(LD), k.astype(LD)
    L = u.shape[-1]
    y = np.zeros(u.shape, LD)
    for t in range(L):
        y[..., t] = np.sum(ul[..., : t + 1] * kl[..., t::-1], axis=-1)
    if D is not None:
        y = y + ul * D.astype(LD)[:, None]
    return y


def _conv_plain(u, k):
    n = 2 * u.shape[-1]
    y = mx.fft.irfft(mx.fft.rfft(u, n=n) * mx.fft.rfft(k, n=n), n=n)
    return y[..., : u.shape[-1]]


def _conv_safari(u, k, D):
    L = u.shape[-1]
    n = 2 * L
    k_f = mx.fft.rfft(k, n=n) / n
    u_f = mx.fft.rfft(u, n=n)
    y = mx.fft.irfft(u_f * k_f, n=n, norm="forward")[..., :L]
    return y + u * D[:, None]


def test_fft_convolution_forms(backend):
    B, C, L = 2, 3, 128
    u, k, D = rng_f32((B, C, L), 10), rng_f32((C, L), 11), rng_f32((C,), 12)
    ref_plain, ref_safari = _causal_oracle(u, k), _causal_oracle(u, k, D)
    args = (mx.array(u), mx.array(k))
    plain = share(_conv_plain(*args), ref_plain)
    with mp.extended_precision() as rep:
        y1 = _conv_plain(*args)
        y2 = _conv_safari(*args, mx.array(D))
    assert share(y1, ref_plain) >= 0.99 > plain
    assert share(y2, ref_safari) >= 0.99
    assert rep.extended["fft.rfft"] == 4 and rep.extended["fft.irfft"] == 2
    assert not rep.float32


def test_fno_spectral_layer(backend):
    H = W = 16
    modes = 4
    x = rng_f32((2, H, W), 13)
    wr = rng_f32((modes, modes), 14) + 1j * rng_f32((modes, modes), 15)
    wts = mx.array(wr.astype(np.complex64))

    def layer(a):
        f = mx.fft.rfft2(a)
        low = f[:, :modes, :modes] * wts
        out = mx.pad(low, [(0, 0), (0, H - modes), (0, W // 2 + 1 - modes)])
        return mx.fft.irfft2(out, s=(H, W))

    with mp.extended_precision() as rep:
        y = layer(mx.array(x))
    f = np.fft.rfft2(x.astype(np.float64))  # float64 oracle of a linear layer
    g = np.zeros_like(f)
    g[:, :modes, :modes] = f[:, :modes, :modes] * wr.astype(np.complex128)
    ref = np.fft.irfft2(g, s=(H, W))
    assert share(y, ref) >= 0.99
    assert not rep.float32


# ---- gradients ---------------------------------------------------------------------

def test_gradients_match_float64(backend):
    L = 32
    u, k = rng_f32((1, 2, L), 16), rng_f32((2, L), 17)

    def loss(a, b):
        return ((_conv_plain(a, b) * 0.1 + a) ** 2).sum()

    with mp.extended_precision():
        gu, gk = mx.grad(loss, argnums=(0, 1))(mx.array(u), mx.array(k))
    # float64 gradient by hand: y = causal(u, k) * 0.1 + u; loss = sum y^2
    u64, k64 = u.astype(np.float64), k.astype(np.float64)
    y = np.real(_causal_oracle(u, k)).astype(np.float64) * 0.1 + u64
    gy = 2 * y
    # d/du: gy + 0.1 * correlation with k;  d/dk: 0.1 * correlation with u
    gu_ref = gy.copy()
    gk_ref = np.zeros_like(k64)
    for t in range(L):
        for s in range(t + 1):
            gu_ref[..., t - s] += 0.1 * gy[..., t] * k64[..., s]
            gk_ref[..., s] += 0.1 * np.sum(gy[:, :, t] * u64[:, :, t - s], axis=0)
    for got, want in ((gu, gu_ref), (gk, gk_ref)):
        err = np.max(np.abs(np.array(got) - want)) / np.max(np.abs(want))
        assert err < 1e-5, err


# ---- the block's contract ----------------------------------------------------------

def test_outside_the_block_nothing_changes():
    # (by id: a local holding an MLX function is rebound to its stand-in in a block)
    add, mul, getitem = map(id, (mx.array.__add__, mx.multiply, mx.array.__getitem__))
    x = mx.array(rng_f32(64, 18))
    before = np.array(x * 0.1 + x[::2].sum())
    with mp.extended_precision():
        assert id(mx.array.__add__) != add  # the dispatcher is in place
    assert (id(mx.array.__add__), id(mx.multiply), id(mx.array.__getitem__)) == (
        add, mul, getitem)
    np.testing.assert_array_equal(np.array(x * 0.1 + x[::2].sum()), before)


def test_unsupported_ops_are_reported_and_strict_raises(backend):
    x = mx.array(rng_f32(8, 19))
    with mp.extended_precision() as rep:
        # no double-word rule: the value rounded once, then MLX's op
        y = mx.to_fp8(x / 3)
        h = mx.array(np.ones(8, np.float16)) * 0.1
    assert rep.float32["to_fp8"] == 1 and rep.plain["__mul__"] == 1
    assert h.dtype == mx.float16 and low_word(h) is None
    np.testing.assert_array_equal(np.array(y), np.array(mx.to_fp8(mx.array(np.array(x / 3)))))
    with pytest.raises(PrecisionDropError, match="to_fp8"):
        with mp.extended_precision(strict=True):
            mx.to_fp8(x / 3)


def test_nested_off_block_and_threads():
    import threading

    x = mx.array(rng_f32(8, 20))
    out = {}
    with mp.extended_precision():
        with mp.extended_precision(False):
            out["off"] = x / 3

        def other():
            out["thread"] = x / 3

        t = threading.Thread(target=other)
        t.start()
        t.join()
        out["on"] = x / 3
    assert low_word(out["off"]) is None and low_word(out["thread"]) is None
    assert low_word(out["on"]) is not None


def test_compiled_functions_run_extended_inside():
    """Functions compiled by the user (after the import) and mlx.nn's activations
    (compiled by MLX at its import) run their ops through the flow, with the low
    words of their inputs: not a float32 replay, not rounded inputs."""
    from scipy.special import erf

    x = mx.array(rng_f32(4096, 21))
    X = np.array(x).astype(LD) / 3
    with mp.use_backend("cpu"), mp.extended_precision() as rep:
        y = mx.compile(lambda a: a * 0.1)(x)
        q = x / 3
        g = nn.gelu(q)
        s = nn.silu(q)
    assert low_word(y) is not None and rep.extended["erf"] == 1 and rep.extended["sigmoid"] == 1
    Xd = X.astype(np.float64)
    assert share(g, Xd * (1 + erf(Xd / np.sqrt(2))) / 2) >= 0.999
    assert share(s, Xd / (1 + np.exp(-Xd))) >= 0.999
    assert type(nn.gelu).__name__ == "_gc_func"  # MLX's compiled one is back


def test_no_low_word_outlives_its_array():
    x = mx.array(rng_f32(32, 22))
    gc.collect()
    start = carried()
    for _ in range(1000):
        with mp.use_backend("cpu"), mp.extended_precision():
            y = (x * 0.1 + 1) / 3
        del y
    gc.collect()
    assert carried() == start


def test_metal_glue_stays_lazy(lazy_metal):
    """On metal the flow's glue never evaluates: a whole plain-MLX chain (FFTs,
    arithmetic with scalars, complex products, slices, a reduction) traces under
    mx.compile with the lazy stand-in for the Metal executor."""
    u = mx.array(rng_f32((1, 2, 32), 23))
    k, D = mx.array(rng_f32((2, 32), 24)), mx.array(rng_f32((2,), 25))

    def chain(u, k, D):
        with mp.use_backend("metal"), mp.extended_precision() as rep:
            y = _conv_safari(u, k, D) * 0.1
            out = (y / 3 + mx.maximum(y, 0.5)).sum(axis=-1)
        assert not rep.float32 and rep.extended["fft.rfft"] == 2
        return out

    assert mx.compile(chain)(u, k, D).shape == (1, 2)


def test_in_place_updates_keep_words_consistent(backend):
    """MLX updates arrays in place (aliases see it): the low words must follow."""
    x0 = rng_f32(6, 26)
    ref = x0.astype(LD) / 3
    with mp.extended_precision() as rep:
        x = mx.array(x0) / 3
        alias = x
        x += 0.1
        x *= 2
        alias2 = x
        x[1:3] = mx.array(x0[:2]) / 7
        x[0] = 0.3
        rows = list(x.reshape(3, 2))
        y = mx.array(x0) / 3
        y += mx.array(np.full(6, 0.25, np.float16))  # a float16 operand: promoted, exact
        z = mx.array(x0) / 3
        z += 1j  # MLX makes z complex in place: its words follow
    want = (ref + LD(0.1)) * 2
    want[1:3] = x0[:2].astype(LD) / 7
    want[0] = LD(0.3)
    assert alias is x and alias2 is x
    total = np.array(x).astype(LD) + np.array(low_word(x)).astype(LD)
    assert np.max(np.abs(total - want) / np.abs(want)) < 2.0**-46
    assert share(x, want) == 1.0
    assert share(mx.concatenate([r[None] for r in rows]).reshape(-1), want) == 1.0
    assert all(low_word(r) is not None for r in rows)
    # the update's low word is its result's (not x0 / 3's)
    total = np.array(y).astype(LD) + np.array(low_word(y)).astype(LD)
    assert np.max(np.abs(total - (ref + LD(0.25))) / np.abs(ref + LD(0.25))) < 2.0**-46
    assert rep.extended["__iadd__"] == 3 and rep.extended["__setitem__"] == 2
    assert not rep.float32, rep
    assert z.dtype == mx.complex64
    total = np.array(z).astype(np.clongdouble) + np.array(low_word(z)).astype(np.clongdouble)
    assert np.max(np.abs(total - (ref + 1j)) / np.abs(ref + 1j)) < 2.0**-46


def test_fno_gradient_and_float64_operands(backend):
    H = W = 8
    x = mx.array(rng_f32((2, H, W), 27))
    wts = mx.array((rng_f32((3, 3), 28) + 1j * rng_f32((3, 3), 29)).astype(np.complex64))
    c = mx.array(rng_f32((2, H, W), 30))

    def loss(a, w):
        f = mx.fft.rfft2(a)[:, :3, :3] * w
        y = mx.fft.irfft2(mx.pad(f, [(0, 0), (0, H - 3), (0, W // 2 + 1 - 3)]), s=(H, W))
        return (y * c).sum()

    # float32 MLX autodiff of the same function: an oracle to float32 accuracy
    ref = mx.grad(loss, argnums=(0, 1))(x, wts)
    with mp.extended_precision():
        got = mx.grad(loss, argnums=(0, 1))(x, wts)
    for g, r in zip(got, ref):
        err = float(mx.max(mx.abs(g - r))) / float(mx.max(mx.abs(r)))
        assert err < 1e-5, err
    # an mx.float64 operand: MLX computes in float64, the double-word operand
    # enters at its exact value hi + lo
    x64 = mx.array(rng_f32(16, 31).astype(np.float64) * (1 + 2.0**-40), dtype=mx.float64)
    with mp.extended_precision():
        z = x64 * (mx.array(rng_f32(16, 32)) / 3)
    want = np.array(x64) * (rng_f32(16, 32).astype(LD) / 3)
    assert z.dtype == mx.float64
    assert np.max(np.abs(np.array(z) - want) / np.abs(want)) < 2.0**-46


@pytest.mark.parametrize("op", ["__iadd__", "__isub__", "__imul__", "__itruediv__"])
def test_in_place_update_by_a_float64_operand(backend, op):
    """``x op= y64``: MLX makes x a float64 array holding ``x op y``; x enters at its
    exact value, as in the out-of-place ``x op y64`` (bit for bit, signed zeros
    included: -0 + -0 is -0), within 2^-46 of long double on x0 / 3 (before: x's
    high word only, reported, raising under strict=True). Special values as IEEE."""
    x0 = np.array([1, 2, -0.0, 7, np.inf, np.nan, 3e38, 5, -0.0, 11], np.float32)
    y = np.array([1, 0.1, -0.0, -2.5, 1, 2, 1e300, 0.3, 2, 2.0**-30])
    with mp.extended_precision(strict=True) as rep:
        x = mx.array(x0) / 3
        alias = x
        want = getattr(x, op.replace("__i", "__"))(mx.array(y, dtype=mx.float64))
        getattr(x, op)(mx.array(y, dtype=mx.float64))
        mx.eval(x, want)
    assert alias is x and x.dtype == mx.float64 and low_word(x) is None
    assert not rep.float32 and rep.extended[op] == 1
    got = np.array(x)
    assert np.array_equal(got.view(np.uint64), np.array(want).view(np.uint64))
    fn = {"__iadd__": np.add, "__isub__": np.subtract, "__imul__": np.multiply,
          "__itruediv__": np.divide}[op]
    with np.errstate(all="ignore"):
        ref = fn(x0.astype(LD) / 3, y.astype(LD))
        r64 = ref.astype(np.float64)  # (3e38 / 3 * 1e300 overflows float64: inf)
    ok = np.isfinite(r64) & (r64 != 0)
    # (x carries x0 / 3 to ~2^-48 of |x|: a sum's error is relative to its operands)
    scale = (np.abs(x0.astype(LD) / 3) + np.abs(y.astype(LD)) if op in ("__iadd__", "__isub__")
             else np.abs(ref))
    assert np.max(np.abs(got[ok] - ref[ok]) / scale[ok]) < 2.0**-46
    np.testing.assert_array_equal(got[~ok], r64[~ok])
    signed = ~ok & ~np.isnan(r64)
    assert np.array_equal(np.signbit(got[signed]), np.signbit(r64[signed]))


def test_var_and_grids(backend):
    """var decomposes into ops with rules (two-pass, rounded once); linspace and
    arange with float steps are exact in float64, in two words."""
    x = rng_f32((4, 100), 33) + np.float32(1000)  # a large mean: cancellation
    X = mx.array(x)
    with mp.extended_precision() as rep:
        v = mx.var(X, axis=1)
        v1 = X.var(axis=1, ddof=1)
        grid = mx.linspace(-1, 1, 7)
        steps = mx.arange(0.0, 1.0, 0.1)
    xl = x.astype(LD)
    assert share(v, xl.var(axis=1)) == 1.0
    assert share(v1, xl.var(axis=1, ddof=1)) == 1.0
    assert float(np.mean(np.array(mx.var(X, axis=1)) == xl.var(axis=1).astype(np.float32))) < 1
    for got, want in ((grid, np.linspace(-1, 1, 7)), (steps, np.arange(10) * 0.1)):
        assert got.shape == want.shape and got.dtype == mx.float32
        total = np.array(got).astype(np.float64) + np.array(low_word(got)).astype(np.float64)
        # the float64 values to double-word precision (48 bits), not float32 sums
        assert np.max(np.abs(total - want)) <= 2.0**-47 * np.max(np.abs(want))
        assert share(got, want) == 1.0
    assert rep.extended["var"] == 2 and rep.extended["linspace"] == 1


def test_grids_made_once_are_handed_out_as_new_arrays():
    """A grid's words are made once per grid and handed out as new arrays over them:
    updating one in place (inside a block and outside) leaves the next call's."""
    want = np.linspace(-1, 1, 7)
    with mp.extended_precision():
        a = mx.linspace(-1, 1, 7)
        a[0] = 5.0
        a += 1.0
    b = mx.linspace(-1, 1, 7)  # (outside: MLX's)
    b[1] = 7.0
    with mp.extended_precision():
        c = mx.linspace(-1, 1, 7)
        d = mx.linspace(-1, 1, 7)
    assert c is not d and float(np.array(a)[0]) == 6.0
    for g in (c, d):
        total = np.array(g).astype(np.float64) + np.array(low_word(g)).astype(np.float64)
        assert np.max(np.abs(total - want)) <= 2.0**-47


@pytest.mark.parametrize("backend", ["cpu", "emulate"])
def test_second_order_gradients(backend):
    """A gradient inside a gradient: the inner backward pass is recorded on the
    outer tape (never zeros, on every backend), in double-word."""
    x, v = mx.array([1.0, 2.0, 3.0]) / 3, mx.array([0.5, 1.0, -1.0])
    inner = (lambda b: mx.sum(b * b * b))  # gradient 3 b^2, Hessian diag(6 b)

    def hvp(a):
        return mx.sum(mx.grad(inner)(a) * v)

    want = 6 * np.array(x).astype(np.float64) * np.array(v).astype(np.float64)
    with mp.use_backend(backend), mp.extended_precision() as rep:
        got = mx.grad(hvp)(x)
    assert np.abs(value64(got) - want).max() <= 2**-44 * np.abs(want).max()
    assert not rep.float32, rep
    with mp.use_backend(backend), mp.extended_precision():
        through_fft = mx.grad(lambda a: mx.sum(mx.fft.rfft(mx.grad(inner)(a)).real))(x)
    # d/da sum(real(rfft(3 a^2))) = 6 a * (sum over the spectrum's real parts of e_j)
    assert np.isfinite(np.array(through_fft)).all() and np.abs(np.array(through_fft)).max() > 0


def test_division_gradients_with_carried_operands(backend):
    """d/da sum(c / a) = -c / a^2 and d/dc = 1 / a, real and complex, operands
    carrying low words (against the closed forms in float64)."""
    a0, c0 = rng_f32(16, 40) + 3, rng_f32(16, 41)
    za = (rng_f32(16, 42) + 2 + 1j * rng_f32(16, 43)).astype(np.complex64)
    with mp.extended_precision():
        ga, gc = mx.grad(lambda a, c: mx.sum((c / 3) / (a / 7)), argnums=(0, 1))(
            mx.array(a0), mx.array(c0))
        gz = mx.grad(lambda a: mx.sum(mx.real(mx.array(c0.astype(np.complex64)) / (a / 7))))(
            mx.array(za))
    a, c = a0.astype(np.float64) / 7, c0.astype(np.float64) / 3
    np.testing.assert_allclose(np.array(ga), -c / a**2 / 7, rtol=1e-5)
    np.testing.assert_allclose(np.array(gc), 1 / a / 3, rtol=1e-5)
    # MLX's convention for a complex input: conj of the holomorphic derivative
    want = np.conj(-c0.astype(np.float64) / (za.astype(np.complex128) / 7) ** 2 / 7)
    np.testing.assert_allclose(np.array(gz), want, rtol=1e-5)


@pytest.mark.parametrize("op", ["__iadd__", "__isub__", "__imul__", "__itruediv__"])
def test_in_place_update_that_broadcasts_x(backend, op):
    """``mask += bias`` with a (4, 4) carried ``mask`` and a (2, 4, 4) ``bias``: MLX
    gives x the broadcast shape in place; the update is double-word, bit for bit the
    out-of-place ``x op y`` (before: declined, x's high word only, reported float32,
    raising under strict=True; mlx-examples' T5 decoder does this). Special values
    (-0, inf, NaN) of x keep through the broadcast."""
    x0 = np.array(rng_f32((4, 4), 41))
    x0[0, :3] = [-0.0, np.inf, np.nan]
    y = rng_f32((2, 4, 4), 42)
    with mp.extended_precision(strict=True) as rep:
        x = mx.array(x0) / 3
        alias = x
        want = getattr(x, op.replace("__i", "__"))(mx.array(y))
        getattr(x, op)(mx.array(y))
        got, ref = value64(x), value64(want)
    assert alias is x and x.shape == (2, 4, 4) and x.dtype == mx.float32
    assert not rep.float32 and rep.extended[op] == 1
    assert np.array_equal(got.view(np.uint64), ref.view(np.uint64))
    fn = {"__iadd__": np.add, "__isub__": np.subtract, "__imul__": np.multiply,
          "__itruediv__": np.divide}[op]
    with np.errstate(all="ignore"):
        exact = fn(x0.astype(LD) / 3, np.asarray(y).astype(LD))
    ok = np.isfinite(exact) & (exact != 0)
    scale = (np.abs(x0.astype(LD) / 3) + np.abs(np.asarray(y).astype(LD))
             if op in ("__iadd__", "__isub__") else np.abs(exact))
    assert np.max(np.abs(got[ok] - exact[ok]) / scale[ok]) < 2.0**-46
    np.testing.assert_array_equal(got[~ok], exact[~ok].astype(np.float64))


@pytest.mark.parametrize("op", ["__iadd__", "__isub__", "__imul__", "__itruediv__"])
def test_in_place_update_that_makes_x_complex(backend, op):
    """``y op= 1j * c`` on a carried float32 ``y``: MLX makes y complex64 in place;
    the update is double-word, bit for bit the out-of-place ``y op v`` (before:
    declined, y's high word only, reported float32)."""
    x0 = np.array(rng_f32((5,), 51))
    x0[0] = -0.0
    with mp.extended_precision(strict=True) as rep:
        y = mx.array(x0) / 3
        v = 1j * (mx.array(rng_f32((5,), 52)) / 7) + 0.5
        alias = y
        want = getattr(y, op.replace("__i", "__"))(v)
        getattr(y, op)(v)
        mx.eval(y, want)
    assert alias is y and y.dtype == mx.complex64
    assert not rep.float32 and rep.extended[op] == 1
    for a, b in ((y, want), (low_word(y), low_word(want))):
        np.testing.assert_array_equal(np.array(a).view(np.uint64), np.array(b).view(np.uint64))
