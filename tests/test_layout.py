"""The package's layout (docs/design.md, "Layers"): capability subpackages over a
foundation (``core/``, with the Metal emulator beneath it), and no import circles.

The import graph is read from the source with :mod:`ast`, so it counts every
import: at module level, inside functions (a lazy import that only dodges a circle
is still a circle), under ``TYPE_CHECKING``, relative or absolute, and ``from . import
x`` of a submodule. A package's ``__init__`` is the node of the package itself;
importing a submodule does not count as importing its parent package.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import mlx_precise

PKG = Path(mlx_precise.__file__).resolve().parent
ROOT = PKG.parent
NAME = "mlx_precise"
# The foundation: what core/ may import inside the package (the Metal emulator is
# the executor core's kernel registry runs kernels on; it imports nothing of ours).
FOUNDATION = ("core", "emulator")
MAX_TOP_MODULES = 8


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PKG.rglob("*.py"))
            if "metal" not in p.relative_to(PKG).parts[:1]}


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name a (possibly relative) import refers to."""
    if level == 0:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _known(name: str, modules: dict) -> str | None:
    """The longest prefix of ``name`` that is a module of the package."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in modules:
            return cand
        parts.pop()
    return None


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod, is_package, node.level, node.module)
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    # `from pkg import sub` imports the submodule pkg.sub
                    targets.append(sub if sub in modules else base)
            for t in targets:
                if not (t == NAME or t.startswith(NAME + ".")):
                    continue
                k = _known(t, modules)
                if k is not None and k != mod:
                    graph[mod].add(k)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), plus
    self-loops."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph[v]:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_graph_sees_every_kind_of_import(tmp_path):
    """The reader itself: relative, absolute, function-level, ``from . import sub``."""
    g = import_graph()
    assert f"{NAME}.core.kernels" in g[f"{NAME}.doubleword.dw_kernels"]
    assert f"{NAME}.core" not in g[f"{NAME}.doubleword.dw_kernels"]
    # function-level imports count (tools/__main__ import lazily)
    assert any(t.startswith(f"{NAME}.tools") for t in g[f"{NAME}.__main__"])
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _resolve("p.q.r", False, 2, "s") == "p.s"
    assert _resolve("p.q", True, 1, None) == "p.q"


def test_no_import_cycles():
    cycles = _cycles(import_graph())
    assert not cycles, "import circles (module granularity): " + "; ".join(
        " <-> ".join(c) for c in cycles)


def test_core_imports_no_capability():
    allowed = tuple(f"{NAME}.{p}" for p in FOUNDATION)
    bad = []
    for mod, deps in import_graph().items():
        if mod == f"{NAME}.core" or mod.startswith(f"{NAME}.core."):
            bad += [f"{mod} -> {d}" for d in sorted(deps)
                    if not any(d == a or d.startswith(a + ".") for a in allowed)]
    assert not bad, bad


def test_emulator_imports_nothing_of_the_package():
    bad = [f"{m} -> {d}" for m, deps in import_graph().items()
           if m.startswith(f"{NAME}.emulator") for d in deps
           if not d.startswith(f"{NAME}.emulator")]
    assert not bad, bad


def test_few_top_level_modules():
    top = sorted(p.name for p in PKG.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(top) <= MAX_TOP_MODULES, top


def test_no_module_shadowed_by_a_name():
    """A package attribute must not hide a submodule of the same name (the old
    ``mlx_precise.sf16`` function over the ``sf16`` module)."""
    bad = []
    for mod, path in _modules().items():
        if path.name != "__init__.py":
            continue
        pkg = importlib.import_module(mod)
        subs = [p.stem for p in path.parent.glob("*.py")]
        subs += [p.parent.name for p in path.parent.glob("*/__init__.py")]
        for name in subs:
            if name in ("__init__", "__main__"):
                continue
            full = f"{mod}.{name}"
            attr = getattr(pkg, name, None)
            if attr is not None and getattr(attr, "__name__", None) != full:
                bad.append(f"{mod}.{name} is {attr!r}, not the module {full}")
    assert not bad, bad


def test_public_names_importable():
    for name in mlx_precise.__all__:
        assert hasattr(mlx_precise, name), name


