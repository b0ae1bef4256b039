uint i = thread_position_in_grid.x;
if (i < x_shape[0]) {
    y[i] = x[i] * float(S);
}
