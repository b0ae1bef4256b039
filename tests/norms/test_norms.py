"""Tile norms (mlx_precise.norms) against LAPACK's definitions in exact arithmetic.

The oracle is ``tests/oracle.py``'s :func:`lapack_norm`: LAPACK's reference loops
(xLANGE / xLANTR / xLANSY / xLANHE) evaluated on exact rationals (complex moduli as
exact square roots, sums of complex moduli with mpmath at 220 bits), rounded once
with :meth:`NormValue.rn`; the 4096 x 4096 Frobenius norm uses the exact integer
sum of squares :func:`sum_squares_f32`. Asserted:

* max norms exact (0 ulp) for real data and for complex moduli;
* one, inf and Frobenius norms of float32/complex64 within 1 ulp of the correctly
  rounded value through the kernels (and through the cpu path), for every
  kind x structure x uplo x diag, square / tall / wide, sizes that are not multiples
  of the tile, 1x1 and empty; in fact correctly rounded in every case here;
* float64/complex128 (cpu path) within 2 ulps (float64), max exact;
* entries near 1e36 and 1e-30 (squares outside float32's range), the thresholds
  of the scaled accumulators, float32's extremes: no overflow, no flush to 0;
* subnormal entries: zero on the kernels (Apple GPUs flush them), exact on cpu;
* NaN/Inf in corner tiles propagate as LAPACK's NaN-aware max and sums do, and
  entries outside the structure are never read;
* bad input raises ValueError/TypeError naming the argument.

``pytest -s`` prints how many results were correctly rounded and the worst ulps.
"""

import math
import os
import threading
from collections import defaultdict

import mlx.core as mx
import numpy as np
import pytest
from oracle import (
    Exact,
    NormValue,
    lapack_norm,
    rn32_sqrt,
    round_f32,
    sum_squares_f32,
    ulp_distance,
    ulps_f64,
)

from mlx_precise.core import backends, cputhreads
from mlx_precise.norms import checks as norms_checks
from mlx_precise.norms import engine as norms
from mlx_precise.norms import distributed as nd
from mlx_precise.norms import norm

BACKEND = "emulate"
KINDS = ("max", "one", "inf", "fro")
SHAPES = ((13, 13), (19, 7), (7, 19), (1, 1))  # square, tall, wide: tile 4 leaves ragged edges
# A subset of the combinations (both uplos, a unit diagonal, both symmetric kinds)
# for the tests that multiply cases by positions or processes.
DIST_COMBOS = (("general", "lower", "nonunit"), ("trapezoid", "upper", "unit"),
               ("trapezoid", "lower", "nonunit"), ("symmetric", "lower", "nonunit"),
               ("hermitian", "upper", "nonunit"))
STATS = defaultdict(lambda: [0, 0, 0.0])  # key -> [cases, correctly rounded, max ulps]


def combos(shape):
    """Every valid (structure, uplo, diag) for a shape."""
    for structure in ("general", "trapezoid", "symmetric", "hermitian"):
        if structure in ("symmetric", "hermitian") and shape[0] != shape[1]:
            continue
        for uplo in ("lower", "upper"):
            if structure == "general" and uplo == "upper":
                continue  # uplo is ignored for general matrices
            for diag in ("nonunit", "unit") if structure == "trapezoid" else ("nonunit",):
                yield structure, uplo, diag


def random_matrix(rng, shape, dtype, spread=8):
    """Entries N(0,1) * 2^U[-spread, spread]: many binades, so sums carry."""
    a = rng.standard_normal(shape) * 2.0 ** rng.integers(-spread, spread + 1, shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape) * 2.0 ** rng.integers(-spread, spread + 1, shape)
    return a.astype(dtype)


def ulps(got, ref: NormValue, dtype=np.float32) -> float:
    """Distance of ``got`` from the correctly rounded reference, in ulps; 0 when both
    are NaN (or the same Inf), inf on any other special mismatch."""
    want = ref.rn(dtype)
    got = dtype(got)
    if np.isnan(want) or np.isnan(got):
        return 0.0 if np.isnan(want) and np.isnan(got) else math.inf
    if np.isinf(want) or np.isinf(got):
        return 0.0 if want == got else math.inf
    if dtype == np.float32:
        return float(ulp_distance(got, want, "float32"))
    return float(ulps_f64(got, want))


