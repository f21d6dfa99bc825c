"""The handle an async op returns: `wait()` and `is_completed()`, like torch's `Work`.

It also keeps the op's buffers alive until completion: mpi4py does not hold a reference to
the buffers of a nonblocking call (Iallreduce with IN_PLACE, Ireduce_scatter_block), so a
temporary freed early would make the result garbage. The runtime holds every handle until its
op completes (`mcr.inflight`), so a caller may drop it.

Several threads may complete a handle: the caller (wait, is_completed), the runtime's progress
thread (`mcr.progress`) and the MPI backend's worker (`mpi_worker`). A lock lets one of them test
or wait on the request at a time (MPI forbids two threads completing one request) and runs the
finishers exactly once; `done` is set only after they ran, so a thread that sees it set sees
their results. Read `done`; never set it.
"""

from __future__ import annotations

from threading import Lock
from time import perf_counter, time_ns

from .flight import DONE, LIVE, S_DONE


class Handle:
    __slots__ = (
        "_wait",
        "_test",
        "_keep",
        "_finishers",
        "done",
        "_lock",
        "op",
        "completes_alone",
        "source",
        "watch",
        "group",
        "record",
        "_log",
        "_check",
        "error",
    )
    device = None  # a CPU op's; `mcr.streams.StreamHandle` says which GPU

    def __init__(self, wait, test, keep=None, finish=None, check=None):
        self._wait = wait  # blocks until the backend op is done
        self._test = test  # returns True when the backend op is done, without blocking
        # after a test says done, raises the op's error before any finisher runs on its data
        # (a failed torch Work reads as completed: `from_torch_work`)
        self._check = check
        self.error = None  # the op's failure, once seen: raised again by every later wait()
        self._keep = keep  # buffers that must outlive the op
        self._finishers = [finish] if finish is not None else []
        self.done = False
        self._lock = Lock()
        self.op = None  # the runtime's OpCall, to name the op if it never completes
        self.completes_alone = True  # False: the library marks it done only when waited on
        self.source = None  # a receive from any source: returns the sender's group rank once done
        # Set by the runtime at issue, used only if waited on: binding them into a wrapper here
        # instead cost each async issue a closure (issue 21: an issue should cost less than a wait)
        self.watch = None  # the runtime's watch(wait, test, handle): watchdog, rule 3, a named error
        self.group = None  # the op's group, for that error
        # the op's flight-recorder entry: stamped done here (not by a finisher), started when waited on
        self.record = None
        self._log = None  # (comm log, issue time): the op's time recorded at completion

    def issued(self, op, watch, group, comm_log=None, started=0.0, record=None) -> None:
        """The runtime's facts about the op, set once at issue (a finisher closure per issue
        costs more: issue 21): its OpCall, watch and group, the comm log that times it from
        `started` (perf_counter), the flight-recorder entry to stamp done. Called by the issuing
        thread before the handle is in flight, when no other thread can complete it, so without
        the lock; a handle another thread may complete sooner is a `SharedHandle`."""
        self.op, self.watch, self.group = op, watch, group
        if not self.done:
            self.record = record
            if comm_log is not None:
                self._log = (comm_log, started)
        else:  # completed inside the backend's call
            self._at_completion(comm_log, started, record)

    def then(self, finish) -> "Handle":
        """Run `finish()` once the op completes (copy-outs, averaging, accounting)."""
        with self._lock:
            if not self.done:
                self._finishers.append(finish)
                return self
        if self.error is None:  # never on a failed op's data
            finish()
        return self

    def stamp_done(self, entry) -> None:
        """Set a flight-recorder entry's DONE time when the op completes (now if it has)."""
        self._at_completion(None, 0.0, entry)

    def _at_completion(self, comm_log, started, record) -> None:
        """Log the op's time and stamp its entry when it completes, under the lock that
        completion takes; an op already complete (on the MPI worker) is logged and stamped now."""
        with self._lock:
            if not self.done:
                if record is not None:
                    self.record = record
                if comm_log is not None:
                    self._log = (comm_log, started)
                return
        if comm_log is not None:
            comm_log.record(self.op, perf_counter() - started)
        if record is not None:
            record[DONE] = record[LIVE][S_DONE] = time_ns()

    def wait(self, timeout=None) -> bool:
        if not self.done:
            with self._lock:
                if not self.done:
                    try:
                        if self.watch is None:
                            self._wait()
                        else:
                            self.watch(self._wait, self._test, self)
                    except BaseException as exc:
                        self._fail(exc)
                        raise
                    self._complete()
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self) -> bool:
        """Never blocks: while another thread holds the handle (waiting or testing), says False."""
        if not self.done and self._lock.acquire(blocking=False):
            try:
                if not self.done and self._test():
                    if self._check is not None:
                        try:
                            self._check()
                        except BaseException as exc:
                            self._fail(exc)
                            raise
                    self._complete()
            finally:
                self._lock.release()
        return self.done

    def _fail(self, exc) -> None:
        """The op failed: no finisher runs on its data, and it is over (no thread tests it again:
        a progress thread would report again what its caller was told)."""
        self.error = exc
        self._finishers = ()
        self._keep = None
        self._wait = self._test = self._check = None
        self.done = True

    def _complete(self):
        for finish in self._finishers:
            finish()
        self._finishers = ()
        self._keep = None
        self._wait = self._test = self._check = None  # the request or Work, and the buffers a Work holds
        if self._log is not None:
            comm_log, started = self._log
            comm_log.record(self.op, perf_counter() - started)
        if self.record is not None:
            self.record[DONE] = self.record[LIVE][S_DONE] = time_ns()
        self.done = True


class SharedHandle(Handle):
    """A handle another thread may complete as soon as it exists (the MPI worker's)."""

    __slots__ = ()

    def issued(self, op, watch, group, comm_log=None, started=0.0, record=None) -> None:
        self.op, self.watch, self.group = op, watch, group
        self._at_completion(comm_log, started, record)


def from_torch_work(work, keep=None, finish=None) -> Handle:
    """A torch Work reads as completed when it failed too (NCCL: `WorkNCCL::isCompleted`); its
    wait() then raises the error (and orders the current stream, a no-op on the CPU), so a test
    that says done waits once before the finishers run."""
    return Handle(work.wait, work.is_completed, keep, finish, work.wait)


def from_mpi_request(request, keep=None, finish=None) -> Handle:
    return Handle(request.Wait, request.Test, keep, finish)
