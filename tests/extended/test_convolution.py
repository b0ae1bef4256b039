"""Dense, grouped and transposed convolutions inside extended_precision()
(mlx_precise.extended.rules.convolution): exactly rounded against float64 oracles, on
cpu and emulate, as functions and as mlx.nn layers, with gradients.

Oracles: direct convolution loops in numpy float64 from the same float32 inputs
(products of float32 values are exact in float64; sums of a few hundred terms err
by ~1e-16 relative), rounded once to float32.
"""

import itertools
import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlx_precise as mp
from flow_helpers import f64, rng_f32, share
from mlx_precise.core import backends
from mlx_precise.extended import low_word, rules
from mlx_precise.extended.rules import convolution

U = 2.0 ** -24  # float32's unit roundoff


def normwise(y, ref) -> float:
    return float(np.linalg.norm(f64(y) - ref) / np.linalg.norm(ref))


# ---- float64 oracles ---------------------------------------------------------------------

def ref_conv(x, w, stride, lo, hi, dilation, groups):
    """Cross-correlation (MLX's conv): x (N, *S, Cin), w (Cout, *K, Cin/G) float64,
    zero padding lo / hi per spatial dimension."""
    x = np.pad(x, [(0, 0), *zip(lo, hi), (0, 0)])
    Cout, kernel, Cg = w.shape[0], w.shape[1:-1], w.shape[-1]
    Og = Cout // groups
    out = [(n - d * (k - 1) - 1) // s + 1
           for n, k, s, d in zip(x.shape[1:-1], kernel, stride, dilation)]
    y = np.zeros((x.shape[0], *out, Cout))
    for tap in itertools.product(*(range(k) for k in kernel)):
        idx = (slice(None),) + tuple(slice(t * d, t * d + (o - 1) * s + 1, s)
                                     for t, d, o, s in zip(tap, dilation, out, stride))
        xs = x[idx]
        for g in range(groups):
            y[..., g * Og:(g + 1) * Og] += (xs[..., g * Cg:(g + 1) * Cg]
                                            @ w[(slice(g * Og, (g + 1) * Og),) + tap].T)
    return y


def ref_transpose(x, w, stride, padding, dilation, output_padding, groups):
    """y[j] = sum over i s + k d - p = j of x[i] w[k] (MLX's conv_transpose)."""
    Cout, kernel, Cg = w.shape[0], w.shape[1:-1], w.shape[-1]
    Og = Cout // groups
    out = [(n - 1) * s - 2 * p + d * (k - 1) + op + 1 for n, k, s, p, d, op in
           zip(x.shape[1:-1], kernel, stride, padding, dilation, output_padding)]
    y = np.zeros((x.shape[0], *out, Cout))
    for i in itertools.product(*(range(n) for n in x.shape[1:-1])):
        for tap in itertools.product(*(range(k) for k in kernel)):
            j = tuple(a * s + t * d - p for a, s, t, d, p in zip(i, stride, tap, dilation, padding))
            if all(0 <= b < o for b, o in zip(j, out)):
                for g in range(groups):
                    y[(slice(None),) + j + (slice(g * Og, (g + 1) * Og),)] += (
                        x[(slice(None),) + i + (slice(g * Cg, (g + 1) * Cg),)]
                        @ w[(slice(g * Og, (g + 1) * Og),) + tap].T)
    return y


def check(y, ref, rep, name):
    """Exactly rounded (>= 99% of outputs; the rest double roundings of near-ties),
    normwise error of the final rounding alone, extended without a float32 drop."""
    assert y.shape == ref.shape and y.dtype == mx.float32
    assert share(y, ref) >= 0.99, (name, share(y, ref))
    assert normwise(y, ref) <= U, (name, normwise(y, ref))
    assert rep.extended[name] >= 1 and not rep.float32, rep


# ---- the functions -----------------------------------------------------------------------

# (Cin, Cout, groups, K, stride, padding, dilation)
CONV1D = [(4, 6, 1, 3, 1, 0, 1), (4, 8, 1, 5, 2, 2, 1), (6, 6, 2, 3, 1, 2, 2),
          (8, 4, 4, 4, 3, 1, 1)]


