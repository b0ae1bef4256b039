"""The strict Metal gate over this package's kernel registry.

Every :class:`~mlx_precise.core.kernels.Kernel` declares the values its wrappers can give
its template parameters and output dtypes (``variants``), its input dtypes and, where
a wrapper guarantees the size, how its inputs are passed (``input_forms``). This
module enumerates every instantiation MLX could generate from that and runs each
through :mod:`mlx_precise.emulator.strict`, the Metal front-end check. It backs
``python -m mlx_precise check-kernels`` and the test that keeps the gate complete.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from ..emulator import strict
from ..core.kernels import METAL_DIR, Kernel


def registry() -> dict[str, Kernel]:
    """Every kernel this package declares (module-level :class:`Kernel` objects in
    any of its modules, subpackages included), by name."""
    import importlib
    import pkgutil

    import mlx_precise

    found: dict[str, Kernel] = {}
    for info in pkgutil.walk_packages(mlx_precise.__path__, "mlx_precise."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, Kernel):
                found[value.name] = value
    return found


def instances(kernel: Kernel) -> list[strict.Instance]:
    """Every instantiation of ``kernel`` its wrappers can generate: the product of its
    template values, input dtypes and output dtypes, each with the inputs in their
    possible forms: all in their first form, all in their last, and each input alone
    in each of its other forms (an address-space error involves the input it reads,
    so single deviations find them without the 2^n combinations)."""
    gaps = kernel.coverage_gaps()
    if gaps:
        raise ValueError(f"kernel {kernel.name!r} cannot be checked: {'; '.join(gaps)}")
    names = list(kernel.inputs)
    forms = [tuple(kernel.input_forms.get(n, ("device", "constant"))) for n in names]
    patterns = {tuple(f[0] for f in forms), tuple(f[-1] for f in forms)}
    for k, fk in enumerate(forms):
        for form in fk[1:]:
            patterns.add(tuple(form if j == k else f[0] for j, f in enumerate(forms)))
    tnames = list(kernel.template)
    in_domains = [tuple(kernel.input_dtypes[n]) for n in names]
    out = []
    for tv in itertools.product(*(kernel.variants[t] for t in tnames)):
        template = tuple(zip(tnames, tv))
        # an output domain given as a template parameter's name follows that parameter
        out_domains = [
            (dict(template)[d],) if isinstance(d, str) else tuple(d)
            for d in (kernel.variants[o] for o in kernel.outputs)
        ]
        for dt_in, dt_out, pattern in itertools.product(
            itertools.product(*in_domains), itertools.product(*out_domains), sorted(patterns)
        ):
            out.append(strict.Instance(template, tuple(zip(names, dt_in, pattern)), dt_out))
    return out


def source_of(kernel: Kernel) -> strict.Source:
    """The kernel as MLX receives it, with ``#line`` markers naming our files."""
    path = kernel.source_path()
    try:
        label = str(path.relative_to(METAL_DIR.parent))
    except ValueError:
        label = str(path)
    return strict.Source(
        kernel.name, tuple(kernel.inputs), tuple(kernel.outputs), kernel.source(),
        kernel.header(markers=True), kernel.atomic_outputs, source_file=label,
    )


@dataclass
class Report:
    kernel: str
    count: int
    seconds: float
    failures: list = field(default_factory=list)


def check(kernel: Kernel) -> Report:
    """Run the strict check on every instantiation of one kernel."""
    t0 = time.perf_counter()
    insts = instances(kernel)
    failures = strict.check_instances(source_of(kernel), insts)
    return Report(kernel.name, len(insts), time.perf_counter() - t0, failures)


def check_all(names=None, progress=None) -> list[Report]:
    """Check every registered kernel (or those in ``names``); ``progress(report)``
    is called after each."""
    reg = registry()
    unknown = sorted(set(names or ()) - set(reg))
    if unknown:
        raise ValueError(f"unknown kernels {unknown}; registered: {sorted(reg)}")
    reports = []
    for name in sorted(names or reg):
        r = check(reg[name])
        reports.append(r)
        if progress:
            progress(r)
    return reports


# ---- a user's own code -----------------------------------------------------------------


def check_metal_file(path) -> Report:
    """A ``.metal`` file, checked whole as Metal compiles a library."""
    t0 = time.perf_counter()
    diag = strict.check_file(str(path))
    failures = [strict.Failure(str(path), "(whole file)", diag)] if diag else []
    return Report(str(path), 1, time.perf_counter() - t0, failures)


class _Recorder:
    """Stands in for ``mx.fast.metal_kernel`` while a script runs: each kernel runs
    in the emulator (so the script goes on as on a Mac) and each instantiation it
    launches is recorded for the strict check."""

    def __init__(self):
        self.kernels: dict[tuple, tuple[strict.Source, dict]] = {}

    def metal_kernel(self, name, input_names, output_names, source, header="",
                     ensure_row_contiguous=True, atomic_outputs=False, compile_options=None,
                     **kwargs):
        from ..emulator import metal_kernel

        kernel = metal_kernel(name, input_names, output_names, source, header,
                              ensure_row_contiguous, atomic_outputs, compile_options, **kwargs)
        key = (name, source, header, atomic_outputs, tuple(input_names), tuple(output_names))
        src = strict.Source(name, tuple(input_names), tuple(output_names), source, header,
                            atomic_outputs)
        _, seen = self.kernels.setdefault(key, (src, {}))

        def call(*, inputs, output_dtypes, template=None, **call_kwargs):
            inst = strict.make_instance(input_names, inputs, output_dtypes, template)
            seen.setdefault(inst.label(), inst)
            return kernel(inputs=inputs, output_dtypes=output_dtypes, template=template,
                          **call_kwargs)

        return call


