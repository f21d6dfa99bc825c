"""Large async MPI collectives run as blocking calls on one worker thread.

Open MPI's nonblocking collectives (libnbc) are much slower than its blocking ones on large
messages and advance only when someone tests them (a large Iallreduce against Allreduce:
configs/tuning/vm-n2-bench-ddp.txt), so DDP's bucket all-reduces on MPI ran several times
slower than they need to. The worker runs each queued op's blocking call in issue order (the
order every rank issues them in), on the group's twin communicator, so its collectives never
share a matching order with the caller's own on the group's communicator; mpi4py releases the
GIL inside the call. The handle completes, post-steps included, on the worker when the op ends;
an op on CUDA tensors first waits on the worker until the issuing stream has reached it
(`before`), and is completed by the runtime on that stream (`mcr.streams`), not here: the worker
runs its MPI call alone, on memory the caller made ready (its temporaries made and its copy-outs
queued on the issuing stream by the runtime), and never queues a kernel itself.
"""

from __future__ import annotations

import queue
import threading

from .. import threads
from ..handle import SharedHandle


class CollectiveWorker:
    def __init__(self):
        self._queue = queue.SimpleQueue()
        self._thread = threads.start(self._run, "mcr-mpi-worker")

    def submit(self, comm, call, keep, before=None) -> SharedHandle:
        """Queue `call(comm)` (a blocking MPI collective on `comm`), after `before()` where given;
        returns its handle."""
        done, failed = threading.Event(), []

        def wait():
            done.wait()
            if failed:
                raise failed[0]

        def test():
            if not done.is_set():
                return False
            if failed:
                raise failed[0]
            return True

        handle = SharedHandle(wait, test, keep)
        self._queue.put((comm, call, before, done, failed, handle))
        return handle

    def stop(self):
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._one(*item)
            item = None  # the op's buffers are its handle's to keep, not this thread's until the next op

    @staticmethod
    def _one(comm, call, before, done, failed, handle):
        try:
            if before is not None:
                before()
            call(comm)
        except Exception as exc:  # raised to the caller by wait() (under its watchdog)
            failed.append(exc)
        done.set()
        if not failed and before is None:
            handle.is_completed()  # post-steps and futures here, not at the next poll
