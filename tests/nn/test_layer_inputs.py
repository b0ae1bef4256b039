"""The layers validate their arguments and inputs with clear errors, and share one
dtype policy: float32, float16 and bfloat16 inputs, widened exactly to float32."""

import mlx.core as mx
import numpy as np
import pytest

from mlx_precise.nn import FFTConv, HyenaOperator


@pytest.mark.parametrize("make,match", [
    (lambda: HyenaOperator(0, 8), "d_model must be a positive int"),
    (lambda: HyenaOperator(4, 0), "max_len must be a positive int"),
    (lambda: HyenaOperator(4, 8, order=1), "order must be an int >= 2"),
    (lambda: HyenaOperator(4, 8, filter_order=0), "filter_order must be a positive int"),
    (lambda: HyenaOperator(4, 8, short_filter_order=0), "short_filter_order must be"),
    (lambda: HyenaOperator(4.0, 8), "d_model must be a positive int"),
    (lambda: FFTConv(0, 8), "channels must be a positive int"),
    (lambda: FFTConv(2, 0), "max_len must be a positive int"),
], ids=["hyena-d_model-0", "hyena-max_len-0", "hyena-order-1", "hyena-filter_order-0",
        "hyena-short_filter_order-0", "hyena-d_model-float", "fftconv-channels-0",
        "fftconv-max_len-0"])
def test_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_inputs():
    h, f = HyenaOperator(4, 16), FFTConv(4, 16)
    cases = [
        (h, mx.zeros((16, 4)), ValueError, r"must be 3-D \(batch, L, d_model\), got shape \(16, 4\)"),
        (h, mx.zeros((1, 16, 3)), ValueError, "must have 4 on axis 2"),
        (h, mx.zeros((1, 17, 4)), ValueError, "input length 17 exceeds max_len=16"),
        (h, mx.zeros((1, 16, 4), mx.int32), TypeError, "float32, float16 or bfloat16"),
        (h, "not an array", TypeError, "must be an mx.array or array-like"),
        (f, mx.zeros((4, 16)), ValueError, r"must be 3-D \(batch, channels, L\)"),
        (f, mx.zeros((1, 3, 16)), ValueError, "must have 4 on axis 1"),
        (f, mx.zeros((1, 4, 17)), ValueError, "input length 17 exceeds max_len=16"),
    ]
    for layer, u, err, match in cases:
        with pytest.raises(err, match=match):
            layer(u)


def test_array_likes_are_accepted():
    mx.random.seed(4)
    f = FFTConv(2, 8)
    u = np.random.default_rng(0).standard_normal((1, 2, 8)).astype(np.float32)
    np.testing.assert_array_equal(np.array(f(u)), np.array(f(mx.array(u))))


def test_half_precision_inputs_are_widened_exactly():
    mx.random.seed(3)
    h, f = HyenaOperator(4, 16), FFTConv(4, 16)
    for layer, shape in ((h, (2, 16, 4)), (f, (2, 4, 16))):
        u32 = mx.random.normal(shape)
        for dt in (mx.float16, mx.bfloat16):
            u = u32.astype(dt)
            y = layer(u)
            assert y.dtype == mx.float32 and y.shape == shape
            np.testing.assert_array_equal(np.array(y), np.array(layer(u.astype(mx.float32))))


def test_repr_shows_the_constructor_arguments_as_mlx_layers_do():
    """``_extra_repr`` as in mlx.nn (``Linear(input_dims=4, output_dims=12, bias=True)``):
    the arguments that shape the layer, children listed below."""
    from mlx_precise.nn import HyenaFilter, Int8Linear, Sin

    assert repr(FFTConv(4, 16)) == "FFTConv(channels=4, max_len=16, skip=True, layout='NCL')"
    assert repr(FFTConv(2, 8, skip=False, layout="NLC")) == (
        "FFTConv(channels=2, max_len=8, skip=False, layout='NLC')")
    assert repr(Sin(5)) == "Sin(dim=5)"
    assert repr(Int8Linear(3, 5, bias=False)) == (
        "Int8Linear(input_dims=3, output_dims=5, bias=False, symmetric=True)")
    f = HyenaFilter(4, 2, 16, filter_order=8)
    assert repr(f).splitlines()[0] == (
        "HyenaFilter(channels=4, order=2, max_len=16, emb_dim=3, filter_order=8")
    h = HyenaOperator(4, 16, order=3, filter_order=8, short_filter_order=5)
    lines = repr(h).splitlines()
    assert lines[0] == ("HyenaOperator(d_model=4, max_len=16, order=3, filter_order=8, "
                        "short_filter_order=5")
    assert "  (in_proj): Linear(input_dims=4, output_dims=16, bias=True)" in lines
    assert "  (filter): HyenaFilter(channels=4, order=2, max_len=16, emb_dim=3, filter_order=8" \
        in lines
