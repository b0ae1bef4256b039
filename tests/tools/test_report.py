"""`python -m mlx_precise report`: where the page goes without --out, and what it says
when matplotlib is missing. The sections are replaced by a tiny one (the real ones
take minutes); the page's frame, the output folder and the plots logic are real."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mlx_precise import __main__ as cli
from mlx_precise.tools import report

ROOT = Path(__file__).resolve().parents[2]


def _tiny_section(backend, quick):
    fig = report._loglog("tiny.png", "tiny", "n", "error", [2, 4], {"a": [1e-3, 1e-4]})
    return "### tiny\n\n| a |\n|---|\n| 1 |", fig


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(report, "SECTIONS", [_tiny_section])


def test_checkout_docs_only_in_a_source_checkout(tmp_path):
    assert report.checkout_docs() == ROOT / "docs"
    installed = tmp_path / "site-packages" / "mlx_precise" / "tools" / "report.py"
    installed.parent.mkdir(parents=True)
    installed.write_text("")
    (tmp_path / "docs").mkdir()  # a docs/ beside site-packages is not a checkout
    assert report.checkout_docs(installed) is None


def test_report_without_out_outside_a_checkout_needs_out(tiny, monkeypatch, tmp_path, capsys):
    """It used to write ./docs/ into whatever folder it ran in."""
    monkeypatch.setattr(report, "checkout_docs", lambda *a: None)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["report", "--backend", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out" in err[0] and err[0].startswith("error:")
    assert not any(tmp_path.iterdir())


def test_report_without_out_in_a_checkout_writes_its_docs(tiny, monkeypatch, tmp_path):
    docs = tmp_path / "checkout" / "docs"
    monkeypatch.setattr(report, "checkout_docs", lambda *a: docs)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["report", "--backend", "cpu"]) == 0
    assert (docs / "accuracy.md").is_file()
    assert not (tmp_path / "docs").exists()


def test_report_says_when_plots_are_skipped(tiny, monkeypatch, tmp_path, capsys):
    """Without matplotlib the plots used to be skipped silently."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    assert cli.main(["report", "--backend", "cpu", "--out", str(tmp_path)]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "matplotlib" in line]
    assert len(err) == 1 and "plots" in err[0] and "pip install matplotlib" in err[0]
    page = (tmp_path / "accuracy.md").read_text()
    assert "matplotlib is not installed" in page and "pip install matplotlib" in page
    assert "![" not in page and not list((tmp_path / "img").iterdir())


def test_report_with_matplotlib_draws_and_says_nothing(tiny, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert cli.main(["report", "--backend", "cpu", "--out", str(tmp_path)]) == 0
    assert "matplotlib" not in capsys.readouterr().err
    page = (tmp_path / "accuracy.md").read_text()
    assert "![tiny.png](img/tiny.png)" in page and "not installed" not in page
    assert (tmp_path / "img" / "tiny.png").is_file()
