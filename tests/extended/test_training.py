"""Training in double-word: gradients taken in a block differentiate the carried
values (the caller's arrays, low words kept), in double-word, cotangents summed in
double-word; parameters and optimizer state keep their low words across
``optimizer.update`` and across blocks; checkpoints keep them too. Oracles: the
independent float64 numpy implementation in benchmarks/training_oracle.py."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten

import bench_training as bt
import mlx_precise as mp
from mlx_precise.extended import PrecisionDropError, autodiff, low_word
from flow_helpers import rng_f32, value64


BACKENDS = ["cpu", "emulate"]


def test_value_and_grad_sees_the_carried_value():
    w = mx.array([1.0])
    with mp.extended_precision():
        w = w + 2**-30
        f = (lambda v: ((v - 1.0) * 2**30).sum())
        value, g = mx.value_and_grad(f)(w)
        assert float(value) == 1.0 and float(f(w)) == 1.0
    assert float(g[0]) == 2**30


@pytest.mark.parametrize("backend", [*BACKENDS, "cpu, flow pass"])
@pytest.mark.parametrize("case", ["arith chain", "exp", "tanh", "sigmoid", "erf", "matmul",
                                  "conv1d", "layer_norm", "rms_norm", "softmax", "attention",
                                  "cumsum", "param used n times", "recurrence of n steps",
                                  "MLP (GELU, LayerNorm)"])
def test_gradients_at_the_floor(backend, case, monkeypatch):
    """Each gradient taken in the block is within 2x of the floor (the float64
    gradient rounded once to float32, normwise), and its carried value far below.
    On cpu the backward pass runs in float64; "flow pass": the double-word pass
    that metal / emulate run (and a gradient inside a gradient, on cpu too)."""
    if backend == "cpu, flow pass":
        monkeypatch.setattr(autodiff, "FLOAT64_PASS", False)
        backend = "cpu"
    chain = 16 if backend == "emulate" else 300
    r = bt.measure_case(case, backends=(backend,), chain=chain)
    got = r[backend]
    assert "error" not in got, got
    assert got["err"] <= 2 * r["floor"], (case, got["err"] / r["floor"])
    assert got["dw_err"] <= r["floor"] / 100, (case, got["dw_err"] / r["floor"])
    assert not got["float32"], got["float32"]


@pytest.mark.parametrize("name", ["sgd-momentum", "adam", "adamw"])
def test_training_trajectory_at_the_floor(name):
    """Steps of the benchmark MLP on cpu stay at the floor where float32 drifts
    past 3x it. Fewer steps than a backward pass is seen before it compiles
    (autodiff.COMPILE_AT): its compiled replay gives the op-by-op pass's bits
    (tests/extended/test_compiled_pass.py), and compiling it costs a cold suite
    about 30 s of MLX's C++ compiler."""
    steps = autodiff.COMPILE_AT - 1
    r = bt.run_training(name, steps=steps, backend="cpu", burst=steps)
    assert r["cpu"]["err"] <= 3 * r["floor"], r["cpu"]["err"] / r["floor"]
    assert r["plain"]["err"] > 3 * r["floor"]  # float32 is not
    assert not r["cpu"]["float32"]


def test_training_trajectory_on_emulate():
    r = bt.run_training("adam", steps=3, backend="emulate", burst=1)
    assert r["emulate"]["err"] <= 3 * r["floor"], r["emulate"]["err"] / r["floor"]


def _mlp():
    mx.random.seed(3)
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
    x, y = mx.array(rng_f32((16, 4), 1)), mx.array(rng_f32((16, 2), 2))
    return model, x, y


def _loss(model, x, y):
    return nn.losses.mse_loss(model(x), y)


def test_parameters_and_optimizer_state_keep_their_low_words():
    model, x, y = _mlp()
    opt = optim.Adam(learning_rate=1e-2)
    step = nn.value_and_grad(model, _loss)  # made outside the block, as usual
    for _ in range(3):
        with mp.extended_precision() as rep:
            before = dict(tree_flatten(model.parameters()))
            loss, grads = step(model, x, y)
            # the model's arrays now are the gradient's aliases: same values, low words
            for k, a in tree_flatten(model.parameters()):
                np.testing.assert_array_equal(value64(a), value64(before[k]))
            opt.update(model, grads)
        assert not rep.float32, rep
    assert all(low_word(a) is not None for _, a in tree_flatten(model.parameters()))
    assert all(low_word(a) is not None for k, a in tree_flatten(opt.state)
               if k.endswith((".m", ".v")))


