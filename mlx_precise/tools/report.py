"""``python -m mlx_precise report``: regenerate the accuracy tables and plots of docs/.

Writes ``<out>/accuracy.md`` (markdown tables) and, when matplotlib is installed
(``pip install matplotlib``; the ``plots`` extra of a checkout), PNG plots in ``<out>/img/``; without matplotlib
the plots are skipped, and one line on stderr and a note in the page say so. Without
``--out`` the page goes to the ``docs/`` folder of the source checkout that this
package runs from (an editable install); an installed package has no such folder, so
there ``--out`` is required (exit status 2 and a one-line error otherwise: never a
``docs/`` folder made in whatever directory the command runs in). Every figure is
measured here, against oracles independent of the code under test: numpy longdouble
FFTs (64-bit significand on x86-64; on platforms where longdouble is float64 the
oracle is float64, which the tables say), exact rationals and exact integers.

Sections: the Hyena convolution (error vs L, float32 vs extended), the FFTs, the
double-word elementwise operations, the int8 epilogues, the DGEMM emulation (error vs
phi and slices, ESC rule vs ours), the Frobenius norm (error vs n) and the SF16 grid
checks. Each section is a function ``(backend, quick) -> (markdown, figure or None)``.
"""

from __future__ import annotations

import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..core import backends


def _oracle():
    ld = np.longdouble
    if np.finfo(ld).nmant > 52:
        return ld, "numpy longdouble (64-bit significand)"
    return np.float64, "float64 (longdouble is float64 here)"


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def checkout_docs(module_file: str | Path = __file__) -> Path | None:
    """The ``docs/`` folder of the source checkout holding this package, or None when
    the package is installed (no ``pyproject.toml`` and ``docs/`` beside it)."""
    root = Path(module_file).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "docs").is_dir():
        return root / "docs"
    return None


def _have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


_NO_PLOTS = ("matplotlib is not installed, so the plots were skipped "
             '(pip install matplotlib draws them)')


