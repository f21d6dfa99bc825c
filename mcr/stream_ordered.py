"""A stream-ordered library (NCCL) on CUDA tensors: each op runs as torch's own call runs it.

torch's ProcessGroupNCCL (`collective()`, `pointToPoint()`, `WorkNCCL::wait`) is the contract its
users rely on, so mcr adds nothing to it on the GPU:

- a blocking call goes on the caller's current stream with `asyncOp` false, as `dist.all_reduce`
  does: no side stream, no stash, no Work, no wait, no thread woken. Ops of one communicator are
  ordered by the streams they run on, never by the host;
- an async call returns torch's Work itself: `wait()` orders the waiter's current stream after
  the op and releases the stash, its future is torch's CUDA-aware one (DDP's reducer overlaps
  its all-reduces with backward because nothing else waits on them);
- an op with a finisher (the hook's flattened all-reduce copies back) chains it on torch's
  future (`then`): it runs on a stream that waits for the op, never the issuing one;
- AVG is NCCL's own average;
- mcr's flight recorder, comm log and watchdog read each op's state on their own schedule
  (`StreamOps`): a blocking op costs one event, recorded only where the recorder or the comm
  log is on; an async op's Work is read as it is. An op issued while the caller's stream is being
  captured into a CUDA graph is launched and nothing else: it is never held, queried or timed.
"""

from __future__ import annotations

import collections
import threading
from time import time_ns

import torch
import torch.distributed as dist

from .flight import DONE, LIVE, RETURNED, S_DONE


class StreamOps:
    """Stream-ordered ops the runtime tracks until the GPU has run them: their flight-recorder
    entry is stamped DONE, their GPU time logged and the watchdog told of the oldest, whenever
    one of those reads (`settle`): the watchdog's tick, a dump, finalize, or an `add` past a
    bound. Nothing is woken per op."""

    BOUND = 256  # past this many, `add` settles the completed ones itself (queries: microseconds)

    def __init__(self):
        # (done: a Work or an Event, (op,), its flight-recorder entry (a batch's: a tuple), timing)
        self._ops = collections.deque()
        self._lock = threading.Lock()

    def __len__(self):
        return len(self._ops)

    def add(self, done, op, entry, timing=None) -> None:
        """`timing`: (comm log, start event, end event) where the comm log times the op."""
        self._ops.append((done, (op,), entry, timing))
        if len(self._ops) > self.BOUND:
            self.settle()

    def settle(self, block=False):
        """Read the oldest ops' state, front first (a stream runs them in order, and most run in
        issue order), until one is still pending; `block`: wait for the GPU first (finalize).
        Returns the pending one's `(op,)`, the same tuple at every call (the watchdog times it
        from when it first saw it), or None."""
        ops = self._ops
        if block and ops:
            torch.cuda.synchronize()
        with self._lock:
            while ops:
                done, op, entry, timing = ops[0]
                if not (done.query() if isinstance(done, torch.cuda.Event) else done.is_completed()):
                    return op
                ops.popleft()
                if type(entry) is tuple:  # a batch's ops (`Runtime.batch_p2p`)
                    for one in entry:
                        one[DONE] = one[LIVE][S_DONE] = time_ns()
                elif entry is not None:
                    entry[DONE] = entry[LIVE][S_DONE] = time_ns()
                if timing is not None:
                    comm_log, started, ended = timing
                    ended.synchronize()  # right behind `done` on the GPU
                    comm_log.record(op[0], started.elapsed_time(ended) / 1e3)
        return None

    def oldest(self):
        """The oldest op the GPU has not run (its Work or event), once the ones it has are
        settled; None where there is none."""
        if self.settle() is None:
            return None
        with self._lock:
            return self._ops[0][0] if self._ops else None


