"""Suite-wide settings."""

import os

# Emulated kernels run in checked mode: divergent barriers and stray writes into
# the unguarded slack around buffers are reported (see docs/emulator.md).
os.environ.setdefault("MLX_PRECISE_EMULATOR_CHECKED", "1")
