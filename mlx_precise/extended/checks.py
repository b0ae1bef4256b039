"""The self-test's checks of the block's own kernels: the double-word row sums of
scatter-adds and gradients (``dw_rows_add``), on a kernel backend; on the metal
backend, the replays of composite rules (:mod:`.recipes`), of optimizer updates
(:mod:`.updates`) and of blocks (:mod:`.blocks`) against the rules, updates and
blocks run op by op, bit for bit."""

from __future__ import annotations

from fractions import Fraction

import mlx.core as mx
import numpy as np

from ..core import backends
from ..core.selftest import Check, register
from ..doubleword.checks import U
from . import autodiff, blocks, recipes
from .carry import attach, low_word, suspended
from ..core.context import extended_precision, switched
from .rules.shape import rows_add


def check_rows_add(backend, n: int = 600, rows: int = 40, m: int = 3) -> Check:
    """Rows named repeatedly (about 15 values each, negative indices included) against
    exact rational sums: the compensated sum's error is at most 2u^2 |sum| plus
    (4k + O(1)) u^3 times the sum of magnitudes for k terms (dw_acc in doubleword.h);
    required here: 4u^2 times the sum of magnitudes."""
    rng = np.random.default_rng(17)
    hi = rng.standard_normal((n, m)).astype(np.float32)
    lo = (hi * np.float32(2.0**-30) * rng.choice([-1, 1], (n, m))).astype(np.float32)
    idx = rng.integers(-rows, rows, n).astype(np.int32)
    with suspended():  # (a carried array: the words as given)
        v = attach(mx.array(hi), mx.array(lo))
    with backends.use_backend(backends.of(backend).name):
        out = rows_add(rows, mx.array(idx), v)
        got_hi, got_lo = np.array(out), np.array(low_word(out))
    worst = Fraction(0)
    for r in range(rows):
        sel = np.nonzero(idx % rows == r)[0]
        for c in range(m):
            terms = [Fraction(float(hi[k, c])) + Fraction(float(lo[k, c])) for k in sel]
            total, mags = sum(terms, Fraction(0)), sum((abs(t) for t in terms), Fraction(0))
            got = Fraction(float(got_hi[r, c])) + Fraction(float(got_lo[r, c]))
            if mags:
                worst = max(worst, abs(got - total) / mags)
    return Check(f"scatter-add row sums [{n} values, {rows} rows]", worst <= 4 * U**2,
                 f"max err {float(worst / U**2):.3g} u^2 of the magnitudes (need <= 4)")


def _composites(r):
    """The composite rules that replay, on carried operands made from ``r``."""
    x = r["x"] * 1.5 + r["y"]
    q = mx.fast.rope(x[None], 16, traditional=False, base=10000.0, scale=1.0, offset=2)
    return [mx.fast.layer_norm(x, r["w"], r["w"], 1e-5), mx.fast.rms_norm(x, r["w"], 1e-5),
            mx.softmax(x, axis=-1), mx.logsumexp(x, axis=-1), q,
            mx.fast.scaled_dot_product_attention(q, x[None], x[None], scale=0.25,
                                                 mask="causal"),
            mx.addmm(r["w"], x, r["m"].T), x @ r["m"], mx.fft.irfft(mx.fft.rfft(x), n=32),
            mx.grad(lambda a: mx.softmax(mx.fast.layer_norm(a @ r["m"], r["w"], None, 1e-5),
                                         axis=-1).sum())(x)]


def check_replays(backend, calls: int = 4) -> Check:
    """Each composite rule's result and low word, replayed (the fourth call of its
    structure), and a gradient by the replayed backward pass, against the rules
    and the pass run op by op: the same bits (the same programs on the same
    operands: :mod:`.recipes`, :mod:`.autodiff`)."""
    rng = np.random.default_rng(5)
    r = {k: mx.array(rng.standard_normal(shape).astype(np.float32))
         for k, shape in (("x", (4, 8, 32)), ("y", (4, 8, 32)), ("w", (32,)), ("m", (32, 32)))}

    def words(on: bool) -> list:
        # (the rules' replays, not the block's)
        with switched((recipes, "ENABLED", on), (autodiff, "COMPILED_PASS", on),
                      (blocks, "ENABLED", False)):
            for _ in range(calls):
                with backends.use_backend(backends.of(backend).name), extended_precision():
                    outs = _composites(r)
                    got = [(np.array(y), np.array(low_word(y))) for y in outs]
        return got

    direct, replayed = words(False), words(True)
    same = sum(all(np.array_equal(a.view(np.uint32) if a.dtype == np.float32 else a,
                                  b.view(np.uint32) if b.dtype == np.float32 else b)
                   for a, b in zip(d, p)) for d, p in zip(direct, replayed))
    return Check(f"replayed rules and pass [{len(direct)} ops]", same == len(direct),
                 f"{same} of {len(direct)} bit-identical to the rules run op by op")


