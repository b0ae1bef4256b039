"""python -m mlx_precise selftest: every check passes here, and a failure is reported."""

import subprocess
import sys

import pytest

from mlx_precise.doubleword import checks as dw_checks
from mlx_precise.tools import selftest


@pytest.mark.parametrize("backend", ["emulate", "cpu"])
def test_every_check_passes(backend):
    checks = selftest.run(backend, verbose=False)
    assert len(checks) >= (45 if backend == "emulate" else 30)
    failed = [c.line() for c in checks if not c.passed]
    assert not failed, failed
    names = " ".join(c.name for c in checks)
    kernels_only = ("TwoSum",) if backend == "emulate" else ()
    for topic in kernels_only + ("complex_multiply_extended", "hyena_conv_extended", "fft",
                  "Q1.15", "int8 scaled_mm", "norm", "ozaki"):
        assert topic in names, topic


def test_cli_exit_status_and_failure_reporting(monkeypatch):
    out = subprocess.run([sys.executable, "-m", "mlx_precise", "selftest", "--backend", "cpu"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert " passed, 0 failed" in out.stdout
    # A failing check makes main() return non-zero and prints FAIL.
    monkeypatch.setattr(dw_checks, "check_split_join",
                        lambda: selftest.Check("forced failure", False, "x"))
    assert selftest.main("cpu") == 1
