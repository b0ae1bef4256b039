"""Suite-wide settings."""

import os

import pytest

# Emulated kernels run in checked mode: divergent barriers and stray writes into
# the unguarded slack around buffers are reported (see docs/emulator.md).
os.environ.setdefault("MLX_PRECISE_EMULATOR_CHECKED", "1")


@pytest.fixture
def lazy_metal():
    """The metal backend on a machine without a GPU, with lazy stand-ins for the
    kernels (mlx_precise.testing.lazy_metal_executor): the glue around them can be
    traced by ``mx.compile`` and its graph inspected; the values are meaningless."""
    from mlx_precise.testing import lazy_metal_executor

    with lazy_metal_executor():
        yield


# The files that take longest where nothing is cached yet (a fresh machine: MLX's
# CPU compiler and the emulator's build every kernel; measured with --durations),
# heaviest first. The suite runs under pytest-xdist with --dist loadfile: each file
# whole in one worker, handed out in collection order (pytest_configure below), so
# the longest ones start first and the short ones fill the other worker, instead of
# one long file running alone at the end.
_LONGEST_FIRST = (
    "extended/test_compiled_ops_cpu.py",
    "extended/test_compiled_ops_emulate.py",
    "extended/test_training_compile.py",
    "extended/test_training.py",
    "extended/test_nn_layers.py",
    "test_notebooks.py",
    "emulator/test_strict.py",
    "int8/test_int8.py",
    "doubleword/test_elementwise.py",
    "tools/test_install_cli.py",
    "doubleword/test_tables_source.py",
    "doubleword/test_sincos64.py",
    "extended/test_models.py",
    "test_metal_counts.py",
    "emulator/test_emulator_robustness.py",
)


def pytest_configure(config):
    # pytest-xdist would hand out files by their number of tests, most first
    # (--loadscope-reorder, its default): a file of a few long tests came last
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    def rank(item):
        path = item.path.as_posix()
        return next((k for k, f in enumerate(_LONGEST_FIRST) if path.endswith(f)),
                    len(_LONGEST_FIRST))

    items.sort(key=rank)  # (stable: the order within a file and among the others kept)
