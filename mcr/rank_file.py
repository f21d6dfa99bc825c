"""Each rank's rank, host and PID, written once at start-up into the job's rank directory
(`rank_dir`, MCR_RANK_DIR: `launch.local` and the job scripts set it), so that when a rank dies
the launcher's side can say which one (`launch/dead_rank.py` reads the files): the launchers name
a dead process by its PID and host, or not at all."""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys

from .files import write_atomic


def write_rank_file(directory: str, rank: int, ended_well: bool = False) -> None:
    """`directory`/rank-<rank>.json: {"rank", "host", "pid", "ended_well"}, written whole (a
    reader may look while a rank dies)."""
    about = {"rank": rank, "host": socket.gethostname(), "pid": os.getpid(), "ended_well": ended_well}
    write_atomic(os.path.join(directory, f"rank-{rank}.json"), json.dumps(about) + "\n")


_MARKED: set = set()  # (directory, rank) already marked at exit


def mark_a_clean_exit(directory: str, rank: int) -> None:
    """After finalize(): when this process exits by itself with no uncaught exception, its file
    says `ended_well`, so a rank that finished first is not taken for the one that died (a rank
    SIGKILLed never runs this). Once per rank file, however often the runtime starts again."""
    if (directory, rank) in _MARKED:
        return
    _MARKED.add((directory, rank))
    pid = os.getpid()

    def at_exit():
        if os.getpid() == pid and getattr(sys, "last_value", None) is None:  # set by an uncaught exception
            try:
                write_rank_file(directory, rank, ended_well=True)
            except OSError:  # the directory went (the launcher's side cleaned up): nobody reads it now
                pass

    atexit.register(at_exit)