def test_one_block_or_one_per_step_give_the_same_trajectory():
    runs = []
    for per_step in (True, False):
        model, x, y = _mlp()
        opt = optim.AdamW(learning_rate=1e-2)
        step = nn.value_and_grad(model, _loss)
        if per_step:
            for _ in range(4):
                with mp.extended_precision():
                    opt.update(model, step(model, x, y)[1])
        else:
            with mp.extended_precision():
                for _ in range(4):
                    opt.update(model, step(model, x, y)[1])
        runs.append({k: value64(a) for k, a in tree_flatten(model.parameters())})
    for k in runs[0]:
        np.testing.assert_array_equal(runs[0][k], runs[1][k])


def test_bias_correction_power_is_extended():
    t = mx.array(7)
    with mp.extended_precision() as rep:
        c = 1 - 0.999 ** t
    assert rep.extended["__rpow__"] == 1 and not rep.float32
    # 0.999 ** 7 to ~2^-48 relative; the subtraction from 1 is exact (float32 gives 1.2e-5)
    assert abs(value64(c) - (1 - 0.999 ** 7)) <= 2**-46


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_checkpoint_keeps_the_low_words(tmp_path, suffix):
    model, x, y = _mlp()
    opt = optim.Adam(learning_rate=1e-2)
    with mp.extended_precision():
        opt.update(model, nn.value_and_grad(model, _loss)(model, x, y)[1])
    weights = dict(tree_flatten(model.parameters()))
    mp.save_extended(tmp_path / f"w{suffix}", model.parameters())
    mp.save_extended(tmp_path / f"s{suffix}", opt.state)
    back = dict(tree_flatten(mp.load_extended(tmp_path / f"w{suffix}")))
    state = dict(tree_flatten(mp.load_extended(tmp_path / f"s{suffix}")))
    assert set(back) == set(weights)
    for k in weights:
        np.testing.assert_array_equal(value64(back[k]), value64(weights[k]))
        assert low_word(back[k]) is not None
    for k, a in tree_flatten(opt.state):
        np.testing.assert_array_equal(value64(state[k]), value64(a))
    with pytest.raises(ValueError, match="must end in"):
        mp.save_extended(tmp_path / "w.bin", model.parameters())


def test_gradient_without_a_double_word_rule_is_reported_and_strict_raises():
    x = mx.array(rng_f32(8, 3))
    f = (lambda a: mx.minmax(a * 3.0)[1] * 2.0)  # cpu: float64 forward, no derivative
    with mp.extended_precision() as rep:
        g = mx.grad(f)(x)
    assert rep.float32["minmax (gradient)"] == 1
    np.testing.assert_array_equal(np.array(g), np.array(mx.grad(f)(x)))
    with pytest.raises(PrecisionDropError):
        with mp.extended_precision(strict=True):
            mx.grad(f)(x)


def _minmax_loss(a):
    return mx.minmax(a / 3)[1]  # minmax has a rule (cpu), not a double-word VJP


@mx.custom_function
def _doubled(a, scale=None):
    return a * 2  # called with a keyword: MLX's call, on new arrays (float32 VJP)


def _update_through_an_op_without_a_rule(a):
    return a - 0.1 * mx.from_fp8(mx.to_fp8(a / 3), mx.float32)  # through float8


@pytest.mark.parametrize("backend", [*BACKENDS, "cpu, flow pass"])
@pytest.mark.parametrize("case", ["VJP without a rule", "custom function",
                                  "update without a rule"])
def test_strict_raises_where_training_would_pass_through_float32(backend, case, monkeypatch):
    """Under ``strict=True`` a gradient through an op without a double-word VJP, a
    gradient through a function the flow cannot see into, and a parameter update
    through an op without a rule raise PrecisionDropError; without strict each is
    reported under float32."""
    if backend == "cpu, flow pass":
        monkeypatch.setattr(autodiff, "FLOAT64_PASS", False)
        backend = "cpu"
    x = mx.array(np.linspace(0.1, 1, 8, dtype=np.float32))
    run, name = {
        "VJP without a rule": (lambda: mx.grad(_minmax_loss)(x), "minmax (gradient)"),
        "custom function": (lambda: mx.grad(lambda a: _doubled(a / 3, scale=x).sum())(x),
                            "mx.custom_function (gradient)"),
        "update without a rule": (lambda: _update_through_an_op_without_a_rule(x / 3),
                                  "to_fp8"),
    }[case]
    with mp.use_backend(backend), mp.extended_precision() as rep:
        mx.eval(run())
    assert rep.float32[name] >= 1, rep
    with pytest.raises(PrecisionDropError):
        with mp.use_backend(backend), mp.extended_precision(strict=True):
            run()