def record(key, u):
    s = STATS[key]
    s[0] += 1
    s[1] += u == 0
    s[2] = max(s[2], u)


def run_norm(a, kind, structure="general", uplo="lower", diag="nonunit", tile=4,
             backend=BACKEND):
    arr = a if a.dtype in (np.float64, np.complex128) else mx.array(a)
    r = norm(arr, kind, structure=structure, uplo=uplo, diag=diag, tile=tile, backend=backend)
    assert r.shape == ()
    return r


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    for key, (n, exact, worst) in sorted(STATS.items()):
        print(f"\n{key}: {n} cases, {exact} correctly rounded, max {worst:g} ulp", end="")


# ---- every combination ------------------------------------------------------------


@pytest.mark.parametrize("backend", [BACKEND, "cpu"])
@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
def test_every_combination_float32(dtype, backend):
    """float32/complex64 through the kernels (emulate) and the cpu path: every kind x
    structure x uplo x diag on square, tall, wide and 1x1 matrices, tile 4."""
    rng = np.random.default_rng(7 if dtype == np.float32 else 8)
    for shape in SHAPES:
        a = random_matrix(rng, shape, dtype)
        for structure, uplo, diag in combos(shape):
            for kind in KINDS:
                ref = lapack_norm(a, kind, structure, uplo, diag)
                r = run_norm(a, kind, structure, uplo, diag, backend=backend)
                assert r.dtype == mx.float32
                u = ulps(r.item(), ref)
                record(f"{np.dtype(dtype).name} {kind} [{backend}]", u)
                where = f"{kind} {structure} {uplo} {diag} {shape}: got {r.item()!r}, want {ref.rn()!r}"
                assert u == 0 if kind == "max" else u <= 1, where
                assert u == 0, where  # correctly rounded (a random case near a midpoint is ~2^-30 likely)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_every_combination_float64(dtype):
    """float64/complex128 numpy data (the float64 cpu path whatever the backend):
    within 2 ulps of the correctly rounded value, max exact."""
    rng = np.random.default_rng(9)
    for shape in SHAPES:
        a = random_matrix(rng, shape, dtype)
        for structure, uplo, diag in combos(shape):
            for kind in KINDS:
                ref = lapack_norm(a, kind, structure, uplo, diag)
                r = run_norm(a, kind, structure, uplo, diag)
                assert r.dtype == mx.float64
                u = ulps(r.item(), ref, np.float64)
                record(f"{np.dtype(dtype).name} {kind} [cpu]", u)
                assert u == 0 if kind == "max" else u <= 2, (kind, structure, uplo, diag, shape)


def test_mlx_float64_input():
    a = random_matrix(np.random.default_rng(3), (6, 5), np.float64)
    r = norm(mx.array(a, dtype=mx.float64), "one", backend=BACKEND)
    assert r.dtype == mx.float64
    assert ulps(r.item(), lapack_norm(a, "one"), np.float64) <= 2


@pytest.mark.parametrize("shape", [(0, 0), (0, 5), (5, 0)])
def test_empty_is_zero(shape):
    for dtype in (np.float32, np.complex64, np.float64):
        a = np.zeros(shape, dtype)
        for structure, uplo, diag in combos(shape):
            for kind in KINDS:
                r = run_norm(a, kind, structure, uplo, diag)
                assert r.item() == 0.0 and r.dtype == (mx.float64 if dtype == np.float64 else mx.float32)


@pytest.mark.parametrize("tile", [1, 3, 64, 256, 300, 4096])
def test_any_tile_size(tile):
    """Tiles of 1, odd sizes, more than 256 (threads loop over lines), larger than
    the matrix: all correctly rounded."""
    rng = np.random.default_rng(11)
    a = random_matrix(rng, (37, 29), np.float32)
    for kind in KINDS:
        for structure, uplo, diag in (("general", "lower", "nonunit"),
                                      ("trapezoid", "upper", "unit")):
            r = run_norm(a, kind, structure, uplo, diag, tile=tile)
            assert ulps(r.item(), lapack_norm(a, kind, structure, uplo, diag)) == 0
    s = random_matrix(rng, (29, 29), np.complex64)
    for kind in KINDS:
        r = run_norm(s, kind, "hermitian", "lower", tile=tile)
        assert ulps(r.item(), lapack_norm(s, kind, "hermitian", "lower")) == 0


