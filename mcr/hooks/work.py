"""`dist.Work` objects for the registered backend: what torch and its C++ callers wait on.

Every ProcessGroup method must return a Work (never None): the C++ trampoline wraps it and
callers such as the DDP reducer call `wait()` or `getFuture()` on it.
"""

from __future__ import annotations

from threading import Lock

import torch
import torch.distributed as dist

from .. import api


def _completed_future(result):
    fut = torch.futures.Future()
    fut.set_result(result)
    return fut


class DoneWork(dist.Work):
    """A blocking op that has already finished. One shared instance serves every sync call:
    building a Work per call costs about 3 µs, more than the rest of the hook together."""

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
    (the DDP reducer reads the reduced tensor from `future.value()[0]`)."""

    def __init__(self, handles, result):
        super().__init__()
        self._handles = handles  # one mcr Handle, or a list for coalesced ops
        self._result = result

    def wait(self, timeout=None):
        h = self._handles
        if isinstance(h, list):
            for one in h:
                one.wait()
        else:
            h.wait()
        return True

    def is_completed(self):
        h = self._handles
        return all(one.is_completed() for one in h) if isinstance(h, list) else h.is_completed()

    def is_success(self):
        return self.is_completed()

    def get_future(self):
        """A future that completes when the op does: on its own where the runtime's progress
        thread runs (DDP's reducer then overlaps the all-reduce with the rest of backward), or
        here, waiting, where it does not (MCR_PROGRESS_THREAD=0)."""
        if api.runtime().progress is None:
            self.wait()
            return _completed_future(self._result)
        fut = torch.futures.Future()
        handles = self._handles if isinstance(self._handles, list) else [self._handles]
        left = [len(handles)]  # the last handle to complete sets the result (finishers run one at a time)
        lock = Lock()

        def one_done():
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                fut.set_result(self._result)

        for handle in handles:
            handle.then(one_done)
        return fut

    def result(self):
        return self._result
