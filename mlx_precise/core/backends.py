"""Backend selection: ``metal``, ``emulate`` or ``cpu``.

* ``metal``   - Metal kernels through ``mx.fast.metal_kernel`` on an Apple GPU.
* ``emulate`` - the same Metal kernels run on the CPU by :mod:`mlx_precise.emulator`.
* ``cpu``     - native float64 implementations (numpy / MLX CPU float64).

The default is ``metal`` where Metal is available and ``cpu`` elsewhere. It can be
overridden by the ``MLX_PRECISE_BACKEND`` environment variable, by
:func:`set_backend`, or for a scope by :func:`use_backend` (a context variable, so it
is per thread and per async task). Asking for a backend that cannot run here raises
:class:`BackendUnavailableError`; nothing ever falls back silently.
"""

from __future__ import annotations

import contextlib
import contextvars
import os

import mlx.core as mx

BACKENDS = ("metal", "emulate", "cpu")
ENV_VAR = "MLX_PRECISE_BACKEND"


class Backend(str):
    """A backend: its name (the string value, so ``backend() == "cpu"`` holds) and
    what it can do, which code asks instead of comparing names.

    Attributes:
        has_kernels: runs the package's Metal kernels (metal, emulate).
        float64_engine: computes in native float64 (cpu: MLX float64 on the CPU
            stream, numpy / scipy where MLX has no accurate float64 function).
        host_evaluated: a kernel launch evaluates its inputs on the host at once
            (the emulator), so it cannot be traced by mx.compile / mx.vmap /
            mx.export_function, and cannot run inside an MLX gradient trace.
        host_functions: evaluates some functions on the host through numpy / scipy
            where MLX has no accurate float64 version (cpu: erf, the FFTs); the
            call sites name which, and those cannot be traced either.
        gpu: runs on an Apple GPU through Metal (needs ``mx.metal.is_available()``).
        traceable: its ops are graph nodes MLX can compile and differentiate.
    """

    has_kernels: bool
    float64_engine: bool
    host_evaluated: bool
    host_functions: bool
    gpu: bool

    def __new__(cls, name: str, *, has_kernels: bool, float64_engine: bool,
                host_evaluated: bool, host_functions: bool, gpu: bool):
        self = super().__new__(cls, name)
        self.has_kernels, self.float64_engine = has_kernels, float64_engine
        self.host_evaluated, self.host_functions = host_evaluated, host_functions
        self.gpu = gpu
        return self

    @property
    def name(self) -> str:
        return str(self)

    @property
    def traceable(self) -> bool:
        return not self.host_evaluated

    def __reduce__(self):  # pickle / copy give back the one object of the name
        return _object, (str(self),)


def _object(name: str) -> "Backend":
    return _OBJECTS[name]


_OBJECTS = {
    "metal": Backend("metal", has_kernels=True, float64_engine=False, host_evaluated=False,
                     host_functions=False, gpu=True),
    "emulate": Backend("emulate", has_kernels=True, float64_engine=False,
                       host_evaluated=True, host_functions=False, gpu=False),
    "cpu": Backend("cpu", has_kernels=False, float64_engine=True, host_evaluated=False,
                   host_functions=True, gpu=False),
}


def of(backend) -> Backend:
    """``backend`` itself when it is a :class:`Backend`, else :func:`get` of it."""
    return backend if isinstance(backend, Backend) else get(backend)


def get(name: str) -> Backend:
    """The :class:`Backend` object of a backend name (validated: see
    :func:`validate`)."""
    return _OBJECTS[validate(str(name))]


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run on this machine."""


_scoped: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "mlx_precise_backend", default=None
)
_global: str | None = None


_metal_seen: dict = {}  # MLX's probe function -> its answer (asked once per function)


def metal_available() -> bool:
    """True when MLX can run Metal kernels here (an Apple GPU). Asked once (every
    op of a block resolves the default backend); a replaced probe, as
    ``check-kernels --as-metal`` installs, is asked again."""
    probe = mx.metal.is_available
    if probe not in _metal_seen:
        try:
            _metal_seen[probe] = bool(probe())
        except Exception:
            _metal_seen[probe] = False
    return _metal_seen[probe]


def _why_unavailable(name: str) -> str | None:
    """None when ``name`` can run here, else the reason it cannot."""
    if name == "metal":
        if not metal_available():
            return "MLX reports no Metal device on this machine (mx.metal.is_available() is False)"
    elif name == "emulate":
        from ..emulator.compiler import CompilerNotFoundError, find_compiler

        try:
            find_compiler()
        except CompilerNotFoundError as e:
            return str(e)
    return None


def validate(name: str) -> Backend:
    """Return the :class:`Backend` of ``name`` if it can run here, else raise.

    Raises:
        ValueError: ``name`` is not one of ``metal``, ``emulate``, ``cpu``.
        BackendUnavailableError: the backend cannot run on this machine.
    """
    if not isinstance(name, str) or name not in BACKENDS:
        raise ValueError(
            f"unknown backend {name!r}: expected one of {', '.join(BACKENDS)}"
        )
    why = _why_unavailable(name)
    if why is not None:
        raise BackendUnavailableError(f"backend {str(name)!r} cannot run here: {why}")
    return _OBJECTS[name]


_ENV_KEY = os.fsencode(ENV_VAR)


def default_backend() -> Backend:
    """The backend used when nothing was set: the environment variable
    ``MLX_PRECISE_BACKEND`` if present, else ``metal`` if available, else ``cpu``."""
    # (os.environ's own dictionary of bytes: .get encodes the name and, when it is
    # unset, raises and catches a KeyError, 1.5 us of a compiled call's 2.3 us here)
    env = os.environ._data.get(_ENV_KEY)
    if env:
        env = os.fsdecode(env)
        try:
            return validate(env.strip().lower())
        except ValueError as e:
            raise ValueError(f"{ENV_VAR}={env!r}: {e}") from None
    return _OBJECTS["metal" if metal_available() else "cpu"]


def backend() -> Backend:
    """The active backend: a :func:`use_backend` scope, else :func:`set_backend`,
    else :func:`default_backend`."""
    return _scoped.get() or _global or default_backend()


def set_backend(name: str | None) -> None:
    """Set the process-wide backend (``None`` restores the default)."""
    global _global
    _global = None if name is None else validate(name)


@contextlib.contextmanager
def use_backend(name: str):
    """Run a block on backend ``name``; restores the previous choice on exit,
    exceptions included.

    Example::

        import mlx.core as mx
        import mlx_precise

        x = mx.random.normal((1024,)).astype(mx.complex64)
        with mlx_precise.use_backend("emulate"):
            y = mlx_precise.fft_extended(x)  # the Metal kernels, run by the emulator
    """
    token = _scoped.set(validate(name))
    try:
        yield name
    finally:
        _scoped.reset(token)


def resolve(name: str | None) -> Backend:
    """The backend to use for one call: ``name`` validated, or the active one."""
    return backend() if name is None else validate(name)
