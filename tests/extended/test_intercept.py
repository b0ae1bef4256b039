"""Unmodified MLX code inside extended_precision(): MLX's FFTs and depthwise conv1d
run extended (against numpy float64 / longdouble oracles), MLX stays bit for bit
unchanged outside the block and in other threads, mx.compile / mx.vmap never run
silently plain, and the opt-outs work."""

import asyncio
import os
import subprocess
import sys
import threading
import types

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise import extended_precision
from mlx_precise.extended import intercept

import port_guide
from mlx_fftconv_block import LongConvBlock, fftconv_ref

BACKENDS = ("cpu", "emulate")


def bits(a) -> np.ndarray:
    a = np.array(a)
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


# ---- the unmodified model ----------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_unmodified_model_gains_accuracy(backend):
    """Both blocks (FFT along the last axis / along axis 1, batch 2) against the
    longdouble oracle: wrapped, and ported to mlx_precise.fftconv inside the block,
    every output is exactly rounded (plain: <= 20%); the ported LongConvBlock's
    fftconv reads its short filter's carried output (it read the float32 value, 58%
    exactly rounded, before it took the low words of carried operands)."""
    res = port_guide.measure(backend, batch=2, channels=8, L=2048)
    for key, (share, err) in sorted(res.items()):
        print(f"{backend} {key[0]:>13} {key[1]:>10}: {100 * share:5.1f}% exactly rounded, "
              f"normwise {err:.2e}")
    for blk in ("fftconv_ref", "LongConvBlock"):
        plain_share, plain_err = res[blk, "unmodified"]
        share, err = res[blk, "wrapped"]
        assert plain_share <= 0.20 and plain_err >= 1.4e-7  # the float32 baseline
        assert plain_err / err >= 3.0
        assert share == 1.0 and res[blk, "ported"][0] == 1.0


def _block_and_input(seed=3):
    mx.random.seed(seed)
    block = LongConvBlock(8, 512)
    x = mx.array(np.random.default_rng(seed).standard_normal((2, 512, 8)).astype(np.float32))
    return block, x


def test_plain_mlx_unchanged_outside_and_in_other_threads():
    block, x = _block_and_input()
    u = mx.array(np.random.default_rng(4).standard_normal((2, 4, 300)).astype(np.float32))
    k, D = u[0] * 0.5, mx.ones((4,))
    before = [bits(block(x)), bits(fftconv_ref(u, k, D))]
    inside, other = {}, {}
    entered, done = threading.Event(), threading.Event()

    def worker():  # runs while the main thread holds an extended block open
        entered.wait()
        other["out"] = [bits(block(x)), bits(fftconv_ref(u, k, D))]
        done.set()

    t = threading.Thread(target=worker)
    t.start()
    with mp.use_backend("cpu"), extended_precision():
        entered.set()
        done.wait(60)
        inside["out"] = [bits(block(x)), bits(fftconv_ref(u, k, D))]
        with extended_precision(intercept_mlx=False):
            opt_out = [bits(block(x)), bits(fftconv_ref(u, k, D))]
        with extended_precision(False):
            off = [bits(block(x)), bits(fftconv_ref(u, k, D))]
    t.join()
    after = [bits(block(x)), bits(fftconv_ref(u, k, D))]
    for got in (other["out"], opt_out, off, after):
        assert all((g == b).all() for g, b in zip(got, before))
    assert all((g != b).any() for g, b in zip(inside["out"], before))


def test_mlx_functions_replaced_between_blocks():
    """A replacement of an MLX function or mx.array method made between blocks
    stays in place after the next block (the stand-ins are rebuilt over it, not the
    old originals put back), and the flow still extends the op inside."""
    x = mx.array(np.array([0.1, 2.0, -3.5], np.float32))
    bound = types.ModuleType("bound_before")  # a module that bound mx.exp by name
    bound.exp = mx.exp
    sys.modules[bound.__name__] = bound
    with extended_precision():
        pass
    original_exp, original_neg = mx.exp, mx.array.__neg__
    calls = []

    def exp(a, **kw):
        calls.append("exp")
        return original_exp(a, **kw)

    def neg(a):
        calls.append("neg")
        return original_neg(a)

    try:
        mx.exp, mx.array.__neg__ = exp, neg
        with mp.use_backend("cpu"), extended_precision() as report:
            assert mx.exp is not exp and mx.array.__neg__ is not neg  # the flow's stand-ins
            -mx.exp(x)
            bound.exp(x)  # MLX's own exp, bound before the replacement: extended too
        assert report.extended["exp"] == 2 and report.extended["__neg__"] == 1
        assert mx.exp is exp and mx.array.__neg__ is neg  # the replacements stay
        assert np.array_equal(np.array(-mx.exp(x)), -np.array(original_exp(x)))
        assert calls[-2:] == ["exp", "neg"]  # (inside, the rules call the replacements too)
    finally:
        mx.exp, mx.array.__neg__ = original_exp, original_neg
        del sys.modules[bound.__name__]
    exp_id = id(original_exp)  # (not a name: the block rebinds the names that hold it)
    with extended_precision():
        assert id(mx.exp) != exp_id
    assert mx.exp is original_exp and mx.array.__neg__ is original_neg