class StreamOrderedRoute:
    """One route's calls on a stream-ordered library: `run` (blocking) and `issue` (async),
    made once per route (as `mcr.runner`'s pair for CPU tensors)."""

    def __init__(self, rt, op, backend, method, comm, route=None):
        self.rt, self.op, self.comm = rt, op, comm
        self.fn = getattr(backend, method)
        self.p2p = op.family == "send_recv"
        recorder = rt.recorder if route is not None else None
        self.openers = None if recorder is None else [recorder.opener(route, method, a) for a in (False, True)]
        self._timer = None  # the stream an async op's end is timed on, where the comm log is on
        # CUDA-aware MPI ops in flight, which an NCCL op waits for (`mcr.gpu_turns`); () in a job without
        self._mpi = rt.turns.mpi if rt.turns is not None else ()
        # the runtime's own steps (route None) are tracked too where CUDA-aware MPI waits for them
        self._kept = rt.turns is not None and route is None

    def run(self, group, args) -> None:
        """The blocking call: on the caller's current stream; returns once it is queued there."""
        rt = self.rt
        if self._mpi:
            rt.turns.nccl_may_launch()
        entry = self.openers[0](group, args[1] if self.p2p else None) if self.openers is not None else None
        comm_log = rt.comm_log
        capturing = torch.cuda.is_current_stream_capturing()
        if comm_log is not None and not capturing:
            started = torch.cuda.Event(enable_timing=True)
            started.record()
        try:
            self.fn(self.comm, *args, False)
        except Exception as exc:
            raise rt.op_error(self.op, group, exc) from exc
        if capturing or (entry is None and comm_log is None and not self._kept):
            return
        done = torch.cuda.Event(enable_timing=comm_log is not None)
        done.record()
        rt.stream_ops.add(done, self.op, entry, (comm_log, started, done) if comm_log is not None else None)

    def issue(self, group, args):
        """The async call: torch's Work, as its own async call returns it."""
        rt = self.rt
        if self._mpi:
            rt.turns.nccl_may_launch()
        entry = self.openers[1](group, args[1] if self.p2p else None) if self.openers is not None else None
        comm_log = rt.comm_log
        capturing = torch.cuda.is_current_stream_capturing()
        if comm_log is not None and not capturing:
            started = torch.cuda.Event(enable_timing=True)
            started.record()
        try:
            work = self.fn(self.comm, *args, True)
        except Exception as exc:
            raise rt.op_error(self.op, group, exc) from exc
        if capturing:
            return work
        timing = None
        if comm_log is not None:  # its end, on a stream of ours that waits on the Work's future
            if self._timer is None:
                self._timer = torch.cuda.Stream()
            with torch.cuda.stream(self._timer):
                work.get_future().wait()  # the stream waits; the host does not, the stash stays
                ended = torch.cuda.Event(enable_timing=True)
                ended.record()
            timing = (comm_log, started, ended)
        rt.stream_ops.add(work, self.op, entry, timing)
        if entry is not None:
            entry[RETURNED] = time_ns()
        return work


class FinishedWork(dist.Work):
    """torch's Work of an op followed by a finisher, chained on its CUDA-aware future: the
    finisher runs now, on a stream that waits for the op (torch's `Future.then`), and whoever
    waits on this Work or its future is ordered after it, on their own current stream."""

    def __init__(self, work, finish):
        super().__init__()
        self._work = work
        self._future = work.get_future().then(lambda fut: (finish(), fut.value())[1])

    def wait(self, timeout=None):
        self._future.wait()
        return True

    def is_completed(self):
        return self._work.is_completed()

    def is_success(self):
        return self.is_completed()

    def get_future(self):
        return self._future

    def result(self):
        return self._future.value()


def then(handle, finish):
    """`finish()` once `handle`'s op is done: an mcr handle runs it itself (`Handle.then`), a
    torch Work (a stream-ordered op) through its future (`FinishedWork`)."""
    if isinstance(handle, dist.Work):
        return FinishedWork(handle, finish)
    return handle.then(finish)
