"""A thread that completes async ops nobody is waiting on.

MPI's nonblocking ops advance only inside MPI calls, and every handle's post-steps (AVG's
divide, copy-outs, a `dist.Work` future's result) run only when someone tests or waits on it.
So without help an async all-reduce issued during DDP's backward pass sits still until the
step's end, and its future completes only when waited on. This thread tests every in-flight
handle (MPI_Test moves MPI's progress engine), so handles and futures complete on their own.

On a machine with as many ranks as cores it must not take a core from compute: it sleeps
while nothing is in flight, and while ops are pending it polls with a pause that doubles from
MIN_PAUSE_S to MAX_PAUSE_S between tests (back to the minimum when one completes), and while
the caller keeps issuing ops it skips the tests until the pause reaches MAX_PAUSE_S. Each poll
costs a few microseconds of one core (mpi4py releases the GIL inside MPI calls); a train of
async ops their caller waits on costs a little more than without the thread. Calls through
torch's C++ trampoline pay more on a small VM, where any thread that wakes every millisecond
slows GIL hand-offs (a thread that only sleeps does the same); MCR_PROGRESS_THREAD=0 avoids it.
Both are measured by `python -m mcr.tools.bench_hooks` with the thread on and off
(configs/tuning/vm-n2-bench-hooks.txt, and its async issue table: vm-n2-bench-issue.txt).

It also tells the watchdog about the oldest pending op, so an async op that never completes
(a dead or diverged peer) ends the job naming it, even when the caller waits on a future from
C++ (DDP), where no wait of ours runs.
"""

from __future__ import annotations

import sys
import threading
import time

from . import threads
from .inflight import tested

MIN_PAUSE_S = 50e-6
MAX_PAUSE_S = 1e-3


class ProgressThread:
    def __init__(self, runtime, waits=None):
        self._runtime = runtime
        self._waits = waits  # the watchdog's {thread: op} map, or None
        self._wake = threading.Event()
        self.idle = True  # read by the issuing thread: only an idle thread needs waking
        self._stopped = False
        self._seen = set()  # ids of the ops pending at the last pass
        self._thread = threads.start(self._loop, "mcr-progress")

    def poke(self) -> None:
        """An op was issued: start polling if asleep."""
        if self.idle:
            self.idle = False
            self._wake.set()

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=5)

    def _loop(self):
        try:
            self._poll_while_pending()
        except Exception as exc:  # an op failed where no caller will see it: end the job, named
            rt = self._runtime
            sys.stderr.write(f"mcr: rank {rt.rank}: {exc} (seen by the progress thread); aborting the job\n")
            sys.stderr.flush()
            rt.abort_job()

    def _poll_while_pending(self):
        me = threading.get_ident()
        watched = None  # the oldest pending handle the watchdog was told of
        pause = MIN_PAUSE_S
        entries = self._runtime.in_flight.entries
        newest = None  # the newest op in flight when this thread last looked
        while not self._stopped:
            # Sleep first: a caller that waits on its op soon completes it itself, and a thread
            # that stays awake through a train of ops is not woken (a context switch) per op.
            time.sleep(pause)
            try:  # read without the lock: the last entry may leave between a test and the read
                latest = entries[-1][1]
            except IndexError:
                latest = None
            if latest is not newest and pause < MAX_PAUSE_S:
                # the caller is issuing ops (its own calls move MPI and complete what it waits
                # on): keep out of its way, looking less often, up to once per MAX_PAUSE_S
                newest = latest
                pause = 2 * pause
                continue
            newest = latest
            oldest, completed = self._pass()
            if self._waits is not None and oldest is not watched:
                watched = oldest
                if oldest is None:
                    self._waits.pop(me, None)
                else:  # a fresh tuple per handle: the watchdog times an object from when it first saw it
                    self._waits[me] = (oldest.op if oldest.op is not None else ("async op", "?", 0, 0),)
            if oldest is not None and completed:
                pause = MIN_PAUSE_S
            elif oldest is not None or pause < MAX_PAUSE_S:
                pause = min(2 * pause, MAX_PAUSE_S)  # nothing pending: linger ~2 ms before sleeping
            else:
                self._sleep_until_poked()
                pause = MIN_PAUSE_S

    def _pass(self):
        """Test, once and without blocking, each op that was already pending at the last pass
        (an op its caller waits on right away is left to the caller: no lock contention).
        Returns the oldest op still pending (None when none is) and whether any completed."""
        oldest, completed, stale, seen = None, False, False, set()
        for handle in self._runtime.in_flight.handles():
            if handle.done:
                stale = True
            elif handle.completes_alone:  # gloo's send/recv complete only in their caller's wait
                key = id(handle)
                seen.add(key)
                if key in self._seen and tested(handle):
                    completed = True
                elif oldest is None:
                    oldest = handle
        self._seen = seen
        if completed or stale:
            self._runtime.in_flight.forget_completed()
        return oldest, completed

    def _sleep_until_poked(self):
        self.idle = True
        self._wake.clear()
        # stopped, or an op issued, between the last pass and `idle`: go on (a stop() whose wake
        # this clear() undid would otherwise wait out its join's timeout)
        if self._stopped or self._runtime.in_flight.any_pending_alone():
            self.idle = False
            return
        self._wake.wait()
