"""SF16 mode (mlx_precise.sf16) on a small GPT-style model built here.

* Every boundary tensor lies on the Q1.15 grid (value * 2^15 an integer) and within
  +-threshold, and every boundary the reference quantizes is reported.
* Loss and gradients equal a straight-through reference written out in this file:
  the same forward, with each boundary replaced by
  ``stop_gradient(oracle(x)) + (x - stop_gradient(x))`` where ``oracle`` is the
  exact integer reference of tests/oracle.py (Q1.31 then Q1.15 for matmuls).
* About 20 Adam steps on a toy next-token task lower the loss.
* Storage in bf16, excluded modules, restoring the model, mask forms, bad input.
"""

import math

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from oracle import fixed_reference

from mlx_precise.fixedpoint import Q115_THRESHOLD
from mlx_precise.fixedpoint.sf16mode import HANDLED_TYPES, sf16, sf16_boundary, sf16_matmul

VOCAB, DIMS, HEADS, LAYERS, CTX = 16, 32, 4, 2, 12
T15 = float(np.float32(Q115_THRESHOLD))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(DIMS)
        self.attn = nn.MultiHeadAttention(DIMS, HEADS, bias=True)
        self.ln2 = nn.RMSNorm(DIMS)
        self.fc1 = nn.Linear(DIMS, 2 * DIMS)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * DIMS, DIMS)

    def __call__(self, x, mask):
        h = self.ln1(x)
        x = sf16_boundary(x + self.attn(h, h, h, mask), "resid")
        return sf16_boundary(x + self.fc2(self.act(self.fc1(self.ln2(x)))), "resid")


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIMS)
        self.pos = nn.Embedding(CTX, DIMS)
        self.blocks = [Block() for _ in range(LAYERS)]
        self.ln_f = nn.LayerNorm(DIMS)
        self.head = nn.Linear(DIMS, VOCAB)

    def __call__(self, tokens):
        x = sf16_boundary(self.tok(tokens) + self.pos(mx.arange(tokens.shape[1])), "embed")
        for b in self.blocks:
            x = b(x, "causal")
        return self.head(self.ln_f(x))


def make_model(seed=0):
    mx.random.seed(seed)
    model = TinyGPT()
    mx.eval(model.parameters())
    return model


def batch(seed=1, n=4):
    """Toy task: sequences t, t+1, t+2, ... (mod VOCAB); predict the next token."""
    start = np.random.default_rng(seed).integers(0, VOCAB, (n, 1))
    seq = (start + np.arange(CTX + 1)) % VOCAB
    return mx.array(seq[:, :-1]), mx.array(seq[:, 1:])


def loss_fn(model, x, y):
    return nn.losses.cross_entropy(model(x), y, reduction="mean")


# Boundaries per forward pass of TinyGPT: Linear outputs (q, k, v, out, fc1, fc2 per
# block and the head) and attention-weighted values are matmuls.
EXPECTED_KINDS = {"matmul": 7 * LAYERS + 1, "softmax": LAYERS, "gelu": LAYERS,
                  "norm": 2 * LAYERS + 1, "embedding": 2, "boundary": 1 + 2 * LAYERS}


def on_grid(a: np.ndarray, limit: float) -> bool:
    a = a.astype(np.float64)
    return bool(np.all(a * 2**15 == np.round(a * 2**15)) and np.all(np.abs(a) <= limit))


# ---- boundaries ---------------------------------------------------------------------


@pytest.mark.parametrize("backend", ("emulate", "cpu"))
def test_boundaries_on_grid(backend):
    model = make_model()
    x, _ = batch()
    plain = model(x)
    seen = []
    with sf16(model, backend=backend, observer=lambda n, k, a: seen.append((n, k, a))) as mode:
        out = model(x)
        mx.eval(out)
    kinds = {k: sum(1 for _, kk, _ in seen if kk == k) for k in EXPECTED_KINDS}
    assert kinds == EXPECTED_KINDS
    for name, kind, a in seen:
        assert a.dtype == mx.float32, name
        assert on_grid(np.array(a), T15), f"{name} ({kind}) off the Q1.15 grid or threshold"
    # The model's output is the head's quantized output, and it differs from the
    # unquantized model by about the grid step, not by more than the clamp allows.
    assert seen[-1][0] == "head" and np.array_equal(np.array(out), np.array(seen[-1][2]))
    diff = np.abs(np.array(out) - np.array(plain))
    assert diff.max() > 0
    # Leaving the mode restores the model exactly.
    assert np.array_equal(np.array(model(x)), np.array(plain))
    assert all(type(m) in (nn.Module, TinyGPT, Block) or type(m) in HANDLED_TYPES
               for _, m in model.named_modules())
    assert not any(hasattr(m, "_sf16_where") for _, m in model.named_modules())
    assert sorted(p for p, _ in mode.handled)[:3] == ["blocks.0.act", "blocks.0.attn",
                                                        "blocks.0.attn.key_proj"]
    assert mode.unhandled == []


# ---- straight-through reference -------------------------------------------------------


