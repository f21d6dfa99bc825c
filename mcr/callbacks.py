"""The futures of `dist.Work` on backend "mcr", and where the callbacks chained on them run.

DDP comm hooks (PowerSGD, quantization) chain Python callbacks on a collective's future that
issue more collectives, wait on those, and update the hook's state. With NCCL a future is done
as soon as its op is queued, so these callbacks run at once, on the thread that chains them, in
its program order. Run anywhere else they break: on the thread that completed the op they block
it (a progress thread or MPI worker waiting inside a callback cannot complete the op it waits
for: PowerSGD hung so), and on any other thread their collectives race the caller's next ones
for the op order and their state updates race the next hook's (plain gloo fails PowerSGD with
several buckets that way: "Received data size doesn't match expected size").

So an mcr future keeps NCCL's order on the CPU:
- a Python callback chained on it (`then`, `add_done_callback`), and `wait()`/`value()`, first
  wait for the op on the calling thread, so the callback runs right there, outside every
  runtime lock, in the caller's program order, the same on every rank;
- callbacks chained from C++ (DDP's reducer, `torch.futures.collect_all`) run on the runtime's
  callback thread as soon as the op completes, so DDP still overlaps its all-reduce with
  backward; those never issue collectives.

An NCCL op's future never comes here: the hook hands torch the op's own Work, whose future is
torch's (`mcr.stream_ordered`). On CUDA tensors a future of a host library's op is CUDA-aware as
that one is: the thread that sets it has waited for the op on its current stream, setting it
records an event there, and whoever takes the value (DDP's reducer, a callback, `wait()`) is
ordered after that event. The callback thread does this on a side stream of its own; the op's own
finishers run on its issuing stream (`mcr.streams`, rule 3). A GPU library's Work among a
coalesced block's is waited on through its future, which orders this thread's stream without
releasing the tensors the Work keeps for their own stream.
"""

from __future__ import annotations

import contextlib
import queue
import threading

import torch
import torch.distributed as dist

from . import streams, threads


class CallbackFuture(torch.futures.Future):
    """A torch future that is set when its handles complete, by whichever thread asks first:
    the callback thread, or a caller that chains a callback or waits (see the module's doc)."""

    def __init__(self, handles, result):
        super().__init__(devices=sorted({d for d in map(_device, handles) if d is not None}, key=str) or None)
        self._handles = handles
        self._result = result  # the value, or a function that makes it once the op is done
        self._claim = threading.Lock()
        self._claimed = False
        self._settled = threading.Event()

    def settle(self) -> None:
        """Wait for the op and set the value (only the first caller does; the others wait for it)."""
        with self._claim:
            mine, self._claimed = not self._claimed, True
        if not mine:
            self._settled.wait()
            return
        try:
            for handle in self._handles:
                if isinstance(handle, dist.Work):  # a GPU library's: its future orders this stream,
                    handle.get_future().wait()  # and its wait() would free its tensors for that stream
                else:
                    handle.wait()  # under the watchdog; rule 3 keeps MPI moving meanwhile
            value = self._result() if callable(self._result) else self._result
        except Exception as exc:  # the waiter (DDP, a hook) sees the op's error
            super().set_exception(exc)
        else:
            super().set_result(value)  # runs the callbacks chained from C++ so far
        finally:
            self._handles = self._result = None
            self._settled.set()

    def then(self, callback):
        self.settle()
        return super().then(callback)  # done: torch runs the callback here, now

    def add_done_callback(self, callback):
        self.settle()
        super().add_done_callback(callback)

    def wait(self):
        self.settle()
        return super().wait()

    def value(self):
        self.settle()
        return super().value()


def _device(handle):
    """The GPU an op ran on: an mcr handle says; a GPU library's Work (NCCL) is on the bound one."""
    return streams.bound_device() if isinstance(handle, dist.Work) else handle.device


class CallbackThread:
    """Sets each future as soon as its op completes, in the order the futures were made."""

    def __init__(self):
        self._queue = queue.SimpleQueue()
        self._thread = None
        self._lock = threading.Lock()

    def future(self, handles, result) -> CallbackFuture:
        fut = CallbackFuture(handles, result)
        with self._lock:
            if self._thread is None:
                self._thread = threads.start(self._run, "mcr-callbacks")
        self._queue.put(fut)
        return fut

    def stop(self) -> None:
        """Set every queued future (finalize: their ops have completed), then end the thread."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout=30)

    def _run(self):
        side = torch.cuda.Stream() if streams.bound_device() is not None else None
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            while True:
                fut = self._queue.get()
                if fut is None:
                    return
                fut.settle()