def test_inputs_numpy_and_noncontiguous():
    a = random_matrix(np.random.default_rng(12), (23, 17), np.float32)
    at = mx.array(np.ascontiguousarray(a.T)).T  # a transposed view of the transpose
    for kind in KINDS:
        want = norm(mx.array(a), kind, tile=4, backend=BACKEND).item()
        assert norm(at, kind, tile=4, backend=BACKEND).item() == want
        assert norm(a, kind, tile=4, backend=BACKEND).item() == want  # numpy float32
    assert norm(mx.array(a), backend=BACKEND).item() == pytest.approx(np.linalg.norm(a), rel=1e-6)


# ---- accuracy at size ---------------------------------------------------------------


def test_frobenius_4096_correctly_rounded():
    """4096 x 4096 float32 Frobenius norm (default tile 64: 4096 tiles) against the
    exact integer sum of squares, rounded once. Entries: random sign and significand,
    exponents in [-4, 4]. A float32 running sum of the same squares is printed for
    comparison."""
    r = np.random.default_rng(4096).integers(0, 1 << 32, 4096 * 4096, dtype=np.uint32)
    exp = ((r >> 23) & 0xFF) % 9 + 123  # biased exponents 123..131
    a = ((r & 0x807FFFFF) | (exp << 23)).view(np.float32).reshape(4096, 4096)
    want = rn32_sqrt(sum_squares_f32(a))
    got = norm(mx.array(a), "fro", backend=BACKEND).item()
    u = float(ulp_distance(np.float32(got), want, "float32"))
    record("float32 fro 4096x4096 [emulate]", u)
    assert u == 0, (got, want)
    naive = float(np.sqrt(np.cumsum((a * a).reshape(-1), dtype=np.float32)[-1]))
    print(f"\n4096^2 fro: got {got!r}, exact {want!r}; float32 running sum "
          f"{naive!r} (rel. error {abs(naive - float(want)) / float(want):.2e})", end="")


def test_one_inf_medium_exact():
    """one/inf of a 1000 x 777 float32 matrix (default tile, column and row
    partials over many tiles) against exact integer column/row sums."""
    rng = np.random.default_rng(1000)
    a = random_matrix(rng, (1000, 777), np.float32, spread=20)
    ex = Exact.f32(np.abs(a))
    want_one = round_f32(Exact(np.sum(ex.n, axis=0), ex.k)).max()
    want_inf = round_f32(Exact(np.sum(ex.n, axis=1), ex.k)).max()
    assert norm(mx.array(a), "one", backend=BACKEND).item() == want_one
    assert norm(mx.array(a), "inf", backend=BACKEND).item() == want_inf


def test_rounding_ties_and_near_ties():
    """Adversarial rounding: column sums that are exact float32 midpoints (the
    double-word sum holds them exactly, so ties go to even); a sum 2^-60 above a
    midpoint, below what a double-word next to 1 can hold (1 ulp off is allowed:
    the documented limit of rounding a double-word value); a Frobenius norm that is
    exactly a midpoint, sqrt((2^24 + 1)^2) from entries 2^24, 2^12, 2^12, 1."""
    t = np.float32(2.0**-24)
    ties = np.array([[1, 1, 1 + 2**-22], [t, 3 * t, t]], np.float32)  # col sums 1+2^-24, 1+3*2^-24, ...
    for kind, structure in (("one", "general"), ("inf", "general")):
        a = ties if kind == "one" else ties.T.copy()
        want = lapack_norm(a, kind).rn()
        assert run_norm(a, kind).item() == want  # exact ties, to even
    near = np.array([[1.0], [2.0**-24], [2.0**-60]], np.float32)  # 1 + 2^-24 + 2^-60
    want = lapack_norm(near, "one").rn()
    assert want == np.float32(1 + 2**-23)
    got = run_norm(near, "one").item()
    assert ulp_distance(np.float32(got), want, "float32") <= 1
    print(f"\nnear tie 1 + 2^-24 + 2^-60: got {got!r}, correctly rounded {float(want)!r}", end="")
    fro_tie = np.array([[2.0**24, 2.0**12], [2.0**12, 1.0]], np.float32)
    want = lapack_norm(fro_tie, "fro").rn()
    assert want == np.float32(2.0**24)  # (2^24 + 1) is a tie: to even
    for backend in (BACKEND, "cpu"):
        got = run_norm(fro_tie, "fro", backend=backend).item()
        assert ulp_distance(np.float32(got), want, "float32") <= 1
        print(f"\nfro tie sqrt((2^24+1)^2) [{backend}]: got {got!r}, "
              f"correctly rounded {float(want)!r}", end="")


