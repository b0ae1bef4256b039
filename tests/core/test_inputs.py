"""Every kind of input to every public op: what is accepted, at what precision, and
what is refused with which error (docs/api.md, "Inputs").

Each accepted input is checked against an independent float64 oracle computed with
numpy from the values the input holds: float64 / complex128 data must reach the
engine unrounded (results within ~2^-44 of the float64 oracle, where a rounding to
float32 would leave ~2^-24), float32 data exactly. Each refused input must raise
the op's error naming the argument. The ``cpu`` backend runs the engines (the
reading of inputs does not depend on the backend).
"""

from __future__ import annotations

import warnings

import mlx.core as mx
import numpy as np
import pytest

import mlx_precise as mp
from mlx_precise import DoubleWord
from mlx_precise.ozaki import dgemm_emulated

RNG = np.random.default_rng(32)

# ---- the kinds of input --------------------------------------------------------

# name -> (make from float64 / complex128 values, the values the op receives)
_F32 = lambda v: v.astype(np.float32).astype(np.float64)  # noqa: E731
_F16 = lambda v: v.astype(np.float16).astype(np.float64)  # noqa: E731
_C64 = lambda v: v.astype(np.complex64).astype(np.complex128)  # noqa: E731
KINDS = {
    "mx_float32": (lambda v: mx.array(v.real.astype(np.float32)), lambda v: _F32(v.real)),
    "mx_float16": (lambda v: mx.array(v.real.astype(np.float16)), lambda v: _F16(v.real)),
    "mx_bfloat16": (lambda v: mx.array(v.real.astype(np.float32)).astype(mx.bfloat16),
                    lambda v: np.array(mx.array(v.real.astype(np.float32)).astype(mx.bfloat16)
                                       .astype(mx.float32)).astype(np.float64)),
    "mx_float64": (lambda v: mx.array(v.real, dtype=mx.float64), lambda v: v.real),
    "mx_complex64": (lambda v: mx.array(v.astype(np.complex64)), _C64),
    "mx_int32": (lambda v: mx.array(np.round(v.real * 4).astype(np.int32)),
                 lambda v: np.round(v.real * 4)),
    "np_float32": (lambda v: v.real.astype(np.float32), lambda v: _F32(v.real)),
    "np_float16": (lambda v: v.real.astype(np.float16), lambda v: _F16(v.real)),
    "np_float64": (lambda v: v.real.copy(), lambda v: v.real),
    "np_complex64": (lambda v: v.astype(np.complex64), _C64),
    "np_complex128": (lambda v: v.astype(np.complex128), lambda v: v),
    "np_longdouble": (lambda v: v.real.astype(np.longdouble), lambda v: v.real),
    "np_int64": (lambda v: np.round(v.real * 4).astype(np.int64), lambda v: np.round(v.real * 4)),
    "list": (lambda v: v.real.tolist(), lambda v: v.real),  # float32 or float64: per op
    "complex_list": (lambda v: v.tolist(), lambda v: v),
    "dw_real": (lambda v: DoubleWord.from_float64(v.real), lambda v: v.real),
    "dw_complex": (lambda v: DoubleWord.from_float64(v), lambda v: v),
    "bool": (lambda v: True, None),
    "str": (lambda v: "abc", None),
    "None": (lambda v: None, None),
}


def _values(shape) -> np.ndarray:
    """complex128 values whose parts use all 53 bits (float32 rounding is visible)."""
    return RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)


def _rel(got, ref) -> float:
    """Normwise relative error of ``got`` against the float64 oracle ``ref``."""
    if isinstance(got, mx.array) and got.dtype == mx.bfloat16:  # numpy has no bfloat16
        got = got.astype(mx.float32)
    got = got.to_float64() if isinstance(got, DoubleWord) else np.asarray(got)
    ref = np.asarray(ref)
    assert got.shape == ref.shape
    scale = max(np.abs(ref).max(), 1e-300)
    return float(np.abs(got.astype(np.complex128) - ref).max() / scale)


# ---- the ops ---------------------------------------------------------------------

