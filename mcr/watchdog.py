"""Turn a hang into a failure that says which rank, op and backend.

Every blocking wait registers itself; a daemon thread checks once a second and, when one has
waited longer than the timeout, prints the culprit and ends the process. The launcher
(mpiexec, torchrun, srun) then takes the rest of the job down with a non-zero exit.
"""

from __future__ import annotations

import os
import sys
import threading
import time

EXIT_CODE = 86  # distinct, so a test can tell a watchdog stop from a crash


class Watchdog:
    """`waits` maps a thread to the (op, backend, nbytes, group_size) it is blocked in. The
    caller only stores and deletes that tuple (cheap: no clock reads on the hot path); this
    thread notes when it first saw each tuple and times it from there, to within a period."""

    def __init__(self, rank: int, timeout_s: float):
        self.rank = rank
        self.timeout_s = timeout_s
        self.waits = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="mcr-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self):
        first_seen = {}  # id(what) -> (what, time): holding `what` keeps its id unique
        period = min(1.0, self.timeout_s / 4)
        while not self._stop.wait(period):
            now = time.monotonic()
            seen = {}
            for what in list(self.waits.values()):
                earlier = first_seen.get(id(what))
                seen[id(what)] = earlier if earlier is not None and earlier[0] is what else (what, now)
                waited = now - seen[id(what)][1]
                if waited > self.timeout_s:
                    self._fire(what, waited)
            first_seen = seen

    def _fire(self, what, waited):
        op, backend, nbytes, group_size = what
        sys.stderr.write(
            f"mcr watchdog: rank {self.rank} has waited {waited:.1f} s in {op} "
            f"on backend {backend} ({nbytes} bytes, group of {group_size} ranks). Another rank "
            f"probably died or issued a different op; ending this job (MCR_WATCHDOG_TIMEOUT="
            f"{self.timeout_s:g}).\n"
        )
        sys.stderr.flush()
        os._exit(EXIT_CODE)