def oracle_ste(x: mx.array, kind: str) -> mx.array:
    """Reference boundary: the exact oracle's simulated value in the forward pass,
    the identity in the backward pass."""
    a = np.array(x.astype(mx.float32))
    if kind == "matmul":
        a = fixed_reference(a, 31, 1.0, "half_even")[1].reshape(a.shape)
    q = mx.array(fixed_reference(a, 15, Q115_THRESHOLD, "half_even")[1].reshape(a.shape))
    return mx.stop_gradient(q) + (x - mx.stop_gradient(x))


def reference_forward(model, tokens, q=oracle_ste):
    """TinyGPT's forward with every boundary written out (the modules run plain)."""
    x = q(q(model.tok(tokens), "embedding") + q(model.pos(mx.arange(tokens.shape[1])),
                                                "embedding"), "boundary")
    for b in model.blocks:
        h = q(b.ln1(x), "norm")
        a = b.attn
        qs, ks, vs = (q(p(h), "matmul") for p in (a.query_proj, a.key_proj, a.value_proj))
        qs, ks, vs = (mx.unflatten(t, -1, (HEADS, -1)).transpose(0, 2, 1, 3) for t in (qs, ks, vs))
        scores = (qs * math.sqrt(1 / qs.shape[-1])) @ ks.swapaxes(-1, -2)
        n = scores.shape[-1]
        causal = mx.arange(n)[:, None] >= mx.arange(n)[None]
        scores = mx.where(causal, scores, mx.array(mx.finfo(mx.float32).min))
        p_ = q(mx.softmax(scores, axis=-1, precise=True), "softmax")
        att = q(p_ @ vs, "matmul").transpose(0, 2, 1, 3).flatten(-2, -1)
        x = q(x + q(a.out_proj(att), "matmul"), "boundary")
        h = q(b.fc2(q(b.act(q(b.fc1(q(b.ln2(x), "norm")), "matmul")), "gelu")), "matmul")
        x = q(x + h, "boundary")
    return q(model.head(q(model.ln_f(x), "norm")), "matmul")


def test_straight_through_gradients():
    model = make_model(2)
    x, y = batch(3)

    def ref_loss(model, x, y):
        return nn.losses.cross_entropy(reference_forward(model, x), y, reduction="mean")

    ref_l, ref_g = nn.value_and_grad(model, ref_loss)(model, x, y)
    with sf16(model, backend="emulate"):
        l, g = nn.value_and_grad(model, loss_fn)(model, x, y)
    plain_l, plain_g = nn.value_and_grad(model, loss_fn)(model, x, y)
    assert l.item() == ref_l.item() != plain_l.item()
    flat = dict(nn.utils.tree_flatten(g))
    ref_flat = dict(nn.utils.tree_flatten(ref_g))
    plain_flat = dict(nn.utils.tree_flatten(plain_g))
    assert flat.keys() == ref_flat.keys() and len(flat) > 20
    worst_ref = worst_plain = 0.0
    for k in flat:
        a, r, p = (np.array(d[k]) for d in (flat, ref_flat, plain_flat))
        scale = np.abs(r).max() + 1e-30
        worst_ref = max(worst_ref, np.abs(a - r).max() / scale)
        worst_plain = max(worst_plain, np.abs(p - r).max() / scale)
    print(f"straight-through gradients: max rel. difference {worst_ref:.3g} from the "
          f"reference, {worst_plain:.3g} from the unquantized model")
    assert worst_ref <= 1e-5, worst_ref  # same ops in the same order: ~float32 rounding
    assert worst_plain > 1e-3, worst_plain  # the quantized forward does change them


def test_straight_through_at_clamp():
    """The gradient passes the clamp and the rounding unchanged (identity VJP)."""
    x = mx.array(np.float32([-3.0, -1.0, -0.5, 0.3, 0.9995, 2.0, 1e-6, 0.25]))
    with sf16(backend="cpu"):
        g = mx.grad(lambda v: (sf16_boundary(v) * mx.arange(8)).sum())(x)
        gm = mx.grad(lambda v: sf16_matmul(v[None], mx.eye(8)).sum())(x)
        y = sf16_boundary(x)
    assert np.array_equal(np.array(g), np.arange(8, dtype=np.float32))
    assert np.array_equal(np.array(gm), np.ones(8, np.float32))
    assert np.array(y).tolist()[:2] == [-32735 / 32768] * 2
    assert np.array_equal(np.array(sf16_boundary(x)), np.array(x))  # inactive: identity
    with sf16(backend="cpu"):  # a 0-d value (MLX hands the VJP a lone input unwrapped)
        g0 = mx.grad(lambda v: sf16_boundary(v) * 3.0)(mx.array(np.float32(0.25)))
    assert g0.shape == () and g0.item() == 3.0