class _AsMetal:
    """While a script runs with ``--as-metal``: MLX on this machine looks like a Mac.
    ``mx.metal.is_available()`` is True, ``mx.gpu`` is the CPU device (so
    ``stream=mx.gpu``, ``mx.set_default_device(mx.gpu)``, ``mx.Device(mx.gpu)`` and
    ``mx.default_device() == mx.gpu`` work), and the device functions that take a
    device or stream (``set_default_device``, ``default_stream``, ``new_stream``,
    ``stream``, ``is_available``, ``device_count``, ``device_info``) map a GPU
    device to the CPU. Everything is restored afterwards, the default device too.
    ``mx.DeviceType.gpu`` itself cannot be replaced (an enum member): an op given
    it still raises MLX's error."""

    _WRAPPED = ("set_default_device", "default_stream", "new_stream", "stream",
                "is_available", "device_count", "device_info")

    def __enter__(self):
        import mlx.core as mx

        self.mx = mx
        self.saved = {name: getattr(mx, name) for name in self._WRAPPED}
        self.saved_gpu, self.saved_available = mx.gpu, mx.metal.is_available
        self.saved_info, self.saved_default = mx.metal.device_info, mx.default_device()
        gpu = self.saved_gpu

        def to_cpu(d):
            if d == gpu or (isinstance(d, mx.Device) and d.type == gpu):
                return mx.cpu
            return d

        def wrap(fn):
            def wrapped(*args, **kwargs):
                return fn(*(to_cpu(a) for a in args), **{k: to_cpu(v) for k, v in kwargs.items()})
            wrapped.__name__, wrapped.__doc__ = fn.__name__, fn.__doc__
            return wrapped

        for name, fn in self.saved.items():
            setattr(mx, name, wrap(fn))
        mx.gpu = mx.cpu
        mx.metal.is_available = lambda: True
        mx.metal.device_info = mx.device_info
        return self

    def __exit__(self, *exc):
        mx = self.mx
        for name, fn in self.saved.items():
            setattr(mx, name, fn)
        mx.gpu, mx.metal.is_available = self.saved_gpu, self.saved_available
        mx.metal.device_info = self.saved_info
        mx.set_default_device(self.saved_default)
        return False


def check_script(path, argv=(), as_metal: bool = False) -> tuple[list[Report], BaseException | None]:
    """Run a Python script with ``mx.fast.metal_kernel`` emulated, then check every
    instantiation it launched. ``as_metal``: run it as on a Mac (:class:`_AsMetal`),
    so that a Metal path behind ``if mx.metal.is_available():`` is taken. Returns the
    reports (one per kernel source, with the count of instantiations it launched)
    and the exception the script ended with (None if it finished)."""
    import contextlib
    import runpy
    import sys

    import mlx.core as mx

    rec = _Recorder()
    saved = mx.fast.metal_kernel, sys.argv
    mx.fast.metal_kernel, sys.argv = rec.metal_kernel, [str(path), *argv]
    error = None
    try:
        with _AsMetal() if as_metal else contextlib.nullcontext():
            runpy.run_path(str(path), run_name="__main__")
    except SystemExit as e:
        error = None if e.code in (None, 0) else e
    except Exception as e:  # reported by the caller, with what was recorded so far
        error = e
    finally:
        mx.fast.metal_kernel, sys.argv = saved
    reports = []
    for src, seen in rec.kernels.values():
        t0 = time.perf_counter()
        failures = strict.check_instances(src, list(seen.values()))
        reports.append(Report(src.name, len(seen), time.perf_counter() - t0, failures))
    return reports, error


def _nothing_checked(path, reports: list[Report], as_metal: bool) -> str | None:
    """The error for a script that launched no kernel (None if it launched one):
    nothing of it was checked, which must not pass as a success."""
    if any(r.count for r in reports):
        return None
    made = (f"created {len(reports)} metal_kernel{'s' if len(reports) != 1 else ''} "
            "but launched none" if reports else "created no metal_kernel")
    hint = ("make the script call its kernels (with the inputs it uses in practice)"
            if as_metal else
            "if its Metal path is behind `if mx.metal.is_available():` (False on Linux), "
            "run it with --as-metal; else make the script call its kernels")
    return f"{path} {made}, so nothing was checked: {hint}"


def check_targets(targets, progress=None, as_metal: bool = False) -> tuple[list[Report], list[str]]:
    """``check-kernels`` arguments: kernel names of this package, ``.metal`` files
    and Python scripts (which run, with their kernels emulated, and are checked on
    every instantiation they launched; ``as_metal``: run as on a Mac, see
    :func:`check_script`); none means every kernel of this package. Returns the
    reports and the errors: a script that did not finish, or that launched no
    kernel (0 instantiations: nothing was checked)."""
    from pathlib import Path

    files = [t for t in targets if t.endswith((".metal", ".py"))]
    names = [t for t in targets if t not in files]
    reports, errors = (check_all(names, progress) if names or not files else []), []
    for f in files:
        if not Path(f).is_file():
            raise ValueError(f"no such file: {f}")
        if f.endswith(".metal"):
            found = [check_metal_file(f)]
        else:
            found, error = check_script(f, as_metal=as_metal)
            if error is not None:
                errors.append(f"{f} stopped with {type(error).__name__}: {error}")
            empty = _nothing_checked(f, found, as_metal)
            if empty:
                errors.append(empty)
        for r in found:
            reports.append(r)
            if progress:
                progress(r)
    return reports, errors
