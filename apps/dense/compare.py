"""Throughput of the dense trainer with gloo only, MPI only and the runtime's own (tuned) choice,
as in the MCR-DL paper's dense Megatron-DeepSpeed figure: `python -m apps.common.compare --app dense`
under its own name.

    python -m apps.dense.compare --config configs/dense/default.yaml -n 2 [--repeats 3] [--tuning FILE] [key=value ...]
    python -m apps.dense.compare -n 4 parallel.tensor=2        # TP=2 x DP=2
"""

import sys

from apps.common.compare import App, main

APP = App("dense", title="Dense GPT (Megatron-style)")

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], APP))
