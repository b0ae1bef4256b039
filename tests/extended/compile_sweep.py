"""The sweep of tests/extended/test_compiled_ops_*.py: for every op with a rule and
its gradient, a traced function (``mx.compile``, or an export) that opens the block
inside computes what the uncompiled call computes, bit for bit, or raises
TransformUnsupportedError (never MLX's own evaluation error). Oracles: the
uncompiled calls (themselves tested against float64 elsewhere). One file per
backend, so that the two sweeps (the suite's longest tests) run on two workers."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import mlx.core as mx
import numpy as np

import mlx_precise as mp
from mlx_precise import TransformUnsupportedError
from mlx_precise.extended import registry

_rng = np.random.default_rng(0)


def _f32(*shape, shift=0.5):
    return mx.array(_rng.random(shape).astype(np.float32) + shift)


X, Y = _f32(3, 4), _f32(3, 4)
_M = _rng.random((4, 4))
SPD = mx.array((_M @ _M.T + 4 * np.eye(4)).astype(np.float32))
IDX = mx.array(np.array([[0, 2, 1, 0]] * 3, dtype=np.int32))
Q = _f32(1, 2, 5, 8)
# Ops whose generic argument patterns (below) do not fit: one call each.
SPECIAL = {
    "addmm": ((X @ Y.T, X, Y.T), {}), "matmul": ((X, Y.T), {}), "gather_mm": ((X, Y.T), {}),
    "einsum": (("ij,kj->ik", X, Y), {}), "arange": ((3,), {}),
    "fft.fftfreq": ((8, 0.5), {}), "fft.rfftfreq": ((8, 0.5), {}),
    "conv1d": ((_f32(2, 8, 3), _f32(5, 3, 3)), {}),
    "conv_general": ((_f32(2, 8, 3), _f32(5, 3, 3)), {}),
    "conv_transpose1d": ((_f32(2, 8, 3), _f32(5, 3, 3)), {}),
    "conv2d": ((_f32(1, 6, 6, 2), _f32(3, 3, 3, 2)), {}),
    "conv_transpose2d": ((_f32(1, 6, 6, 2), _f32(3, 3, 3, 2)), {}),
    "conv3d": ((_f32(1, 4, 4, 4, 2), _f32(3, 2, 2, 2, 2)), {}),
    "conv_transpose3d": ((_f32(1, 4, 4, 4, 2), _f32(3, 2, 2, 2, 2)), {}),
    "convolve": ((X[0], Y[0]), {}),
    "fast.layer_norm": ((X, Y[0], Y[1], 1e-5), {}), "fast.rms_norm": ((X, Y[0], 1e-5), {}),
    "fast.rope": ((Q, 8), {"traditional": False, "base": 10000.0, "scale": 1.0, "offset": 0}),
    "fast.scaled_dot_product_attention": ((Q, Q, Q), {"scale": 0.5}),
    "fft.stft": ((X[0],), {}), "put_along_axis": ((X, IDX, Y, 1), {}),
    "take_along_axis": ((X, IDX, 1), {}),
    "slice": ((X, mx.array([1]), [1], [2]), {}),
    "slice_update": ((X, Y[:1], mx.array([0, 0]), [0, 1]), {}),
    "linalg.cross": ((X[:, :3], Y[:, :3]), {}), "searchsorted": ((mx.sort(X[0]), Y[0]), {}),
    "meshgrid": ((X[0], Y[0]), {}), "broadcast_to": ((X[0], (3, 4)), {}),
    "reshape": ((X, (4, 3)), {}), "unflatten": ((X, 1, (2, 2)), {}),
    "moveaxis": ((X, 0, 1), {}), "swapaxes": ((X, 0, 1), {}), "pad": ((X, 1), {}),
    "linspace": ((0.1, 0.7, 5), {}), "where": ((X > 1.0, X, Y), {}),
    "permute_dims": ((X, (1, 0)), {}), "astype": ((X, mx.float32), {}),
}


UNORDERED = ("partition", "argpartition")  # MLX leaves the order around the kth open


def _patterns(op):
    if op in SPECIAL:
        return [SPECIAL[op]]
    if op.startswith("linalg."):
        return [((SPD,), {}), ((SPD, Y.T), {})]
    return [((X,), {}), ((X, Y), {}), ((X,), {"axis": -1}), ((X, 1), {}), ((X, 2), {})]


def _ops_with_rules() -> dict:
    """op name -> (owner, attribute) of every MLX function with a rule."""
    return {e.op: (e.owner, e.attr) for e in registry.entries()
            if e.kind == "rule" and e.owner is not mx.array and not e.op.startswith("random.")}


def _is_float(a) -> bool:
    return isinstance(a, mx.array) and mx.issubdtype(a.dtype, mx.floating)


def _floats(args):
    return [a for a in args if _is_float(a)]


def _call(fn, args, kw, gradient, arrays):
    """fn on ``args`` with its float arrays replaced by ``arrays``; ``gradient``:
    the gradient of the sum of its float outputs with respect to the first one."""
    it = iter(arrays)
    real = [next(it) if _is_float(a) else a for a in args]
    if not gradient:
        return fn(*real, **kw)
    k = next(j for j, a in enumerate(args) if _is_float(a))

    def loss(v):
        r = list(real)
        r[k] = v
        out = fn(*r, **kw)
        outs = out if isinstance(out, (list, tuple)) else [out]
        return sum(mx.sum(mx.real(o) if o.dtype == mx.complex64 else o) for o in outs
                   if mx.issubdtype(o.dtype, mx.floating) or o.dtype == mx.complex64)

    return mx.grad(loss)(real[k])


def _bits(v):
    return [np.array(a) for a in (v if isinstance(v, (list, tuple)) else [v])]


def _first_pattern(owner, attr, op, backend, gradient):
    """(args, kw, float arrays, the uncompiled result) of the first argument
    pattern the op (or its gradient) takes on ``backend``, or None."""
    for args, kw in _patterns(op):
        arrays = _floats(args)
        if gradient and not arrays:
            return None
        try:
            with mp.use_backend(backend), mp.extended_precision():
                want = _call(getattr(owner, attr), args, kw, gradient, arrays)
            mx.eval(want)
        except Exception:  # noqa: BLE001  (a pattern the op does not take)
            continue
        return args, kw, arrays, _bits(want)
    return None


# Ops whose traced graphs MLX's CPU compiler fuses in the cpu sweep below: a few of
# each family of the cpu engine's float64 formulas (arithmetic, the elementary
# functions: exp's pieces, sigmoid, power, rsqrt; reductions and scans; products
# and convolutions; the fast norms). MLX's compiler builds a C++ kernel per fused
# graph, about 0.4-0.8 s each on a fresh machine: fusing every op's graph and
# gradient built about 300 of them, four minutes of the suite (43 ops: about 100 s
# of the cold suite's longest test). rope and attention, whose cpu forms are those
# families' steps (cos, sin, products, softmax), took 13 s and 2.6 s cold here, sin
# and erf (17 and 18 kernels: their reductions and tables split the graph) 8.6 s
# and 9.5 s: they are left to the export. The other ops' graphs (selections too:
# exact whatever a compiler does) are traced by an export (the same trace, without
# fusion) and replayed, their bits compared the same way.
FUSED = frozenset((
    "add", "divide", "exp", "sigmoid", "power", "rsqrt", "softmax", "sum", "var",
    "cumsum", "matmul", "conv1d", "fast.layer_norm", "linalg.norm"))


def _traced(run, arrays, backend: str, op: str) -> list:
    """``run(*arrays)`` (a flat list of arrays) traced: compiled by ``mx.compile``,
    or on cpu for an op outside :data:`FUSED`, exported and imported (compiled
    where MLX cannot write a primitive of the graph: ``Contiguous``, ...)."""
    if backend == "cpu" and op not in FUSED:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "run.mlxfn")
            try:
                mx.export_function(path, run, *arrays)
            except ValueError as e:
                if "Unable to serialize" not in str(e):
                    raise
            else:
                return mx.import_function(path)(*arrays)
    return mx.compile(run)(*arrays)


def _flat(outs) -> list:
    return [a for out in outs for a in (out if isinstance(out, (list, tuple)) else [out])]


def check_every_op(backend: str) -> None:
    """For every op with a rule and its gradient: a traced function that opens the
    block and calls it gives the uncompiled call's bits, or raises
    TransformUnsupportedError; any other error fails. Traced: by ``mx.compile``, or
    on cpu for ops outside :data:`FUSED` by an export (MLX's trace without its
    fusion). On cpu only the FFTs and eig / eigvals (numpy on the host) cannot be
    traced. Where the op and its gradient take the same arguments, one function
    returns both."""
    same, unsupported, exercised = [], [], {False: 0, True: 0}
    for op, (owner, attr) in sorted(_ops_with_rules().items()):
        found = {g: _first_pattern(owner, attr, op, backend, g) for g in (False, True)}
        jobs = [[g] for g, f in found.items() if f is not None]
        if len(jobs) == 2 and found[False][:2] == found[True][:2]:
            jobs = [[False, True]]
        for kinds in jobs:
            args, kw, arrays, _ = found[kinds[0]]

            def run(*a, args=args, kw=kw, kinds=kinds):
                with mp.use_backend(backend), mp.extended_precision():
                    return _flat(_call(getattr(owner, attr), args, kw, g, a) for g in kinds)

            for g in kinds:
                exercised[g] += 1
            try:
                got = _traced(run, arrays, backend, op)
                mx.eval(got)
            except TransformUnsupportedError:
                unsupported.append(op)
                continue
            got = iter(_bits(got))
            for g in kinds:
                w = found[g][3]
                c = [next(got) for _ in w]
                if op in UNORDERED:  # only the kth place is defined: compare it
                    w, c = [v[..., args[1]] for v in w], [v[..., args[1]] for v in c]
                if not all(np.array_equal(a, b, equal_nan=True) for a, b in zip(w, c)):
                    same.append((op, "gradient" if g else "forward"))
            assert next(got, None) is None, op  # as many outputs as the uncompiled calls
    assert not same, f"traced != uncompiled: {same}"
    assert exercised[False] >= 180 and exercised[True] >= 140, exercised
    assert FUSED <= set(_ops_with_rules())
    unsupported = sorted(set(unsupported))
    if backend == "cpu":
        host = [op for op in unsupported if not op.startswith("fft.")]
        assert host in ([], ["linalg.eig", "linalg.eigvals"]), host
    else:  # the emulator runs kernels eagerly: anything that launches one raises
        assert "exp" in unsupported and "add" in unsupported


def check_every_op_in_a_fresh_process(backend: str) -> None:
    """:func:`check_every_op` in a new interpreter, its output shown where it fails.
    Each of the sweep's blocks (one per op and gradient) finds that MLX functions'
    reference counts changed since the last block closed (MLX's compile holds
    references to them, which no Python object shows) and scans the heap for new
    holders: in a test session's heap, every test module imported, that took three
    times as long as in a fresh process's."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    out = subprocess.run(
        [sys.executable, "-c", f"import compile_sweep; compile_sweep.check_every_op({backend!r})"],
        capture_output=True, text=True, timeout=1200, env={**os.environ, "PYTHONPATH": path})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-6000:]
