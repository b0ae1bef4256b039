"""Backend selection and the kernel registry's argument checking."""

import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import mlx.core as mx
import pytest

import mlx_precise
from mlx_precise import BackendUnavailableError, Kernel
from mlx_precise.core.kernels import KernelInputError, resolve_headers


def test_default_is_cpu_without_metal(monkeypatch):
    monkeypatch.delenv("MLX_PRECISE_BACKEND", raising=False)
    assert not mlx_precise.metal_available()  # the test machines have no Apple GPU
    assert mlx_precise.default_backend() == "cpu"
    assert mlx_precise.backend() == "cpu"


def test_environment_variable(monkeypatch):
    monkeypatch.setenv("MLX_PRECISE_BACKEND", "emulate")
    assert mlx_precise.backend() == "emulate"
    monkeypatch.setenv("MLX_PRECISE_BACKEND", "cuda")
    with pytest.raises(ValueError, match="MLX_PRECISE_BACKEND='cuda'.*unknown backend"):
        mlx_precise.backend()
    monkeypatch.setenv("MLX_PRECISE_BACKEND", "metal")
    with pytest.raises(BackendUnavailableError, match="no Metal device"):
        mlx_precise.backend()


def test_set_backend_and_reset(monkeypatch):
    monkeypatch.delenv("MLX_PRECISE_BACKEND", raising=False)
    try:
        mlx_precise.set_backend("emulate")
        assert mlx_precise.backend() == "emulate"
        with pytest.raises(ValueError, match="unknown backend 'gpu'"):
            mlx_precise.set_backend("gpu")
        with pytest.raises(BackendUnavailableError, match="'metal' cannot run here"):
            mlx_precise.set_backend("metal")
        assert mlx_precise.backend() == "emulate"  # a failed set changes nothing
    finally:
        mlx_precise.set_backend(None)
    assert mlx_precise.backend() == "cpu"


def test_use_backend_nests_restores_and_is_scoped(monkeypatch):
    monkeypatch.delenv("MLX_PRECISE_BACKEND", raising=False)
    with mlx_precise.use_backend("emulate"):
        assert mlx_precise.backend() == "emulate"
        with mlx_precise.use_backend("cpu"):
            assert mlx_precise.backend() == "cpu"
        assert mlx_precise.backend() == "emulate"
        seen = []
        t = threading.Thread(target=lambda: seen.append(mlx_precise.backend()))
        t.start()
        t.join()
        assert seen == ["cpu"]  # another thread does not see this scope
    with pytest.raises(RuntimeError, match="boom"):
        with mlx_precise.use_backend("emulate"):
            raise RuntimeError("boom")
    assert mlx_precise.backend() == "cpu"

    async def task(name):
        with mlx_precise.use_backend(name):
            await asyncio.sleep(0.01)
            return mlx_precise.backend()

    async def both():
        return await asyncio.gather(task("emulate"), task("cpu"))

    assert asyncio.run(both()) == ["emulate", "cpu"]


COPY = Kernel(name="test_copy_scaled", body=str(Path(__file__).parent / "kernels" / "copy_scaled.metal"),
              inputs=("x",), outputs=("y",), template=("S",),
              input_dtypes={"x": (mx.float32,)}, extended=False,
              grid=lambda arrays, t: ((arrays[0].size, 1, 1), (64, 1, 1)))


def test_kernel_runs_on_emulate_and_rejects_cpu():
    x = mx.arange(100, dtype=mx.float32)
    (y,) = COPY(inputs=[x], template={"S": 3}, output_shapes=[x.shape],
                output_dtypes=[mx.float32], backend="emulate")
    assert (y == 3 * x).all().item()
    with pytest.raises(BackendUnavailableError, match="Metal kernel.*'metal' or 'emulate'"):
        COPY(inputs=[x], template={"S": 3}, output_shapes=[x.shape],
             output_dtypes=[mx.float32], backend="cpu")
    with pytest.raises(BackendUnavailableError, match="'metal' cannot run here"):
        COPY(inputs=[x], template={"S": 3}, output_shapes=[x.shape],
             output_dtypes=[mx.float32], backend="metal")