def test_gradients_outside_blocks_are_mlx_own():
    """Outside any block (after one was opened and closed), every transform is
    MLX's: the same bits as MLX's own functions."""
    x = mx.array(rng_f32(16, 4))
    f = (lambda a: (mx.exp(a) * mx.sin(a)).sum())
    g = (lambda a: mx.exp(a) * mx.sin(a))
    from mlx_precise.core.plain import plain

    with mp.extended_precision():
        mx.grad(f)(x)
    model, xs, ys = _mlp()
    ours_nn = nn.value_and_grad(model, _loss)(model, xs, ys)
    vg = plain.value_and_grad(lambda p: (model.update(p), _loss(model, xs, ys))[1])
    theirs_nn = vg(model.trainable_parameters())
    pairs = [(mx.grad(f)(x), plain.grad(f)(x)),
             (mx.value_and_grad(f)(x)[1], plain.value_and_grad(f)(x)[1]),
             (mx.vjp(g, [x], [x])[1][0], plain.vjp(g, [x], [x])[1][0]),
             (mx.jvp(g, [x], [x])[1][0], plain.jvp(g, [x], [x])[1][0]),
             (mx.grad(mx.checkpoint(f))(x), plain.grad(plain.checkpoint(f))(x)),
             (mx.compile(mx.grad(f))(x), plain.compile(plain.grad(f))(x)),
             (ours_nn[0], theirs_nn[0])]
    pairs += [(a, b) for (_, a), (_, b) in zip(tree_flatten(ours_nn[1]),
                                               tree_flatten(theirs_nn[1]))]
    assert len(pairs) >= 10
    for ours, theirs in pairs:
        assert np.array_equal(np.array(ours).view(np.uint32), np.array(theirs).view(np.uint32))


@pytest.mark.parametrize("backend", BACKENDS)
def test_mlx_grad_of_a_function_that_opens_a_block_with_ffts(backend):
    """``mx.grad`` (MLX's: no block is open where it is called) of a function whose
    block runs FFTs: the transforms' VJP is that of their float32 form at the high
    words (on cpu too, where the float64 transform runs on the host, out of MLX's
    autodiff; it raised there, and on emulate the VJP read a lone input as a list:
    IndexError). Against the float64 gradient of sum |fft(x)| (Re(fft^H (y / |y|)))
    within float32's rounding of the forward values."""
    xs = rng_f32((3, 64), seed=7)
    x = mx.array(xs)

    def loss(v):
        with mp.extended_precision():
            return mx.abs(mx.fft.fft(v)).sum() + mx.fft.irfft(mx.fft.rfft(v) * 2).sum()

    with mp.use_backend(backend):
        got = np.array(mx.grad(loss)(x), np.float64)
    y = np.fft.fft(xs.astype(np.float64), axis=-1)
    want = np.real(np.fft.ifft(y / np.abs(y), axis=-1)) * 64 + 2.0
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want)), np.max(np.abs(got - want))


_MLX_GRAD_OPS = {
    "arithmetic": lambda v, w: ((v + 1.5) * v / 3.0).sum(),
    "var, mean": lambda v, w: mx.var(v, axis=-1).sum() + mx.mean(v),
    "softmax": lambda v, w: (mx.softmax(v, axis=-1) * w).sum(),
    "logsumexp": lambda v, w: mx.logsumexp(v, axis=-1).sum(),
    "addmm": lambda v, w: (mx.addmm(w, v, v.T[:, :1] * w) ** 2).sum(),
    "layer_norm": lambda v, w: (mx.fast.layer_norm(v, w, w, 1e-5) * w).sum(),
    "rms_norm": lambda v, w: (mx.fast.rms_norm(v, w, 1e-5) * w).sum(),
    "exp, sin, sigmoid, erf": lambda v, w: (mx.exp(v) * mx.sin(v) + mx.sigmoid(v) * mx.erf(v)
                                            ).sum(),
    "power, rsqrt": lambda v, w: (v ** 2.5 + mx.rsqrt(v)).sum(),
    "attention": lambda v, w: (mx.fast.scaled_dot_product_attention(
        v[None, None], v[None, None], v[None, None], scale=0.3) ** 2).sum(),
}