# Each op: (argument name, input shape, run(x) -> result, oracle(values) -> float64
# result, accepted kinds -> tolerance: "wide" (float64 data unrounded: 2^-44), "f32"
# (a float32 result, rounded once: 2^-22), lists read as float64 ("list64") or as
# float32 ("list32")). Every kind not listed must be refused.
_K = mx.array(RNG.standard_normal((2, 3)).astype(np.float32))
_D = mx.array(RNG.standard_normal(2).astype(np.float32))
_K64, _D64 = np.array(_K, np.float64), np.array(_D, np.float64)


def _causal(u, k, d):
    """out[b, c, t] = sum_s k[c, s] u[b, c, t - s] + d[c] u[b, c, t] in float64."""
    L = u.shape[-1]
    out = np.zeros(u.shape)
    for b in range(u.shape[0]):
        for c in range(u.shape[1]):
            out[b, c] = np.convolve(u[b, c], k[c])[:L] + d[c] * u[b, c]
    return out


def _depthwise(x, w, bias):
    """y[b, c, t] = bias[c] + sum_j w[c, j] x[b, c, t + j - (K - 1)]: a causal
    convolution with the reversed filter."""
    return _causal(x, w[:, ::-1], np.zeros(len(bias))) + bias[None, :, None]


F32_ONLY = {"mx_float32": "f32", "np_float32": "f32", "list": "list32"}
WORDS_REAL = {"mx_float32": "wide", "np_float32": "wide", "mx_float64": "wide",
              "np_float64": "wide", "list": "list32", "dw_real": "wide"}
WORDS_COMPLEX = {"mx_complex64": "wide", "np_complex64": "wide", "np_complex128": "wide",
                 "complex_list": "list32", "dw_complex": "wide"}
CPU = dict(backend="cpu")

OPS = {
    "hyena_conv_extended": ("u", (1, 2, 8), lambda u: mp.hyena_conv_extended(u, _K, _D, **CPU),
                            lambda v: _causal(v, _K64, _D64), F32_ONLY),
    "hyena_conv_extended NLC": (
        "u", (1, 8, 2),
        lambda u: mp.hyena_conv_extended(u, _K, _D, layout="NLC", **CPU),
        lambda v: _causal(v.transpose(0, 2, 1), _K64, _D64).transpose(0, 2, 1), F32_ONLY),
    "hyena_conv_extended k": (
        "k", (2, 3), lambda k: mp.hyena_conv_extended(mx.ones((1, 2, 8)), k, _D, **CPU),
        lambda v: _causal(np.ones((1, 2, 8)), v, _D64), F32_ONLY),
    "fftconv": ("u", (1, 2, 8), lambda u: mp.fftconv(u, _K, _D),
                lambda v: _causal(v, _K64, _D64), {k: "plain" for k in F32_ONLY}),
    "depthwise_conv_extended": (
        "x", (1, 2, 8), lambda x: mp.depthwise_conv_extended(x, _K, _D, **CPU),
        lambda v: _depthwise(v, _K64, _D64), F32_ONLY),
    "depthwise_conv_extended w": (
        "w", (2, 3), lambda w: mp.depthwise_conv_extended(mx.ones((1, 2, 8)), w, _D, **CPU),
        lambda v: _depthwise(np.ones((1, 2, 8)), v, _D64), F32_ONLY),
    "depthwise_conv": ("x", (1, 2, 8), lambda x: mp.depthwise_conv(x, _K, _D),
                       lambda v: _depthwise(v, _K64, _D64), {k: "plain" for k in F32_ONLY}),
    "fft_extended": ("a", (8,), lambda a: mp.fft.fft_extended(a, round_output=False, **CPU),
                     np.fft.fft, {**WORDS_REAL, **WORDS_COMPLEX}),
    "rfft_extended": ("a", (8,), lambda a: mp.fft.rfft_extended(a, round_output=False, **CPU),
                      np.fft.rfft, WORDS_REAL),
    "fft2_extended": ("a", (2, 4),
                      lambda a: mp.fft.fft2_extended(a, round_output=False, **CPU),
                      np.fft.fft2, {**WORDS_REAL, **WORDS_COMPLEX}),
    "fft (plain)": ("a", (8,), mp.fft.fft, np.fft.fft,
                    {k: "plain" for k in {**WORDS_REAL, **WORDS_COMPLEX}}),
    "fftshift": ("a", (8,), mp.fft.fftshift, np.fft.fftshift,
                 {**WORDS_REAL, **WORDS_COMPLEX, "mx_float16": "exact", "np_float16": "exact",
                  "mx_int32": "exact", "np_int64": "exact", "mx_bfloat16": "exact"}),
    "complex_multiply_extended": (
        "a", (8,),
        lambda a: mp.complex_multiply_extended(a, mx.array(np.full(8, 1 + 2j, np.complex64)),
                                               round_output=False, **CPU),
        lambda v: v * (1 + 2j), WORDS_COMPLEX),
    "complex_multiply": (
        "a", (8,), lambda a: mp.complex_multiply(a, mx.array(np.full(8, 1 + 2j, np.complex64))),
        lambda v: v * (1 + 2j), {k: "plain" for k in WORDS_COMPLEX}),
    "fft_scale_extended": ("x", (8,),
                           lambda x: mp.fft_scale_extended(x, 4, round_output=False, **CPU),
                           lambda v: v / 4, {**WORDS_REAL, **WORDS_COMPLEX}),
    "DoubleWord + x": ("y", (4,), lambda y: DoubleWord.from_float64(np.full(4, 0.1)) + y,
                       lambda v: 0.1 + v, {**WORDS_REAL, **WORDS_COMPLEX}),
    "DoubleWord.from_array": ("x", (4,), DoubleWord.from_array, lambda v: v,
                              {**WORDS_REAL, **WORDS_COMPLEX}),
    "DoubleWord.from_float64": ("x", (4,), DoubleWord.from_float64, lambda v: v,
                                {"mx_float64": "wide", "np_float64": "wide",
                                 "np_complex128": "wide", "list": "list64",
                                 "complex_list": "list64"}),
    "norm": ("A", (3, 4), mp.norm, lambda v: np.linalg.norm(v),
             {"mx_float32": "f32", "np_float32": "f32", "mx_complex64": "f32",
              "np_complex64": "f32", "mx_float64": "f64", "np_float64": "f64",
              "np_complex128": "f64", "list": "f64", "complex_list": "f64"}),
    "dgemm_emulated": ("A", (3, 4), lambda A: dgemm_emulated(A, np.eye(4)), lambda v: v,
                       {"mx_float64": "f64", "np_float64": "f64", "list": "f64"}),
    "linalg.matmul": ("a", (3, 4),
                      lambda a: mp.linalg.matmul(a, DoubleWord.from_float64(np.eye(4)), **CPU),
                      lambda v: v, {"dw_real": "wide", "dw_complex": "wide"}),
}

