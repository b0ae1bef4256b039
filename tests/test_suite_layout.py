"""The test suite's own plumbing (pyproject.toml, [tool.pytest.ini_options]): what
test modules share lives in tests/oracle.py, tests/helpers.py, conftest.py
fixtures or mlx_precise.testing, never in another test module, so that a test
file can be run alone, moved, or collected in any order."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _imported_modules(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module


def test_no_test_module_imports_another():
    bad = [f"{p.relative_to(TESTS.parent)} imports {m}"
           for p in sorted(TESTS.rglob("*.py")) if "__pycache__" not in p.parts
           for m in _imported_modules(p) if m.split(".")[0].startswith("test_")]
    assert not bad, "\n".join(bad)


def test_only_tests_folder_on_the_path():
    """Helpers are found under tests/ alone, not through every test folder; the
    benchmarks' and examples' scripts the tests check are on the path by the one
    declaration in pyproject.toml, never by a test module's own sys.path insert."""
    tomllib = __import__("pytest").importorskip("tomllib")
    conf = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())
    assert conf["tool"]["pytest"]["ini_options"]["pythonpath"] == [
        "tests", "benchmarks", "examples"]
    inserts = [str(p.relative_to(TESTS)) for p in TESTS.rglob("*.py")
               if "sys.path.insert" in p.read_text() and p.name != Path(__file__).name]
    assert not inserts, inserts
