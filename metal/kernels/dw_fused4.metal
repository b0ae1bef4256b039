// dw_fused.metal for programs over at most four word arrays (most chains: an
// operation on two double-word operands reads four): the slots a0 .. a3, so a launch
// binds five buffers instead of thirteen; the program never reads the other slots
// (they repeat a0).
const dwf_slots s = {
    {a0, a1, a2, a3, a0, a0, a0, a0, a0, a0, a0, a0},
    {a0_strides, a1_strides, a2_strides, a3_strides, a0_strides, a0_strides, a0_strides,
     a0_strides, a0_strides, a0_strides, a0_strides, a0_strides}};
dwf_store<MATH>(s, prog, thread_position_in_grid.x, zh, zl);
