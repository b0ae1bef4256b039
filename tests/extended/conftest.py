"""Fixtures of the double-word flow's tests."""

import pytest

import mlx_precise as mp


@pytest.fixture(params=["cpu", "emulate"])
def backend(request):
    """Each test once per host backend, with that backend active."""
    with mp.use_backend(request.param):
        yield request.param