def test_plain_mlx_unchanged_in_other_async_tasks():
    block, x = _block_and_input(seed=5)
    before = bits(block(x))

    async def run(extended):
        with mp.use_backend("cpu"), extended_precision(extended):
            await asyncio.sleep(0.01)  # the other task runs here, in its own context
            return bits(block(x))

    async def main():
        return await asyncio.gather(run(True), run(False), run(True))

    ext1, plain, ext2 = asyncio.run(main())
    assert (plain == before).all() and (ext1 == ext2).all() and (ext1 != before).any()


# ---- every mx.fft function and argument ----------------------------------------------


CASES = [  # (name, input kind, args, kwargs)
    ("fft", "c", (), {}),
    ("fft", "r", (), {"n": 20, "axis": 0}),
    ("ifft", "c", (12,), {"axis": -2, "norm": "ortho"}),
    ("rfft", "r", (), {"n": 30, "norm": "forward"}),
    ("rfft", "c", (None, 1), {}),  # complex input: MLX takes the real part
    ("irfft", "c", (), {}),
    ("irfft", "c", (15, 0), {"norm": "ortho"}),
    ("irfft", "c", (), {"n": 40, "norm": "forward"}),
    ("fft2", "c", (), {}),
    ("fft2", "r", ((8, 6),), {"axes": (0, 2), "norm": "forward"}),
    ("ifft2", "c", (), {"s": (10, 7), "norm": "ortho"}),
    ("rfft2", "r", (), {"axes": [2, 0]}),
    ("irfft2", "c", (), {"s": (6, 9)}),
    ("fftn", "c", (), {}),
    ("fftn", "r", (None, [1]), {"norm": "ortho"}),
    ("ifftn", "c", ((5, 4, 16), (0, 1, 2)), {}),
    ("rfftn", "r", (), {"s": (4, 24), "axes": (1, 2), "norm": "forward"}),
    ("irfftn", "c", (), {"axes": (0, 1, 2), "norm": "ortho"}),
    ("irfftn", "c", ((6, 14), (0, 2)), {"stream": mx.cpu}),
]


def _numpy_args(name, a, args, kwargs):
    """The same call for numpy (axis/axes and s/n by name, MLX's casts)."""
    names = ["n", "axis"] if name in ("fft", "ifft", "rfft", "irfft") else ["s", "axes"]
    kw = dict(zip(names + ["norm"], args))
    kw.update({k: v for k, v in kwargs.items() if k != "stream"})
    if name.startswith("rfft"):
        a = a.real
    if "axes" in kw and kw["axes"] is not None:
        kw["axes"] = tuple(kw["axes"])
    if name.endswith("2") and "axes" not in kw:
        kw["axes"] = (-2, -1)
    return a, kw


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_fft_function_is_extended(backend):
    """Each call inside the block is the exact transform rounded once: every
    component within half an ulp of the longdouble oracle (plus 1e-12 max|y| for
    the oracle's and the double-word's own error: exact ties at frequencies with
    twiddles +-1, +-i may round either way), a lower normwise error than plain."""
    rng = np.random.default_rng(5)
    shape = (6, 5, 16)
    for name, kind, args, kwargs in CASES:
        a = rng.standard_normal(shape) + (1j * rng.standard_normal(shape) if kind == "c" else 0)
        a = a.astype(np.complex64 if kind == "c" else np.float32)
        with mp.use_backend(backend), extended_precision():
            y = np.array(getattr(mx.fft, name)(mx.array(a), *args, **kwargs))
        plain = np.array(getattr(mx.fft, name)(mx.array(a), *args, **kwargs))
        na, kw = _numpy_args(name, a.astype(np.clongdouble), args, kwargs)
        ref = getattr(np.fft, name)(na, **kw)
        assert y.shape == ref.shape == plain.shape and y.dtype == plain.dtype, name
        parts = [(np.real(y), np.real(ref))] + ([(y.imag, ref.imag)] if y.dtype == np.complex64
                                                 else [])
        slack = 1e-12 * float(np.abs(ref).max())
        for got, want in parts:
            half_ulp = np.spacing(np.abs(want.astype(np.float32))) / 2
            err = np.abs(got - want).astype(np.float64)
            assert (err <= half_ulp * (1 + 1e-9) + slack).all(), (name, args, kwargs)
        rel = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
        rel_plain = float(np.linalg.norm(plain - ref) / np.linalg.norm(ref))
        assert rel <= 3.5e-8 and rel < rel_plain, (name, rel, rel_plain)


