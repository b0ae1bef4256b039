"""Run by .ci/run against an installed wheel: its kernels must come from the wheel."""

import sys
from pathlib import Path

import mlx_precise
from mlx_precise import kernels

site = Path(sys.argv[1]).resolve()
pkg = Path(mlx_precise.__file__).resolve().parent
assert pkg.parent == site, f"imported {pkg}, not the wheel in {site}"
assert kernels.METAL_DIR.resolve() == pkg / "metal", kernels.METAL_DIR
shipped = sorted(p.relative_to(pkg / "metal") for p in (pkg / "metal").rglob("*") if p.is_file())
source = Path(__file__).resolve().parent.parent / "metal"
expected = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file())
assert shipped == expected, f"wheel ships {shipped}, source has {expected}"

from mlx_precise.doubleword import eft_selftest  # noqa: E402

eft_selftest("emulate")
print(f"wheel OK: {len(shipped)} Metal files in {pkg / 'metal'}, EFT self-test passed")