# ---- range: overflow, underflow, subnormals ---------------------------------------


def scaled_cases():
    """Matrices whose squares leave float32's range, mixed with others, and values
    at the thresholds of the scaled accumulators (2^-40, 2^46) and float32's ends."""
    rng = np.random.default_rng(36)
    base = rng.uniform(1, 2, (9, 11))
    big, tiny = base * 1e36, base * 1e-30
    mixed = np.where(rng.random((9, 11)) < 0.5, big, tiny)
    three = np.where(rng.random((9, 11)) < 0.3, big, np.where(rng.random((9, 11)) < 0.5, base, tiny))
    small_med = np.where(rng.random((9, 11)) < 0.5, base * 2.0**-39, base * 2.0**-41)
    big_med = np.where(rng.random((9, 11)) < 0.5, base * 2.0**45, base * 2.0**47)
    extremes = np.array([[3.4e38, 3.0e38], [2.0**-126, 1.0]])
    one_tiny = np.full((5, 5), 2.0**-126)
    return {"1e36": big, "1e-30": tiny, "1e36+1e-30": mixed, "1e36+1+1e-30": three,
            "2^-40 edge": small_med, "2^46 edge": big_med, "max float": extremes,
            "2^-126": one_tiny}


@pytest.mark.parametrize("name", list(scaled_cases()))
@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
def test_extreme_magnitudes(name, dtype):
    a = scaled_cases()[name]
    a = (a * np.where(np.arange(a.size).reshape(a.shape) % 3 == 0, -1, 1)).astype(np.float64)
    if dtype == np.complex64:
        a = a + 1j * a[::-1, ::-1]
    a = a.astype(dtype)
    for kind in KINDS:
        for structure, uplo in (("general", "lower"), ("trapezoid", "upper")):
            ref = lapack_norm(a, kind, structure, uplo)
            for backend in (BACKEND, "cpu"):
                r = run_norm(a, kind, structure, uplo, backend=backend).item()
                u = ulps(r, ref)
                record(f"extreme {np.dtype(dtype).name} [{backend}]", u)
                assert u <= (0 if kind == "max" else 1), (name, kind, structure, r, ref.rn())
                want = ref.rn()
                assert (r == 0) == (want == 0) and np.isinf(r) == np.isinf(want)


@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
def test_tiny_sums_keep_double_word_accuracy(dtype):
    """Columns of 600 entries in [2^-126, 2^-117): sums ~2^-108, where the low words
    of a plain double-word sum would be flushed (below 2^-126) and it would add like
    float32. The scaled small class of the line sums keeps them exact."""
    rng = np.random.default_rng(126)
    a = rng.uniform(1, 2, (600, 5)) * 2.0 ** rng.integers(-126, -117, (600, 5))
    if dtype == np.complex64:
        a = a + 1j * rng.uniform(1, 2, (600, 5)) * 2.0**-124
    a = a.astype(dtype)
    for kind in KINDS:
        for backend in (BACKEND, "cpu"):
            r = run_norm(a, kind, tile=64, backend=backend).item()
            u = ulps(r, lapack_norm(a, kind))
            record(f"tiny sums {np.dtype(dtype).name} [{backend}]", u)
            assert u == 0, (kind, backend, r)
        r = run_norm(a.T.copy(), "inf", tile=64).item()  # row sums
        assert ulps(r, lapack_norm(a, "one")) == 0


def test_frobenius_overflows_only_when_the_norm_does():
    f = np.float32(np.finfo(np.float32).max)
    a = np.array([[f, f]], np.float32)  # sqrt(2) * max: above float32's range
    assert math.isinf(norm(mx.array(a), backend=BACKEND).item())
    a = np.array([[f / 2, f / 2]], np.float32)  # max / sqrt(2): representable
    assert norm(mx.array(a), backend=BACKEND).item() == lapack_norm(a, "fro").rn()