CASES = [(op, kind) for op in OPS for kind in KINDS]


@pytest.mark.parametrize("op,kind", CASES, ids=[f"{o}-{k}" for o, k in CASES])
def test_input_kind(op, kind):
    name, shape, run, oracle, accepted = OPS[op]
    make, seen = KINDS[kind]
    v = _values(shape)
    x = make(v)
    if kind not in accepted:
        with pytest.raises((TypeError, ValueError)) as err:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                run(x)
        assert str(err.value).startswith(name + " "), str(err.value)  # names the argument
        if kind in ("mx_float64", "np_float64", "np_complex128") and accepted is F32_ONLY:
            # float64 data is never rounded to float32 silently: the message says so
            assert "round to float32" in str(err.value)
        return
    ref = oracle(seen(v))
    got = run(x)
    tol = {"wide": 2.0**-44, "exact": 0.0, "f64": 2.0**-50, "f32": 2.0**-22,
           "plain": 2.0**-18, "list64": 2.0**-44}.get(accepted[kind])
    if accepted[kind] == "list32":  # lists follow mx.array's rule: float32 values
        ref = oracle(_C64(seen(v)) if np.iscomplexobj(seen(v)) else _F32(seen(v)))
        tol = 2.0**-44 if isinstance(got, DoubleWord) else 2.0**-22
    if accepted[kind] in ("f32", "plain") and not isinstance(got, DoubleWord):
        assert np.asarray(got).dtype in (np.float32, np.complex64)
    if accepted[kind] == "f64":
        assert np.asarray(got).dtype == np.float64
    assert _rel(got, ref) <= tol, (_rel(got, ref), tol)
