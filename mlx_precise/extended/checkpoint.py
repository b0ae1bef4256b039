"""Saving and restoring double-word values: weights, optimizer state, any tree.

``mx.save_safetensors`` / ``mx.savez`` of an array that carries a low word store its
float32 rounding (an exit: rounded once). A checkpoint of a training run in
double-word must keep the low words, or the run resumes from float32 values. These
functions store each array's high word under its own name and its low word (when it
carries one) under ``<name>@lo``, in the same file, and put the low words back when
loading.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from .carry import attach, low_word
from .constructor import ARRAY  # the class (mx.array is a stand-in inside blocks)

LOW = "@lo"


def save_extended(file, tree) -> None:
    """Save a tree of arrays (a dict such as ``dict(model.parameters())`` or
    ``optimizer.state``, lists, nested) with their low words.

    Args:
        file: a path ending in ``.safetensors`` or ``.npz``.
        tree: arrays of any dtype in dicts / lists; float32 / complex64 arrays keep
            the low word they carry.

    Raises:
        ValueError: another file suffix, or a key already ending in ``@lo``.
    """
    file = str(file)
    flat = dict(tree_flatten(tree))
    out = {}
    for key, a in flat.items():
        if not isinstance(a, ARRAY):
            raise ValueError(f"save_extended: {key!r} is {type(a).__name__}, not an mx.array")
        if key.endswith(LOW):
            raise ValueError(f"save_extended: the key {key!r} ends in {LOW!r}, which names "
                             "low words")
        out[key] = a
        lo = low_word(a)
        if lo is not None:
            out[key + LOW] = lo
    if file.endswith(".safetensors"):
        mx.save_safetensors(file, out)
    elif file.endswith(".npz"):
        mx.savez(file, **out)
    else:
        raise ValueError(f"save_extended: {file!r} must end in .safetensors or .npz")


def load_extended(file):
    """Load what :func:`save_extended` saved: the tree (dicts and lists rebuilt from
    the dotted keys), each array carrying its low word again.

    Raises:
        ValueError: a low word without its array, or of another shape / dtype.
    """
    flat = mx.load(str(file))
    if Path(str(file)).suffix == ".npz" and not isinstance(flat, dict):
        raise ValueError(f"load_extended: {file!r} holds no named arrays")
    items = []
    for key, a in flat.items():
        if key.endswith(LOW):
            continue
        lo = flat.get(key + LOW)
        if lo is not None:
            if lo.shape != a.shape or lo.dtype != a.dtype:
                raise ValueError(f"load_extended: the low word of {key!r} is {lo.shape} "
                                 f"{lo.dtype}, its array {a.shape} {a.dtype}")
            attach(a, lo)
        items.append((key, a))
    orphans = [k for k in flat if k.endswith(LOW) and k[:-len(LOW)] not in flat]
    if orphans:
        raise ValueError(f"load_extended: low words without their arrays: {orphans}")
    return tree_unflatten(items)
