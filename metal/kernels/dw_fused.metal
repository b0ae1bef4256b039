// A chain of elementwise double-word operations in one launch: the program `prog`
// (int32; layout and operation codes in dw_fused.h, evaluated by dwf_eval) over the
// word array slots a0 .. a11 (float32 arrays of any strides, aligned with the
// output's last axes and broadcast as the program's header says: no operand is
// copied or expanded; slots the program does not read repeat a0). Outputs zh, zl:
// float32, the output's shape (the program's iteration), row-contiguous: the high
// and low words of the result. One thread per output element. Template parameter
// MATH: the program may call the elementary functions of dw_math.h (DWF_OP_FN;
// the kernel's headers then include dw_fused_math.h); without it the kernel leaves
// them out. dw_fused4.metal is this kernel with four slots.
const dwf_slots s = {
    {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11},
    {a0_strides, a1_strides, a2_strides, a3_strides, a4_strides, a5_strides, a6_strides,
     a7_strides, a8_strides, a9_strides, a10_strides, a11_strides}};
dwf_store<MATH>(s, prog, thread_position_in_grid.x, zh, zl);