@pytest.mark.parametrize("cfg", CONV1D, ids=lambda c: "Cin{}Cout{}g{}K{}s{}p{}d{}".format(*c))
def test_conv1d(backend, cfg):
    Cin, Cout, G, K, s, p, d = cfg
    x, w = rng_f32((2, 32, Cin), 1), rng_f32((Cout, K, Cin // G), 2)
    ref = ref_conv(f64(x), f64(w), (s,), (p,), (p,), (d,), G)
    with mp.extended_precision() as rep:
        y = mx.conv1d(mx.array(x), mx.array(w), s, p, d, G)
    check(y, ref, rep, "conv1d")
    assert share(mx.conv1d(mx.array(x), mx.array(w), s, p, d, G), ref) < 0.9  # float32


def test_conv1d_reads_carried_words_and_keyword_arguments(backend):
    """The input x / 3 carries a low word; the result carries one on."""
    x, w = rng_f32((2, 24, 4), 3), rng_f32((5, 3, 4), 4)
    with mp.extended_precision() as rep:
        y = mx.conv1d(mx.array(x) / 3, mx.array(w), padding=1, stride=2, stream=None)
    check(y, ref_conv(f64(x) / 3, f64(w), (2,), (1,), (1,), (1,), 1), rep, "conv1d")
    assert low_word(y) is not None


CONV2D = [(3, 4, 1, (3, 3), 1, 1, 1), (4, 6, 2, (3, 2), (2, 1), (1, 0), (1, 2)),
          (4, 4, 4, (3, 3), 1, 1, 1)]


@pytest.mark.parametrize("cfg", CONV2D, ids=["dense", "grouped-tuples", "depthwise"])
def test_conv2d(backend, cfg):
    Cin, Cout, G, K, s, p, d = cfg
    tup = (lambda v: (v, v) if isinstance(v, int) else v)
    x, w = rng_f32((2, 9, 8, Cin), 5), rng_f32((Cout, *K, Cin // G), 6)
    ref = ref_conv(f64(x), f64(w), tup(s), tup(p), tup(p), tup(d), G)
    with mp.extended_precision() as rep:
        y = mx.conv2d(mx.array(x), mx.array(w), s, p, d, G)
    check(y, ref, rep, "conv2d")


# (Cin, Cout, groups, K, stride, padding, dilation, output_padding)
TRANSPOSE1D = [(8, 4, 1, 4, 2, 1, 1, 0),  # a vocoder's 2x upsampler (K = 2 s, p = s / 2)
               (4, 6, 2, 3, 3, 2, 2, 1), (6, 4, 1, 8, 4, 2, 1, 0), (4, 4, 1, 2, 3, 0, 1, 0)]


@pytest.mark.parametrize("cfg", TRANSPOSE1D,
                         ids=lambda c: "Cin{}Cout{}g{}K{}s{}p{}d{}op{}".format(*c))
def test_conv_transpose1d(backend, cfg):
    Cin, Cout, G, K, s, p, d, op = cfg
    x, w = rng_f32((2, 16, Cin), 7), rng_f32((Cout, K, Cin // G), 8)
    ref = ref_transpose(f64(x), f64(w), (s,), (p,), (d,), (op,), G)
    with mp.extended_precision() as rep:
        y = mx.conv_transpose1d(mx.array(x), mx.array(w), s, p, d, op, G)
    check(y, ref, rep, "conv_transpose1d")


def test_conv3d_transpose2d_and_general(backend):
    x3, w3 = rng_f32((1, 5, 4, 6, 2), 9), rng_f32((3, 2, 3, 2, 2), 10)
    x2, w2 = rng_f32((2, 5, 4, 4), 11), rng_f32((4, 3, 4, 2), 12)
    xg, wg = rng_f32((2, 9, 4), 13), rng_f32((6, 3, 2), 14)
    with mp.extended_precision() as rep:
        y3 = mx.conv3d(mx.array(x3), mx.array(w3), (1, 2, 1), 1, 1)
        y2 = mx.conv_transpose2d(mx.array(x2), mx.array(w2), (2, 3), (1, 0), 1, (1, 0), 2)
        yg = mx.conv_general(mx.array(xg), mx.array(wg), stride=2, padding=([2], [1]),
                             kernel_dilation=2, input_dilation=3, groups=2, flip=True)
    check(y3, ref_conv(f64(x3), f64(w3), (1, 2, 1), (1,) * 3, (1,) * 3, (1,) * 3, 1), rep, "conv3d")
    check(y2, ref_transpose(f64(x2), f64(w2), (2, 3), (1, 0), (1, 1), (1, 0), 2), rep,
          "conv_transpose2d")
    xd = np.zeros((2, 25, 4))
    xd[:, ::3] = f64(xg)
    check(yg, ref_conv(xd, f64(wg)[:, ::-1], (2,), (2,), (1,), (2,), 2), rep, "conv_general")


def test_special_values_follow_float32(backend):
    x, w = rng_f32((1, 12, 4), 15), rng_f32((3, 3, 4), 16)
    x[0, 3, 1], x[0, 8, 2] = np.inf, np.nan
    with mp.extended_precision():
        y = np.array(mx.conv1d(mx.array(x), mx.array(w), 1, 1))
    plain = np.array(mx.conv1d(mx.array(x), mx.array(w), 1, 1))
    assert np.array_equal(np.isnan(y), np.isnan(plain))
    assert np.array_equal(np.isinf(y), np.isinf(plain))
    assert np.array_equal(y[np.isinf(y)], plain[np.isinf(plain)])


# 1-D geometries of the one-launch path (rules.convolution.window_correlate,
# _window_transposed_plan): (kind, N, L, Cin, Cout, K, stride, padding, dilation, groups
# or output_padding)
WINDOWED = [("conv1d", 2, 9, 4, 6, 3, 1, 1, 1, 1), ("conv1d", 1, 13, 6, 4, 5, 2, 2, 1, 2),
            ("conv1d", 2, 20, 3, 5, 3, 1, 3, 3, 1), ("conv1d", 1, 7, 8, 4, 7, 1, 3, 1, 4),
            ("conv1d", 2, 40, 33, 35, 3, 3, 0, 2, 1), ("conv1d", 1, 3, 2, 3, 5, 1, 4, 1, 1),
            ("conv_transpose1d", 2, 9, 8, 4, 16, 8, 4, 1, 0),  # the vocoder's upsamplers
            ("conv_transpose1d", 1, 12, 6, 3, 8, 4, 2, 1, 0),
            ("conv_transpose1d", 1, 5, 3, 2, 4, 2, 1, 1, 1),
            ("conv_transpose1d", 2, 7, 4, 5, 3, 1, 1, 1, 0),
            ("conv_transpose1d", 1, 6, 3, 3, 6, 3, 0, 1, 0)]


@pytest.mark.parametrize("special", [False, True], ids=["finite", "special"])
@pytest.mark.parametrize("cfg", WINDOWED, ids=lambda c: "{}-N{}L{}Cin{}Cout{}K{}s{}p{}d{}x{}".format(*c))
def test_window_gemm_gives_the_bits_of_the_composition(cfg, special, monkeypatch):
    """On emulate a 1-D convolution is one GEMM launch reading its input's window and
    its weights in place; both words equal, bit for bit, those of the composition it
    replaced (pad, im2col gather, weight rearrangement, dw_gemm, interleave, crop),
    with a carried low word in (the input's; also the weights' with the special
    values), Inf, NaN, -0 and an overflowing sum among the operands."""
    kind, N, L, Cin, Cout, K, s, p, d, extra = cfg
    groups = extra if kind == "conv1d" else 1
    x, w = rng_f32((N, L, Cin), 31), rng_f32((Cout, K, Cin // groups), 32)
    if special:
        x[0, 1, 0], x[-1, L // 2, -1], x[0, -1, Cin // 2] = np.inf, np.nan, -0.0
        w[-1, K // 2, 0], w[0, 0, -1] = -np.inf, 3e38
        x[-1, 0, :] = 3e38  # overflows the sums that meet it
    args = (s, p, d, extra) if kind == "conv_transpose1d" else (s, p, d, groups)
    fn = getattr(mx, kind)
    launched = []

    def words(direct):
        with mp.use_backend("emulate"), monkeypatch.context() as m:
            if direct:
                window = convolution.gemm.window_matmul
                m.setattr(convolution.gemm, "window_matmul",
                          lambda *a, **k: launched.append(1) or window(*a, **k))
            else:
                m.setattr(convolution, "_direct", lambda *a: None)
            with mp.extended_precision() as rep:
                wa = mx.array(w) / 7 if special else mx.array(w)  # (a low word too)
                y = fn(mx.array(x) / 3, wa, *args)
                lo = low_word(y)
            assert rep.extended[kind] >= 1 and not rep.float32, rep
            return np.array(y), np.array(lo)

    (yd, ld), (yc, lc) = words(True), words(False)
    assert launched == [1]
    assert yd.shape == tuple(fn(mx.array(x), mx.array(w), *args).shape)
    np.testing.assert_array_equal(yd.view(np.uint32), yc.view(np.uint32))
    np.testing.assert_array_equal(ld.view(np.uint32), lc.view(np.uint32))
    assert np.isnan(yd).any() == special  # (the NaN reached the outputs it meets)


def test_window_gemm_graph_is_one_launch(lazy_metal):
    """On the metal path a conv1d is one launch and nothing else, and so is a
    vocoder's transposed conv1d: the result's words are the two halves of the
    launch's packed output (one slice each), and the GEMM reads exp's packed output
    as it is (no slice of it)."""
    from mlx_precise.testing import graph_counts

    x, w = mx.array(rng_f32((2, 9, 8), 33)), mx.array(rng_f32((4, 16, 8), 34))
    with mp.use_backend("metal"), mp.extended_precision():
        y = mx.conv1d(mx.exp(x), mx.array(rng_f32((4, 3, 8), 35)), 1, 1)
        t = mx.conv_transpose1d(x, w, 8, 4)
        gy, gt = graph_counts(y, low_word(y)), graph_counts(t, low_word(t))
    assert gy["by_primitive"] == {"Depends": 2, "Slice": 2}, gy  # exp, then the GEMM
    assert gt["by_primitive"] == {"Depends": 1, "Slice": 2}, gt


@pytest.mark.parametrize("kind, wshape, args", [("conv1d", (6, 3, 8), (1, 1, 1)),
                                                ("conv_transpose1d", (4, 8, 8), (4, 2))])
def test_window_gemm_under_mlx_grad(kind, wshape, args, monkeypatch):
    """mx.grad of a function that opens a block around the one-launch convolution:
    MLX differentiates it by its own convolution's float32 VJP, so the gradients are
    MLX's plain ones but for the double-word forward value in the cotangent (2 y):
    within 1e-6 relative, and the launch ran."""
    x, w = mx.array(rng_f32((2, 9, 8), 36)), mx.array(rng_f32(wshape, 37))
    launched = []
    window = convolution.gemm.window_matmul
    monkeypatch.setattr(convolution.gemm, "window_matmul",
                        lambda *a, **k: launched.append(1) or window(*a, **k))

    def loss(x, w, extended):
        if not extended:
            return (getattr(mx, kind)(x, w, *args) ** 2).sum()
        with mp.use_backend("emulate"), mp.extended_precision():
            y = getattr(mx, kind)(x, w, *args)
            assert low_word(y) is not None
        return (y ** 2).sum()

    got = mx.grad(lambda x, w: loss(x, w, True), argnums=(0, 1))(x, w)
    want = mx.grad(lambda x, w: loss(x, w, False), argnums=(0, 1))(x, w)
    assert launched == [1]
    for g, ref in zip(got, want):
        assert np.abs(f64(g) - f64(ref)).max() <= 1e-6 * np.abs(f64(ref)).max()


def test_declines_and_errors():
    """Depthwise conv1d is left to the table's dedicated rule; other dtypes and
    MLX's own output-length convention (transpose padding > d (K - 1)) to MLX; an
    invalid call gets MLX's error."""
    ctx = rules.Operands(backends.of("cpu"), None, None)
    x, w = mx.array(rng_f32((1, 10, 4), 17)), mx.array(rng_f32((4, 3, 1), 18))
    assert convolution._CONV1D(ctx, mx.conv1d, x, w, 1, 0, 1, 4) is NotImplemented
    w16 = mx.array(rng_f32((4, 3, 4), 19)).astype(mx.float16)
    assert convolution._CONV1D(ctx, mx.conv1d, x, w16) is NotImplemented
    wt = mx.array(rng_f32((4, 3, 4), 20))
    assert convolution.RULES["conv_transpose1d"](ctx, mx.conv_transpose1d, x, wt, 1,
                                                 3) is NotImplemented
    with mp.extended_precision(), pytest.raises(ValueError):
        mx.conv1d(x, mx.array(rng_f32((4, 3, 3), 21)))  # Cin 4 vs 3


# ---- mlx.nn layers and gradients ------------------------------------------------------------

class Upsampler(nn.Module):
    """A vocoder-style stage: transposed-convolution upsampling, a grouped dilated
    convolution with a residual, a strided 2-D convolution over (time, channel)."""

    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose1d(8, 4, kernel_size=4, stride=2, padding=1)
        self.res = nn.Conv1d(4, 4, kernel_size=3, padding=2, dilation=2, groups=2)
        self.out = nn.Conv1d(4, 2, kernel_size=5, stride=2, padding=2)
        self.img = nn.Conv2d(1, 3, kernel_size=(3, 2), stride=(2, 1), padding=1)

    def __call__(self, x):
        h = self.up(x)
        h = h + self.res(h) * 0.5
        y = self.out(h)
        return self.img(y[..., None])


def upsampler_reference(p: dict, x):
    """The model's math in float64: p (parameter name -> float64 array)."""
    h = ref_transpose(x, p["up.weight"], (2,), (1,), (1,), (0,), 1) + p["up.bias"]
    h = h + (ref_conv(h, p["res.weight"], (1,), (2,), (2,), (2,), 2) + p["res.bias"]) * 0.5
    y = ref_conv(h, p["out.weight"], (2,), (2,), (2,), (1,), 1) + p["out.bias"]
    return ref_conv(y[..., None], p["img.weight"], (2, 1), (1, 1), (1, 1), (1, 1), 1) + p[
        "img.bias"]


def test_nn_layers_and_gradients(backend):
    mx.random.seed(4)
    m = Upsampler()
    x = mx.array(rng_f32((2, 16, 8), 22))
    params = {k: f64(v) for k, v in nn.utils.tree_flatten(m.parameters())}
    ref = upsampler_reference(params, f64(x))
    plain = m(x)
    with mp.extended_precision() as rep:
        y = m(x)
    assert share(y, ref) >= 0.99 and normwise(y, ref) <= U, (share(y, ref), normwise(y, ref))
    assert share(plain, ref) < 0.9 and normwise(plain, ref) > 2 * normwise(y, ref)
    assert not rep.float32, rep
    for name in ("conv_transpose1d", "conv1d", "conv2d"):
        assert rep.extended[name] >= 1, rep
    # gradients (parameters and input) against float64 directional derivatives of
    # the reference (central differences, h = 1e-6: ~1e-10 relative). The backward
    # pass is MLX's float32 VJPs of the sub-ops: float32-accurate, like plain MLX's
    # gradient (both measured <= 8e-9 relative to |g| |d|); tolerance u / 2.
    loss_fn = (lambda model, v: (model(v) ** 2).sum())
    with mp.extended_precision():
        grads = nn.value_and_grad(m, loss_fn)(m, x)[1]
        gx = mx.grad(lambda v: loss_fn(m, v))(x)
    g = {k: f64(v) for k, v in nn.utils.tree_flatten(grads)}
    g["x"], params["x"] = f64(gx), f64(x)
    rng = np.random.default_rng(23)
    for _ in range(3):
        d = {k: rng.standard_normal(v.shape) for k, v in params.items()}

        def loss(t):
            q = {k: params[k] + t * d[k] for k in params}
            return (upsampler_reference(q, q["x"]) ** 2).sum()

        h = 1e-6
        want = (loss(h) - loss(-h)) / (2 * h)
        got = sum(float(np.sum(g[k] * d[k])) for k in params)
        scale = math.sqrt(sum(float(np.sum(v ** 2)) for v in g.values())) * math.sqrt(
            sum(float(np.sum(v ** 2)) for v in d.values()))
        assert abs(got - want) <= U / 2 * scale, (got, want, scale)
