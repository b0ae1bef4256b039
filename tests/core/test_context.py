"""extended_precision(): nesting, scoping, and what the precision-aware entry points run."""

import asyncio
import threading

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise
from mlx_precise import extended_precision, is_extended

FFT_NAMES = {f"{kind}{form}" for kind in ("fft", "ifft", "rfft", "irfft")
             for form in ("", "2", "n")}
# The documented list of precision-aware entry points (docs/api.md); later
# capabilities add theirs here and there.
DOCUMENTED = {"complex_multiply", "depthwise3", "depthwise_conv", "fft_scale", "fftconv",
              *FFT_NAMES}


def test_nesting_and_exceptions():
    assert not is_extended()
    with extended_precision():
        assert is_extended()
        with extended_precision(False):
            assert not is_extended()
            with extended_precision():
                assert is_extended()
            assert not is_extended()
        assert is_extended()
    assert not is_extended()
    with pytest.raises(KeyError):
        with extended_precision():
            raise KeyError("x")
    assert not is_extended()
    with pytest.raises(TypeError, match="takes a bool"):
        with extended_precision("yes"):
            pass
    with pytest.raises(TypeError, match=r"extended_precision\(intercept_mlx\) takes a bool"):
        with extended_precision(intercept_mlx=1):
            pass
    with pytest.raises(TypeError, match=r"extended_precision\(strict\) takes a bool"):
        with extended_precision(strict="raise"):
            pass


def test_decorator_and_reuse():
    @extended_precision()
    def inside():
        return is_extended()

    assert inside() and inside() and not is_extended()  # each call opens its own block
    block = extended_precision()
    with block:
        with pytest.raises(RuntimeError, match="already open"):
            with block:
                pass
        assert is_extended()  # the refused re-entry left the open block alone
    assert not is_extended()
    with block:  # closed: it opens again
        assert is_extended()
    assert not is_extended()


def test_per_thread_and_per_task():
    seen = {}
    with extended_precision():
        t = threading.Thread(target=lambda: seen.setdefault("thread", is_extended()))
        t.start()
        t.join()
    assert seen["thread"] is False

    async def task(flag):
        with extended_precision(flag):
            await asyncio.sleep(0.01)
            return is_extended()

    async def main():
        return await asyncio.gather(task(True), task(False), task(True))

    assert asyncio.run(main()) == [True, False, True]


def test_registry_matches_documentation():
    assert set(mlx_precise.precision_aware_functions()) == DOCUMENTED
    for name in DOCUMENTED:
        # The FFT twins live in the mlx_precise.fft namespace (numpy's naming).
        home = mlx_precise.fft if name in FFT_NAMES else mlx_precise
        assert getattr(home, name) is mlx_precise.precision_aware_functions()[name]


def test_entry_points_follow_the_context():
    """Outside: plain complex64 MLX. Inside: the extended kernel's result."""
    rng = np.random.default_rng(0)
    # Cancellation-prone operands, where the two differ.
    ar, ai, br = (rng.uniform(1, 2, 4096).astype(np.float32) for _ in range(3))
    bi = (ar.astype(np.float64) * br / ai).astype(np.float32)
    a, b = mx.array(ar + 1j * ai), mx.array(br + 1j * bi)
    plain = np.array(mlx_precise.complex_multiply(a, b))
    assert (plain == np.array(a * b)).all()
    with mlx_precise.use_backend("emulate"), extended_precision():
        ext = np.array(mlx_precise.complex_multiply(a, b))
    ref = np.array(mlx_precise.complex_multiply_extended(a, b, backend="emulate"))
    assert (ext == ref).all() and (ext != plain).any()
    x = mx.array(np.float32([1, 2, 10]))
    with mlx_precise.use_backend("cpu"), extended_precision():
        s = mlx_precise.fft_scale(x, 3)
    assert np.array(s).tolist() == np.float32(np.array([1, 2, 10]) / 3).tolist()