@pytest.mark.parametrize("backend", BACKENDS)
def test_mlx_grad_of_a_function_that_opens_a_block(backend):
    """``mx.grad`` (MLX's) of functions whose block runs elementary functions,
    softmax, norms and attention: on cpu their float64 formulas build powers of two
    from exponent bits, which MLX cannot differentiate ("[Primitive::vjp] Not
    implemented for View float64"), and a fused chain with one leaf read MLX's lone
    primal as a list on emulate; now each takes its float32 VJP at the high words.
    Against MLX's own float64 gradient of the same function on the CPU."""
    rng = np.random.default_rng(5)
    x = mx.array(rng.uniform(0.2, 1.5, (4, 8)).astype(np.float32))
    w = mx.array(rng.standard_normal(8).astype(np.float32))
    for name, f in _MLX_GRAD_OPS.items():
        with mx.stream(mx.cpu):
            want = np.array(mx.grad(f)(x.astype(mx.float64), w.astype(mx.float64)))

        def opens_a_block(v):
            with mp.extended_precision():
                return f(v, w)

        with mp.use_backend(backend):
            got = np.array(mx.grad(opens_a_block)(x), np.float64)
        err = np.max(np.abs(got - want)) / np.max(np.abs(want))
        assert err <= 2e-6, (name, err)


def test_a_gradient_taken_outside_the_block_is_reported():
    """MLX's gradient of a function that opens a block is float32's (each op's
    VJP at its high words): the block reports it under float32 and strict=True
    raises; the gradient taken inside the block reports nothing of the kind."""
    x = mx.array(rng_f32((4, 8), seed=2))
    reports = []

    def loss(v, strict=False):
        with mp.extended_precision(strict=strict) as report:
            reports.append(report)
            return (mx.exp(v) * v).sum()

    mx.grad(loss)(x)
    assert reports[-1].float32["gradient (MLX's autodiff, outside the block)"] == 1
    with pytest.raises(PrecisionDropError, match="gradient .MLX's autodiff"):
        mx.grad(lambda v: loss(v, strict=True))(x)
    with mp.extended_precision(strict=True) as outer:
        mx.grad(loss)(x)  # (the flow's reverse mode)
    assert not reports[-1].float32 and not outer.float32
    mx.checkpoint(loss)(x)  # (no gradient taken: nothing to report)
    assert not reports[-1].float32
    mx.grad(mx.checkpoint(loss))(x)
    assert reports[-1].float32["gradient (MLX's autodiff, outside the block)"] == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_vjp_jvp_argnums_and_argnames(backend):
    a, b = mx.array(rng_f32(6, 5)), mx.array(rng_f32(6, 6))

    def f(p, q, *, r):
        return (mx.sin(p) * q * r).sum()

    r = mx.array(rng_f32(6, 7))
    a64, b64, r64 = (np.array(v).astype(np.float64) for v in (a, b, r))
    with mp.use_backend(backend), mp.extended_precision():
        (ga, gb), kw = mx.grad(f, argnums=(0, 1), argnames="r")(a, b, r=r)
        outs, (va,) = mx.vjp(lambda p: mx.sin(p) * b, [a], [mx.ones_like(a)])
        _, (ja,) = mx.jvp(lambda p: mx.sin(p) * b, [a], [mx.ones_like(a)])
    tol = 2**-44
    np.testing.assert_allclose(value64(ga), np.cos(a64) * b64 * r64, rtol=tol)
    np.testing.assert_allclose(value64(gb), np.sin(a64) * r64, rtol=tol)
    np.testing.assert_allclose(value64(kw["r"]), np.sin(a64) * b64, rtol=tol)
    np.testing.assert_allclose(value64(va), np.cos(a64) * b64, rtol=tol)
    np.testing.assert_allclose(value64(ja), np.cos(a64) * b64, rtol=tol)


