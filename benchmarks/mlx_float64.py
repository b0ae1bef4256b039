"""How accurate MLX's own float64 is on the CPU, op by op: the ops a float64 reference
run of a model (``model.set_dtype(mx.float64)`` on ``mx.cpu``) meets, against numpy /
scipy float64 on the same float64 inputs.

    python benchmarks/mlx_float64.py

Several of them compute in float32 inside (SIMD approximations of exp, sin, cos,
sigmoid, erf; the fused norms, RoPE and the convolutions; softmax / logsumexp /
logaddexp through that exp), so a "float64 oracle" built from them is itself wrong
at about 1e-7, the size of the errors the double-word flow removes: compare a port
with numpy / scipy / mpmath instead (as this package's tests do), or write those
ops out in accurate float64 (docs/port_guide.md). Error: max |MLX - reference| /
max |reference| over the output (an accurate float64 op is within a few 2^-52;
float32's rounding is 2^-24). Ops MLX refuses for float64 are listed with its
message.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
from scipy import special

RNG = np.random.default_rng(0)
X = RNG.uniform(-6.0, 6.0, 4096)
POS = RNG.uniform(0.01, 20.0, 4096)
M = RNG.standard_normal((2, 4, 8, 16))
W = RNG.standard_normal(16)


def _mx(a) -> mx.array:
    return mx.array(np.asarray(a), dtype=mx.float64)


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w


def _layer(x, w, b, eps):
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps) * w + b


def _rope(x, dims, base, offset):
    """MLX's non-traditional RoPE (rotate the two halves of the first ``dims``)."""
    half = dims // 2
    th = (offset + np.arange(x.shape[-2]))[:, None] * base ** (-np.arange(half) * 2.0 / dims)
    c, s = np.cos(th), np.sin(th)
    x1, x2 = x[..., :half], x[..., half:dims]
    return np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c, x[..., dims:]], -1)


def _attention(q, k, v, scale):
    s = q @ np.swapaxes(k, -1, -2) * scale
    return special.softmax(s, -1) @ v


def _conv1d(x, w, groups):
    """Valid 1-D convolution, channels last: x (B, T, C), w (O, K, C / groups)."""
    B, T, _ = x.shape
    O, K, cg = w.shape
    out = np.zeros((B, T - K + 1, O))
    for o in range(O):
        g = o // (O // groups)
        for k in range(K):
            out[:, :, o] += x[:, k:k + T - K + 1, g * cg:(g + 1) * cg] @ w[o, k]
    return out


def _conv2d(x, w):
    B, H, Wd, _ = x.shape
    O, kh, kw, _ = w.shape
    out = np.zeros((B, H - kh + 1, Wd - kw + 1, O))
    for i in range(out.shape[1]):
        for j in range(out.shape[2]):
            out[:, i, j] = np.einsum("bhwc,ohwc->bo", x[:, i:i + kh, j:j + kw], w)
    return out


def cases():
    """(name, MLX's float64 call, numpy / scipy reference) for each op."""
    x, p, m, w = _mx(X), _mx(POS), _mx(M), _mx(W)
    c1 = RNG.standard_normal((2, 24, 8))
    w1, wd = RNG.standard_normal((6, 3, 8)), RNG.standard_normal((8, 4, 1))
    c2, w2 = RNG.standard_normal((1, 8, 8, 3)), RNG.standard_normal((4, 3, 3, 3))
    a, b = RNG.standard_normal((4, 64, 32)), RNG.standard_normal((4, 32, 16))
    return [
        ("exp", lambda: mx.exp(x), np.exp(X)),
        ("expm1", lambda: mx.expm1(x), np.expm1(X)),
        ("log", lambda: mx.log(p), np.log(POS)),
        ("log1p", lambda: mx.log1p(p), np.log1p(POS)),
        ("sin", lambda: mx.sin(x), np.sin(X)),
        ("cos", lambda: mx.cos(x), np.cos(X)),
        ("tan", lambda: mx.tan(x), np.tan(X)),
        ("tanh", lambda: mx.tanh(x), np.tanh(X)),
        ("sigmoid", lambda: mx.sigmoid(x), special.expit(X)),
        ("erf", lambda: mx.erf(x), special.erf(X)),
        ("sqrt", lambda: mx.sqrt(p), np.sqrt(POS)),
        ("rsqrt", lambda: mx.rsqrt(p), 1 / np.sqrt(POS)),
        ("power", lambda: mx.power(p, 0.37), POS ** 0.37),
        ("arctan", lambda: mx.arctan(x), np.arctan(X)),
        ("softmax", lambda: mx.softmax(m, axis=-1), special.softmax(M, -1)),
        ("logsumexp", lambda: mx.logsumexp(m, axis=-1), special.logsumexp(M, -1)),
        ("logaddexp", lambda: mx.logaddexp(x, 0.5), np.logaddexp(X, 0.5)),
        ("matmul", lambda: _mx(a) @ _mx(b), a @ b),
        ("sum", lambda: mx.sum(m, axis=-1), M.sum(-1)),
        ("cumsum", lambda: mx.cumsum(m, axis=-1), np.cumsum(M, -1)),
        ("fast.rms_norm", lambda: mx.fast.rms_norm(m, w, 1e-5), _rms(M, W, 1e-5)),
        ("fast.layer_norm", lambda: mx.fast.layer_norm(m, w, w, 1e-5), _layer(M, W, W, 1e-5)),
        ("fast.rope", lambda: mx.fast.rope(m, 16, traditional=False, base=10000.0,
                                           scale=1.0, offset=3), _rope(M, 16, 10000.0, 3)),
        ("fast.scaled_dot_product_attention",
         lambda: mx.fast.scaled_dot_product_attention(m, m, m, scale=0.25),
         _attention(M, M, M, 0.25)),
        ("conv1d", lambda: mx.conv1d(_mx(c1), _mx(w1)), _conv1d(c1, w1, 1)),
        ("conv1d (depthwise)", lambda: mx.conv1d(_mx(c1), _mx(wd), groups=8),
         _conv1d(c1, wd, 8)),
        ("conv2d", lambda: mx.conv2d(_mx(c2), _mx(w2)), _conv2d(c2, w2)),
        ("gather_mm", lambda: mx.gather_mm(_mx(a), _mx(b), mx.array([0, 1, 2]),
                                           mx.array([1, 0, 3])), a[[0, 1, 2]] @ b[[1, 0, 3]]),
    ]


def measure() -> list[tuple[str, str, str]]:
    """(op, error, accuracy) for each case; MLX's message where it refuses float64."""
    rows = []
    for name, call, ref in cases():
        try:
            got = np.array(call())
        except (RuntimeError, ValueError) as e:
            rows.append((name, "-", f"refused: {str(e).splitlines()[0][:60]}"))
            continue
        err = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
        grade = "float64" if err < 2.0 ** -40 else "float32 (about 2^%d)" % round(math.log2(err))
        rows.append((name, f"{err:.1e}", grade))
    return rows


def main() -> None:
    print(f"MLX {mx.__version__}, float64 on the CPU, against numpy / scipy float64 on the "
          f"same inputs (error: max |MLX - reference| / max |reference|)\n")
    print("| op | error | accurate to |\n|---|---|---|")
    for name, err, grade in measure():
        print(f"| {name} | {err} | {grade} |")


if __name__ == "__main__":
    mx.set_default_device(mx.cpu)
    main()
