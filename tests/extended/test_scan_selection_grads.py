"""Double-word VJPs of cumprod, cummax / cummin, partition and topk (and the
forward cummax / cummin of carried values off cpu), against float64 oracles
written out in numpy (products of cofactors, explicit index loops), each gradient
within 2x of the floor (the float64 gradient rounded once to float32, normwise),
reported nowhere and raising nothing under ``strict=True``."""

import itertools

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise.extended import autodiff

from flow_helpers import f64, rng_f32, value64

SCANS = [dict(), dict(reverse=True), dict(inclusive=False), dict(reverse=True, inclusive=False)]


def _floor_check(g, want):
    """``g`` (float32 high words) within 2x of the floor ``|RN32(want) - want|``,
    normwise, and its carried value within 2^-40 of ``want``."""
    hi = f64(g)
    scale = np.linalg.norm(want)
    floor = np.linalg.norm(want.astype(np.float32).astype(np.float64) - want) / scale
    err = np.linalg.norm(hi - want) / scale
    assert err <= 2 * floor + 1e-300, (err, floor)
    np.testing.assert_allclose(value64(g), want, rtol=2**-40, atol=2**-40 * scale)


def _scan_order(n, reverse, inclusive):
    """For each output i of a scan: the inputs it combines, in order."""
    order = range(n - 1, -1, -1) if reverse else range(n)
    order = list(order)
    out = {}
    for pos, i in enumerate(order):
        out[i] = order[:pos + 1] if inclusive else order[:pos]
    return out


def _cumprod_grad(x, w, reverse, inclusive):
    """d/dx_k sum_i w_i prod_{j in S_i} x_j = sum over i with k in S_i of w_i times
    the product of the other factors (float64, no division)."""
    g = np.zeros(len(x))
    for i, s in _scan_order(len(x), reverse, inclusive).items():
        for k in s:
            g[k] += w[i] * np.prod([x[j] for j in s if j != k])
    return g


def _running_grad(x, w, reverse, inclusive, larger):
    """MLX's convention: w_i goes to the last input of S_i (in scan order) equal to
    the extreme of S_i."""
    g = np.zeros(len(x))
    for i, s in _scan_order(len(x), reverse, inclusive).items():
        if not s:
            continue
        ext = max(x[j] for j in s) if larger else min(x[j] for j in s)
        g[[j for j in s if x[j] == ext][-1]] += w[i]
    return g


@pytest.fixture(params=["float64 pass", "flow pass"])
def passes(request, backend, monkeypatch):
    """On cpu both backward passes (float64 values with the flow off; the flow's
    double-word ops); emulate has the flow's only."""
    if request.param == "float64 pass" and backend == "emulate":
        pytest.skip("emulate runs the flow's pass")
    if request.param == "flow pass":
        monkeypatch.setattr(autodiff, "FLOAT64_PASS", False)
    return request.param


@pytest.mark.parametrize("kw", SCANS, ids=str)
@pytest.mark.parametrize("zeros", [(), (3,), (3, 7)], ids=["no zero", "a zero", "two zeros"])
def test_cumprod_gradient(passes, kw, zeros):
    x0 = 1 + 0.25 * rng_f32(11, 1)
    x0[list(zeros)] = 0.0
    w0 = rng_f32(11, 2)
    with mp.extended_precision(strict=True) as rep:
        w = mx.array(w0) / 3
        g = mx.grad(lambda a: (mx.cumprod(a, **kw) * w).sum())(mx.array(x0))
    assert not rep.float32, rep
    _floor_check(g, _cumprod_grad(f64(x0), f64(w0) / 3, kw.get("reverse", False),
                                  kw.get("inclusive", True)))


def test_cumprod_gradient_along_an_axis_and_flattened(passes):
    x0 = 1 + 0.25 * rng_f32((3, 5), 3)
    x0[1, 2] = 0.0
    w0 = rng_f32((3, 5), 4)
    with mp.extended_precision(strict=True):
        w = mx.array(w0) / 3
        g0 = mx.grad(lambda a: (mx.cumprod(a, axis=0) * w).sum())(mx.array(x0))
        gn = mx.grad(lambda a: (mx.cumprod(a) * w.reshape(-1)).sum())(mx.array(x0))
    want0 = np.stack([_cumprod_grad(f64(x0)[:, c], f64(w0)[:, c] / 3, False, True)
                      for c in range(5)], 1)
    _floor_check(g0, want0)
    wantn = _cumprod_grad(f64(x0).reshape(-1), f64(w0).reshape(-1) / 3, False, True)
    _floor_check(gn, wantn.reshape(3, 5))


@pytest.mark.parametrize("kw", SCANS, ids=str)
@pytest.mark.parametrize("op", ["cummax", "cummin"])
def test_running_extreme_gradient(passes, kw, op):
    """Ties (repeated values) follow MLX's convention: the same positions as MLX's
    own float32 VJP (on exact weights)."""
    x0 = np.array([1, 3, 2, 3, 1, 5, 5, 0, -2, 5, 4], np.float32)
    w0 = rng_f32(11, 5)
    fn = (lambda a, w: (getattr(mx, op)(a, **kw) * w).sum())
    with mp.extended_precision(strict=True) as rep:
        w = mx.array(w0) / 3
        g = mx.grad(fn)(mx.array(x0), w)
        g_exact = mx.grad(fn)(mx.array(x0), mx.array(w0))
    assert not rep.float32, rep
    want = _running_grad(f64(x0), f64(w0) / 3, kw.get("reverse", False),
                         kw.get("inclusive", True), op == "cummax")
    _floor_check(g, want)
    mlx_own = np.array(mx.grad(fn)(mx.array(x0), mx.array(w0)))  # MLX's float32 sums
    np.testing.assert_array_equal(np.array(g_exact) != 0, mlx_own != 0)
    np.testing.assert_allclose(np.array(g_exact), mlx_own, rtol=1e-6)