def test_in_place_updates_inside_a_gradient():
    """``h += e`` and ``h[i] = v`` in a differentiated function: the ops that read
    h's old value keep it, and the update is differentiated."""
    x = mx.array(rng_f32(6, 8))

    def f(a):
        h = a * 2.0
        s = h * a  # reads h before the update
        h += a * a
        h[0] = a[1] * 3.0
        return (h * s).sum()

    x64 = np.array(x).astype(np.float64)
    h = 2 * x64 + x64 ** 2
    h[0] = 3 * x64[1]
    s = 2 * x64 ** 2
    # d/da of sum(h * s) by hand
    dh = (2 + 2 * x64) * s
    dh[0] = 0.0
    g = dh + h * 4 * x64
    g[1] += 3 * s[0]
    with mp.use_backend("cpu"), mp.extended_precision() as rep:
        got = mx.grad(f)(x)
    assert not rep.float32, rep
    np.testing.assert_allclose(value64(got), g, rtol=2**-44, atol=2**-44 * np.abs(g).max())


def test_checkpoint_bad_input(tmp_path):
    """Clear errors: a key ending in the low-word suffix, a non-array leaf, a low
    word without its array or of another shape."""
    with pytest.raises(ValueError, match="ends in '@lo'"):
        mp.save_extended(tmp_path / "a.npz", {"w@lo": mx.zeros((2,))})
    with pytest.raises(ValueError, match="not an mx.array"):
        mp.save_extended(tmp_path / "a.npz", {"w": 3.0})
    mx.savez(str(tmp_path / "orphan.npz"), **{"w@lo": mx.zeros((2,))})
    with pytest.raises(ValueError, match="without their arrays"):
        mp.load_extended(tmp_path / "orphan.npz")
    mx.savez(str(tmp_path / "shape.npz"), **{"w": mx.zeros((2,)), "w@lo": mx.zeros((3,))})
    with pytest.raises(ValueError, match="low word of 'w'"):
        mp.load_extended(tmp_path / "shape.npz")


@pytest.mark.parametrize("backend", BACKENDS)
def test_complex_matmul_and_exp_gradients(backend):
    """Complex matmul and exp (the FNO's and S4D's) have double-word VJPs: MLX's
    convention, the conjugate of the holomorphic derivative (closed forms in
    complex128)."""
    rng = np.random.default_rng(5)

    def c64(*shape):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(
            np.complex64)

    a, b, g = c64(3, 4), c64(4, 2), c64(3, 2)
    a128, b128, g128 = (v.astype(np.complex128) for v in (a, b, g))
    G = mx.array(g)
    with mp.use_backend(backend), mp.extended_precision() as rep:
        ga, gb = mx.grad(lambda p, q: mx.sum(mx.real(G * (p @ q))), argnums=(0, 1))(
            mx.array(a), mx.array(b))
        ge = mx.grad(lambda p: mx.sum(mx.real(G[:, :1] * mx.exp(p * 0.3))))(mx.array(a))
    assert not rep.float32, rep
    for got, want in ((ga, np.conj(g128 @ b128.T)), (gb, np.conj(a128.T @ g128)),
                      (ge, np.conj(g128[:, :1] * 0.3 * np.exp(0.3 * a128)))):
        value = np.array(got).astype(np.complex128) + np.array(low_word(got))
        np.testing.assert_allclose(value, want, rtol=0, atol=2**-44 * np.abs(want).max())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("axis", [-1, 0, None])
def test_sort_gradient_is_the_permutation_undone(backend, axis):
    """d/dx sum(sort(x) * c) puts c back where each value came from, keeping c's
    low word (c = w / 3 carries one), for x exact and x carrying a low word."""
    x0, w0 = rng_f32((3, 7), 21), rng_f32((3, 7) if axis is not None else 21, 22)
    ax = -1 if axis is None else axis
    for scale in (1.0, 3.0):
        with mp.use_backend(backend), mp.extended_precision() as rep:
            c = mx.array(w0) / 3
            g = mx.grad(lambda a: (mx.sort(a / scale, axis=axis) * c).sum())(mx.array(x0))
        assert not rep.float32, rep
        xs = x0 if axis is not None else x0.reshape(-1)
        want = np.zeros(w0.shape)
        np.put_along_axis(want, np.argsort(xs, axis=ax, kind="stable"),
                          w0.astype(np.float64) / 3 / scale, axis=ax)
        np.testing.assert_allclose(value64(g), want.reshape(x0.shape), rtol=2**-44, atol=0)


