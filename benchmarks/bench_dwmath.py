"""Accuracy of the double-word elementary functions (mlx_precise.doubleword.functions) against mpmath.

Prints, per function and backend, the largest relative error |computed - f(x)| / |f(x)|
(as log2) over adversarial and random inputs: the table of docs/dwmath.md. The
test suite (tests/doubleword/test_dwmath.py) runs the same cases at a smaller size and asserts
the bounds.

    python benchmarks/bench_dwmath.py [--n 4000] [--backends cpu,emulate] [--seed 0]

Inputs are double-words (hi, lo) whose exact values lie in each function's
accuracy domain (results of magnitude >= 2^-78, see docs/dwmath.md); the oracle is
mpmath at 120 bits on the exact value hi + lo (independent of the code under test).
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx
import mpmath as mp
import numpy as np

from mlx_precise import DoubleWord
from mlx_precise.doubleword import functions as dwmath

PREC = 120


def _dw(hi, lo=None) -> tuple[np.ndarray, np.ndarray]:
    hi = np.asarray(hi, np.float32).ravel()
    lo = np.zeros_like(hi) if lo is None else np.asarray(lo, np.float32).ravel()
    return hi, lo


def _split(v) -> tuple[np.ndarray, np.ndarray]:
    """float64 values -> (hi, lo) words (exact)."""
    v = np.asarray(v, np.float64).ravel()
    hi = v.astype(np.float32)
    return hi, (v - hi.astype(np.float64)).astype(np.float32)


def _near(points) -> tuple[np.ndarray, np.ndarray]:
    """Double-words at the float64 values nearest to the mpmath values ``points``
    (within 2^-53 relative: a reduction must cancel ~53 bits), split exactly, so
    that the cpu backend's float64 sees the same numbers."""
    return _split([float(p) for p in points])


def _cat(*parts) -> tuple[np.ndarray, np.ndarray]:
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def _logu(rng, lo, hi, n):
    return np.exp(rng.uniform(np.log(lo), np.log(hi), n))


