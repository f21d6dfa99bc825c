"""Start the runtime and end it: what rank 0 says at start-up (tests/gpu/test_binding_said.py)."""

import mcr

mcr.init()
mcr.finalize()