def test_bad_fft_arguments_raise_mlx_errors_inside():
    x = mx.array(np.arange(8, dtype=np.float32))
    with mp.use_backend("cpu"), extended_precision():
        # MLX's own argument checks and messages, inside the block too
        for call in (lambda: mx.fft.rfft(x, axis=3), lambda: mx.fft.fft2(x),
                     lambda: mx.fft.irfft(x, n=0), lambda: mx.fft.fftn(x, norm="bad")):
            with pytest.raises(Exception) as inside:
                call()
            with extended_precision(False), pytest.raises(Exception) as outside:
                call()
            assert (inside.type, str(inside.value)) == (outside.type, str(outside.value))


def test_a_rule_error_leaves_no_reference_cycle(backend):
    """An op whose rule raises (a matmul of mismatched shapes) raises MLX's error,
    and once it is caught and dropped nothing of it is left: no reference cycle
    holds the traceback's frames (the dispatcher re-raised the error from a frame
    that kept it as a local), so no MLX function the frames held is kept until the
    garbage collector runs (the next block would scan the heap for the reference
    that went away)."""
    import gc

    x = mx.ones((3, 4))
    matmul = mx.matmul  # MLX's own (no block is open)

    def fail():
        with extended_precision():
            with pytest.raises(ValueError, match="matmul"):
                mx.matmul(x * 1.5, x * 2.0)

    fail()  # (the first call builds the rule's caches)
    gc.collect()
    gc.disable()
    try:
        before = sys.getrefcount(matmul)
        fail()
        after = sys.getrefcount(matmul)
    finally:
        gc.enable()
    assert after == before


