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
