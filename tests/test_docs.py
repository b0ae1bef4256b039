"""The text of the repository stays true to it: the paths and module names it
mentions exist, and the Python examples of the README and docs/ run.

What is checked
---------------

* **Paths.** Every repository path named in the README, docs/, the package (code,
  comments, docstrings, the emulator's shim headers), the Metal sources, tests/,
  benchmarks/ and examples/ (notebooks included) exists. A path is a word that starts
  with a top-level folder of the repository and a slash: ``mlx_precise/``,
  ``metal/``, ``tests/``, ``benchmarks/``, ``docs/`` or ``examples/``. Patterns (a
  path with ``*``, ``<...>`` or ``{...}`` in it, as in ``tests/<package>/test_*.py``)
  are not checked. ``mlx_precise/metal/...`` and ``mlx_precise/benchmarks/...`` are
  the wheel's copies of ``metal/`` and ``benchmarks/`` (pyproject.toml's
  ``force-include``) and are checked as those.
* **Module names.** Every dotted name ``mlx_precise.X.Y`` in the same text imports
  (a module, or an attribute of one). One capital letter standing for "any" (as in
  ``mlx_precise.X``) is a placeholder.
* **Links.** Every relative Markdown link of the README and docs/ names a file.
* **Examples.** Every ```` ```python ```` block of README.md and docs/*.md runs, each
  in a fresh interpreter with the cpu backend (``MLX_PRECISE_BACKEND=cpu``) in an
  empty folder, in under a minute (keep the sizes small: the whole set runs in
  seconds).

Conventions for writers of docs
-------------------------------

An HTML comment on the line right before the fence (blank lines and other
comments, such as the README's ``<!-- ci:... -->`` markers, may come between) says
what kind of example a block is:

* ``<!-- fragment -->``: the block is not a whole program (it continues an
  earlier block, uses a name the text introduces, elides code with ``...``, or
  needs several processes). It is compiled, so its syntax is checked, but not run.
* ``<!-- raises: NameOfError -->``: the block shows an error: it runs and must end
  with that exception.

Any other block must run as written.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOPS = ("mlx_precise", "metal", "tests", "benchmarks", "docs", "examples")
BINARY = (".png", ".jpg", ".svg", ".pyc", ".so", ".dylib", ".o", ".whl")

# ---- which text ------------------------------------------------------------------------


def _text_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for top in TOPS:
        files += [p for p in sorted((ROOT / top).rglob("*"))
                  if p.is_file() and "__pycache__" not in p.parts
                  and ".ipynb_checkpoints" not in p.parts and p.suffix not in BINARY]
    return files


def _lines():
    """``(path relative to ROOT, line number, line)`` of every text file."""
    for p in _text_files():
        rel = p.relative_to(ROOT).as_posix()
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            yield rel, i, line


def _wheel_copies() -> dict[str, str]:
    """``{"mlx_precise/metal": "metal", ...}``: the folders the wheel ships inside the
    package (pyproject.toml, [tool.hatch.build.targets.wheel.force-include])."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[tool.hatch.build.targets.wheel.force-include]", 1)[1]
    section = section.split("\n[", 1)[0]
    return {dest: src for src, dest in re.findall(r'^"([^"]+)"\s*=\s*"([^"]+)"', section, re.M)}


# ---- paths -----------------------------------------------------------------------------

_PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./*<>{}-]*[\w*>}])" % "|".join(TOPS))


def _missing_paths() -> list[str]:
    copies = _wheel_copies()
    out = []
    for rel, i, line in _lines():
        for m in _PATH.finditer(line):
            ref = m.group(1)
            if re.search(r"[*<>{}]", ref):
                continue  # a pattern
            target = ref
            for dest, src in copies.items():
                if ref == dest or ref.startswith(dest + "/"):
                    target = src + ref[len(dest):]
            if not (ROOT / target).exists():
                out.append(f"{rel}:{i}: {ref}")
    return out


def test_named_paths_exist():
    missing = _missing_paths()
    assert not missing, "paths named in text that do not exist:\n" + "\n".join(missing)


def test_path_pattern_finds_paths():
    """The pattern itself: what it takes and what it leaves."""
    found = [m.group(1) for m in _PATH.finditer(
        "see mlx_precise/core/kernels.py, `metal/include/dw_math.h` and "
        "(tests/doubleword/test_dwmath.py). Also docs/fft.md; not foo/mlx_precise/x.py")]
    assert found == ["mlx_precise/core/kernels.py", "metal/include/dw_math.h",
                     "tests/doubleword/test_dwmath.py", "docs/fft.md"]
    assert _wheel_copies() == {"mlx_precise/metal": "metal",
                               "mlx_precise/benchmarks": "benchmarks"}


# ---- dotted module names ---------------------------------------------------------------

_DOTTED = re.compile(r"(?<![\w.])mlx_precise(?:\.[A-Za-z_]\w*)+")


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:n]))
        except ImportError:
            continue
        for name in parts[n:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_named_modules_import(monkeypatch):
    monkeypatch.setenv("MLX_PRECISE_BACKEND", "cpu")
    seen: dict[str, bool] = {}
    bad = []
    for rel, i, line in _lines():
        for m in _DOTTED.finditer(line):
            dotted = m.group(0)
            if re.search(r"\.[A-Z](?:\.|$)", dotted):
                continue  # a placeholder
            if dotted not in seen:
                seen[dotted] = _resolves(dotted)
            if not seen[dotted]:
                bad.append(f"{rel}:{i}: {dotted}")
    assert len(seen) > 50  # the text does name the package's modules
    assert not bad, "module names in text that do not import:\n" + "\n".join(bad)


# ---- Markdown links --------------------------------------------------------------------

_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _markdown_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_relative_links_name_files():
    bad = []
    for page in _markdown_pages():
        for i, line in enumerate(page.read_text().splitlines(), 1):
            for m in _LINK.finditer(line):
                target = m.group(1)
                if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                    continue  # a URL or an anchor on the page
                if not (page.parent / target.split("#")[0]).exists():
                    bad.append(f"{page.relative_to(ROOT)}:{i}: {target}")
    assert not bad, "\n".join(bad)


# ---- Python examples -------------------------------------------------------------------

_FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_MARK = re.compile(r"<!--\s*(fragment|raises:\s*(\w+))\s*-->")


def _snippets():
    """``(id, code, kind, error)``: kind "run", "fragment" or "raises" (with error)."""
    out = []
    for page in _markdown_pages():
        text = page.read_text()
        for m in _FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            before = text[:m.start()].rstrip("\n").splitlines()
            kind, error = "run", None
            # the comments (and blank lines) right before the fence
            for prev in reversed(before):
                if not prev.strip():
                    continue
                if not prev.strip().startswith("<!--"):
                    break
                mark = _MARK.search(prev)
                if mark:
                    kind = "fragment" if mark.group(1) == "fragment" else "raises"
                    error = mark.group(2)
            out.append((f"{page.relative_to(ROOT).as_posix()}:{line}", m.group(1), kind, error))
    return out


SNIPPETS = _snippets()


def test_snippets_found():
    ids = [s[0] for s in SNIPPETS]
    assert any(i.startswith("README.md:") for i in ids)
    assert sum(i.startswith("docs/") for i in ids) >= 10
    assert any(s[2] == "fragment" for s in SNIPPETS)


@pytest.mark.parametrize("sid, code, kind, error", SNIPPETS, ids=[s[0] for s in SNIPPETS])
def test_python_snippet_runs(sid, code, kind, error, tmp_path):
    compile(code, sid, "exec")  # every block parses
    if kind == "fragment":
        return
    env = dict(os.environ, MLX_PRECISE_BACKEND="cpu",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                          if p))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=60)
    tail = proc.stdout[-2000:] + proc.stderr[-3000:]
    if kind == "raises":
        assert proc.returncode != 0, f"{sid} ran through; it is marked raises: {error}"
        assert re.search(rf"^(\w+\.)*{error}(:|$)", proc.stderr, re.M), tail
    else:
        assert proc.returncode == 0, tail


# ---- figures quoted from scripts ----------------------------------------------------------


@pytest.mark.skipif(__import__("mlx.core").core.__version__ != "0.32.4",
                    reason="the port guide quotes MLX 0.32.4's float64 accuracy")
def test_port_guide_float64_table_agrees_with_its_script():
    """The port guide's table of MLX's float64 accuracy is what
    benchmarks/mlx_float64.py measures: the ops it lists as float64-accurate are
    within 2^-40 there, the others float32-grade with the quoted error, and
    gather_mm is refused."""
    import mlx_float64  # (benchmarks/ is on the path: pyproject.toml)

    rows = {name: (err, grade) for name, err, grade in mlx_float64.measure()}
    text = (ROOT / "docs" / "port_guide.md").read_text()
    row = next(line for line in text.splitlines()
               if line.startswith("| `+ - * /`, `matmul`"))
    accurate, inaccurate = row.strip("|").split("|")
    for name in re.findall(r"`([\w.]+)`", accurate):
        assert rows[name][1] == "float64", name
    quoted = re.findall(r"`([\w.]+)` (\d\.\de-\d\d)(?: \(depthwise (\d\.\de-\d\d)\))?",
                        inaccurate)
    assert len(quoted) == 14
    for name, err, depthwise in quoted:
        name = name.removeprefix("mx.")
        assert rows[name] == (err, rows[name][1]) and rows[name][1].startswith("float32"), name
        if depthwise:
            assert rows["conv1d (depthwise)"][0] == depthwise
    assert rows["gather_mm"][1].startswith("refused")
