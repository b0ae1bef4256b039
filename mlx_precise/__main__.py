"""Command line: ``python -m mlx_precise {demo,selftest,info}``."""

from __future__ import annotations

import argparse
import sys

import mlx.core as mx

from . import __version__, backends


def info() -> int:
    print(f"mlx-precise {__version__}, MLX {mx.__version__}")
    print(f"active backend: {backends.backend()}")
    for name in backends.BACKENDS:
        why = backends._why_unavailable(name)
        print(f"  {name:<8} {'available' if why is None else 'unavailable: ' + why}")
    return 0


def demo(backend: str | None, length: int) -> int:
    """The Hyena long-convolution comparison on the chosen (default) backend."""
    from . import demo as demo_mod

    info()
    print()
    rows = demo_mod.run(backend, L=length)
    # The extended result must be (almost) exactly rounded; say so loudly if not.
    ok = rows[1]["exactly_rounded"] >= 0.9999
    if not ok:
        print("the extended result is not exactly rounded: something is wrong")
    return 0 if ok else 1


def bench(backend: str | None, full: bool) -> int:
    """Run every benchmark script (``benchmarks/bench_*.py``, shipped in the wheel as
    ``mlx_precise/benchmarks``) and print its table."""
    import subprocess
    from pathlib import Path

    here = Path(__file__).resolve().parent
    folder = next((d for d in (here / "benchmarks", here.parent / "benchmarks") if d.is_dir()), None)
    if folder is None:
        print("error: the benchmark scripts are not installed", file=sys.stderr)
        return 2
    rc = 0
    for script in sorted(folder.glob("bench_*.py")):
        print(f"\n## {script.stem}\n", flush=True)
        cmd = [sys.executable, str(script)] + (["--backend", backend] if backend else [])
        rc |= subprocess.run(cmd + (["--full"] if full else [])).returncode
    return rc


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mlx_precise", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    for cmd, help_ in (
        ("demo", "the main job on the default backend"),
        ("selftest", "every kernel against exact oracles; non-zero exit on failure"),
        ("report", "regenerate docs/accuracy.md and its plots"),
        ("bench", "print the performance tables (benchmarks/)"),
        ("info", "version and backends"),
    ):
        sp = sub.add_parser(cmd, help=help_)
        if cmd != "info":
            sp.add_argument("--backend", choices=backends.BACKENDS, default=None)
        if cmd == "demo":
            sp.add_argument("--length", type=int, default=16384, help="sequence length L")
        if cmd in ("report", "bench"):
            sp.add_argument("--full", action="store_true", help="the issues' full sizes (slow)")
        if cmd == "report":
            sp.add_argument("--out", default="docs", help="output folder (default: docs)")
    args = p.parse_args(argv)
    try:
        if args.command == "info":
            return info()
        if args.command == "demo":
            return demo(args.backend, args.length)
        if args.command == "report":
            from . import report

            return report.main(args.out, args.backend, quick=not args.full)
        if args.command == "bench":
            return bench(args.backend, args.full)
        from . import selftest

        return selftest.main(args.backend)
    except (backends.BackendUnavailableError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
