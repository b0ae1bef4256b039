"""The mlx.nn layers of ``test_nn_layers.py``: small deterministic modules, inputs
and loss weights, importable without ``mlx_precise`` (a subprocess computes MLX's
own float32 results from them, for the bits outside the block).

A case is ``(make, inputs, call)``: ``make()`` builds the module (seeded: the same
parameters at every call), ``inputs`` the float32 inputs the gradient is taken
with respect to (numpy), ``call(module, *inputs)`` the output (an array or a tuple
of arrays). The loss of a case is ``sum(output * weights)`` with fixed random
weights per output (:func:`loss_weights`).
"""

import mlx.core as mx
import mlx.nn as nn
import numpy as np


def rng_f32(shape, seed=0, scale=1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def seeded(ctor, seed=0, **arrays):
    """``ctor()`` with MLX's initialisers seeded; ``arrays`` (name -> numpy)
    replace parameters after construction (e.g. BatchNorm's running statistics)."""

    def make():
        mx.random.seed(seed)
        m = ctor()
        for k, v in arrays.items():
            setattr(m, k, mx.array(v)) if k.startswith("running") else m.update({k: mx.array(v)})
        return m

    return make


def _call(m, *xs):
    return m(*xs)


def _two_outputs(m, x):
    return tuple(m(x))


CAUSAL4 = np.triu(np.full((4, 4), -1e9, np.float32), 1)  # additive causal mask, L = 4
KEEP = np.array([[True, True, False, True]] * 3)  # a boolean mask, L = 3 by S = 4


def _mha(m, q, k, v):
    return m(q, k, v, mask=mx.array(CAUSAL4))


def _mha_bool(m, q, k, v):
    return m(q, k[:, :4], v[:, :4], mask=mx.array(KEEP))


def _decoder(m, x, memory):
    return m(x, memory, mx.array(CAUSAL4), None)


def _transformer(m, src, tgt):
    return m(src, tgt, None, mx.array(CAUSAL4), None)


def _embedding(m, x):
    return m(mx.array(np.array([[1, 4, 4, 0], [9, 2, 7, 1]], np.int32))) * x


def _as_linear(m, x):
    return m.as_linear(x)


def _alibi(m, scores):
    return m(scores, offset=1, mask=mx.array(CAUSAL4[:3]))


def _dropout_eval(m, x):
    m.eval()
    return m(x)


def _batchnorm_eval(m, x):
    m.eval()
    return m(x)


ACTIVATIONS = {
    "CELU": lambda: nn.CELU(0.7), "ELU": lambda: nn.ELU(0.8), "SELU": nn.SELU,
    "HardShrink": lambda: nn.HardShrink(0.4), "Hardswish": nn.Hardswish,
    "HardTanh": nn.HardTanh, "LeakyReLU": lambda: nn.LeakyReLU(0.03),
    "LogSigmoid": nn.LogSigmoid, "LogSoftmax": nn.LogSoftmax, "Mish": nn.Mish,
    "PReLU": lambda: nn.PReLU(1, 0.3), "ReLU6": nn.ReLU6, "ReLU2": nn.ReLU2, "SiLU": nn.SiLU,
    "Softmin": nn.Softmin, "Softplus": nn.Softplus, "Softshrink": lambda: nn.Softshrink(0.4),
    "Softsign": nn.Softsign, "Step": lambda: nn.Step(0.2), "Tanh": nn.Tanh, "GLU": nn.GLU,
    "GELU.fast": lambda: nn.GELU("fast"), "Sigmoid": nn.Sigmoid, "ReLU": nn.ReLU,
    "Softmax": nn.Softmax,
}

ACT_INPUT = rng_f32((4, 12), 1, 2.5)
ACT_INPUT[0, :4] = [4.5, 7.0, -3.5, -4.0]  # past Hardswish / ReLU6 / HardTanh's corners

CASES = {
    "BatchNorm.train": (seeded(lambda: nn.BatchNorm(5, momentum=0.3), 1,
                               weight=rng_f32(5, 2), bias=rng_f32(5, 3)),
                        (rng_f32((6, 3, 5), 4, 2.0) + 1.5,), _call),
    "BatchNorm.eval": (seeded(lambda: nn.BatchNorm(5), 1, weight=rng_f32(5, 2), bias=rng_f32(5, 3),
                              running_mean=rng_f32(5, 5),
                              running_var=np.abs(rng_f32(5, 6)) + 0.5),
                       (rng_f32((6, 5), 4, 2.0),), _batchnorm_eval),
    "InstanceNorm": (seeded(lambda: nn.InstanceNorm(4, affine=True), 1,
                            weight=rng_f32(4, 2), bias=rng_f32(4, 3)),
                     (rng_f32((2, 3, 5, 4), 7, 3.0) + 2,), _call),
    "BatchNorm.train.4d_no_affine": (seeded(lambda: nn.BatchNorm(3, affine=False), 1),
                                     (rng_f32((2, 3, 4, 3), 4, 2.0) - 1,), _call),
    "RNN": (seeded(lambda: nn.RNN(3, 5), 2), (rng_f32((2, 4, 3), 8),), _call),
    "RNN.relu.hidden": (seeded(lambda: nn.RNN(3, 5, nonlinearity=nn.relu), 2),
                        (rng_f32((2, 4, 3), 8), rng_f32((2, 5), 31)), _call),
    "GRU.hidden": (seeded(lambda: nn.GRU(3, 5), 3), (rng_f32((2, 4, 3), 8), rng_f32((2, 5), 32)),
                   _call),
    "LSTM.hidden_cell": (seeded(lambda: nn.LSTM(3, 5), 4),
                         (rng_f32((4, 3), 8, 3.0), rng_f32((5,), 33), rng_f32((5,), 34)),
                         lambda m, x, h, c: tuple(m(x, h, c))),
    "GRU": (seeded(lambda: nn.GRU(3, 5), 3), (rng_f32((2, 4, 3), 8),), _call),
    "LSTM": (seeded(lambda: nn.LSTM(3, 5), 4), (rng_f32((2, 4, 3), 8),), _two_outputs),
    "MultiHeadAttention": (seeded(lambda: nn.MultiHeadAttention(8, 2, bias=True), 5),
                           (rng_f32((2, 4, 8), 9), rng_f32((2, 4, 8), 10),
                            rng_f32((2, 4, 8), 11)), _mha),
    "MultiHeadAttention.bool_mask": (seeded(lambda: nn.MultiHeadAttention(8, 2), 5),
                                     (rng_f32((2, 3, 8), 9), rng_f32((2, 5, 8), 10),
                                      rng_f32((2, 5, 8), 11)), _mha_bool),
    "TransformerEncoder": (seeded(lambda: nn.TransformerEncoder(1, 8, 2, 16), 6),
                           (rng_f32((2, 4, 8), 12),), lambda m, x: m(x, mx.array(CAUSAL4))),
    "TransformerDecoder": (seeded(lambda: nn.TransformerDecoder(1, 8, 2, 16, norm_first=False), 7),
                           (rng_f32((2, 4, 8), 13), rng_f32((2, 3, 8), 14)), _decoder),
    "TransformerEncoder.post_norm_checkpoint": (
        seeded(lambda: nn.TransformerEncoder(2, 8, 2, 16, norm_first=False, checkpoint=True,
                                             activation=nn.gelu), 6),
        (rng_f32((2, 4, 8), 12),), lambda m, x: m(x, None)),
    "Transformer": (seeded(lambda: nn.Transformer(8, 2, 1, 1, 16), 8),
                    (rng_f32((2, 3, 8), 15), rng_f32((2, 4, 8), 16)), _transformer),
    "MaxPool2d": (nn.MaxPool2d(2, 1), (rng_f32((2, 4, 5, 3), 17),), _call),
    "MaxPool3d": (nn.MaxPool3d(2, 2, 1), (rng_f32((1, 3, 4, 4, 2), 18),), _call),
    "AvgPool2d": (nn.AvgPool2d(3, 1, 1), (rng_f32((2, 4, 5, 3), 19),), _call),
    "AvgPool3d": (nn.AvgPool3d(2, 1), (rng_f32((1, 3, 4, 4, 2), 20),), _call),
    "Conv3d": (seeded(lambda: nn.Conv3d(2, 3, 2, padding=1), 9),
               (rng_f32((1, 3, 4, 3, 2), 21),), _call),
    "ConvTranspose2d": (seeded(lambda: nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1), 10),
                        (rng_f32((2, 3, 4, 2), 22),), _call),
    "ConvTranspose3d": (seeded(lambda: nn.ConvTranspose3d(2, 2, 2, stride=2), 11),
                        (rng_f32((1, 2, 3, 2, 2), 23),), _call),
    "Embedding": (seeded(lambda: nn.Embedding(10, 4), 12), (rng_f32((2, 4, 4), 24),), _embedding),
    "Embedding.as_linear": (seeded(lambda: nn.Embedding(10, 4), 12), (rng_f32((3, 4), 25),),
                            _as_linear),
    "Bilinear": (seeded(lambda: nn.Bilinear(3, 4, 5), 13),
                 (rng_f32((6, 3), 26), rng_f32((6, 4), 27)), _call),
    "ALiBi": (nn.ALiBi(), (rng_f32((2, 4, 3, 4), 28),), _alibi),
    "Dropout.eval": (lambda: nn.Dropout(0.5), (rng_f32((4, 6), 29),), _dropout_eval),
    "Dropout2d.eval": (lambda: nn.Dropout2d(0.5), (rng_f32((2, 3, 3, 4), 29),), _dropout_eval),
    # scales whose sampling positions are dyadic in float32 (MLX computes them in
    # float32, the block in double-word: the same values only when exact)
    **{f"Upsample.{mode}.{ac}": (lambda mode=mode, ac=ac: nn.Upsample(3 if ac else 2, mode, ac),
                                 (rng_f32((1, 3, 3, 2), 30),), _call)
       for mode in ("nearest", "linear", "cubic") for ac in (False, True)
       if not (mode == "nearest" and ac)},
    **{name: (seeded(ctor, 14), (ACT_INPUT,), _call) for name, ctor in ACTIVATIONS.items()},
}


