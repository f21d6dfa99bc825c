"""What every trainer's `python -m apps.<app>` runs: a config error is said once, and the job exits 2."""

import sys
import time

from apps.common.config import ConfigError
from mcr.env import discover

# Every rank loads the same config, so rank 0 meets the same error, and its exit makes the launcher
# end the others. They wait this long first: a rank that exited at once could get rank 0 killed
# before it printed (seen under mpiexec when rank 1 finished its imports first). A rank whose error
# rank 0 does not share (a data file missing on its node) still speaks, after the wait.
PEER_GRACE_S = 10.0


def run(main, app: str) -> None:
    try:
        main(sys.argv[1:])
    except ConfigError as exc:
        rank = discover().rank
        if rank != 0:
            time.sleep(PEER_GRACE_S)
        where = "" if rank == 0 else f" on rank {rank}"
        print(f"apps.{app}: config error{where}: {exc}", file=sys.stderr)
        sys.exit(2)
