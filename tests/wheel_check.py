"""Run by .ci/run against an installed wheel: its kernels must come from the wheel."""

import sys
from pathlib import Path

import mlx_precise
from mlx_precise.core import kernels

site = Path(sys.argv[1]).resolve()
pkg = Path(mlx_precise.__file__).resolve().parent
assert pkg.parent == site, f"imported {pkg}, not the wheel in {site}"
assert kernels.METAL_DIR.resolve() == pkg / "metal", kernels.METAL_DIR
shipped = sorted(p.relative_to(pkg / "metal") for p in (pkg / "metal").rglob("*") if p.is_file())
source = Path(__file__).resolve().parent.parent / "metal"
expected = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file())
assert shipped == expected, f"wheel ships {shipped}, source has {expected}"

from mlx_precise.core.kernels import eft_selftest  # noqa: E402

eft_selftest("emulate")

# `bench` runs the shipped benchmark scripts, which must need nothing outside the
# wheel (they once imported a helper from tests/); --quick keeps this to seconds.
import subprocess  # noqa: E402
import tempfile  # noqa: E402

scripts = sorted(p.stem for p in (pkg / "benchmarks").glob("bench_*.py"))
assert scripts, f"no benchmark scripts in {pkg / 'benchmarks'}"
with tempfile.TemporaryDirectory() as tmp:
    proc = subprocess.run(
        [sys.executable, "-m", "mlx_precise", "bench", "--quick", "--backend", "cpu",
         "--out", f"{tmp}/bench/"], capture_output=True, text=True)
    assert proc.returncode == 0, f"bench exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    page = Path(tmp, "bench", "performance.md").read_text()
sections = [line[3:] for line in page.splitlines() if line.startswith("## ")]
assert sections == scripts, f"report sections {sections}, scripts {scripts}"
assert "FAILED" not in page, page
print(f"wheel OK: {len(shipped)} Metal files in {pkg / 'metal'}, EFT self-test passed, "
      f"bench --quick wrote {len(sections)} sections")
