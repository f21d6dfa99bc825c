"""The handle an async op returns: `wait()` and `is_completed()`, like torch's `Work`.

It also keeps the op's buffers alive until completion: mpi4py does not hold a reference to
the buffers of a nonblocking call (Iallreduce with IN_PLACE, Ireduce_scatter_block), so a
temporary freed early would make the result garbage. The runtime holds every handle until its
op completes (`Runtime.hold`), so a caller may drop it.
"""

from __future__ import annotations


class Handle:
    __slots__ = ("_wait", "_test", "_keep", "_finishers", "_done")

    def __init__(self, wait, test, keep=None, finish=None):
        self._wait = wait  # blocks until the backend op is done
        self._test = test  # returns True when the backend op is done, without blocking
        self._keep = keep  # buffers that must outlive the op
        self._finishers = [finish] if finish is not None else []
        self._done = False

    def then(self, finish) -> "Handle":
        """Run `finish()` once the op completes (copy-outs, averaging, accounting)."""
        if self._done:
            finish()
        else:
            self._finishers.append(finish)
        return self

    def wait(self, timeout=None) -> bool:
        if not self._done:
            self._wait()
            self._complete()
        return True

    def is_completed(self) -> bool:
        if not self._done and self._test():
            self._complete()
        return self._done

    def _complete(self):
        self._done = True
        for finish in self._finishers:
            finish()
        self._finishers = ()
        self._keep = None
        self._wait = self._test = None  # the request or Work, and the buffers a Work holds


def from_torch_work(work, keep=None, finish=None) -> Handle:
    return Handle(work.wait, work.is_completed, keep, finish)


def from_mpi_request(request, keep=None, finish=None) -> Handle:
    return Handle(request.Wait, request.Test, keep, finish)
