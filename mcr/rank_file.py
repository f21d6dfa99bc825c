"""Each rank's rank, host and PID, written once at start-up into the job's rank directory
(`rank_dir`, MCR_RANK_DIR: `launch.local` and the job scripts set it), so that when a rank dies
the launcher's side can say which one (`launch/dead_rank.py` reads the files): the launchers name
a dead process by its PID and host, or not at all."""

from __future__ import annotations

import json
import os
import socket

from .files import write_atomic


def write_rank_file(directory: str, rank: int) -> None:
    """`directory`/rank-<rank>.json: {"rank", "host", "pid"}, written whole (a reader may look
    while a rank dies)."""
    about = {"rank": rank, "host": socket.gethostname(), "pid": os.getpid()}
    write_atomic(os.path.join(directory, f"rank-{rank}.json"), json.dumps(about) + "\n")
