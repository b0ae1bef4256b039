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

import collections
import contextlib
import math
import os
import re
import tempfile

import mlx.core as mx

__all__ = ["Launch", "graph_counts", "lazy_metal_executor"]

_ARRAY = mx.array  # the class (inside a block the name is a stand-in: a slower isinstance)


def lazy_metal_executor(record: list | None = None):
    """A context manager standing in for Metal on a machine without it: the metal
    backend is made available and every kernel launch returns lazy MLX ops on its
    inputs (zeros of the output shapes), so the flow builds exactly the graph it
    builds on a Mac, and the time to build it is the host's cost (the values are
    meaningless). Each launch is one ``Depends`` node of the graph (its outputs are
    broadcast views, one ``Broadcast`` node per output shape: the stand-in's own),
    which :func:`graph_counts` counts as a launch. Uses the package's private kernel
    hooks; restores them.

    ``record``: a list that gets one :class:`Launch` per launch (the kernel's name,
    template, inputs and outputs); after the graph is evaluated, :meth:`Launch.ran`
    says whether a GPU would have run it (a launch whose outputs nothing evaluated
    reads, such as the intermediate results of a fused chain, never runs)."""
    from .core import backends, kernels

    zeros: dict = {}  # one 0-d zero per dtype: a constant, no graph node

    def factory(_backend):
        def build(*, name="", **_):
            def run(*, inputs, output_shapes, output_dtypes, template=None, **__):
                # one graph node per launch, as a kernel is on a Mac: the outputs
                # (broadcast zeros: one view per shape and dtype) depend on every
                # input (nothing folds away)
                views: dict = {}
                outs = []
                for sh, d in zip(output_shapes, output_dtypes):
                    key = (tuple(sh), d)
                    if key not in views:
                        if d not in zeros:
                            zeros[d] = mx.array(0, d)
                        views[key] = mx.broadcast_to(zeros[d], key[0])
                    outs.append(views[key])
                deps = [x for x in inputs if isinstance(x, _ARRAY)]
                if record is not None:
                    launch = Launch(name, dict(template or ()), inputs, output_shapes,
                                    output_dtypes)
                    record.append(launch)
                    deps.append(launch.probe)
                return mx.depends(outs, deps) if deps else outs
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


class Launch:
    """One kernel launch seen by :func:`lazy_metal_executor` (with ``record``):
    ``name``, ``template`` (a dict), ``inputs``, ``output_shapes``,
    ``output_dtypes``, and a lazy probe its outputs depend on."""

    def __init__(self, name, template, inputs, output_shapes, output_dtypes):
        self.name, self.template, self.inputs = name, template, list(inputs)
        self.output_shapes, self.output_dtypes = output_shapes, output_dtypes
        self.probe = mx.zeros((1,), mx.float32) * 1  # unevaluated until the launch is

    def nbytes(self) -> int:
        """Bytes the launch reads and writes: its distinct input arrays (a fused
        kernel repeats its first slot in the ones its program does not read) and its
        outputs."""
        seen, total = set(), 0
        for a in self.inputs:
            if isinstance(a, _ARRAY) and id(a) not in seen:
                seen.add(id(a))
                total += a.nbytes
        return total + sum(math.prod(s) * d.size
                           for s, d in zip(self.output_shapes, self.output_dtypes))

    def ran(self) -> bool:
        """Whether evaluating the graph evaluated this launch: its probe then has no
        primitive left (MLX detaches evaluated arrays from their graph)."""
        return not graph_counts(self.probe)["by_primitive"]


# Primitives that make no GPU dispatch of their own: views of their input's buffer
# (MLX shares the data and changes strides / offset / dtype), and the autodiff and
# dependency wrappers that hand their inputs through. Reshape copies when its input
# is not contiguous; counted as a view here (a lower bound).
VIEWS = frozenset({
    "Broadcast", "BroadcastAxes", "Reshape", "Slice", "Transpose", "AsStrided",
    "ExpandDims", "Squeeze", "Flatten", "Unflatten", "View", "StopGradient", "Split",
    "CustomTransforms",
})


def _primitive(label: str) -> str:
    """The primitive's name in a graph label (``View float32``: ``View``)."""
    return label.split(" ", 1)[0]

_NODE_RE = re.compile(r'^\{ (\d+) \[label ="([^"]+)"', re.M)


def graph_counts(*outputs) -> dict:
    """The primitives of the lazy graph that computes ``outputs`` (unevaluated
    arrays), from MLX's own graph export (``mx.export_to_dot``): ``{"launches"``
    (the stand-in kernels of :func:`lazy_metal_executor`, ``Depends`` nodes),
    ``"glue"`` (other primitives that dispatch: not in :data:`VIEWS`), ``"views"``,
    ``"by_primitive"`` (name -> count)}. Evaluated arrays are leaves (their
    primitives are gone), so count before ``mx.eval``."""
    fd, path = tempfile.mkstemp(suffix=".dot")
    os.close(fd)
    try:
        mx.export_to_dot(path, *outputs)
        with open(path) as f:
            text = f.read()
    finally:
        os.remove(path)
    names = collections.Counter(_primitive(label) for _, label in _NODE_RE.findall(text))
    launches = names.get("Depends", 0)
    views = sum(n for k, n in names.items() if k in VIEWS)
    return {"launches": launches, "glue": sum(names.values()) - launches - views,
            "views": views, "by_primitive": dict(names)}
