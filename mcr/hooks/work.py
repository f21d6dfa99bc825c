"""`dist.Work` objects for the registered backend: what torch and its C++ callers wait on.

Every ProcessGroup method must return a Work (never None): the C++ trampoline wraps it and
callers such as the DDP reducer call `wait()` or `getFuture()` on it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import api
from ..callbacks import CallbackFuture


def _completed_future(result):
    fut = torch.futures.Future()
    fut.set_result(result)
    return fut


class DoneWork(dist.Work):
    """A blocking op that has already finished. One shared instance serves every sync call:
    building a Work per call costs more than the rest of the hook together
    (`python -m mcr.tools.bench_hooks`; configs/tuning/vm-n2-bench-hooks.txt)."""

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def get_future(self):
        return _completed_future([])

    def result(self):
        return []


DONE = DoneWork()


class HandleWork(dist.Work):
    """An async op: waits on the runtime's handle(s); `result` is what the future carries
    (the DDP reducer reads the reduced tensor from `future.value()[0]`), or a function that
    makes it once the op is done. Made by `handle_work`."""

    # every async op's issue pays for making one: slots and torch's own __init__ (no Python
    # __init__ calling it) take a third off (python -m mcr.tools.bench_hooks, the issue table)
    __slots__ = ("_handles", "_result")

    def wait(self, timeout=None):
        handles = self._handles
        if type(handles) is list:
            for one in handles:
                one.wait()
        else:
            handles.wait()
        return True

    def is_completed(self):
        h = self._handles
        return all(one.is_completed() for one in h) if isinstance(h, list) else h.is_completed()

    def is_success(self):
        return self.is_completed()

    def handles(self) -> list:
        """The runtime's handles this Work waits on (several for coalesced ops)."""
        return self._handles if isinstance(self._handles, list) else [self._handles]

    def get_future(self):
        """A future set as soon as the op completes by the runtime's callback thread (DDP's
        reducer then overlaps the all-reduce with the rest of backward); Python callbacks chained
        on it run on the thread that chains them, once the op is done (`mcr.callbacks`). Without
        the progress thread (MCR_PROGRESS_THREAD=0, or an MPI without MPI_THREAD_MULTIPLE) the
        op is waited on here."""
        rt = api.runtime()
        handles = self.handles()
        if rt.progress is None:
            fut = CallbackFuture(handles, self._result)
            fut.settle()
            return fut
        return rt.callbacks.future(handles, self._result)

    def result(self):
        return self._result() if callable(self._result) else self._result

    def _source_rank(self):  # torch's recv(src=None) asks who sent (a group rank)
        self.wait()
        return self._handles.source()


def handle_work(handles, result, _make=HandleWork) -> HandleWork:
    """The Work for an async op's handle (one mcr Handle, or a list for coalesced ops)."""
    work = _make()
    work._handles = handles
    work._result = result
    return work
