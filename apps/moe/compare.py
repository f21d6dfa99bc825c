"""Throughput of the MoE trainer with gloo only, MPI only and the runtime's own (tuned) choice, as
in the MCR-DL paper's DS-MoE figure: `python -m apps.common.compare --app moe` under its own name.

    python -m apps.moe.compare --config configs/moe/default.yaml -n 2 [--repeats 3] [--tuning FILE] [key=value ...]
"""

import sys

from apps.common.compare import App, main

APP = App("moe", title="DS-MoE")

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], APP))