def test_kernel_argument_errors():
    x = mx.arange(4, dtype=mx.float32)
    kw = dict(output_shapes=[x.shape], output_dtypes=[mx.float32], backend="emulate")
    with pytest.raises(KernelInputError, match="input 'x' has dtype mlx.core.int32"):
        COPY(inputs=[x.astype(mx.int32)], template={"S": 1}, **kw)
    with pytest.raises(KernelInputError, match="takes 1 inputs"):
        COPY(inputs=[x, x], template={"S": 1}, **kw)
    with pytest.raises(KernelInputError, match=r"missing \['S'\], unexpected \['T'\]"):
        COPY(inputs=[x], template={"T": 1}, **kw)
    with pytest.raises(ValueError, match="unknown backend 'gpu'"):
        COPY(inputs=[x], template={"S": 1}, output_shapes=[x.shape],
             output_dtypes=[mx.float32], backend="gpu")
    missing = Kernel(name="missing", body="no_such_kernel.metal", inputs=("x",),
                     outputs=("y",), extended=False)
    with pytest.raises(FileNotFoundError, match="no_such_kernel.metal"):
        missing(inputs=[x], grid=(4, 1, 1), threadgroup=(4, 1, 1), **kw)
    with pytest.raises(FileNotFoundError, match="no_such_header.h"):
        resolve_headers(["no_such_header.h"])


