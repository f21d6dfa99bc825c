"""Turn a hang into a failure that says which rank, op and backend.

Every blocking wait registers itself; a daemon thread checks once a second and, when one has
waited longer than the timeout, prints the culprit and ends the process. The launcher
(mpiexec, torchrun, srun) then takes the rest of the job down with a non-zero exit.
"""
from __future__ import annotations

import itertools
import os
import sys
import threading
import time

EXIT_CODE = 86  # distinct, so a test can tell a watchdog stop from a crash


class Watchdog:
    def __init__(self, rank: int, timeout_s: float):
        self.rank = rank
        self.timeout_s = timeout_s
        self._waits = {}  # token -> (what, started)
        self._tokens = itertools.count()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="mcr-watchdog", daemon=True)
        self._thread.start()

    def begin(self, what) -> int:
        """`what` is a tuple (op, backend, nbytes, group_size), formatted only on a hang."""
        token = next(self._tokens)
        self._waits[token] = (what, time.monotonic())
        return token

    def end(self, token: int) -> None:
        self._waits.pop(token, None)

    def stop(self) -> None:
        self._stop.set()

    def _watch(self):
        while not self._stop.wait(min(1.0, self.timeout_s / 4)):
            now = time.monotonic()
            for what, started in list(self._waits.values()):
                if now - started > self.timeout_s:
                    op, backend, nbytes, group_size = what
                    sys.stderr.write(
                        f"mcr watchdog: rank {self.rank} has waited {now - started:.1f} s in {op} "
                        f"on backend {backend} ({nbytes} bytes, group of {group_size} ranks). Another rank "
                        f"probably died or issued a different op; ending this job (MCR_WATCHDOG_TIMEOUT="
                        f"{self.timeout_s:g}).\n"
                    )
                    sys.stderr.flush()
                    os._exit(EXIT_CODE)
