"""SF16 mode: Q1.15 boundary quantization of ``mlx.nn`` models, straight-through backward.

The SF16 "true forward" (docs/fixedpoint.md) writes the tensors that cross
layer boundaries through Q1.15: matmul outputs go through ``simulate_q131`` then
``simulate_q115``; attention softmax outputs, GELU outputs, LayerNorm / RMSNorm
outputs, embedding outputs, residual sums and the embedding sum go through
``simulate_q115``; every quantized activation is clamped to +-threshold. The backward
pass is not quantized: each quantizer has an identity vector-Jacobian product
(``mx.custom_function``), i.e. gradients pass straight through, clamp included.

Usage::

    with mlx_precise.sf16(model) as mode:
        loss, grads = nn.value_and_grad(model, loss_fn)(model, x, y)

Inside the block the supported submodules of ``model`` compute in SF16 mode (their
class is swapped for a subclass with a quantizing ``__call__``; the parameter tree is
untouched, so optimizers and ``nn.value_and_grad`` work as usual); on exit they are
restored. Sums written in the model's own code (residuals, token + position
embeddings) are not modules: mark them with :func:`sf16_boundary`, which quantizes
while a mode is active and is the identity otherwise. Raw matmuls in model code can
use :func:`sf16_matmul`.

Handled module types (exact types, not subclasses): ``nn.Linear`` (output through
Q1.31 then Q1.15), ``nn.Embedding`` (output through Q1.15; ``as_linear`` like a
Linear), ``nn.LayerNorm``, ``nn.RMSNorm``, ``nn.GELU`` (output through Q1.15),
``nn.MultiHeadAttention`` (softmax output through Q1.15, the weighted sum of values
through Q1.31 then Q1.15; its projections are Linears). Everything else runs
unchanged: leaf modules of other types are listed in ``SF16.unhandled``.
"""

from __future__ import annotations

import contextvars
import functools
import math
from typing import Callable, Sequence

import mlx.core as mx
import mlx.nn as nn

from ..core import backends
from ..core.autodiff import as_tuple
from ..core.streams import streamed
from .qformat import (
    Q115_THRESHOLD,
    Q131_THRESHOLD,
    _check_rounding,
    _check_storage,
    _check_threshold,
    simulate_q115,
    simulate_q131,
)

_ACTIVE: contextvars.ContextVar["SF16 | None"] = contextvars.ContextVar(
    "mlx_precise_sf16", default=None
)


@functools.lru_cache(maxsize=None)
def _straight_through(matmul: bool, threshold: float, rounding: str, storage, backend: str):
    """The quantizer as an ``mx.custom_function`` whose VJP is the identity."""

    @mx.custom_function
    def quantize(x):
        if matmul:  # the reference's matmul epilogue: Q1.31 (clamp to +-1), then Q1.15
            x = simulate_q131(x, Q131_THRESHOLD, rounding, backend=backend)
        return simulate_q115(x, threshold, rounding, storage, backend=backend)

    @quantize.vjp
    def quantize_vjp(primals, cotangent, output):
        # Straight-through: d(quantize)/dx taken as the identity, also where clamped.
        return cotangent.astype(as_tuple(primals)[0].dtype)

    return quantize


