"""The foundation every capability builds on; it imports none of them.

* :mod:`.backends`: the three executors' names, choice and availability;
* :mod:`.kernels`: the kernel registry (one declaration per Metal kernel, run by
  ``metal`` or ``emulate``) and the device self-test that guards extended kernels;
* :mod:`.arrays`: array-like inputs and the float64 policy;
* :mod:`.autodiff`: guards for ``mx.grad`` / ``mx.compile`` / ``mx.vmap``;
* :mod:`.context`: the ``extended_precision()`` switch and its block hooks;
* :mod:`.plain`: MLX's original functions, captured before interception;
* :mod:`.selftest`: the self-test's ``Check`` and the registry capabilities add
  their checks to;
* :mod:`.cputhreads`: host threads for the cpu engines.

Beneath it only the Metal emulator (:mod:`mlx_precise.emulator`).
"""
