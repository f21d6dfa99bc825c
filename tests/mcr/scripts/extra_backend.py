"""check_ops.py with one more library, added the way a new one is: its class and one
`register(...)` line. Here the library is a second gloo under the name "gloo2" (its own
communicators: a backend's rendezvous keys carry its name). Run on every rank; the runtime
then starts it beside mpi and gloo, the config accepts its name, and check_ops.py runs every
op on it, each rank's input distinct, each result compared whole with a local reference."""

import os
import runpy

from mcr.backends import register
from mcr.backends.torch_dist import GlooBackend


class SecondGloo(GlooBackend):
    name = "gloo2"


register(SecondGloo)  # the one line

runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_ops.py"), run_name="__main__")
