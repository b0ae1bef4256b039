"""Helpers for the test suite and the benchmarks, not for models.

:func:`lazy_metal_executor` stands in for Metal on a machine without a GPU, so that
the glue around the kernels can be traced (``mx.compile``) and its host cost timed
on Linux. It patches private hooks of :mod:`mlx_precise.core` for the duration of a
``with`` block and restores them; the numbers it produces are meaningless.

Used by ``tests/conftest.py`` (the ``lazy_metal`` fixture) and
``benchmarks/bench_models.py`` (host build time of the metal path). It ships with
the wheel, so the benchmarks run from an installed package too.
"""

from __future__ import annotations

import contextlib

import mlx.core as mx

__all__ = ["lazy_metal_executor"]


def lazy_metal_executor():
    """A context manager standing in for Metal on a machine without it: the metal
    backend is made available and every kernel launch returns lazy MLX ops on its
    inputs (zeros of the output shapes), so the flow builds exactly the graph it
    builds on a Mac, and the time to build it is the host's cost (the values are
    meaningless). Uses the package's private kernel hooks; restores them."""
    from .core import backends, kernels

    def factory(_backend):
        def build(**_):
            def run(*, inputs, output_shapes, output_dtypes, **__):
                # depends on every input, so nothing can be folded away
                dep = sum(mx.sum(mx.abs(x).astype(mx.float32)) for x in inputs
                          if isinstance(x, mx.array)) * 0
                return [mx.zeros(tuple(sh), d) + dep.astype(d)
                        for sh, d in zip(output_shapes, output_dtypes)]
            return run
        return build

    @contextlib.contextmanager
    def patched():
        saved = (backends._why_unavailable, kernels._factory, dict(kernels._built),
                 dict(kernels._checked))
        why = saved[0]
        backends._why_unavailable = lambda n: None if backends._OBJECTS[n].gpu else why(n)
        kernels._factory, kernels._built = factory, {}
        kernels._checked["metal"] = None
        try:
            yield
        finally:
            backends._why_unavailable, kernels._factory = saved[0], saved[1]
            kernels._built.clear()
            kernels._built.update(saved[2])
            kernels._checked.clear()
            kernels._checked.update(saved[3])

    return patched()