def test_install_once_and_environment_opt_out():
    before = mx.fft.fft, mx.conv1d, mx.compile, mx.array.__setitem__
    intercept.install()
    assert (mx.fft.fft, mx.conv1d, mx.compile, mx.array.__setitem__) == before
    assert intercept.installed() and mx.compile is not intercept.plain.compile
    code = ("import mlx.core as mx; import mlx_precise; from mlx_precise.extended import intercept; "
            "print(intercept.installed(), mx.compile is intercept.plain.compile)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, intercept.ENV_VAR: "0"}, check=True)
    assert out.stdout.split() == ["False", "True"]


# ---- depthwise conv1d ------------------------------------------------------------


def _conv_oracle(x, w, stride, padding, dilation):
    """MLX conv1d semantics (cross-correlation, groups = channels, channel
    multiplier w.shape[0] // C) in float64: exact products of float32 values."""
    N, L, C = x.shape
    Cout, K, _ = w.shape
    xp = np.pad(x.astype(np.float64), [(0, 0), (padding, padding), (0, 0)])
    xr = np.repeat(xp, Cout // C, axis=2)
    Lout = (L + 2 * padding - dilation * (K - 1) - 1) // stride + 1
    y = np.zeros((N, Lout, Cout))
    for j in range(K):
        y += w[None, None, :, j, 0].astype(np.float64) * xr[:, j * dilation::stride][:, :Lout]
    return y


@pytest.mark.parametrize("backend", BACKENDS)
def test_depthwise_conv1d(backend):
    rng = np.random.default_rng(6)
    for C, m, K, stride, padding, dilation in [(8, 1, 3, 1, 2, 1), (4, 2, 5, 2, 1, 1),
                                               (6, 1, 4, 1, 3, 2), (1, 1, 7, 3, 0, 1)]:
        x = rng.standard_normal((2, 64, C)).astype(np.float32)
        w = rng.standard_normal((C * m, K, 1)).astype(np.float32)
        args = (mx.array(x), mx.array(w), stride, padding, dilation, C)
        plain = np.array(mx.conv1d(*args))
        with mp.use_backend(backend), extended_precision():
            y = np.array(mx.conv1d(*args))
        ref = _conv_oracle(x, w, stride, padding, dilation)
        assert y.shape == plain.shape == ref.shape
        assert (y == ref.astype(np.float32)).mean() >= 0.999
        assert (plain == ref.astype(np.float32)).mean() < 1 or K == 1
    # nn.Conv1d(groups=dim) is reached, and so is its gradient, in double-word: a
    # linear loss, against the float64 sums of exact products
    conv = nn.Conv1d(8, 8, 3, padding=2, groups=8, bias=False)
    x = mx.array(rng.standard_normal((2, 32, 8)).astype(np.float32))
    G = mx.array(rng.standard_normal((2, 34, 8)).astype(np.float32))

    def loss(w, x):
        conv.weight = w
        return (conv(x) * G).sum()

    w = conv.weight
    g_plain = mx.grad(loss, argnums=(0, 1))(w, x)
    with mp.use_backend(backend), extended_precision():
        g_ext = mx.grad(loss, argnums=(0, 1))(w, x)
    x64, G64, w64 = (np.array(v).astype(np.float64) for v in (x, G, w))
    xp = np.pad(x64, [(0, 0), (2, 2), (0, 0)])
    gw = np.stack([(G64 * xp[:, k:k + 34]).sum(axis=(0, 1)) for k in range(3)], axis=1)
    gxp = np.zeros_like(xp)
    for k in range(3):
        gxp[:, k:k + 34] += G64 * w64[:, k, 0]
    for got, plain_g, want in zip(g_ext, g_plain, (gw[:, :, None], gxp[:, 2:-2])):
        want32 = want.astype(np.float32)
        assert (np.array(got) == want32).mean() >= 0.99
        assert (np.array(plain_g) == want32).mean() < (np.array(got) == want32).mean()


def test_non_depthwise_conv_runs_plain_per_op_and_extended_in_the_flow():
    """The per-op interception extends only depthwise conv1d; the flow's rule
    (mlx_precise.extended.rules.convolution) extends grouped ones too."""
    from mlx_precise import extended as flow

    rng = np.random.default_rng(7)
    x = mx.array(rng.standard_normal((2, 16, 4)).astype(np.float32))
    w = mx.array(rng.standard_normal((6, 3, 2)).astype(np.float32))
    plain = bits(mx.conv1d(x, w, padding=1, groups=2))
    with mp.use_backend("cpu"), extended_precision() as rep:
        with flow.suspended():
            assert (bits(mx.conv1d(x, w, padding=1, groups=2)) == plain).all()
        y = mx.conv1d(x, w, padding=1, groups=2)
    assert rep.extended["conv1d"] == 1
    # float64 oracle: groups of 2 input channels, 3 output channels each
    xp = np.pad(np.array(x).astype(np.float64), [(0, 0), (1, 1), (0, 0)])
    w64 = np.array(w).astype(np.float64)
    ref = np.zeros((2, 16, 6))
    for o in range(6):
        g = o // 3
        for k in range(3):
            ref[:, :, o] += xp[:, k:k + 16, 2 * g:2 * g + 2] @ w64[o, k]
    assert (np.array(y) == ref.astype(np.float32)).all()


# ---- mx.compile and mx.vmap -------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_never_runs_plain_inside(backend):
    """A compiled function never replays its float32 graph inside the block."""
    u = mx.array(np.random.default_rng(8).standard_normal((2, 4, 64)).astype(np.float32))
    k, D = u[1] * 0.25, mx.ones((4,))
    step = mx.compile(fftconv_ref)
    plain = bits(fftconv_ref(u, k, D))
    first = bits(step(u, k, D))  # compiled outside: MLX's compiled graph
    with mp.use_backend(backend), extended_precision():
        # The double-word flow runs compiled functions' Python ops (an eager path
        # on the host backends): the same bits as the uncompiled call, not MLX's.
        eager = bits(fftconv_ref(u, k, D))
        assert (bits(step(u, k, D)) == eager).all() and (eager != first).any()
        assert (bits(mx.compile(fftconv_ref)(u, k, D)) == eager).all()
        # mx.vmap runs its function once per slice through the flow (it raised
        # TransformUnsupportedError here before): the rows' extended transforms
        assert (bits(mx.vmap(lambda a: mx.fft.rfft(a))(u)) == bits(mx.fft.rfft(u))).all()
        with extended_precision(intercept_mlx=False):
            assert (bits(step(u, k, D)) == first).all()
    assert (bits(step(u, k, D)) == first).all()
    assert np.allclose(first.view(np.float32), plain.view(np.float32), atol=1e-5)


def test_compile_on_metal_traces_the_extended_kernels(lazy_metal):
    """On metal the kernels are graph nodes: a function compiled outside the block
    is traced again inside it, with the kernels (here a lazy stand-in whose
    outputs are zeros, so the extended graph cannot pass for MLX's plain one)."""
    u = mx.array(np.random.default_rng(9).standard_normal((2, 4, 64)).astype(np.float32))
    k, D = u[1] * 0.25, mx.ones((4,))
    step = mx.compile(fftconv_ref)
    first = bits(step(u, k, D))
    with mp.use_backend("metal"), extended_precision():
        inside = bits(step(u, k, D))
        skip_only = bits(u * D[:, None])  # the FFT part is the stand-in's zeros
    assert (inside != first).any() and (inside == skip_only).all()
    assert (bits(step(u, k, D)) == first).all()


def test_demo_row():
    from mlx_precise.tools import demo

    rows = {r["name"]: r for r in demo.run("cpu", channels=4, L=2048)}
    plain = rows["float32 MLX (mx.fft)"]
    wrapped = rows["unmodified MLX code inside extended_precision()"]
    assert wrapped["exactly_rounded"] >= 0.40 > 0.20 >= plain["exactly_rounded"]
    assert plain["normwise"] / wrapped["normwise"] >= 3.0
    assert rows["extended (cpu)"]["exactly_rounded"] >= 0.9999


@pytest.mark.parametrize("pointed", [True, False])
def test_module_names_written_inside_and_between_blocks(pointed, monkeypatch):
    """A block points MLX's modules at a dictionary with the stand-ins in place
    (standins._Pointed; ``pointed=False``: their names updated in place, as on
    interpreters where that is not safe): a name set or deleted on a module between
    blocks is seen inside the next one, and one set, replaced or deleted inside a
    block stays so after it, as it would without the flow."""
    from mlx_precise.extended import dispatch, standins

    with extended_precision():
        pass
    monkeypatch.setattr(standins, "_POINTS", pointed)
    plan = dispatch._plan(standins.plans[0])
    assert bool(plan.pointed) == pointed
    monkeypatch.setattr(standins, "plans", [plan, *standins.plans])
    x = mx.array(np.array([0.1, 2.0, -3.5], np.float32))
    original = mx.sigmoid
    mine = lambda a: original(a)  # noqa: E731 (a user's replacement, made in a block)
    try:
        mx.between_blocks = 1
        with extended_precision() as report:
            assert mx.between_blocks == 1 and "between_blocks" in dir(mx)
            del mx.between_blocks
            mx.inside_block = 2
            mx.fft.inside_block = 3
            mx.sigmoid = mine
            mx.exp(x)
        assert report.extended["exp"] == 1
        assert not hasattr(mx, "between_blocks")
        assert mx.inside_block == 2 and mx.fft.inside_block == 3
        assert mx.sigmoid is mine
        with extended_precision() as report:
            assert mx.inside_block == 2 and mx.fft.inside_block == 3
            mx.exp(x)
            del mx.inside_block
        assert report.extended["exp"] == 1 and not hasattr(mx, "inside_block")
    finally:
        mx.sigmoid = original
        for module, name in ((mx, "between_blocks"), (mx, "inside_block"),
                             (mx.fft, "inside_block")):
            if name in vars(module):
                delattr(module, name)
    sigmoid_id = id(original)  # (not a name: the block rebinds the names that hold it)
    with extended_precision():
        assert id(mx.sigmoid) != sigmoid_id and not hasattr(mx.fft, "inside_block")
    assert mx.sigmoid is original


def test_mlx_modules_own_their_dictionaries_outside_blocks():
    """Outside every block MLX's modules point at their own dictionaries again (the
    same objects, holding MLX's functions), after blocks that closed normally, by an
    exception, and nested."""
    modules = (mx, mx.fast, mx.fft, mx.linalg, mx.random)
    own = [vars(m) for m in modules]
    exp = own[0]["exp"]
    exp_id = id(exp)  # (not a name: the block rebinds the names that hold it)
    with extended_precision():
        assert id(mx.exp) != exp_id
        with extended_precision(strict=True):
            pass
    with pytest.raises(ZeroDivisionError):
        with extended_precision():
            1 / 0
    assert all(vars(m) is d for m, d in zip(modules, own))
    assert mx.exp is exp and own[0]["exp"] is exp
