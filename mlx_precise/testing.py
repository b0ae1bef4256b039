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
import numpy as np

__all__ = ["Launch", "graph_counts", "graph_text", "lazy_metal_executor"]

_ARRAY = mx.array  # the class (inside a block the name is a stand-in: a slower isinstance)
# MLX's own, captured at import: a kernel launch on a Mac does not pass through the
# flow's stand-ins (inside a block mx's names are stand-ins), so neither does its
# stand-in here (a pass through one would add to the host time this measures)
_DEPENDS, _ZEROS_LIKE = mx.depends, mx.zeros_like


def lazy_metal_executor(record: list | None = None):
    """A context manager standing in for Metal on a machine without it: the metal
    backend is made available and every kernel launch returns lazy MLX ops on its
    inputs (zeros of the output shapes), so the flow builds exactly the graph it
    builds on a Mac, and the time to build it is the host's cost (the values are
    meaningless). Each launch is one ``Depends`` node of the graph, as a kernel is
    one node on a Mac (its outputs are the node's: they depend on every input and
    hold the data of evaluated zeros, one array per output shape and dtype kept for
    the block, so the stand-in adds no node of its own), which :func:`graph_counts`
    counts as a launch. Uses the package's private kernel hooks; restores them.

    ``record``: a list that gets one :class:`Launch` per launch (the kernel's name,
    template, inputs and outputs); after the graph is evaluated, :meth:`Launch.ran`
    says whether a GPU would have run it (a launch whose outputs nothing evaluated
    reads, such as the intermediate results of a fused chain, never runs)."""
    from .core import backends, kernels

    zeros: dict = {}  # (shape, dtype) -> evaluated zeros: data, no graph node

    def factory(_backend):
        def build(*, name="", **_):
            def run(*, inputs, output_shapes, output_dtypes, template=None, **__):
                # one graph node per launch, as a kernel is on a Mac: its outputs
                # depend on every input (nothing folds away); the zeros they hold
                # are shared, so no buffer is donated to a later op
                outs = []
                for sh, d in zip(output_shapes, output_dtypes):
                    key = (tuple(sh), d)
                    z = zeros.get(key)
                    if z is None:
                        z = zeros[key] = _zeros(*key)
                    outs.append(z)
                deps = [x for x in inputs if isinstance(x, _ARRAY)]
                if record is not None:
                    launch = Launch(name, dict(template or ()), inputs, output_shapes,
                                    output_dtypes)
                    record.append(launch)
                    deps.append(launch.probe)
                return _DEPENDS(outs, deps) if deps else [_ZEROS_LIKE(z) for z in outs]
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


def _zeros(shape: tuple, dtype) -> mx.array:
    """Zeros of ``shape`` as data (no graph node, also while ``mx.compile``
    traces), for the dtypes numpy has; a broadcast view of a 0-d zero for others."""
    name = str(dtype).rsplit(".", 1)[-1]
    if name == "bfloat16" or not hasattr(np, name):
        return mx.broadcast_to(_ARRAY(0, dtype), shape)
    return _ARRAY(np.zeros(shape, getattr(np, name)))


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
_OUTPUT_RE = re.compile(r'^\d+ -> "', re.M)  # a primitive's edge to one of its outputs


def graph_text(*outputs) -> str:
    """MLX's export of the lazy graph that computes ``outputs`` (``mx.export_to_dot``:
    DOT text, a node per primitive and per array); ``outputs``: one ``mx.array`` or
    more (else ``TypeError``)."""
    if not outputs or not all(isinstance(o, _ARRAY) for o in outputs):
        raise TypeError("graph_text / graph_counts take one mx.array or more, got "
                        f"{[type(o).__name__ for o in outputs]}")
    fd, path = tempfile.mkstemp(suffix=".dot")
    os.close(fd)
    try:
        mx.export_to_dot(path, *outputs)
        with open(path) as f:
            return f.read()
    finally:
        os.remove(path)


def graph_counts(*outputs) -> dict:
    """The primitives of the lazy graph that computes ``outputs`` (unevaluated
    arrays), from MLX's own graph export (``mx.export_to_dot``): ``{"launches"``
    (the stand-in kernels of :func:`lazy_metal_executor`, ``Depends`` nodes),
    ``"glue"`` (other primitives that dispatch: not in :data:`VIEWS`), ``"views"``,
    ``"extra_outputs"`` (the outputs of primitives beyond their first: MLX's
    compiled replay pays for each), ``"by_primitive"`` (name -> count)}. Evaluated arrays are leaves (their
    primitives are gone), so count before ``mx.eval``."""
    text = graph_text(*outputs)
    names = collections.Counter(_primitive(label) for _, label in _NODE_RE.findall(text))
    launches = names.get("Depends", 0)
    views = sum(n for k, n in names.items() if k in VIEWS)
    outputs = len(_OUTPUT_RE.findall(text))
    return {"launches": launches, "glue": sum(names.values()) - launches - views,
            "views": views, "extra_outputs": outputs - sum(names.values()),
            "by_primitive": dict(names)}