class SF16:
    """An SF16 mode for one model; a context manager (also :meth:`enable` /
    :meth:`disable`). Create it with :func:`sf16`.

    Attributes:
        handled: ``[(path, type name)]`` of the submodules put in SF16 mode.
        unhandled: ``[(path, type name)]`` of leaf submodules of other types, which
            run unquantized (e.g. ``nn.Conv2d``, ``nn.ReLU``, ``nn.QuantizedLinear``,
            ``nn.Dropout``); filled by :meth:`enable`.
    """

    def __init__(self, model, threshold, rounding, storage_dtype, exclude, backend, observer):
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(f"sf16: model must be an mlx.nn.Module or None, got {type(model).__name__}")
        self.model = model
        self.threshold = float(_check_threshold(threshold, "sf16"))
        _check_rounding(rounding, "sf16")
        self.rounding = rounding
        self.storage_dtype = _check_storage(storage_dtype, "sf16")
        if isinstance(exclude, str) or not all(isinstance(e, str) for e in exclude):
            raise TypeError("sf16: exclude must be a sequence of module paths (strings)")
        self.exclude = tuple(exclude)
        self.backend = backends.resolve(backend)
        if observer is not None and not callable(observer):
            raise TypeError(f"sf16: observer must be callable, got {type(observer).__name__}")
        self.observer = observer
        self.handled: list[tuple[str, str]] = []
        self.unhandled: list[tuple[str, str]] = []
        self._swapped: list[tuple[nn.Module, type]] = []
        self._token = None

    # ---- switching -----------------------------------------------------------

    def _excluded(self, path: str) -> bool:
        return any(path == e or path.startswith(e + ".") for e in self.exclude)

    def enable(self) -> "SF16":
        """Put the model's supported submodules in SF16 mode and activate
        :func:`sf16_boundary` (for this thread / task).

        Raises:
            RuntimeError: the mode is already enabled, or a submodule is already in
                another SF16 mode.
        """
        if self._token is not None:
            raise RuntimeError("sf16: this mode is already enabled")
        self.handled, self.unhandled = [], []
        if self.model is not None:
            for path, m in self.model.named_modules():
                if isinstance(m, _SF16Module):
                    self._restore()
                    raise RuntimeError(f"sf16: module {path or '<root>'!r} is already in SF16 mode")
                sub = _SUBCLASSES.get(type(m))
                if sub is not None and not self._excluded(path):
                    object.__setattr__(m, "_sf16_where", (self, path))
                    self._swapped.append((m, type(m)))
                    self.handled.append((path, type(m).__name__))
                    m.__class__ = sub
                elif sub is None and not m.children():
                    self.unhandled.append((path, type(m).__name__))
        self._token = _ACTIVE.set(self)
        return self

    def _restore(self) -> None:
        for m, cls in reversed(self._swapped):
            m.__class__ = cls
            object.__delattr__(m, "_sf16_where")
        self._swapped = []

    def disable(self) -> None:
        """Restore the model's modules and deactivate :func:`sf16_boundary`."""
        if self._token is None:
            return
        self._restore()
        _ACTIVE.reset(self._token)
        self._token = None

    def __enter__(self) -> "SF16":
        return self.enable()

    def __exit__(self, *exc) -> None:
        self.disable()

    # ---- quantizing ----------------------------------------------------------

    def quantize(self, x: mx.array, kind: str, name: str) -> mx.array:
        """``x`` through Q1.15 (``kind == "matmul"``: Q1.31 first) with a
        straight-through gradient; reports ``(name, kind, result)`` to the observer."""
        f = _straight_through(kind == "matmul", self.threshold, self.rounding,
                              self.storage_dtype, self.backend)
        y = f(x)
        if self.observer is not None:
            self.observer(name, kind, y)
        return y


def sf16(model=None, *, threshold: float = Q115_THRESHOLD, rounding: str = "half_even",
         storage_dtype=None, exclude: Sequence[str] = (), backend: str | None = None,
         observer: Callable | None = None) -> SF16:
    """SF16 mode for ``model``: use as ``with mlx_precise.sf16(model): ...``.

    Args:
        model: an ``mlx.nn.Module`` (or None: only :func:`sf16_boundary` and
            :func:`sf16_matmul` act).
        threshold: Q1.15 clamp bound in (0, 1] (the Q1.31 step clamps to +-1).
        rounding: ``"half_even"`` (default), ``"half_away"`` or ``"truncate"``.
        storage_dtype: None (float32 boundary tensors), ``mx.bfloat16`` (as the
            reference's storage) or ``mx.float16``: boundary tensors are rounded once
            more to that type.
        exclude: module paths (as in ``model.named_modules()``) left unquantized,
            with everything under them, e.g. ``("lm_head",)``.
        backend: ``"metal"``, ``"emulate"``, ``"cpu"`` or None (the active backend),
            fixed when the mode is created.
        observer: optional ``observer(name, kind, array)`` called with every
            quantized boundary tensor; ``kind`` is ``"matmul"``, ``"softmax"``,
            ``"gelu"``, ``"norm"``, ``"embedding"`` or ``"boundary"``.

    Returns:
        An :class:`SF16` context manager.

    Raises:
        TypeError: ``model`` not a Module, ``threshold`` not a number, ``exclude``
            not strings, ``observer`` not callable.
        ValueError: ``threshold`` outside (0, 1], unknown ``rounding``,
            ``storage_dtype`` or ``backend``.
    """
    return SF16(model, threshold, rounding, storage_dtype, exclude, backend, observer)


