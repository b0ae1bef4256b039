"""Small whole models in plain MLX / mlx.nn for ``benchmarks/bench_models.py``,
``examples/whole_models.py`` and ``tests/extended/test_models.py``: each module holds one model, written
only against ``mlx.core`` / ``mlx.nn`` (nothing imports mlx_precise), and a float64
numpy oracle of the same math from the same float32 inputs and parameters.

Every module exposes:

* ``build(size="small", seed=0) -> (model, x)``: an ``nn.Module`` and a float32 input;
* ``oracle(p, x) -> np.ndarray``: the model's math in float64, ``p`` mapping the
  parameter names of ``mlx.utils.tree_flatten(model.parameters())`` to float64
  arrays, ``x`` the input as float64;
* ``SIZES``: the sizes ``build`` knows ("small", "medium", "large"; the two models of
  ``bench_models.py``, hyena and vocoder, also "xl").

MLX functions are called through the module at call time (``mx.exp(x)``,
``nn.gelu(x)``), as model code does, so ``extended_precision()`` sees them.
"""

MODELS = ("hyena", "s4d", "fno", "logmel", "vocoder", "transformer", "llama")