# (name, the op with its arguments passed by keyword, numpy's same op) on a (3, 4) x
KEYWORD_OPS = {
    "repeat": (lambda x: mx.repeat(x, repeats=2, axis=1), lambda x: np.repeat(x, 2, axis=1)),
    "repeat, flat": (lambda x: mx.repeat(x, repeats=3), lambda x: np.repeat(x, 3)),
    "take": (lambda x: mx.take(x, indices=mx.array([2, -1, 2]), axis=1),
             lambda x: np.take(x, [2, -1, 2], axis=1)),
    "split": (lambda x: mx.split(x, indices_or_sections=[1, 3], axis=1)[1],
              lambda x: np.split(x, [1, 3], axis=1)[1]),
    "sum": (lambda x: mx.sum(x, axis=0, keepdims=True), lambda x: x.sum(0, keepdims=True)),
    "pad": (lambda x: mx.pad(x, pad_width=[(1, 0), (0, 2)]),
            lambda x: np.pad(x, [(1, 0), (0, 2)])),
    "moveaxis": (lambda x: mx.moveaxis(x, source=0, destination=1),
                 lambda x: np.moveaxis(x, 0, 1)),
    "cumsum": (lambda x: mx.cumsum(x, axis=1, reverse=True),
               lambda x: np.cumsum(x[:, ::-1], axis=1)[:, ::-1]),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(KEYWORD_OPS))
def test_gradients_of_ops_called_with_keyword_arguments(backend, name):
    """The VJP rules read an op's arguments by position: one called with keywords
    (``mx.repeat(x, repeats=2, axis=1)``, mlx-examples' SAM) raised a ValueError in
    the block's gradient (plain MLX takes it). The gradient of ``sum(f(x) * w)`` for a
    linear f is f's transpose applied to w: here from numpy's f on the unit vectors,
    in long double (exact: sums of w's entries)."""
    f, f_np = KEYWORD_OPS[name]
    x0 = rng_f32((3, 4), 81)
    shape = f_np(np.zeros((3, 4))).shape
    w = rng_f32(shape, 82)
    with mp.use_backend(backend), mp.extended_precision(strict=True) as rep:
        x = mx.array(x0) / 3
        g = value64(mx.grad(lambda t: (f(t) * mx.array(w)).sum())(x))
    assert not rep.float32, rep
    basis = np.eye(12).reshape(12, 3, 4)
    jac = np.stack([f_np(b).reshape(-1) for b in basis])  # (12, outputs): 0 / 1
    want = (jac.astype(np.longdouble) @ w.reshape(-1).astype(np.longdouble)).reshape(3, 4)
    np.testing.assert_array_equal(g, want.astype(np.float64))


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_of_an_assignment_whose_value_has_more_axes(backend):
    """``e[0, pos] = f`` with f of shape (1, 4, 16) into a (4, 16) slot (MLX drops the
    leading unit axis; mlx-examples' LLaVA merges its image features so): the
    gradient raised a reshape error in the block (plain MLX takes it). f's gradient
    is w at the slot, x's is w with the slot zeroed (exact: selections of w)."""
    x0, f0, w = rng_f32((2, 7, 16), 91), rng_f32((1, 4, 16), 92), rng_f32((2, 7, 16), 93)
    pos = np.array([1, 2, 4, 6])

    def loss(x, f):
        e = x * 1.0
        e[0, mx.array(pos, mx.uint32)] = f
        return (e * mx.array(w)).sum()

    with mp.use_backend(backend), mp.extended_precision(strict=True) as rep:
        gx, gf = mx.grad(loss, argnums=(0, 1))(mx.array(x0) / 3, mx.array(f0) / 3)
        gx, gf = value64(gx), value64(gf)
    assert not rep.float32, rep
    want_x = w.astype(np.float64).copy()
    want_x[0, pos] = 0.0
    np.testing.assert_array_equal(gx, want_x)
    np.testing.assert_array_equal(gf, w[0, pos][None].astype(np.float64))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["edge", "reflect", "symmetric"])
