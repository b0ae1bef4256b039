"""``python -m mlx_precise check-kernels FILE`` on a user's own code: a ``.metal`` file
checked whole, a Python script run with its kernels emulated and every
instantiation it launches checked. The files are written here for the test."""

import subprocess
import sys
import textwrap

import pytest

SCRIPT = '''
import mlx.core as mx
scale = mx.fast.metal_kernel(name="twice", input_names=["x"], output_names=["y"],
    source="uint i = thread_position_in_grid.x; y[i] = x[i] * T(2);")
for dt in (mx.float32, mx.float16):
    x = mx.arange(16).astype(dt)
    (y,) = scale(inputs=[x], template=[("T", dt)], grid=(16, 1, 1), threadgroup=(16, 1, 1),
                 output_shapes=[x.shape], output_dtypes=[dt])
    assert (y == 2 * x).all().item()
{extra}
'''
BAD_KERNEL = '''
bad = mx.fast.metal_kernel(name="decay", input_names=["x"], output_names=["y"],
    source="uint i = thread_position_in_grid.x; y[i] = x[i] * exp(-0.5);")
bad(inputs=[mx.ones((16,))], grid=(16, 1, 1), threadgroup=(16, 1, 1),
    output_shapes=[(16,)], output_dtypes=[mx.float32])
'''
METAL = '''
#include <metal_stdlib>
using namespace metal;
template <typename T>
[[kernel]] void halve(device T* data [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  data[i] = data[i] / T(2);
}
template [[host_name("halve_float")]] [[kernel]] void halve<float>(device float*, uint);
'''


def cli(*args):
    return subprocess.run([sys.executable, "-m", "mlx_precise", "check-kernels", *args],
                          capture_output=True, text=True, timeout=600)


def run_script(tmp_path, extra=""):
    path = tmp_path / "user.py"
    path.write_text(SCRIPT.format(extra=extra))
    return cli(str(path))


def test_script_all_instantiations_pass(tmp_path):
    proc = run_script(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 kernels, 2 instantiations, 0 failed" in proc.stdout


def test_script_with_a_kernel_metal_rejects(tmp_path):
    proc = run_script(tmp_path, BAD_KERNEL)
    assert (proc.returncode, "call to 'exp' is ambiguous" in proc.stdout) == (1, True)
    assert "decay (x: float device) -> (float):" in proc.stdout


def test_script_that_fails_is_reported(tmp_path):
    proc = run_script(tmp_path, "raise KeyError('boom')")
    assert (proc.returncode, "stopped with KeyError" in proc.stderr) == (1, True)
    assert "1 kernels, 2 instantiations, 0 failed" in proc.stdout


def test_metal_file(tmp_path):
    good = tmp_path / "halve.metal"
    good.write_text(METAL)
    assert cli(str(good)).returncode == 0
    bad = tmp_path / "broken.metal"
    bad.write_text(METAL.replace("device T* data", "T* data").replace("device float*", "float*"))
    proc = cli(str(bad))
    assert proc.returncode == 1
    assert f"{bad}:5:" in proc.stdout
    assert "pointer type must have explicit address space qualifier" in proc.stdout


def test_missing_file(tmp_path):
    proc = cli(str(tmp_path / "nothing.py"))
    assert proc.returncode != 0 and "no such file" in proc.stderr


# A package's usual shape: the Metal kernel behind `mx.metal.is_available()`, a pure
# MLX fallback, MLX ops on the GPU stream.
GUARDED = '''
import mlx.core as mx
import numpy as np

def softplus(x):
    if mx.metal.is_available():
        k = mx.fast.metal_kernel(name="softplus", input_names=["x"], output_names=["y"],
            source="uint i = thread_position_in_grid.x; float v = float(x[i]);"
                   " y[i] = T(v > 20.0f ? v : metal::log(1.0f + metal::exp(v)));")
        (y,) = k(inputs=[x], template=[("T", x.dtype)], grid=(x.size, 1, 1),
                 threadgroup=(32, 1, 1), output_shapes=[x.shape], output_dtypes=[x.dtype],
                 stream=mx.gpu)
        return y
    return mx.logaddexp(x, mx.zeros_like(x))

mx.set_default_device(mx.gpu)
assert mx.default_device() == mx.gpu
x = mx.linspace(-4, 30, 64)
y = mx.multiply(softplus(x), 1.0, stream=mx.gpu)
with mx.stream(mx.gpu):
    z = mx.abs(y - mx.array(np.logaddexp(np.array(x), 0.0).astype(np.float32)))
assert z.max().item() < 1e-5, z.max().item()
print("metal path:", mx.metal.is_available())
'''


def test_script_that_launches_nothing_fails(tmp_path):
    path = tmp_path / "guarded.py"
    path.write_text(GUARDED)
    proc = cli(str(path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "0 kernels, 0 instantiations" in proc.stdout
    assert "created no metal_kernel, so nothing was checked" in proc.stderr
    assert "--as-metal" in proc.stderr
    # a kernel created and never called: no instantiation either
    lazy = tmp_path / "lazy.py"
    lazy.write_text("import mlx.core as mx\nk = mx.fast.metal_kernel(name='k', input_names=['x'],"
                    " output_names=['y'], source='y[0] = x[0];')\n")
    proc = cli(str(lazy))
    assert proc.returncode == 1 and "1 kernels, 0 instantiations" in proc.stdout
    assert "created 1 metal_kernel but launched none, so nothing was checked" in proc.stderr


def test_as_metal_drives_the_metal_path(tmp_path):
    path = tmp_path / "guarded.py"
    path.write_text(GUARDED)
    proc = cli("--as-metal", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "metal path: True" in proc.stdout  # and the kernel matched numpy's softplus
    assert "1 kernels, 1 instantiations, 0 failed" in proc.stdout
    # the same path with a kernel Metal rejects fails the check
    path.write_text(GUARDED.replace("metal::exp(v)", "metal::exp(-2.5)"))
    proc = cli("--as-metal", str(path))
    assert proc.returncode == 1 and "call to 'exp' is ambiguous" in proc.stdout
    bad = cli("--as-metal", "ozaki_slice")
    assert bad.returncode == 2 and "--as-metal applies to Python scripts" in bad.stderr


def test_as_metal_restores_mlx(tmp_path):
    import mlx.core as mx

    from mlx_precise.tools import kernel_check

    path = tmp_path / "probe.py"
    path.write_text("import mlx.core as mx\nmx.set_default_device(mx.gpu)\n"
                    "assert mx.metal.is_available() and mx.Device(mx.gpu) == mx.cpu\n")
    gpu, default = mx.gpu, mx.default_device()
    reports, error = kernel_check.check_script(path, as_metal=True)
    assert (reports, error) == ([], None)
    assert (mx.gpu, mx.metal.is_available(), mx.default_device()) == (gpu, False, default)
    with pytest.raises(ValueError, match="Cannot set gpu device without gpu backend"):
        mx.set_default_device(mx.gpu)
