"""A physics-informed fit that float32 cannot finish: the 1-D Poisson problem

    -u''(x) = f(x) on [-1, 1],   u(-1) = g0,   u(1) = g1,

solved by a linear-in-parameters model (a Chebyshev series u = sum_k theta_k T_k / s_k,
the fixed scales s_k making the columns of the residuals' Jacobian unit-norm) trained
with full-batch gradient descent with heavy-ball momentum (``mlx.optimizers.SGD``) on
the collocation loss

    loss = mean_i (u''(x_i) + f(x_i))^2 + (u(-1) - g0)^2 + (u(1) - g1)^2.

The right-hand side comes from a manufactured solution in the model's span (a
polynomial of degree K - 1 with fixed float32 coefficients), so the minimum loss is
exactly 0 and the exact answer is known: what stops the descent is the arithmetic.

The same MLX code runs three ways: plain float32; inside
``mlx_precise.extended_precision()`` (double-word); and in float64 on the CPU (the
reference trajectory). Every op of the loss is arithmetic, a matrix product, a sum or a
mean: in MLX 0.32 float64 ``exp`` / ``sin`` / ``erf`` are only float32-accurate, and
none is used. ``reference_numpy`` recomputes the float64 trajectory in numpy, as a check
of the MLX float64 run.

Used by ``training_scientific_ml.ipynb``; ``python training_scientific_ml.py [--small]``
prints the table.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

import mlx_precise as mp
from mlx_precise.extended import low_word

MODES = ("float32", "extended", "float64")


def chebyshev(x, K: int, xp=mx):
    """T_k(x), T_k'(x), T_k''(x) for k < K, each of shape (len(x), K), by the
    three-term recurrences (arithmetic only); ``xp`` is ``mlx.core`` or ``numpy``."""
    t = [xp.ones_like(x), x]
    d = [xp.zeros_like(x), xp.ones_like(x)]
    dd = [xp.zeros_like(x), xp.zeros_like(x)]
    for k in range(1, K - 1):
        t.append(2 * x * t[k] - t[k - 1])
        d.append(2 * t[k] + 2 * x * d[k] - d[k - 1])
        dd.append(4 * d[k] + 2 * x * dd[k] - dd[k - 1])
    return tuple(xp.stack(a[:K], axis=1) for a in (t, d, dd))


class ChebyshevPINN(nn.Module):
    """u(x) = sum_k theta_k T_k(x) / s_k, from the features (T, T'') at the points."""

    def __init__(self, scale: np.ndarray):
        super().__init__()
        self.theta = mx.zeros((len(scale),))
        self._scale = mx.array(scale)  # fixed (a leading underscore: not a parameter)

    def coefficients(self):
        return self.theta / self._scale

    def __call__(self, features):
        T, DD = features
        c = self.coefficients()
        return T @ c, DD @ c  # u and u'' at the points


def loss_fn(model, features, Tb, f, g):
    """Mean squared PDE residual at the points plus the squared boundary misfits."""
    _, u_xx = model(features)
    r = u_xx + f  # -(the residual -u'' - f)
    e = Tb @ model.coefficients() - g
    return mx.mean(r * r) + mx.sum(e * e)


@dataclass
class Problem:
    K: int             # Chebyshev modes (parameters)
    x: np.ndarray      # collocation points (Chebyshev-Gauss), float32
    c_true: np.ndarray  # the manufactured solution's coefficients, float32
    scale: np.ndarray  # parameter scales s_k, float32
    lr: float          # heavy-ball step and momentum, float32 values
    momentum: float
    kappa: float       # condition number of the loss's Hessian (float64)


def make_problem(K: int = 16, n: int | None = None, seed: int = 0) -> Problem:
    """The points, the manufactured solution (decaying coefficients with random signs,
    normalised so the loss at theta = 0 is about 1), the scales, and the heavy-ball
    step and momentum tuned to the Hessian's extreme eigenvalues (numpy float64).
    Every number the runs read is a float32 value, so the three runs solve the same
    problem."""
    n = n or 2 * K
    x = np.cos(np.pi * (np.arange(n) + 0.5) / n).astype(np.float32)
    T, _, DD = chebyshev(x.astype(np.float64), K, np)
    Tb = chebyshev(np.array([-1.0, 1.0]), K, np)[0]
    J = np.vstack([DD / np.sqrt(n), Tb])  # Jacobian of the residuals w.r.t. c
    scale = np.linalg.norm(J, axis=0).astype(np.float32)
    c = np.random.default_rng(seed).standard_normal(K) * 0.8 ** np.arange(K)
    c_true = (c / np.linalg.norm(J @ c)).astype(np.float32)
    Js = J / scale.astype(np.float64)
    ev = np.linalg.eigvalsh(2 * Js.T @ Js)
    sl, sm = np.sqrt(ev[-1]), np.sqrt(ev[0])
    lr = float(np.float32(4 / (sl + sm) ** 2))
    momentum = float(np.float32(((sl - sm) / (sl + sm)) ** 2))
    return Problem(K, x, c_true, scale, lr, momentum, float(ev[-1] / ev[0]))


def data(p: Problem, dtype=mx.float32):
    """The features at the points and at the boundary, and the targets -u*'' and
    u*(+-1) of the manufactured solution, computed by the running arithmetic (in the
    block: double-word)."""
    T, _, DD = chebyshev(mx.array(p.x).astype(dtype), p.K)
    Tb = chebyshev(mx.array([-1.0, 1.0]).astype(dtype), p.K)[0]
    c = mx.array(p.c_true).astype(dtype)
    return (T, DD), Tb, -(DD @ c), Tb @ c


def value64(a: mx.array) -> np.ndarray:
    """``a`` as float64: its exact double-word value (high + low word) where it
    carries a low word."""
    if a.dtype == mx.float64:
        return np.array(a)
    lo = low_word(a)
    hi = np.array(a, dtype=np.float64)
    return hi if lo is None else hi + np.array(lo, dtype=np.float64)


@dataclass
class Run:
    mode: str
    backend: str | None    # the extended run's backend
    loss: np.ndarray       # loss(theta_t), t = 0 .. steps - 1
    theta: np.ndarray      # theta_t, (steps, K)
    seconds_per_step: float  # one step: value_and_grad, update, eval
    float32_ops: dict      # the block's report.float32 (extended runs)


def train(p: Problem, mode: str, steps: int, backend: str | None = None) -> Run:
    """Train from theta = 0: ``mode`` 'float32' (plain MLX), 'extended' (the same code
    inside ``extended_precision()``, on ``backend`` or the default one) or 'float64'
    (the model and data in float64 on the CPU)."""
    dtype = mx.float64 if mode == "float64" else mx.float32
    device = mx.cpu if mode == "float64" else mx.default_device()
    with contextlib.ExitStack() as stack:
        stack.enter_context(mx.stream(device))
        report = None
        if mode == "extended":
            if backend:
                stack.enter_context(mp.use_backend(backend))
            report = stack.enter_context(mp.extended_precision())
        model = ChebyshevPINN(p.scale)
        model.set_dtype(dtype)
        opt = optim.SGD(learning_rate=p.lr, momentum=p.momentum)
        loss_and_grad = nn.value_and_grad(model, loss_fn)
        features, Tb, f, g = data(p, dtype)
        mx.eval(features, Tb, f, g)
        losses, thetas, elapsed = [], [], 0.0
        for _ in range(steps):
            thetas.append(value64(model.theta))
            t0 = time.perf_counter()
            loss, grads = loss_and_grad(model, features, Tb, f, g)
            opt.update(model, grads)
            mx.eval(loss, model.parameters(), opt.state)
            elapsed += time.perf_counter() - t0
            losses.append(value64(loss))
    return Run(mode, backend or (mp.backend() if mode == "extended" else None),
               np.array(losses), np.array(thetas), elapsed / steps,
               dict(report.float32) if report is not None else {})


def reference_numpy(p: Problem, steps: int) -> np.ndarray:
    """The float64 trajectory theta_t recomputed in numpy (the gradient written out
    by hand, MLX's SGD update: v = momentum v + grad, theta -= lr v)."""
    T, _, DD = chebyshev(p.x.astype(np.float64), p.K, np)
    Tb = chebyshev(np.array([-1.0, 1.0]), p.K, np)[0]
    c_true, s = p.c_true.astype(np.float64), p.scale.astype(np.float64)
    f, g = -(DD @ c_true), Tb @ c_true
    theta, v, out = np.zeros(p.K), np.zeros(p.K), []
    for _ in range(steps):
        out.append(theta.copy())
        c = theta / s
        grad = (2 / len(p.x) * DD.T @ (DD @ c + f) + 2 * Tb.T @ (Tb @ c - g)) / s
        v = p.momentum * v + grad
        theta = theta - p.lr * v
    return np.array(out)


def relative_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """||a_t - b_t|| / ||b_t|| row by row, for the rows both have."""
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    return np.linalg.norm(a - b, axis=1) / np.maximum(np.linalg.norm(b, axis=1), 1e-300)


def distance(run: Run, ref: Run) -> np.ndarray:
    """||theta_t - theta_t(ref)|| / ||theta_t(ref)|| for the steps both ran."""
    return relative_distance(run.theta, ref.theta)


def solution_error(run: Run, p: Problem) -> float:
    """Relative error of the final coefficients c = theta / s against the manufactured
    solution's (exact)."""
    c = run.theta[-1] / p.scale.astype(np.float64)
    c_true = p.c_true.astype(np.float64)
    return float(np.linalg.norm(c - c_true) / np.linalg.norm(c_true))


def plateau(loss: np.ndarray) -> tuple[float, int]:
    """The level a run levels off at (the median loss over its last quarter) and the
    first step whose loss is within 10x of it."""
    level = float(np.median(loss[-max(1, len(loss) // 4):]))
    return level, int(np.argmax(loss <= 10 * level))


def table(runs: list[Run], p: Problem) -> str:
    """A markdown table: per run, the steps, the last loss, the plateau and the step
    it is reached, the distance to the float64 trajectory at the last step and the
    error against the exact solution. A run shorter than the float64 one (a prefix)
    has no plateau or final error."""
    ref = next(r for r in runs if r.mode == "float64")
    rows = ["| run | steps | last loss | plateau (median, last quarter) | reached at step "
            "| distance to float64 | error vs exact solution | ms / step |",
            "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        name = r.mode + (f" ({r.backend})" if r.backend else "")
        if len(r.loss) < len(ref.loss):
            name, level, at, err = name + ", prefix", "-", "-", "-"
        else:
            level, at = plateau(r.loss)
            level, err = f"{level:.2e}", f"{solution_error(r, p):.1e}"
        rows.append(f"| {name} | {len(r.loss)} | {r.loss[-1]:.2e} | {level} | {at} | "
                    f"{distance(r, ref)[-1]:.1e} | {err} | {1e3 * r.seconds_per_step:.2f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    import sys
    small = "--small" in sys.argv
    p = make_problem(K=10 if small else 16)
    steps = 300 if small else 1500
    print(f"K = {p.K}, kappa = {p.kappa:.3g}, lr = {p.lr:.6g}, momentum = {p.momentum:.6g}")
    runs = [train(p, m, steps) for m in MODES]
    print(table(runs, p))
    print("float32 ops in the block:", runs[1].float32_ops)
    d = relative_distance(runs[2].theta, reference_numpy(p, steps))
    print(f"MLX float64 vs numpy float64 trajectory: max distance {d.max():.1e}")