@pytest.mark.parametrize("pad_width", [2, ((1, 3), (0, 2)), (3, 1)], ids=str)
def test_pad_by_copies_forward_and_gradient(backend, mode, pad_width):
    """``mx.pad(x, w, mode)`` with mode edge / reflect / symmetric (mlx-audio's
    BigVGAN resamplers): was MLX's float32 op, reported (BigVGAN's output 48% exactly
    rounded). The forward moves x's exact values (numpy's pad of them); the gradient
    sums the cotangents of each element's copies, exactly: numpy's pad of the unit
    vectors (its Jacobian, 0 / 1) times the cotangent, in long double."""
    x0 = rng_f32((4, 5), 94)
    out_shape = np.pad(np.zeros((4, 5)), pad_width, mode=mode).shape
    w = rng_f32(out_shape, 95)
    with mp.use_backend(backend), mp.extended_precision(strict=True) as rep:
        x = mx.array(x0) / 3
        y = mx.pad(x, pad_width, mode=mode)
        g = mx.grad(lambda t: (mx.pad(t, pad_width, mode=mode) * mx.array(w)).sum())(x)
        got_y, got_g, x64 = value64(y), value64(g), value64(x)
    assert not rep.float32, rep
    np.testing.assert_array_equal(got_y, np.pad(x64, pad_width, mode=mode))
    jac = np.stack([np.pad(e.reshape(4, 5), pad_width, mode=mode).reshape(-1)
                    for e in np.eye(20)])
    want = (jac.astype(np.longdouble) @ w.reshape(-1).astype(np.longdouble)).reshape(4, 5)
    np.testing.assert_array_equal(got_g, want.astype(np.float64))


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_of_scalar_takes_and_of_reductions_at_nan(backend):
    """``mx.take`` with a Python int index (``mx.median`` takes its middle so) has
    a gradient in a block (it raised AttributeError: 'int' object has no attribute
    'ndim'); max / min of a row holding NaN give a NaN gradient throughout, as MLX's
    (it was 0). Oracle: hand-written gradients and MLX's float32 special values."""
    x = np.array([[1, 5, 3, 4], [2, 7, 1, 6]], np.float32)
    with mp.use_backend(backend), mp.extended_precision(strict=True):
        a = mx.array(x) * 1.0
        g_med = mx.grad(lambda v: mx.median(v, axis=-1).sum())(a)
        g_take = mx.grad(lambda v: (mx.take(v, 2, axis=1) * 3).sum())(a)
        g_flat = mx.grad(lambda v: mx.take(v, 5).sum())(a)
        nan = mx.array(np.array([[np.nan, 1, 2], [1, 2, 3]], np.float32)) * 1.0
        g_max = mx.grad(lambda v: mx.max(v, axis=-1).sum())(nan)
        g_min = mx.grad(lambda v: mx.min(v, axis=-1).sum())(nan)
    want_med = np.array([[0, 0, 0.5, 0.5], [0.5, 0, 0, 0.5]], np.float32)  # (3+4)/2, (2+6)/2
    assert np.array_equal(np.array(g_med), want_med)
    assert np.array_equal(np.array(g_take), np.where(np.arange(4) == 2, 3.0, 0.0)[None].repeat(2, 0))
    assert np.array_equal(np.array(g_flat), (np.arange(8) == 5).reshape(2, 4).astype(np.float32))
    for g in (g_max, g_min):
        g = np.array(g)
        assert np.isnan(g[0]).all() and not np.isnan(g[1]).any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_through_scatter_updates(backend):
    """``x.at[i].add(v)`` (an overlap-add) and ``.subtract`` inside a differentiated
    function: the gradient reaches x and v (it was 0 on cpu, where the update ran in
    float64 out of the tape's sight, and missed v's part on emulate); ``.multiply``
    is differentiated by MLX's float32 VJP and reported. Oracle: the gradient by
    hand in numpy float64."""
    a = (np.arange(1, 7, dtype=np.float64).reshape(2, 3) / 7).astype(np.float32)
    idx = np.array([0, 0, 1])

    def loss(v):
        y = v.at[mx.array(idx)].add(v[0] * 2)
        return (y * y).sum()

    a64 = a.astype(np.float64)
    y = a64.copy()
    np.add.at(y, idx, 2 * a64[0])
    g = 2 * y
    want = g.copy()
    want[0] += 2 * g[idx].sum(axis=0)
    with mp.use_backend(backend), mp.extended_precision(strict=True):
        got = value64(mx.grad(loss)(mx.array(a)))
    assert np.abs(got - want).max() <= 1e-12 * np.abs(want).max()
    with mp.use_backend(backend), mp.extended_precision() as rep:
        g_mul = mx.grad(lambda v: (v.at[0].multiply(v[1]) ** 2).sum())(mx.array(a))
    assert rep.float32["array.at[].multiply (gradient)"] == 1
    assert np.allclose(np.array(g_mul),
                       np.array(mx.grad(lambda v: (v.at[0].multiply(v[1]) ** 2).sum())(
                           mx.array(a))), rtol=1e-6)
