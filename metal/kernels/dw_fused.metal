// (this line: the slots' declaration, dwf_slots s, made by the kernel's prelude)
// A chain of elementwise double-word operations in one launch: the program `prog`
// (int32; layout and operation codes in dw_fused.h, evaluated by dwf_eval) over the
// word array slots a0 .. a3, a7 or a11 (dw_fused4, dw_fused8, dw_fused; float32
// arrays of any strides, aligned with the output's last axes and broadcast as the
// program's header says: no operand is copied or expanded; slots the program does
// not read repeat a0), gathered in s by line 1. Output z: float32, row-contiguous,
// the high words of the result (the program's iteration) then its low words, from
// DWF_PROG_PLANE on (packed words). One thread per output element. Template parameter
// MATH: the program may call the elementary functions of dw_math.h (DWF_OP_FN;
// the kernel's headers then include dw_fused_math.h); without it the kernel leaves
// them out.
dwf_store<MATH>(s, prog, thread_position_in_grid.x, z);