def subnormal_matrix():
    rng = np.random.default_rng(126)
    a = random_matrix(rng, (10, 9), np.float32)
    sub = (rng.integers(1, 1 << 23, (10, 9)).astype(np.uint32)).view(np.float32)  # 0 < x < 2^-126
    mask = rng.random((10, 9)) < 0.4
    sub = np.where(rng.random((10, 9)) < 0.5, -sub, sub)
    out = np.where(mask, sub, a)
    assert out.dtype == np.float32
    return out, mask


def test_subnormals_read_as_zero_on_kernels():
    """Apple GPUs flush float32 subnormals in arithmetic; the kernels read every
    subnormal entry as 0 (explicitly, by its exponent bits), for every kind."""
    a, mask = subnormal_matrix()
    flushed = np.where(mask, np.float32(0), a)
    for kind in KINDS:
        for structure, uplo, diag in combos(a.shape):
            r = run_norm(a, kind, structure, uplo, diag).item()
            assert ulps(r, lapack_norm(flushed, kind, structure, uplo, diag)) == 0
    only = np.where(mask, a, np.float32(0))  # nothing but subnormals and zeros
    for kind in KINDS:
        assert run_norm(only, kind).item() == 0.0
        assert run_norm(only.astype(np.complex64) * np.complex64(1j), kind).item() == 0.0


def test_subnormals_exact_on_cpu():
    """The cpu path computes in float64, where float32 subnormals are normal
    numbers: they count with their exact values, results are correctly rounded
    (and can be subnormal float32 values themselves)."""
    a, mask = subnormal_matrix()
    only = np.where(mask, a, np.float32(0))
    for m in (a, only):
        for kind in KINDS:
            for structure, uplo, diag in (("general", "lower", "nonunit"),
                                          ("trapezoid", "lower", "nonunit")):
                r = run_norm(m, kind, structure, uplo, diag, backend="cpu").item()
                assert ulps(r, lapack_norm(m, kind, structure, uplo, diag)) == 0
    assert run_norm(only, "max", backend="cpu").item() == np.abs(only).max() > 0


# ---- NaN and Inf ------------------------------------------------------------------


CORNERS = ((0, 0), (0, -1), (-1, 0), (-1, -1), (9, 6))


@pytest.mark.parametrize("dtype", [np.float32, np.complex64, np.float64])
def test_nan_inf_in_corner_tiles(dtype):
    """NaN / +-Inf injected into the corner tiles (and one interior entry) of a
    19 x 13 (and 13 x 13) matrix, tile 4: results follow LAPACK (NaN beats Inf,
    entries the structure does not read have no effect)."""
    rng = np.random.default_rng(99)
    for shape in ((19, 13), (13, 13)):
        base = random_matrix(rng, shape, dtype)
        for where in CORNERS:
            for vals in ((np.nan,), (-np.inf,), (np.inf, np.nan)):
                a = base.copy()
                a[where] = vals[0]
                if len(vals) > 1:
                    a[(where[0] + 1) % shape[0], where[1]] = vals[1]
                for structure, uplo, diag in DIST_COMBOS:
                    if structure in ("symmetric", "hermitian") and shape[0] != shape[1]:
                        continue
                    for kind in KINDS:
                        ref = lapack_norm(a, kind, structure, uplo, diag)
                        r = run_norm(a, kind, structure, uplo, diag).item()
                        ok = ulps(r, ref, np.float64 if dtype == np.float64 else np.float32)
                        assert ok <= 1, (where, vals, structure, uplo, diag, kind, r, ref.rn())


def test_complex_special_parts():
    """(Inf + NaN i): modulus Inf (C99 hypot), so max/one/inf are Inf; the Frobenius
    sum takes the parts separately (zLASSQ), so it is NaN. (NaN + 0i): NaN."""
    a = np.ones((3, 3), np.complex64)
    a[1, 2] = complex(np.inf, np.nan)
    for kind, want in (("max", math.inf), ("one", math.inf), ("inf", math.inf)):
        for backend in (BACKEND, "cpu"):
            assert run_norm(a, kind, backend=backend).item() == want
    for backend in (BACKEND, "cpu"):
        assert math.isnan(run_norm(a, "fro", backend=backend).item())
        a2 = np.ones((3, 3), np.complex64)
        a2[0, 0] = complex(np.nan, 0)
        assert all(math.isnan(run_norm(a2, k, backend=backend).item()) for k in KINDS)