def make_case(name):
    """(module, float32 input arrays, call) of case ``name``: a new module each time."""
    make, inputs, call = CASES[name]
    m = make() if callable(make) and not isinstance(make, nn.Module) else make
    return m, tuple(mx.array(x) for x in inputs), call


def loss_weights(outputs, seed=99):
    """Fixed random float32 weights, one array per output."""
    return [mx.array(rng_f32(o.shape, seed + i)) for i, o in enumerate(outputs)]


def outputs_of(m, xs, call):
    y = call(m, *xs)
    return list(y) if isinstance(y, (tuple, list)) else [y]


def value_and_grads(m, xs, call, weights):
    """sum(output * weights) and its gradient with respect to the trainable
    parameters and the inputs, the way ``nn.value_and_grad`` takes it."""

    def loss(params, inputs):
        m.update(params)
        return sum((o * w).sum() for o, w in zip(outputs_of(m, inputs, call), weights))

    return mx.value_and_grad(loss, argnums=(0, 1))(m.trainable_parameters(), list(xs))


def flat(tree) -> dict:
    """name -> numpy array of a gradient tree (float64 view of its values)."""
    return {k: np.array(v) for k, v in nn.utils.tree_flatten(tree)}


def plain_results(names) -> dict:
    """MLX's own float32 forward outputs and gradients of the cases, flattened:
    key 'name/out0', 'name/grad/...'."""
    res = {}
    for name in names:
        m, xs, call = make_case(name)
        ys = outputs_of(m, xs, call)
        for i, y in enumerate(ys):
            res[f"{name}/out{i}"] = np.array(y)
        m, xs, call = make_case(name)
        _, g = value_and_grads(m, xs, call, loss_weights(ys))
        for k, v in flat({"p": g[0], "x": g[1]}).items():
            res[f"{name}/grad/{k}"] = v
    return res


# The cases run again outside every block, against a process without mlx_precise:
# every third (outside blocks nothing of MLX's is replaced, whatever the layer: a
# sample shows it, at a third of the suite's cost of running them all twice)
OUTSIDE = sorted(CASES)[::3]

if __name__ == "__main__":  # python nn_layer_cases.py OUT.npz: MLX alone, no mlx_precise
    import sys

    out = plain_results(OUTSIDE)
    assert "mlx_precise" not in sys.modules
    np.savez(sys.argv[1], **out)
