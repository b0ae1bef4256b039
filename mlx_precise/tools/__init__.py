"""The command line's tools (``python -m mlx_precise ...``): :mod:`.demo`,
:mod:`.selftest` (the checks every capability registers), :mod:`.report`
(accuracy tables and plots) and :mod:`.kernel_check` (the strict Metal front-end
check over every kernel instantiation). Only the command line (``__main__``)
imports them."""