def test_hermitian_ignores_imaginary_diagonal():
    a = np.eye(4, dtype=np.complex64) * np.complex64(3 + 1e30j)
    a[2, 2] = complex(2, np.nan)  # a NaN imaginary part on the diagonal is not read
    for kind, want in (("max", 3.0), ("one", 3.0), ("inf", 3.0), ("fro", math.sqrt(31.0))):
        r = run_norm(a, kind, "hermitian").item()
        assert r == pytest.approx(want, rel=1e-7)
    assert math.isnan(run_norm(a, "max", "symmetric").item())  # symmetric reads it


# ---- distributed layouts, simulated in one process -----------------------------------


LAYOUTS = {
    "rows3": lambda s: nd.block_rows(s, 3),
    "cols2": lambda s: nd.block_cols(s, 2),
    "cyclic2x3": lambda s: nd.block_cyclic(s, (5, 4), (2, 3)),
}


def simulate(a, layout, kind, structure, uplo, diag, backend):
    """What ``norm(..., group=, layout=)`` computes on every rank, with the
    all_gather replaced by a concatenation of the ranks' partials."""
    spec = norms.make_spec(kind, structure, uplo, diag, np.iscomplexobj(a))
    kernel = a.dtype in (np.float32, np.complex64) and backend != "cpu"
    parts = []
    for rank in range(layout.size):
        local = layout.local_block(a, rank)
        args = (spec,) if not kernel else (spec, 4, backend)
        f = norms.kernel_partial if kernel else norms.cpu_partial
        parts.append(f(mx.array(local) if kernel else local, *args, layout.shape,
                       layout.row_map(rank), layout.col_map(rank)))
    values = mx.concatenate([p.values.reshape(-1) for p in parts])
    dtype = mx.float32 if a.dtype in (np.float32, np.complex64) else mx.float64
    return nd.combine(values, parts[0].kind, layout.size, dtype, backend, kernel)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", [np.float32, np.complex64, np.float64])
def test_layouts_simulated(layout, dtype):
    """Block rows (3 processes, one of them empty for 3 x 23), block columns, 2D
    block-cyclic (5 x 4 blocks on a 2 x 3 grid): local partials on global indices,
    combined as the distributed norm combines them."""
    rng = np.random.default_rng(21)
    backend = "cpu" if dtype == np.float64 else BACKEND
    for shape in ((17, 13), (11, 11), (3, 23)):
        a = random_matrix(rng, shape, dtype)
        lay = LAYOUTS[layout](shape)
        for structure, uplo, diag in DIST_COMBOS:
            if structure in ("symmetric", "hermitian") and shape[0] != shape[1]:
                continue
            for kind in KINDS:
                ref = lapack_norm(a, kind, structure, uplo, diag)
                r = simulate(a, lay, kind, structure, uplo, diag, backend).item()
                u = ulps(r, ref, np.float64 if dtype == np.float64 else np.float32)
                record(f"{np.dtype(dtype).name} layouts [{backend}]", u)
                assert u <= (0 if kind == "max" else 1), (layout, shape, structure, uplo, diag, kind)


def test_frobenius_scales_combine_across_processes():
    """Rank 0 holds only entries ~1e-30 (small accumulator), rank 1 only ~1e30 (big),
    rank 2 ordinary ones: their accumulators combine without overflow or loss."""
    rng = np.random.default_rng(30)
    a = np.concatenate([rng.uniform(1, 2, (4, 6)) * 1e-30, rng.uniform(1, 2, (4, 6)) * 1e30,
                        rng.uniform(1, 2, (4, 6))]).astype(np.float32)
    lay = nd.block_rows(a.shape, 3)
    for kind in KINDS:
        for backend in (BACKEND, "cpu"):
            r = simulate(a, lay, kind, "general", "lower", "nonunit", backend).item()
            assert ulps(r, lapack_norm(a, kind)) == 0
    small = a[:4]  # only the small accumulator on one rank, zeros elsewhere
    z = np.concatenate([small, np.zeros((8, 6), np.float32)])
    r = simulate(z, lay, "fro", "general", "lower", "nonunit", BACKEND).item()
    assert ulps(r, lapack_norm(z, "fro")) == 0 and r > 0