def _loglog(fname: str, title: str, xlabel: str, ylabel: str, xs, series: dict):
    """``(fname, figure)`` of log-log lines (x in powers of two), or None without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, ys in series.items():
        ax.plot(xs, ys, "o-", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return fname, fig


def section_hyena(backend: str, quick: bool):
    """Hyena convolution: normwise error and share exactly rounded vs L."""
    from .demo import _inputs
    from ..conv.hyena import default_fft_size, fftconv, hyena_conv_extended

    dtype, oname = _oracle()
    lengths = [2**p for p in range(8, 13 if quick else 18, 2 if quick else 1)]
    channels = 4 if quick else 16
    rows, series = [], {"float32 MLX": [], f"extended ({backend})": []}
    for L in lengths:
        u, k, D = _inputs(1, channels, L, seed=L)
        N = default_fft_size(L, L)
        ref = np.fft.irfft(np.fft.rfft(u.astype(dtype), N) * np.fft.rfft(k.astype(dtype), N), N)
        ref = ref[..., :L] + D.astype(dtype)[None, :, None] * u
        ref64, ref32 = ref.astype(np.float64), ref.astype(np.float32)
        uu, kk, DD = mx.array(u), mx.array(k), mx.array(D)
        f32 = np.array(fftconv.plain(uu, kk, DD))
        ext_dw = hyena_conv_extended(uu, kk, DD, round_output=False, backend=backend)
        ext = np.array(ext_dw.round() if hasattr(ext_dw, "round") else ext_dw)
        dw_err = (np.linalg.norm(ext_dw.to_float64() - ref64) / np.linalg.norm(ref64)
                  if hasattr(ext_dw, "to_float64") else float("nan"))
        e32 = np.linalg.norm(f32 - ref64) / np.linalg.norm(ref64)
        series["float32 MLX"].append(e32)
        series[f"extended ({backend})"].append(dw_err)
        rows.append([L, f"{e32:.2e}", f"{100 * (f32 == ref32).mean():.1f}%", f"{dw_err:.2e}",
                     f"{100 * (ext == ref32).mean():.4f}%"])
    md = (f"### Hyena long convolution (batch 1, {channels} channels, decaying filters)\n\n"
          f"Oracle: {oname} FFT of the same float32 inputs. Extended: normwise error of the "
          "unrounded double-word result and share of rounded outputs equal to the exactly "
          "rounded oracle.\n\n"
          + _table(["L", "float32 normwise", "float32 exactly rounded",
                    f"extended ({backend}) normwise (DoubleWord)", "extended exactly rounded"], rows))
    fig = _loglog("hyena_error_vs_L.png", "Hyena FFT convolution: error vs L", "L",
                  "normwise relative error", lengths, series)
    return md, fig


def section_fft(backend: str, quick: bool):
    """FFT normwise error vs n (complex fft, random complex64 input, 2 rows)."""
    from ..fft.api import fft_extended

    dtype, oname = _oracle()
    sizes = [2**p for p in range(4, 13 if quick else 17, 4 if quick else 2)] + [3, 1000]
    rows = []
    rng = np.random.default_rng(3)
    for n in sizes:
        x = (rng.standard_normal((2, n)) + 1j * rng.standard_normal((2, n))).astype(np.complex64)
        ref = np.fft.fft(x.astype(np.clongdouble if dtype is np.longdouble else np.complex128))
        ref64 = ref.astype(np.complex128)
        y = fft_extended(mx.array(x), round_output=False, backend=backend)
        err = np.linalg.norm(y.to_float64() - ref64) / np.linalg.norm(ref64)
        r = np.array(y.round())
        f = np.array(mx.fft.fft(mx.array(x)))
        ex = ((r.real == ref.real.astype(np.float32)) & (r.imag == ref.imag.astype(np.float32))).mean()
        e32 = np.linalg.norm(f - ref64) / np.linalg.norm(ref64)
        rows.append([n, f"{err:.2e}", f"{100 * ex:.3f}%", f"{e32:.2e}"])
    md = (f"### FFT (complex, 2 rows of random complex64; oracle: {oname})\n\n"
          + _table(["n", f"extended ({backend}) normwise (DoubleWord)",
                    "extended exactly rounded", "mx.fft normwise"], rows))
    return md, None


def section_elementwise(backend: str, quick: bool):
    """Complex multiply / fft_scale / depthwise: share exactly rounded (exact rationals)."""
    from ..conv.checks import check_extended_ops

    n = 2000 if quick else 20000
    checks = check_extended_ops(backend, n=n)
    md = ("### Double-word elementwise operations (exact rational oracle)\n\n"
          + _table(["operation", "result"], [[c.name, c.figure] for c in checks]))
    return md, None


def section_int8(backend: str, quick: bool):
    """scaled_mm: share of outputs equal to the float64 epilogue rounded once."""
    from ..int8.checks import selftest_checks

    checks = [c for c in selftest_checks(backend) if "scaled_mm" in c.name]
    md = ("### int8 scaled_mm epilogues (oracle: exact int64 product, epilogue in float64, "
          "one rounding)\n\n" + _table(["epilogue -> dtype", "result"],
                                       [[c.name, c.figure] for c in checks]))
    return md, None


def section_norms(backend: str, quick: bool):
    """Frobenius norm of random float32 matrices: ulps from the correctly rounded value
    (reference: exact float64 squares summed by math.fsum, sqrt, one rounding) for
    the tile norm and for a float32 running sum of squares."""
    import math

    from ..norms.api import norm

    sizes = [64, 256, 1024] + ([] if quick else [4096])
    rows, ours, naive = [], [], []
    rng = np.random.default_rng(9)
    for n in sizes:
        a = rng.standard_normal((n, n)).astype(np.float32)
        sq = a.astype(np.float64).ravel() ** 2  # exact
        ref = np.float32(math.sqrt(math.fsum(sq)))
        got = np.float32(norm(mx.array(a), "fro", backend=backend).item())
        run = np.float32(np.sqrt(np.cumsum(a.ravel() ** 2, dtype=np.float32)[-1]))
        ulp = float(np.spacing(ref))
        ours.append(abs(float(got) - float(ref)) / ulp)
        naive.append(abs(float(run) - float(ref)) / ulp)
        rows.append([f"{n} x {n}", f"{ours[-1]:.0f}", f"{naive[-1]:.0f}",
                     f"{abs(float(run) - float(ref)) / float(ref):.1e}"])
    md = ("### Frobenius norm, float32 (error in ulps of the correctly rounded value)\n\n"
          + _table(["matrix", f"norm(A, 'fro') ({backend})", "float32 running sum",
                    "running sum relative error"], rows))
    fig = _loglog("fro_error_vs_n.png", "Frobenius norm error vs n", "n (n x n matrix)",
                  "error in ulps (0 drawn at 0.1)", sizes,
                  {"float32 running sum": [max(v, 0.1) for v in naive],
                   f"tile norm ({backend})": [max(v, 0.1) for v in ours]})
    return md, fig


def section_fixedpoint(backend: str, quick: bool):
    """Q1.15 / Q1.31 conversions: bit-exact agreement with exact rounding (the
    self-test's grid checks)."""
    from ..fixedpoint.checks import selftest_checks

    checks = selftest_checks(backend)
    md = ("### Q1.15 / Q1.31 grid checks (exact rational reference)\n\n"
          + _table(["check", "result"], [[c.name, c.figure] for c in checks]))
    return md, None


def section_dgemm(backend: str, quick: bool):
    """DGEMM emulation error vs phi and slices, ESC rule vs the tight rule."""
    from ..ozaki.engine import report_section

    return report_section(backend, quick)


SECTIONS = [section_hyena, section_fft, section_elementwise, section_int8, section_norms,
            section_fixedpoint, section_dgemm]


def main(out: str | None = None, backend: str | None = None, quick: bool = True) -> int:
    """Write the page to ``out`` (a folder; None: the checkout's docs/, see the
    module's docstring). Returns the exit status: 0, or 2 without ``out`` outside a
    source checkout."""
    import sys

    if out is None:
        docs = checkout_docs()
        if docs is None:
            print("error: report needs --out FOLDER here (the default, docs/, exists only "
                  "in a source checkout of mlx-precise)", file=sys.stderr)
            return 2
        out = str(docs)
    name = backend or ("emulate" if backends._why_unavailable("emulate") is None else backends.backend())
    name = backends.resolve(name)
    out_dir = Path(out)
    plots = _have_matplotlib()
    if not plots:
        print(f"note: {_NO_PLOTS}", file=sys.stderr)
    (out_dir / "img").mkdir(parents=True, exist_ok=True)
    parts = [
        "# Accuracy\n",
        f"Generated by `python -m mlx_precise report{'' if quick else ' --full'} --backend {name}` "
        f"(MLX {mx.__version__}). Every number below was measured by that command; re-run it "
        "to regenerate this page and the plots.\n",
    ]
    if not plots:
        parts.append(f"**No plots:** {_NO_PLOTS}.\n")
    for section in SECTIONS:
        t = time.perf_counter()
        print(f"{section.__name__} ...", end=" ", flush=True)
        md, fig = section(name, quick)
        parts.append(md + "\n")
        if fig:
            fname, f = fig
            f.savefig(out_dir / "img" / fname, dpi=120, bbox_inches="tight")
            parts.append(f"![{fname}](img/{fname})\n")
        print(f"{time.perf_counter() - t:.1f} s", flush=True)
    (out_dir / "accuracy.md").write_text("\n".join(parts))
    print(f"wrote {out_dir / 'accuracy.md'}")
    return 0
