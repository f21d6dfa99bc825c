"""Turn a hang into a failure that says which rank, op and backend.

Every blocking wait registers itself; a daemon thread checks once a second and, when one has
waited longer than the timeout, prints the culprit and ends the process. The launcher
(mpiexec, torchrun, srun) then takes the rest of the job down with a non-zero exit.

The same thread names the op a rank waits in when the launcher ends the job (SIGTERM: mpiexec,
torchrun and srun send it to the survivors when a rank dies), so the output says where each
survivor stood, not only the launcher's line about the dead rank.

Where the flight recorder is on (`mcr.flight`), `dump(why)` writes this rank's record before the
process ends (a hang, SIGTERM), and on SIGUSR1 (`kill -USR1 PID`: a look at a live job).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time

from . import threads

EXIT_CODE = 86  # distinct, so a test can tell a watchdog stop from a crash


class Watchdog:
    """`waits` maps a thread to `(what,)`, what = the (op, backend, nbytes, group_size) it is
    blocked in, in a 1-tuple made for that wait. The caller only stores and deletes it (cheap:
    no clock reads on the hot path); this thread notes when it first saw each 1-tuple and times
    it from there, to within a period. A fresh one per wait matters: `what` is the route's
    OpCall, the same object for every call of the route, and a train of one op, the caller in
    it at every look, would read as one wait as long as the train."""

    def __init__(self, rank: int, timeout_s: float, dump=None, pending=None):
        """`pending()`: the oldest op queued on a GPU that the GPU has not run yet, as `(what,)`
        (the same tuple while it stays the oldest), or None (`mcr.stream_ordered.StreamOps`)."""
        self.rank = rank
        self.pending = pending
        self.timeout_s = timeout_s
        self.dump = dump  # dump(why): the flight recorder's, or None
        self.waits = {}
        self.failed = None  # (what, exception) of the last op that failed: set as its error is raised
        self._first_seen = {}  # id(what) -> (what, time): holding `what` keeps its id unique
        self._stop = threading.Event()
        self._ending = threading.Lock()
        self._pid = os.getpid()
        self._signals = self._catch_sigterm()
        self._thread = threads.start(self._watch, "mcr-watchdog")

    def stop(self) -> None:
        self._stop.set()
        if self._signals is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            if self.dump is not None:
                signal.signal(signal.SIGUSR1, signal.SIG_DFL)
            signal.set_wakeup_fd(-1)

    def _catch_sigterm(self):
        """Python runs a signal handler in the main thread between bytecodes, never while that
        thread blocks in MPI or gloo; the wakeup fd lets this thread see SIGTERM at once. Taken
        only where nobody else handles SIGTERM or uses the wakeup fd. Returns the fd to read."""
        if threading.current_thread() is not threading.main_thread():
            return None
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return None
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        if previous != -1:  # someone's event loop: leave it theirs
            signal.set_wakeup_fd(previous)
            os.close(read_end)
            os.close(write_end)
            return None
        signal.signal(signal.SIGTERM, lambda signum, frame: self._terminated())
        if self.dump is not None and signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL:
            # the handler runs only once the main thread is back in Python; this thread dumps at once
            signal.signal(signal.SIGUSR1, lambda signum, frame: None)
        return read_end

    def _sleep(self, period):
        """Wait one period; end the process meanwhile if SIGTERM arrives."""
        if self._signals is None:
            self._stop.wait(period)
            return
        ready, _, _ = select.select([self._signals], [], [], period)
        if not ready or self._stop.is_set():
            return
        received = os.read(self._signals, 64)
        if signal.SIGTERM in received:
            self._terminated()
        if signal.SIGUSR1 in received and self.dump is not None:
            self.dump("SIGUSR1")

    def _watch(self):
        period = min(1.0, self.timeout_s / 4)
        while not self._stop.is_set():
            self._sleep(period)
            if self._stop.is_set():
                return
            now = time.monotonic()
            seen = {}
            waits = list(self.waits.values())
            gpu = self.pending() if self.pending is not None else None
            if gpu is not None:
                waits.append(gpu)
            for wait in waits:
                earlier = self._first_seen.get(id(wait))
                seen[id(wait)] = earlier if earlier is not None and earlier[0] is wait else (wait, now)
                waited = now - seen[id(wait)][1]
                if waited > self.timeout_s:
                    self._fire(wait[0], waited)
            self._first_seen = seen

    def _waited(self, wait) -> float:
        earlier = self._first_seen.get(id(wait))
        return time.monotonic() - earlier[1] if earlier is not None and earlier[0] is wait else 0.0

    def _terminated(self):
        """SIGTERM: name the ops this rank waits in, then end at once, as SIGTERM would have."""
        with self._ending:
            if os.getpid() == self._pid:  # not a forked child (a data-loader worker)
                ended = f"mcr: rank {self.rank} was ended by SIGTERM (its launcher stopping the job; another rank probably died)"
                waits = list(self.waits.values())
                for wait in waits:
                    op, backend, nbytes, group_size = wait[0]
                    sys.stderr.write(
                        f"{ended} while waiting {self._waited(wait):.1f} s in {op} on backend {backend} "
                        f"({nbytes} bytes, group of {group_size} ranks)\n"
                    )
                if not waits:  # most often on its way out with the error of the op that failed last
                    last = ""
                    if self.failed is not None:
                        (op, backend, nbytes, group_size), exc = self.failed
                        last = f", after {op} on backend {backend} ({nbytes} bytes, group of {group_size} ranks) failed: {exc}"
                    sys.stderr.write(f"{ended} outside any communication op{last}\n")
                sys.stderr.flush()
                if self.dump is not None:
                    self.dump("SIGTERM")
            os._exit(128 + signal.SIGTERM)  # the shell's code for "ended by SIGTERM"

    def _fire(self, what, waited):
        op, backend, nbytes, group_size = what
        sys.stderr.write(
            f"mcr watchdog: rank {self.rank} has waited {waited:.1f} s in {op} "
            f"on backend {backend} ({nbytes} bytes, group of {group_size} ranks). Another rank "
            f"probably died or issued a different op; ending this job (MCR_WATCHDOG_TIMEOUT="
            f"{self.timeout_s:g}).\n"
        )
        sys.stderr.flush()
        if self.dump is not None:
            self.dump(f"watchdog: {op} waited {waited:.1f} s")
        os._exit(EXIT_CODE)