def test_layout_checks():
    lay = nd.block_cyclic((10, 7), (3, 2), (2, 2))
    assert [lay.local_shape(r) for r in range(4)] == [(6, 4), (6, 3), (4, 4), (4, 3)]
    a = np.arange(70.0).reshape(10, 7)
    assert lay.local_block(a, 3).tolist() == a[np.ix_([3, 4, 5, 9], [2, 3, 6])].tolist()
    assert nd.block_rows((7, 3), 3).local_shape(2) == (1, 3)
    assert nd.block_rows((2, 3), 3).local_shape(2) == (0, 3)
    with pytest.raises(ValueError, match="layout block"):
        nd.Layout((4, 4), (0, 2), (1, 1))
    with pytest.raises(ValueError, match="layout shape"):
        nd.Layout((4, -1), (1, 2))
    with pytest.raises(ValueError, match="global shape"):
        lay.local_block(np.zeros((3, 3)), 0)
    group = mx.distributed.init()  # a singleton group without a launcher
    x = mx.zeros((10, 7))
    with pytest.raises(ValueError, match="layout is required"):
        norm(x, group=group)
    with pytest.raises(TypeError, match="layout must be"):
        norm(x, group=group, layout=(10, 7))
    with pytest.raises(ValueError, match="group has 1"):
        norm(x, group=group, layout=lay)
    single = nd.block_rows((10, 7), 1)
    with pytest.raises(ValueError, match=r"local block of shape \(10, 7\)"):
        norm(mx.zeros((9, 7)), group=group, layout=single)
    with pytest.raises(ValueError, match="square"):
        norm(x, structure="symmetric", group=group, layout=single)
    a32 = random_matrix(np.random.default_rng(1), (10, 7), np.float32)
    for kind in KINDS:  # a one-process group computes the plain norm
        assert norm(mx.array(a32), kind, group=group, layout=single,
                    backend=BACKEND).item() == lapack_norm(a32, kind).rn()


# ---- bad input ------------------------------------------------------------------------


def test_bad_input():
    x = mx.zeros((3, 4))
    sq = mx.zeros((3, 3))
    with pytest.raises(ValueError, match="kind must be one of"):
        norm(x, "two")
    with pytest.raises(ValueError, match="kind must be one of"):
        norm(x, 2)
    with pytest.raises(ValueError, match="structure must be one of"):
        norm(x, structure="banded")
    with pytest.raises(ValueError, match="uplo must be"):
        norm(sq, uplo="both")
    with pytest.raises(ValueError, match="diag must be"):
        norm(x, structure="trapezoid", diag="yes")
    for s in ("general", "symmetric", "hermitian"):
        with pytest.raises(ValueError, match="diag='unit' applies only to structure='trapezoid'"):
            norm(sq, structure=s, diag="unit")
    for s in ("symmetric", "hermitian"):
        with pytest.raises(ValueError, match=r"needs a square matrix, got A of shape \(3, 4\)"):
            norm(x, structure=s)
    for bad in (mx.zeros((3, 3), mx.int32), mx.zeros((3, 3), mx.bool_),
                mx.zeros((3, 3), mx.float16), np.zeros((3, 3), np.int64)):
        with pytest.raises(TypeError, match="A has dtype .*, expected float32, complex64, float64 or complex128"):
            norm(bad)
    with pytest.raises(TypeError, match="A must be an mx.array"):
        norm("A")
    for shape in ((3,), (2, 3, 4), ()):
        with pytest.raises(ValueError, match="A must be a 2-D matrix"):
            norm(mx.zeros(shape))
    for tile in (0, -4, 5000, 2.0, True):
        with pytest.raises(ValueError, match="tile must be an int"):
            norm(x, tile=tile)
    with pytest.raises(ValueError, match="unknown backend"):
        norm(x, backend="gpu")