def check_update_replays(backend, steps: int = 4) -> Check:
    """A small model trained ``steps`` steps by Adam (a scheduled learning rate)
    and by SGD with momentum, each step in a block: its parameters and the
    optimizer's state, words and low words, with the updates replayed
    (:mod:`.updates`, from the third step) against the updates run op by op: the
    same bits."""
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten

    rng = np.random.default_rng(6)
    x = mx.array(rng.standard_normal((16, 8)).astype(np.float32))
    y = mx.array(rng.standard_normal((16, 2)).astype(np.float32))

    def train(make, on: bool) -> list:
        with switched((recipes, "ENABLED", on), (blocks, "ENABLED", False)):
            mx.random.seed(6)
            model, opt = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 2)), make()
            vg = nn.value_and_grad(model, lambda m: nn.losses.mse_loss(m(x), y))
            for _ in range(steps):
                with backends.use_backend(backends.of(backend).name), extended_precision():
                    _, grads = vg(model)
                    opt.update(model, grads)
                    arrays = [a for _, a in tree_flatten((model.parameters(), opt.state))]
                    got = [np.array(w) for a in arrays
                           for w in (a, low_word(a)) if w is not None]
        return got

    makers = (lambda: optim.Adam(optim.cosine_decay(1e-2, 50)),
              lambda: optim.SGD(1e-2, momentum=0.9))
    pairs = [(d, p) for make in makers for d, p in zip(train(make, False), train(make, True))]
    same = sum(d.shape == p.shape and d.dtype == p.dtype and d.tobytes() == p.tobytes()
               for d, p in pairs)
    return Check(f"replayed optimizer updates [{len(pairs)} arrays]", same == len(pairs),
                 f"{same} of {len(pairs)} bit-identical to the updates run op by op")


def check_block_replays(backend, calls: int = 5) -> Check:
    """A small model's forward pass (linear layers, GELU, layer norm, softmax
    attention, an FFT) in a block at one place, ``calls`` times on new inputs: the
    results' words with the blocks replayed (:mod:`.blocks`: followed from the third
    call) against the blocks run op by op (the rules' own replays off too): the
    same bits."""
    import mlx.nn as nn

    rng = np.random.default_rng(8)
    inputs = [mx.array(rng.standard_normal((2, 8, 16)).astype(np.float32))
              for _ in range(calls)]
    mx.random.seed(8)
    lin, norm, out = nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 16)

    def forward(x):
        h = norm(nn.gelu(lin(x)))
        a = mx.softmax(h @ h.swapaxes(-1, -2) * 0.125, axis=-1) @ h
        return out(a) + mx.fft.irfft(mx.fft.rfft(x), n=16) * 0.5

    def run(on: bool) -> list:
        got = []
        with switched((recipes, "ENABLED", on), (blocks, "ENABLED", on)):
            for x in inputs:
                with backends.use_backend(backends.of(backend).name), extended_precision():
                    y = forward(x)
                got.append(np.array(y).tobytes() + np.array(low_word(y)).tobytes())
        return got

    before = blocks.stats["followed"]
    direct, replayed = run(False), run(True)
    followed = blocks.stats["followed"] - before
    same = sum(d == p for d, p in zip(direct, replayed))
    return Check(f"replayed blocks [{calls} forward passes, {followed} followed]",
                 same == calls and followed >= calls - 2,
                 f"{same} of {calls} bit-identical to the blocks run op by op")


def selftest_checks(backend, done=()) -> list[Check]:
    if not backends.of(backend).has_kernels:
        return []
    return [check_rows_add(backend)] + ([check_replays(backend), check_update_replays(
        backend), check_block_replays(backend)] if backends.of(backend).gpu else [])


register(80, selftest_checks)
