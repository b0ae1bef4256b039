"""mx.compile and the block on the emulate backend, for every op with a rule and its
gradient: see compile_sweep (one file per backend: the sweeps run on two workers;
each in a fresh process, see check_every_op_in_a_fresh_process)."""

from compile_sweep import check_every_op_in_a_fresh_process


def test_compiled_block_for_every_op():
    check_every_op_in_a_fresh_process("emulate")