@streamed
def sf16_boundary(x: mx.array, name: str = "boundary", *, stream=None) -> mx.array:
    """Mark a boundary tensor written in model code (a residual sum, the token +
    position embedding sum): quantized through Q1.15 (straight-through gradient)
    while an SF16 mode is active, returned unchanged otherwise.

    Args:
        x: float32, float16 or bfloat16 ``mx.array``, any shape.
        name: label passed to the mode's observer.
        stream: MLX stream or device the quantization runs on; None: the default.
    """
    mode = _ACTIVE.get()
    return x if mode is None else mode.quantize(x, "boundary", name)


@streamed
def sf16_matmul(a: mx.array, b: mx.array, name: str = "matmul", *, stream=None) -> mx.array:
    """``a @ b``, through Q1.31 then Q1.15 while an SF16 mode is active; on
    ``stream`` (an MLX stream or device; None: the default stream)."""
    mode = _ACTIVE.get()
    y = a @ b
    return y if mode is None else mode.quantize(y, "matmul", name)


# ---- the module subclasses -----------------------------------------------------


class _SF16Module:
    """Marker base of the SF16 subclasses; ``_sf16_where`` is ``(mode, path)``."""

    def _q(self, x, kind, suffix=""):
        mode, path = self._sf16_where
        return mode.quantize(x, kind, path + suffix)


class _Linear(_SF16Module, nn.Linear):
    def __call__(self, x):
        return self._q(super().__call__(x), "matmul")


class _Embedding(_SF16Module, nn.Embedding):
    def __call__(self, x):
        return self._q(super().__call__(x), "embedding")

    def as_linear(self, x):
        return self._q(super().as_linear(x), "matmul", ".as_linear")


class _LayerNorm(_SF16Module, nn.LayerNorm):
    def __call__(self, x):
        return self._q(super().__call__(x), "norm")


class _RMSNorm(_SF16Module, nn.RMSNorm):
    def __call__(self, x):
        return self._q(super().__call__(x), "norm")


class _GELU(_SF16Module, nn.GELU):
    def __call__(self, x):
        return self._q(super().__call__(x), "gelu")


def _causal_mask(q_len: int, k_len: int) -> mx.array:
    # Aligned to the last key, as mx.fast.scaled_dot_product_attention's "causal".
    q_idx = mx.arange(k_len - q_len, k_len)[:, None]
    return q_idx >= mx.arange(k_len)[None]


class _MultiHeadAttention(_SF16Module, nn.MultiHeadAttention):
    """nn.MultiHeadAttention with the attention written out (as MLX's reference
    path of ``scaled_dot_product_attention``) so that its softmax output can be
    quantized."""

    def __call__(self, queries, keys, values, mask=None):
        queries = self.query_proj(queries)
        keys = self.key_proj(keys)
        values = self.value_proj(values)
        h = self.num_heads
        queries = mx.unflatten(queries, -1, (h, -1)).transpose(0, 2, 1, 3)
        keys = mx.unflatten(keys, -1, (h, -1)).transpose(0, 2, 1, 3)
        values = mx.unflatten(values, -1, (h, -1)).transpose(0, 2, 1, 3)
        scale = math.sqrt(1 / queries.shape[-1])
        scores = (queries * scale) @ keys.swapaxes(-1, -2)
        if isinstance(mask, str):
            if mask != "causal":
                raise ValueError(f"MultiHeadAttention: mask must be an array, 'causal' or None, got {mask!r}")
            mask = _causal_mask(scores.shape[-2], scores.shape[-1])
        if mask is not None:
            if mask.dtype == mx.bool_:
                scores = mx.where(mask, scores, mx.array(mx.finfo(scores.dtype).min, scores.dtype))
            else:
                scores = scores + mask
        probs = self._q(mx.softmax(scores, axis=-1, precise=True), "softmax", ".softmax")
        out = self._q(probs @ values, "matmul", ".attention")
        return self.out_proj(out.transpose(0, 2, 1, 3).flatten(-2, -1))


_SUBCLASSES: dict[type, type] = {
    nn.Linear: _Linear,
    nn.Embedding: _Embedding,
    nn.LayerNorm: _LayerNorm,
    nn.RMSNorm: _RMSNorm,
    nn.GELU: _GELU,
    nn.MultiHeadAttention: _MultiHeadAttention,
}
HANDLED_TYPES = tuple(_SUBCLASSES)
"""The module types :func:`sf16` puts in SF16 mode (exact types)."""