def test_lapack_spellings():
    a = random_matrix(np.random.default_rng(5), (6, 6), np.float32)
    for kind, alias in (("max", "M"), ("one", "1"), ("one", "O"), ("inf", "I"),
                        ("fro", "F"), ("fro", "E")):
        assert norm(a, alias, structure="trapezoid", uplo="U", diag="U",
                    tile=4, backend=BACKEND).item() == norm(
            a, kind, structure="trapezoid", uplo="upper", diag="unit", tile=4,
            backend=BACKEND).item()


def test_uplo_is_ignored_for_general():
    a = random_matrix(np.random.default_rng(6), (9, 5), np.complex64)
    for kind in KINDS:
        assert (run_norm(a, kind, "general", "upper").item()
                == run_norm(a, kind, "general", "lower").item()
                == lapack_norm(a, kind).rn())


def test_selftest_checks():
    for backend in (BACKEND, "cpu"):
        checks = norms_checks.selftest_checks(backends.get(backend))
        assert len(checks) == 10 and all(c.passed for c in checks), [c.line() for c in checks]


# ---- cpu streaming path (float32 / complex64, general) ----------------------------


@pytest.mark.parametrize("dtype,shape", [(np.float32, (60, 300)), (np.float32, (2, 1500)),
                                         (np.complex64, (40, 100))])
def test_cpu_streaming_blocks_correctly_rounded(monkeypatch, dtype, shape):
    """The cpu streaming pass over many row blocks (blocks of 1024 values here, two
    threads; a row longer than a block) gives the correctly rounded norm, 0 ulp."""
    monkeypatch.setattr(norms, "_BLOCK_VALUES", 1024)
    monkeypatch.setattr(cputhreads, "_MIN_VALUES", 1024)  # threads even for small data
    threads, block_reduce = set(), norms._block_reduce
    monkeypatch.setattr(norms, "_block_reduce",
                        lambda *a: threads.add(threading.get_ident()) or block_reduce(*a))
    a = random_matrix(np.random.default_rng(77), shape, dtype, spread=20)
    for kind in KINDS:
        want = lapack_norm(a, kind).rn()
        got = run_norm(a, kind, backend="cpu").item()
        assert ulps(got, lapack_norm(a, kind)) == 0, (kind, got, want)
    assert len(threads) >= min(2, os.cpu_count() or 1)


def test_cpu_streaming_near_ties_take_the_exact_path(monkeypatch):
    """1 + 2^-24 + 2^-60 as a column (one) or row (inf) sum: float64 holds 1 + 2^-24,
    a float32 midpoint; the error interval straddles it, so the exact double-double
    path decides: 1 + 2^-23, correctly rounded (the float64 value alone would round
    to 1). Counted through the exact path's entry point."""
    calls = []
    exact = norms.cpu_partial
    monkeypatch.setattr(norms, "cpu_partial", lambda *a, **k: calls.append(1) or exact(*a, **k))
    near = np.array([[1.0], [2.0**-24], [2.0**-60]], np.float32)
    for kind, a in (("one", near), ("inf", near.T.copy())):
        assert run_norm(a, kind, backend="cpu").item() == np.float32(1 + 2**-23)
    assert len(calls) == 2
    far = np.array([[1.0], [2.0**-20]], np.float32)  # nowhere near a boundary: streamed
    assert run_norm(far, "one", backend="cpu").item() == np.float32(1 + 2**-20)
    assert len(calls) == 2


def test_cpu_streaming_memory_is_bounded():
    """A 2048 x 2048 float32 norm (16 MiB) on cpu allocates well under 8 MiB of numpy
    temporaries (tracemalloc), every kind; NaN and Inf still propagate."""
    import tracemalloc

    a = np.random.default_rng(5).standard_normal((2048, 2048), dtype=np.float32)
    A = mx.array(a)
    for kind in KINDS:
        tracemalloc.start()
        norm(A, kind, backend="cpu")
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 8 * 2**20, (kind, peak)
    a[5, 7], a[2000, 3] = np.inf, np.nan
    got = [norm(mx.array(a), k, backend="cpu").item() for k in KINDS]
    assert all(math.isnan(g) for g in got), got
    a[2000, 3] = 1.0
    got = [norm(mx.array(a), k, backend="cpu").item() for k in KINDS]
    assert all(math.isinf(g) for g in got), got