def test_cli_backend_errors_are_clear():
    out = subprocess.run([sys.executable, "-m", "mlx_precise", "selftest", "--backend", "metal"],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert "backend 'metal' cannot run here" in out.stderr


def test_kernel_shape_rule():
    from mlx_precise.doubleword.dw_kernels import DW_OPS

    a, b = mx.zeros((8,)), mx.zeros((9,))
    kw = dict(template={"OP": 4}, output_shapes=[(8,), (8,)],
              output_dtypes=[mx.float32, mx.float32], backend="emulate")
    with pytest.raises(KernelInputError, match="kernel 'dw_ops': inputs must all have one shape"):
        DW_OPS(inputs=[a, a, b, a], **kw)
    with pytest.raises(KernelInputError, match="inputs must be 1-D, got shape \\(2, 4\\)"):
        DW_OPS(inputs=[a.reshape(2, 4)] * 4, **kw)


def test_no_compiler_is_a_clear_error(monkeypatch):
    from mlx_precise.emulator import compiler

    monkeypatch.delenv("MLX_PRECISE_CXX", raising=False)
    monkeypatch.setattr(compiler.shutil, "which", lambda name: None)
    monkeypatch.setitem(sys.modules, "ziglang", None)  # import raises ImportError
    with pytest.raises(compiler.CompilerNotFoundError, match="pip install ziglang"):
        compiler.find_compiler.__wrapped__()


# ---- Backend objects: capabilities instead of names ----------------------------------

from mlx_precise.core import backends as _backends  # noqa: E402

# capability -> (metal, emulate, cpu)
CAPABILITIES = {
    "has_kernels": (True, True, False),
    "float64_engine": (False, False, True),
    "host_evaluated": (False, True, False),
    "host_functions": (False, False, True),
    "gpu": (True, False, False),
    "traceable": (True, False, True),
}


@pytest.mark.parametrize("capability", sorted(CAPABILITIES))
def test_capability_values(capability):
    for name, want in zip(("metal", "emulate", "cpu"), CAPABILITIES[capability]):
        b = _backends._OBJECTS[name]
        assert getattr(b, capability) is want, (name, capability)


def test_every_capability_is_documented_and_tested():
    doc = _backends.Backend.__doc__
    declared = set(_backends.Backend.__annotations__) | {"traceable"}
    assert declared == set(CAPABILITIES)
    for capability in CAPABILITIES:
        assert f"{capability}:" in doc, capability


def test_backend_objects_are_their_names(monkeypatch):
    monkeypatch.delenv("MLX_PRECISE_BACKEND", raising=False)
    for name in ("cpu", "emulate"):
        b = _backends.get(name)
        assert isinstance(b, _backends.Backend) and isinstance(b, str)
        assert b == name and b.name == name and str(b) == name and f"{b}" == name
        assert repr(b) == repr(name) and hash(b) == hash(name)
        assert {name: 1}[b] == 1
        assert _backends.resolve(name) is b and _backends.validate(name) is b
        assert _backends.resolve(b) is b  # an object passes through
        with mlx_precise.use_backend(name):
            assert mlx_precise.backend() is b and _backends.resolve(None) is b
    assert mlx_precise.backend() is _backends.get("cpu")  # the default here


def test_backend_objects_copy_and_pickle_as_themselves():
    import copy
    import pickle

    for b in _backends._OBJECTS.values():
        assert copy.copy(b) is b and copy.deepcopy(b) is b
        assert pickle.loads(pickle.dumps(b)) is b


def test_get_validates():
    with pytest.raises(ValueError, match="unknown backend 'gpu'"):
        _backends.get("gpu")
    with pytest.raises(BackendUnavailableError):
        _backends.get("metal")  # no Apple GPU on the test machines


# Files that still pick behaviour by a backend's name. They belong to work in
# progress elsewhere: remove each from this list once it asks the Backend object.
NAME_COMPARISONS_ALLOWED = {
    "core/backends.py",  # defines the backends: names are its business
}


def _name_comparisons(path: Path) -> list[int]:
    """Lines of ``path`` that compare something to a backend name literal (``==``,
    ``!=``, ``is``, ``in`` / ``not in`` a literal tuple, list or set of names, or a
    ``match`` case on one)."""
    import ast

    names = set(_backends.BACKENDS)

    def is_name(node) -> bool:
        return isinstance(node, ast.Constant) and node.value in names

    def is_names(node) -> bool:
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(
            is_name(e) for e in node.elts)

    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, operands, operands[1:]):
                if isinstance(op, (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)) and (
                        is_name(left) or is_name(right)):
                    lines.append(node.lineno)
                elif isinstance(op, (ast.In, ast.NotIn)) and is_names(right):
                    lines.append(node.lineno)
        elif isinstance(node, ast.MatchValue) and is_name(node.value):
            lines.append(node.lineno)
    return sorted(set(lines))


def test_no_backend_name_comparisons_outside_core_backends():
    """Code asks the Backend object what it can do (``backend.float64_engine``, ...)
    rather than comparing its name: a new backend then needs no hunt for names."""
    pkg = Path(mlx_precise.__file__).parent
    found = {}
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg).as_posix()
        lines = _name_comparisons(path)
        if lines:
            found[rel] = lines
    offending = {f: v for f, v in found.items() if f not in NAME_COMPARISONS_ALLOWED}
    assert not offending, (
        "compare Backend capabilities, not names (add one to core.backends.Backend "
        f"if none fits): {offending}")
    stale = sorted(NAME_COMPARISONS_ALLOWED - set(found))
    assert not stale, f"no name comparisons left: remove {stale} from the allowed list"


def test_name_comparison_detector():
    import textwrap

    src = textwrap.dedent('''
        a = backend == "cpu"
        b = "metal" != name
        c = ctx.backend in ("metal", "emulate")
        d = name not in ["cpu"]
        e = backend.float64_engine
        f = kind == "rfft"
        g = x in ("fft", "ifft")
        match backend:
            case "emulate":
                pass
    ''')

    class P:
        def read_text(self):
            return src

        def __str__(self):
            return "<src>"

    assert _name_comparisons(P()) == [2, 3, 4, 5, 10]
