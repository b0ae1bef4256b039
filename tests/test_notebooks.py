"""The example notebooks (examples/*.ipynb) run from top to bottom, at the size
stored in them (``FULL = False``: small, for a CPU), and are stored without outputs.

Each notebook runs in a fresh IPython kernel started with the python running the
tests (a kernelspec written to a temporary directory, so no installed kernelspec
can substitute another interpreter), with a temporary working directory; the test
fails if any cell raises. On a machine without Metal the notebooks run their
extended paths on the cpu backend and, through the emulator, on the Metal kernels.
"""

import json
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402  (after the skips)
from jupyter_client.manager import AsyncKernelManager  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
KERNEL = "mlx-precise-tests"
CELL_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory):
    """A kernelspec directory whose only kernel is this interpreter's ipykernel."""
    root = tmp_path_factory.mktemp("kernelspecs")
    spec = root / KERNEL
    spec.mkdir()
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python ({sys.executable})",
        "language": "python",
    }))
    return root


def load(path: Path):
    return nbformat.read(path, as_version=4)


def test_examples_present():
    names = {p.name for p in NOTEBOOKS}
    assert {"hyena_extended_precision.ipynb", "dgemm_emulation.ipynb", "sf16_training.ipynb",
            "tile_norms.ipynb", "int8_w8a8.ipynb",
            "training_scientific_ml.ipynb"} <= names, names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_without_outputs_at_small_size(path):
    nb = load(path)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{path.name} has no code cells"
    for i, cell in enumerate(code):
        assert cell.get("outputs") == [], f"{path.name}: code cell {i} has stored outputs"
        assert cell.get("execution_count") is None, f"{path.name}: code cell {i} has an execution count"
    # The size switch comes first and is off: CI runs the small size.
    assert "FULL = False" in code[0].source, f"{path.name}: first code cell lacks 'FULL = False'"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, kernel_dir, tmp_path):
    nb = load(path)
    km = AsyncKernelManager(kernel_name=KERNEL,
                            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernel_dir)]))
    client = nbclient.NotebookClient(nb, km=km, timeout=CELL_TIMEOUT_S,
                                     resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as e:
        pytest.fail(f"{path.name} raised:\n{e}")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), f"{path.name}: a cell did not run"
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
