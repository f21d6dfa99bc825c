"""Throughput of the DLRM trainer with gloo only, MPI only and the runtime's own (tuned) choice, as
in the MCR-DL paper's DLRM figure: `python -m apps.common.compare --app dlrm` under its own name.

    python -m apps.dlrm.compare [--config configs/dlrm/default.yaml] -n 2 [--repeats 3] [--tuning FILE] [key=value ...]
"""

import sys

from apps.common.compare import App, main

APP = App("dlrm", title="DLRM (TorchRec)")

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], APP))
