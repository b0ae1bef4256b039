"""``python -m mlx_precise check-kernels FILE`` on a user's own code: a ``.metal`` file
checked whole, a Python script run with its kernels emulated and every
instantiation it launches checked. The files are written here for the test."""

import subprocess
import sys
import textwrap

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