@pytest.mark.parametrize("op", ["cummax", "cummin"])
def test_running_extreme_of_carried_values(backend, op):
    """The forward scan of carried values (float64 on cpu; the flow's exact
    maximum / minimum elsewhere): NaN propagates, Inf and 2^127 are kept, ties in
    the high word are decided by the low word; and its gradient."""
    hi = np.array([1.0, 1.0, 0.5, 1.0, 2.0**127, 1.0, np.inf, np.nan, 3.0], np.float32)
    lo = np.array([1e-9, -1e-9, 0.0, 2e-9, 0.0, 0.0, 0.0, 0.0, 0.0], np.float32)
    ufunc = np.maximum if op == "cummax" else np.minimum
    for kw in SCANS:
        with mp.extended_precision(strict=True) as rep:
            b = mx.array(hi) + mx.array(lo)
            out = getattr(mx, op)(b, **kw)
        assert not rep.float32, rep
        v = value64(b)
        order = list(range(len(v)))[::-1] if kw.get("reverse") else list(range(len(v)))
        run = ufunc.accumulate(v[order])
        if not kw.get("inclusive", True):
            run = np.concatenate([[-np.inf if op == "cummax" else np.inf], run[:-1]])
        want = np.empty_like(run)
        want[order] = run
        np.testing.assert_array_equal(value64(out), want)
    x0 = rng_f32(16, 6)
    with mp.extended_precision(strict=True) as rep:
        g = mx.grad(lambda a: (getattr(mx, op)(a / 3) * mx.arange(16)).sum())(mx.array(x0))
    assert not rep.float32, rep
    want = _running_grad(f64(x0) / 3, np.arange(16.0) / 3, False, True, op == "cummax")
    _floor_check(g, want)


@pytest.mark.parametrize("axis", [-1, 0, None])
def test_partition_and_topk_gradients(passes, axis):
    """g put back where each selected value came from (distinct values: numpy's
    argsort is the oracle of the positions)."""
    x0 = rng_f32((4, 9), 7)
    ax = -1 if axis is None else axis
    xs = x0.reshape(-1) if axis is None else x0
    n = xs.shape[ax]
    kth, k = 3, 4
    wp0 = rng_f32(xs.shape, 8)
    wt0 = rng_f32([k if d == ax % xs.ndim else s for d, s in enumerate(xs.shape)], 9)
    with mp.extended_precision(strict=True) as rep:
        wp, wt = mx.array(wp0) / 3, mx.array(wt0) / 3
        x = mx.array(x0)
        part = mx.partition(x, kth, axis=axis)
        gp = mx.grad(lambda a: (mx.partition(a, kth, axis=axis) * wp).sum())(x)
        gt = mx.grad(lambda a: (mx.topk(a, k, axis=axis) * wt).sum())(x)
    assert not rep.float32, rep
    order = np.argsort(xs, axis=ax)
    # partition: the kth sorted value at kth, the ones below it before, above after
    parted = f64(part)
    idx = np.array(mx.argpartition(mx.array(x0), kth, axis=axis))
    np.testing.assert_array_equal(parted, np.take_along_axis(f64(xs), idx, axis=ax))
    want = np.zeros(xs.shape)
    np.put_along_axis(want, idx, f64(wp0) / 3, axis=ax)
    _floor_check(gp, want.reshape(x0.shape))
    # topk: the k largest, MLX's order of them (its argpartition at -k)
    top = np.take(np.array(mx.argpartition(mx.array(xs), -k, axis=ax)),
                  range(n - k, n), axis=ax)
    np.testing.assert_array_equal(np.sort(np.take_along_axis(xs, top, axis=ax), axis=ax),
                                  np.take_along_axis(xs, np.take(order, range(n - k, n),
                                                                 axis=ax), axis=ax))
    want = np.zeros(xs.shape)
    np.put_along_axis(want, top, f64(wt0) / 3, axis=ax)
    _floor_check(gt, want.reshape(x0.shape))


def test_selection_of_carried_values_and_argsort_gather(backend):
    """Carried values: sorted by the gather the rule records; argsort + take_along_axis
    too; the gradients at the floor."""
    x0, w0 = rng_f32(12, 10), rng_f32(12, 11)
    with mp.extended_precision(strict=True) as rep:
        w = mx.array(w0) / 3
        g1 = mx.grad(lambda a: (mx.topk(a / 3, 5) * w[:5]).sum())(mx.array(x0))
        g2 = mx.grad(lambda a: (mx.take_along_axis(a, mx.argsort(a), 0) * w).sum())(
            mx.array(x0))
        g3 = mx.grad(lambda a: (mx.partition(a * 0.1, 6) * w).sum())(mx.array(x0))
    assert not rep.float32, rep
    order = np.argsort(x0)
    want = np.zeros(12)
    want[order[-5:]] = f64(w0)[:5] / 3 / 3  # MLX's topk order: increasing
    _floor_check(g1, want)
    want = np.zeros(12)
    want[order] = f64(w0) / 3
    _floor_check(g2, want)
    want = np.zeros(12)
    want[order] = f64(w0) / 3 * 0.1
    _floor_check(g3, want)


def test_strict_does_not_raise_on_the_new_gradients():
    for backend, op in itertools.product(["cpu", "emulate"], ["cumprod", "cummax", "cummin"]):
        with mp.use_backend(backend), mp.extended_precision(strict=True) as rep:
            mx.eval(mx.grad(lambda a: getattr(mx, op)(a / 3).sum())(mx.array(rng_f32(5, 12))))
        assert not rep.float32 and rep.extended[op] >= 1, rep
