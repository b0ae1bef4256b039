"""``mx.array(x)`` inside a block.

MLX's array type is a nanobind class: its construction cannot be wrapped (its
``__init__`` is not looked up, its metaclass is immutable), so while a block is open
the name ``mx.array`` is a stand-in (:class:`Constructor`) that calls the
``"array"`` rule (the copy of a carried array carries its words) and is the class
everywhere else: ``isinstance(x, mx.array)`` and ``issubclass``, attributes
(``mx.array.at``, ``mx.array.__add__``). Pickle writes a class by its name and
checks that the name finds it: while the stand-in holds the name, an array is
pickled as :func:`restore` of its state (loading it needs this package).
"""

from __future__ import annotations

import copyreg

import mlx.core as mx

ARRAY = mx.array  # the class itself


class Constructor:
    """Stands in for the class ``mx.array`` while blocks are open: calls go to
    ``call`` (the dispatcher's wrapper of the ``"array"`` rule), everything else
    to the class."""

    def __init__(self, call):
        object.__setattr__(self, "_call", call)
        for name in ("__doc__", "__module__", "__name__", "__qualname__"):
            object.__setattr__(self, name, getattr(ARRAY, name))

    def __call__(self, *args, **kwargs):
        if args and not isinstance(args[0], (ARRAY, list, tuple)):
            return ARRAY(*args, **kwargs)  # scalars, numpy arrays: nothing carried
        return self._call(*args, **kwargs)

    def __instancecheck__(self, obj) -> bool:
        return isinstance(obj, ARRAY)

    def __subclasscheck__(self, cls) -> bool:
        return issubclass(cls, ARRAY)

    def __getattr__(self, name):
        return getattr(ARRAY, name)

    def __setattr__(self, name, value):
        setattr(ARRAY, name, value)

    def __reduce__(self) -> str:
        return "array"  # pickled by reference, as mlx.core.array

    def __repr__(self) -> str:
        return repr(ARRAY)


def restore(*state) -> mx.array:
    """An array from MLX's pickled state (``array.__getstate__()``)."""
    a = ARRAY.__new__(ARRAY)
    a.__setstate__(state)
    return a


def _reduce(a):
    return restore, a.__getstate__()


def install() -> None:
    """While the stand-in is ``mx.array``, pickle an array as :func:`restore` of its
    state (its class cannot be written by name then)."""
    copyreg.dispatch_table[ARRAY] = _reduce


def uninstall() -> None:
    copyreg.dispatch_table.pop(ARRAY, None)
