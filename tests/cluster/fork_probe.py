"""A rank that says where it runs and whether it was forked from a server that had imported torch."""

import os
import socket
import sys

forked = "torch" in sys.modules  # this script imports nothing: only a fork server's copy has it
print(f"fork-probe: rank {os.environ['SLURM_PROCID']} on {socket.gethostname()} forked {forked}", flush=True)