def test_training_lowers_loss():
    model = make_model(4)
    opt = optim.Adam(learning_rate=1e-2)
    step = nn.value_and_grad(model, loss_fn)
    losses = []
    with sf16(model, backend="emulate"):
        for i in range(20):
            x, y = batch(100 + i, n=8)
            loss, grads = step(model, x, y)
            opt.update(model, grads)
            mx.eval(model.parameters(), opt.state)
            losses.append(loss.item())
    # Logits are clamped to +-0.999 as well, which bounds the loss from below by
    # log(1 + (VOCAB - 1) e^(-2 * 0.999)) = 1.11: the floor shows the mode was on.
    floor = math.log1p((VOCAB - 1) * math.exp(-2 * T15))
    print(f"SF16 training: mean loss of steps 1-3 {np.mean(losses[:3]):.3f}, of steps "
          f"16-20 {np.mean(losses[-5:]):.3f} (floor {floor:.3f})")
    assert all(floor <= v < 4 for v in losses), losses
    assert np.mean(losses[-5:]) < np.mean(losses[:3]) - 0.3, losses


# ---- options, restoring, masks, errors ----------------------------------------------------


def test_storage_and_exclude():
    model = make_model(5)
    x, _ = batch()
    seen = []
    with sf16(model, storage_dtype=mx.bfloat16, exclude=("head", "blocks.1"), backend="cpu",
              observer=lambda n, k, a: seen.append((n, a))):
        out = model(x)
    names = [n for n, _ in seen]
    assert names and not any(n == "head" or n.startswith("blocks.1.") for n in names)
    assert "blocks.0.attn.softmax" in names and "resid" in names
    for n, a in seen:
        assert a.dtype == mx.bfloat16, n
        # bf16 storage keeps the grid but may round 0.999 up to 1.0
        assert on_grid(np.array(a.astype(mx.float32)), 1.0), n
    assert out.dtype == mx.float32  # the head is excluded: a plain Linear


def test_unhandled_and_switching():
    class MyLinear(nn.Linear):
        pass

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Conv1d(4, 4, 3), nn.Dropout(0.1),
                          MyLinear(4, 4), nn.Sequential(nn.GELU()))
    keys = [k for k, _ in nn.utils.tree_flatten(model.parameters())]
    mode = sf16(model, backend="cpu")
    with mode:
        assert [p for p, _ in sorted(mode.handled)] == ["layers.0", "layers.5.layers.0"]
        assert sorted(mode.unhandled) == [("layers.1", "ReLU"), ("layers.2", "Conv1d"),
                                          ("layers.3", "Dropout"), ("layers.4", "MyLinear")]
        assert [k for k, _ in nn.utils.tree_flatten(model.parameters())] == keys
        with pytest.raises(RuntimeError, match="already enabled"):
            mode.enable()
        with pytest.raises(RuntimeError, match="already in SF16 mode"):
            sf16(model, backend="cpu").enable()
        assert type(model.layers[0]).__name__ == "_Linear"
    assert type(model.layers[0]) is nn.Linear and type(model.layers[4]) is MyLinear
    mode.enable()  # enable / disable outside a with block
    assert type(model.layers[0]).__name__ == "_Linear"
    mode.disable()
    assert type(model.layers[0]) is nn.Linear


@pytest.mark.parametrize("mask", ("none", "causal", "bool", "additive"))
def test_attention_masks(mask):
    """SF16 attention agrees with nn.MultiHeadAttention up to the quantization
    (a few grid steps), for every mask form MLX accepts."""
    mx.random.seed(7)
    attn = nn.MultiHeadAttention(16, 2)
    x = mx.random.uniform(-0.5, 0.5, (2, 5, 16))  # no clamping
    m = {"none": None, "causal": "causal",
         "bool": mx.random.uniform(shape=(5, 5)) > 0.3,
         "additive": nn.MultiHeadAttention.create_additive_causal_mask(5)}[mask]
    if mask == "bool":
        m[:, 0] = True  # every query attends to something
    want = np.array(attn(x, x, x, m))
    with sf16(attn, threshold=1.0, backend="cpu"):
        got = np.array(attn(x, x, x, m))
    err = np.abs(got - want).max()
    print(f"attention mask {mask}: max |SF16 - plain| = {err:.3g}")
    assert err < 5e-4
    # ... while a different mask changes the output by far more (the test can fail).
    other = np.array(attn(x, x, x, "causal" if mask == "none" else None))
    assert np.abs(other - want).max() > 20 * err


def test_bad_input():
    with pytest.raises(TypeError, match="model must be an mlx.nn.Module"):
        sf16("model")
    with pytest.raises(ValueError, match=r"threshold must lie in \(0, 1\]"):
        sf16(None, threshold=2.0)
    with pytest.raises(ValueError, match="rounding must be one of"):
        sf16(None, rounding="up")
    with pytest.raises(ValueError, match="storage_dtype"):
        sf16(None, storage_dtype=mx.int32)
    with pytest.raises(TypeError, match="exclude must be a sequence"):
        sf16(None, exclude="head")
    with pytest.raises(TypeError, match="observer must be callable"):
        sf16(None, observer=3)
    attn = nn.MultiHeadAttention(8, 2)
    x = mx.zeros((1, 3, 8))
    with sf16(attn, backend="cpu"), pytest.raises(ValueError, match="mask must be an array, 'causal'"):
        attn(x, x, x, "full")