def cases(fn: str, n: int, seed: int = 0):
    """``(mpmath function, operands)`` for ``fn``: operands are one or two (hi, lo)
    pairs of float32 arrays of equal length (about ``n``): adversarial points first,
    then random ones."""
    mp.mp.prec = PREC
    rng = np.random.default_rng(seed)
    r = max(n // 2, 1)
    pi2 = mp.pi / 2
    if fn == "exp":
        adv = _cat(_split([88.72, 88.7228, 88.72283, -54.0, -53.9, 1e-30, -1e-30, 0.5, 1.0]),
                   _near([mp.log(2) / 128 * (2 * k + 1) for k in range(-40, 40)]),
                   _near([mp.log(2) * k for k in range(-77, 128)]))
        return mp.exp, [_cat(adv, _split(rng.uniform(-54, 88.72, r)), _split(rng.uniform(-1, 1, r)))]
    if fn == "expm1":
        adv = _cat(_split(np.r_[10.0 ** -np.arange(1, 38), -(10.0 ** -np.arange(1, 38))]),
                   _near([mp.log(2) / 128 * k for k in range(-70, 70)]),
                   _split([0.3465, -0.3465, 0.35, -0.35, 1.0, -1.0, 40.0, 40.1, -40.0, -87.0]))
        return mp.expm1, [_cat(adv, _split(rng.uniform(-2, 2, r)), _split(rng.uniform(-50, 88, r)))]
    if fn in ("log", "log2", "log10"):
        f = {"log": mp.log, "log2": lambda v: mp.log(v, 2), "log10": mp.log10}[fn]
        near1 = [1 + mp.mpf(2) ** -k * s for k in range(1, 53) for s in (1, -1)]
        adv = _cat(_near(near1), _split(2.0 ** np.arange(-77, 128)),
                   _split(10.0 ** np.arange(-23, 39)), _split([3.4028234e38, 2.0 ** -77]))
        return f, [_cat(adv, _split(_logu(rng, 2.0 ** -77, 3e38, r)),
                        _split(rng.uniform(0.5, 2.0, r)))]
    if fn == "log1p":
        near = [-1 + mp.mpf(2) ** -k for k in range(1, 53)]
        adv = _cat(_near(near), _split(np.r_[10.0 ** -np.arange(1, 38), -(10.0 ** -np.arange(1, 38))]),
                   _split([3e38, 1e10, -0.5, 0.5, 1.0]))
        return mp.log1p, [_cat(adv, _split(rng.uniform(-0.99, 3, r)), _split(rng.uniform(-1e-3, 1e-3, r)))]
    if fn in ("sin", "cos"):
        f = mp.sin if fn == "sin" else mp.cos
        ks = np.unique(np.r_[np.arange(1, 200), rng.integers(1, 2**20, 200)])
        big = [pi2 * int(k) for k in rng.integers(2**20, 2**40, 40)]
        adv = _cat(_near([pi2 * int(k) for k in ks]), _near(big),
                   _split([1e-30, -1e-30, 1e10, 1e20, 1e30, 3.4e38, -3.4e38, 2.0 ** 20]))
        return f, [_cat(adv, _split(rng.uniform(-10, 10, r)), _split(rng.uniform(-2**20, 2**20, r)))]
    if fn == "tanh":
        adv = _split(np.r_[10.0 ** -np.arange(1, 38), -(10.0 ** -np.arange(1, 38)), 19.9, -19.9, 20.5])
        return mp.tanh, [_cat(adv, _split(rng.uniform(-3, 3, r)), _split(rng.uniform(-20, 20, r)))]
    if fn == "sigmoid":
        adv = _split(np.r_[0.0, 1e-20, -1e-20, 17.0, 20.0, 50.0, 100.0, 103.0, -50.0, -54.0])
        return (lambda v: 1 / (1 + mp.exp(-v))), [_cat(adv, _split(rng.uniform(-54, 120, r)),
                                                      _split(rng.uniform(-5, 5, r)))]
    if fn == "erf":
        adv = _split(np.r_[10.0 ** -np.arange(1, 38), 0.5 * np.arange(1, 13), 0.49999997,
                           0.5, 5.999999, 6.0, 4.0, -4.0])
        edges = np.r_[0.5 + 0.25 * np.arange(23)]
        adv = _cat(adv, _split(np.r_[edges, np.nextafter(edges, 0)]))
        return mp.erf, [_cat(adv, _split(rng.uniform(-6.5, 6.5, r)), _split(rng.uniform(-1, 1, r)))]
    if fn in ("sqrt", "rsqrt"):
        f = mp.sqrt if fn == "sqrt" else (lambda v: 1 / mp.sqrt(v))
        adv = _cat(_split(2.0 ** np.arange(-77, 128)), _near([1 + mp.mpf(2) ** -k for k in range(1, 48)]),
                   _split([3.4028234e38, 2.0 ** -77 * 3]))
        return f, [_cat(adv, _split(_logu(rng, 2.0 ** -77, 3e38, r)))]
    if fn == "reciprocal":
        adv = _split(np.r_[2.0 ** np.arange(-77, 78), 3.0, -3.0, 1e37, -1e-23])
        return (lambda v: 1 / v), [_cat(adv, _split(rng.uniform(-10, 10, r)),
                                        _split(_logu(rng, 1e-23, 1e23, r)))]
    if fn == "power":
        # near overflow / underflow (y log x ~ 88 or -54) with x near 1 and far from it
        xs, ys = [], []
        for k in range(1, 24):
            x = 1 + 2.0 ** -k
            for t in (88.7, -54.0, 60.0):
                xs.append(x)
                ys.append(t / np.log(x))
        xa = np.r_[xs, 2.0, 2.0, 0.5, 10.0, -2.0, -2.0, -3.0, 7.0]
        ya = np.r_[ys, 127.9, -125.5, 100.0, 38.0, 3.0, 101.0, -8.0, 0.5]
        xr = _logu(rng, 1e-3, 1e3, r)
        yr = rng.uniform(-1, 1, r) * 50 / np.maximum(np.abs(np.log(xr)), 1)
        x2 = rng.uniform(0.1, 10, r)
        y2 = rng.uniform(-5, 5, r)
        return mp.power, [_split(np.r_[xa, xr, x2]), _split(np.r_[ya, yr, y2])]
    if fn == "arctan2":
        ya = np.r_[1.0, 1.0, -1.0, 1e-30, 1e30, 1.0, 3.0, 1.0000001, -2.0 ** -70]
        xa = np.r_[1.0, -1.0, -1.0, 1.0, 1e-30, -1e-30, 3.0000002, 1.0, -1.0]
        yr = rng.uniform(-5, 5, 2 * r) * np.exp(rng.uniform(-20, 20, 2 * r))
        xr = rng.uniform(-5, 5, 2 * r) * np.exp(rng.uniform(-20, 20, 2 * r))
        return mp.atan2, [_split(np.r_[ya, yr]), _split(np.r_[xa, xr])]
    if fn == "cexp":
        ks = rng.integers(1, 2**20, 100)
        b_adv = _near([pi2 * int(k) for k in ks])
        a_adv = _split(rng.uniform(-50, 80, len(ks)))
        a = _cat(a_adv, _split(rng.uniform(-50, 80, r)), _split([88.8, 89.5, 0.0, -1.0]))
        b = _cat(b_adv, _split(rng.uniform(-2**20, 2**20, r)), _split([0.1, 0.05, 2.0**20, 1e5]))
        return (lambda a_, b_: mp.exp(mp.mpc(a_, b_))), [a, b]
    raise ValueError(fn)


FUNCTIONS = dwmath.UNARY + dwmath.BINARY + ("cexp",)


def exact_values(words) -> list:
    mp.mp.prec = PREC
    hi, lo = words
    return [mp.mpf(float(h)) + mp.mpf(float(l)) for h, l in zip(hi, lo)]


def oracle(fn: str, f, operands) -> list:
    """mpmath values of ``f`` at the exact operands (complex for cexp)."""
    vals = [exact_values(w) for w in operands]
    mp.mp.prec = PREC
    return [f(*args) for args in zip(*vals)]


def run(fn: str, operands, backend: str):
    """The function on ``backend``: (hi, lo) numpy arrays (real, imaginary for cexp)."""
    dws = [DoubleWord(mx.array(h), mx.array(lo_)) for h, lo_ in operands]
    if fn == "cexp":
        from mlx_precise.doubleword import complex_from_parts  # noqa: PLC0415

        z = DoubleWord(complex_from_parts(dws[0].hi, dws[1].hi),
                       complex_from_parts(dws[0].lo, dws[1].lo))
        r = dwmath.unary("exp", z, backend)
        mx.eval(r.hi, r.lo)
        h, lo_ = np.array(r.hi), np.array(r.lo)
        return (h.real.copy(), lo_.real.copy()), (h.imag.copy(), lo_.imag.copy())
    r = (dwmath.binary(fn, *dws, backend) if fn in dwmath.BINARY
         else dwmath.unary(fn, dws[0], backend))
    mx.eval(r.hi, r.lo)
    return (np.array(r.hi), np.array(r.lo))


def max_rel_error(fn: str, ref: list, got) -> float:
    """Largest relative error (normwise |z - w| / |w| for cexp) over the points whose
    exact result has magnitude >= 2^-78 (the accuracy domain)."""
    mp.mp.prec = PREC
    tiny = mp.mpf(2) ** -78
    worst = mp.mpf(0)
    if fn == "cexp":
        (rh, rl), (ih, il) = got
        vals = zip(exact_values((rh, rl)), exact_values((ih, il)))
        for (re, im), w in zip(vals, ref):
            if abs(w) >= tiny and abs(w) < mp.mpf(2) ** 128:
                worst = max(worst, abs(mp.mpc(re, im) - w) / abs(w))
        return float(worst)
    for g, w in zip(exact_values(got), ref):
        if abs(w) >= tiny and abs(w) < mp.mpf(2) ** 128:
            worst = max(worst, abs(g - w) / abs(w))
    return float(worst)


def measure(fn: str, n: int, backends, seed: int = 0) -> dict:
    f, operands = cases(fn, n, seed)
    ref = oracle(fn, f, operands)
    return {b: max_rel_error(fn, ref, run(fn, operands, b)) for b in backends}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=None,
                   help="random points per function (default 4000; --quick 200, --full 40000)")
    p.add_argument("--backends", default="cpu,emulate")
    p.add_argument("--backend", default=None, help="one backend (overrides --backends)")
    p.add_argument("--seed", type=int, default=0)
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="200 random points per function")
    size.add_argument("--full", action="store_true", help="40000 random points per function")
    args = p.parse_args(argv)
    if args.n is None:
        args.n = 200 if args.quick else 40000 if args.full else 4000
    backends = [args.backend] if args.backend else args.backends.split(",")
    print(f"max relative error (log2) over adversarial + {args.n} random points, seed "
          f"{args.seed}")
    print("| function | " + " | ".join(backends) + " |")
    print("|---|" + "---|" * len(backends))
    for fn in FUNCTIONS:
        t = time.perf_counter()
        errs = measure(fn, args.n, backends, args.seed)
        cells = [f"{np.log2(e):.2f}" if e > 0 else "exact" for e in errs.values()]
        print(f"| {fn} | " + " | ".join(cells) + f" |  ({time.perf_counter() - t:.1f} s)")


if __name__ == "__main__":
    main()
