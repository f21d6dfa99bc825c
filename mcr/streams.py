"""CUDA tensors: the stream and device rules the ops of host libraries keep, written once, here.

Users rely on torch's ProcessGroupNCCL (`syncStream` at issue, `WorkNCCL::synchronize` at wait,
its tensors kept until then); mcr gives the same promise whatever library runs the op. A GPU
library (NCCL: `Backend.gpu_native`) runs as torch runs it (`mcr.stream_ordered`); this module
runs the others:

1. At issue, the op is ordered after all work queued on the caller's current stream. A library
   that orders itself against the current stream (gloo on the ops it runs on CUDA tensors:
   `Backend.stream_ordered`) is called on the caller's thread, where that stream is current.
   A host-driven library (MPI, CUDA-aware or staged through host memory; gloo on what
   the runtime stages for it) gets the memory only once an event recorded on that stream at
   issue has completed (`StreamOrder.ready`, an event of the route's, reused), on the issuing
   thread or on the backend's worker, which polls it itself (`MPIDriver.wait_gpu`).
   The device temporaries it reads (scatter's stacked list, the list reduce-scatter's cat) are
   made by the caller on that stream before the event (`Backend.prepare`): the library reads
   them at once, on the host, so a kernel queued after the event could still be filling them.
2. After `wait()`, work queued on the caller's current stream (the one current at the wait) is
   ordered after the op and its finishers: it waits on an event recorded after them
   (`StreamOrder.done`).
3. Finishers (copy-outs from a packed temporary, staging's copy-back, AVG's divide, unflatten)
   run on the issuing device and stream, whichever thread completes the op (`StreamHandle`):
   nothing of the op runs on another stream (the MPI worker runs only the library call).
   Temporaries are kept by the handle until its op is done; device ones are made on the issuing
   stream, where the finishers that last use them run; pinned host ones go back to torch's host
   allocator, which holds a block until the copies queued on it have run. An async op's own
   tensors are recorded on the issuing stream (`record_on`): the caller may free them before its
   finishers have run there, and they may have been made on another stream.
4. Every rank binds its device from its local rank before MPI or NCCL start (`bind_device`), and
   every thread of the runtime binds it too (`mcr.threads`).

The routes that hand a buffer from one library to another (chunked, node-aware, a table that
switches libraries between ops on one tensor) keep these rules because each of their steps is an
op that keeps them: the next step's issue waits for what the last one queued. An op on CUDA
tensors stays in flight until the GPU has run it (`StreamHandle.done`). None of these libraries
can be captured into a CUDA graph: under capture an op here fails, naming the fix. Nothing here
runs for CPU tensors: their routes never reach this module.
"""

from __future__ import annotations

from contextlib import nullcontext
from functools import partial
from threading import Lock, get_ident
from time import perf_counter, time_ns

import torch

from .flight import DONE, LIVE, RETURNED, S_DONE, FlightRecorder

_bound = None  # the device this rank bound (`bind_device`); every runtime thread sets it


def bind_device(local_rank: int):
    """Make GPU `local_rank % device_count` this process's current device (before MPI_Init and
    any NCCL communicator, which take the current device); None where there is no GPU."""
    global _bound
    if not torch.cuda.is_available():
        return None
    _bound = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(_bound)
    return _bound


def bound_device():
    return _bound


def set_thread_device(device) -> None:
    torch.cuda.set_device(device)


def gpu_identity() -> str:
    """The bound GPU's UUID, the same in every process that sees it ("" without one): ranks that
    share a GPU can use no NCCL communicator together (NCCL refuses "duplicate GPU")."""
    if _bound is None:
        return ""
    return str(torch.cuda.get_device_properties(_bound).uuid)


def device_of(args):
    """The CUDA device of an op's tensors (a tensor, or a list's first), or None for CPU ones."""
    for arg in args:
        first = arg[0] if isinstance(arg, list) and arg else arg
        if isinstance(first, torch.Tensor):
            return first.device if first.is_cuda else None
    return None


class StreamOrder:
    """One op's place among its device's streams: the caller's current stream at issue, the
    event a host-driven library waits for before touching the memory (rule 1), and the event
    after the op's finishers that a waiting caller's stream waits on (rule 2). `timed`: events
    that can time the op on the GPU, for the comm log."""

    __slots__ = ("device", "stream", "ready", "done", "_started")

    def __init__(self, device, timed=False):
        self.device = device
        self.stream = torch.cuda.current_stream(device)
        self.ready = self.done = None
        self._started = None
        if timed:
            self._started = torch.cuda.Event(enable_timing=True)
            self._started.record(self.stream)

    def mark_ready(self, event) -> None:
        """Record `event` (a new one, or one whose last record was waited for) after the producers'
        work (and staging's copies to the host) on the issuing stream."""
        self.ready = event
        event.record(self.stream)

    def on_stream(self):
        """Run what follows on the issuing device and stream (from any thread)."""
        return torch.cuda.stream(self.stream)

    def mark_done(self) -> None:
        """After the op's finishers on the issuing stream; a later finisher marks it again."""
        self.done = torch.cuda.Event(enable_timing=self._started is not None)
        self.done.record(self.stream)

    def caller_waits(self) -> None:
        torch.cuda.current_stream(self.device).wait_event(self.done)

    def gpu_seconds(self) -> float:
        return self._started.elapsed_time(self.done) / 1e3


class StreamHandle:
    """The handle of an op on CUDA tensors: the backend's own handle (`inner`), always completed
    under the issuing stream, so its finishers run there (rule 3); `wait()` orders the waiting
    caller's stream after them (rule 2). Finished once the op's finishers are queued; `done`
    once the GPU has run them: until then the runtime keeps it in flight, and its flight-recorder
    entry and comm-log time are stamped then, not when the host let go of the op."""

    __slots__ = ("_inner", "_order", "_finished", "_lock", "done", "op", "group", "record", "_log")
    __slots__ += ("completes_alone", "source", "error")  # the inner handle's, kept past its release

    def __init__(self, inner, order: StreamOrder, op, group, record=None, comm_log=None):
        self._inner, self._order = inner, order
        self._finished = self.done = False
        self._lock = Lock()
        self.op, self.group, self.record, self._log = op, group, record, comm_log
        self.completes_alone, self.source = inner.completes_alone, inner.source
        self.error = None  # the op's failure, once seen (as `Handle.error`)

    @property
    def device(self):
        return self._order.device

    def stamp_done(self, entry) -> None:
        """Stamp a flight-recorder entry's DONE when the GPU has run the op (now, if it has)."""
        if self.done:
            entry[DONE] = entry[LIVE][S_DONE] = time_ns()
        else:
            self.record = entry

    def then(self, finish) -> "StreamHandle":
        """Run `finish()` on the issuing stream once the op completes (now, if it has)."""
        with self._lock:
            if not self._finished:
                self._inner.then(finish)  # run by `_finish`, under the issuing stream
                return self
            if self.error is not None:  # never on a failed op's data
                return self
            with self._order.on_stream():
                finish()
                self._order.mark_done()
        return self

    def wait(self, timeout=None) -> bool:
        # A caller on the issuing stream (a blocking call; most waits) is ordered after the op
        # already, and completes it without entering that stream: each costs ~10 us of Python
        on_issuing = torch.cuda.current_stream(self._order.device) == self._order.stream
        if not self._finished:
            if self.record is not None:
                FlightRecorder.waited(self.record)
            with self._lock:
                if not self._finished:
                    self._finish(waiting=True, on_issuing=on_issuing)
        if self.error is not None:
            raise self.error
        if not on_issuing:
            self._order.caller_waits()
        return True

    @property
    def host_done(self) -> bool:
        """The op is over on the host: the library let go of its memory, its finishers are queued."""
        return self._finished

    def wait_host(self) -> None:
        """Wait until `host_done` (under the watchdog, keeping MPI moving), ordering no stream of
        the caller's; a failure is left to the op's own wait, which raises it."""
        if not self._finished:
            with self._lock:
                if not self._finished:
                    try:
                        self._finish(waiting=True)
                    except Exception:  # the op is over either way
                        pass

    def is_completed(self) -> bool:
        """True once the GPU has run the op and its finishers; never blocks."""
        if self.done:
            return True
        if not self._finished:
            if not self._lock.acquire(blocking=False):
                return False
            try:
                if not self._finished and not self._finish(waiting=False):
                    return False
            finally:
                self._lock.release()
        if self._order.done.query():
            self._at_gpu_done()
        return self.done

    def _finish(self, waiting: bool, on_issuing=False) -> bool:
        """Under the lock: complete the backend's handle on the issuing stream (a library that
        orders streams makes it wait for the op; a failed op raises here, before any finisher)
        and mark the stream after its finishers. False where `waiting` is off and it is not done.
        `on_issuing`: the calling thread's current stream is the issuing one already."""
        try:
            with nullcontext() if on_issuing else self._order.on_stream():
                if waiting:
                    self._inner.wait()  # under the watchdog and rule 3 (the inner handle's watch)
                elif not self._inner.is_completed():
                    return False
                self._order.mark_done()
        except BaseException as exc:  # over, failed: seen once, by whoever waited or tested
            self.error, self._finished, self.done, self._inner = exc, True, True, None
            raise
        self._finished = True
        return True

    def _at_gpu_done(self) -> None:
        if self.done:
            return
        if self._log is not None:
            self._log.record(self.op, self._order.gpu_seconds())
        if self.record is not None:
            self.record[DONE] = self.record[LIVE][S_DONE] = time_ns()
        self._inner = None  # the backend's request and the buffers it held
        self.done = True


# --- staging through host memory ---------------------------------------------------------------
# What each backend method reads and writes among its arguments after the group (positions):
# only what is read is copied to the host, only what is written is copied back.
STAGED_ARGS = {
    "all_reduce": ((0,), (0,)),
    "reduce": ((0,), (0,)),
    "broadcast": ((0,), (0,)),
    "all_gather": ((1,), (0,)),
    "all_gather_into_tensor": ((1,), (0,)),
    "gather": ((0,), (1,)),
    "scatter": ((1,), (0,)),
    "reduce_scatter": ((1,), (0,)),
    "reduce_scatter_tensor": ((1,), (0,)),
    "all_to_all": ((1,), (0,)),
    "all_to_all_single": ((1,), (0,)),
    "send": ((0,), ()),
    "recv": ((), (0,)),
    "barrier": ((), ()),
}


def to_host(method: str, args: tuple):
    """Pinned host twins of the op's CUDA tensors, the ones it reads filled by copies queued on
    the current stream, and a finisher that queues the copies back of the ones it writes (on the
    stream current when it runs: the issuing one, by rule 3)."""
    reads, writes = STAGED_ARGS[method]
    host, back = list(args), []
    for i in set(reads) | set(writes):
        arg = args[i]
        if arg is None:  # a root-only list on another rank
            continue
        many = isinstance(arg, list)
        twins = [_pinned(t, i in reads) for t in (arg if many else [arg])]
        host[i] = twins if many else twins[0]
        if i in writes:
            back += zip(arg if many else [arg], twins)

    def copy_back():
        for device_tensor, twin in back:
            device_tensor.copy_(twin, non_blocking=True)

    return tuple(host), copy_back


def _pinned(tensor, read: bool):
    twin = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    if read:
        twin.copy_(tensor, non_blocking=True)
    return twin


def record_on(stream, args) -> None:
    """Tell the caching allocator that an async op's CUDA tensors are used on `stream` (its issuing
    one): its staging copies and temporaries read them there at issue, its finishers write them
    there once the op is done, after the call returned, and the caller may free them meanwhile. A
    tensor made on another stream would go back to that stream's pool at once, and new work there
    could take its block before these ran; `record_stream` holds it until they have (on the
    tensor's own stream it costs the allocator nothing)."""
    for arg in args:
        for tensor in arg if isinstance(arg, list) else (arg,):
            if isinstance(tensor, torch.Tensor) and tensor.is_cuda:
                tensor.record_stream(stream)


# --- running a route on CUDA tensors -------------------------------------------------------------
class CudaRoute:
    """How one route's calls on CUDA tensors run: blocking (`run`) or async (`issue`), under the
    rules above. Made once per route, like `mcr.runner`'s pair for CPU routes.
    `route` and `method`: for the flight recorder (None: a step of the runtime's own, not
    recorded); `staged`: through host memory even where the library reads device memory (the
    candidate BACKEND/host)."""

    def __init__(
        self, rt, op, backend, method, comm, route=None, staged=False, logged=True, reduce_op=None, dtype=None
    ):
        self.rt, self.op, self.backend, self.method, self.comm = rt, op, backend, method, comm
        self.fn = getattr(backend, method)
        native = not staged and backend.reads_device(method, dtype, reduce_op)
        self.stream_ordered = native and backend.stream_ordered
        self.staged = not native
        recorder = rt.recorder if route is not None else None
        # each call's flight-recorder entry: blocking [False] or async [True]
        self.openers = None if recorder is None else [recorder.opener(route, method, a) for a in (False, True)]
        self.logged = logged
        self.p2p = op.family == "send_recv"
        self.driven = backend.name in rt.driver.needed
        self.inner_op = op._replace(label=backend.name)  # mpi/host waits in MPI: rule 3 by the backend's name
        # a host-driven library handed device memory (a CUDA-aware MPI) takes turns with NCCL
        self.turns = rt.turns if native and not backend.stream_ordered else None
        self._events = []  # ready events waited for, recorded again by the next call (none made per call)

    def _entry(self, group, args, async_op):
        if self.openers is None:
            return None
        return self.openers[async_op](group, args[1] if self.p2p else None)

    def _mark_ready(self, order) -> None:
        events = self._events
        order.mark_ready(events.pop() if events else torch.cuda.Event())

    def _wait_ready(self, order) -> None:
        """Rule 1 for a host-driven library: block until the issuing stream reached the op, on
        this thread, keeping MPI moving meanwhile (mixing rule 3: that stream may wait on another
        backend); on device memory beside NCCL, first until NCCL's ops so far have run
        (`mcr.gpu_turns`). The event is then free for the next call."""
        if self.turns is not None:
            self.turns.mpi_may_start(order.device)
        self.rt.driver.wait_gpu(order.ready)
        self._events.append(order.ready)

    def _refuse_capture(self):
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"mcr.{self.op.family} on backend {self.op.label}: the caller's stream is being captured into a "
                f"CUDA graph, and {self.op.label} runs on the host, outside any graph; run this op outside the "
                "capture, or on a GPU library a graph can hold (backend='nccl')"
            )

    def run(self, group, args) -> None:
        """The blocking call: returns with the caller's current stream ordered after the op."""
        self._refuse_capture()
        rt, op, comm = self.rt, self.op, self.comm
        entry = self._entry(group, args, False)
        if not self.p2p and rt.in_flight.entries:
            rt.in_flight.complete_earlier(comm)
        comm_log = rt.comm_log if self.logged else None
        waits, thread = rt.waits, get_ident()
        waits[thread] = (op,)
        try:
            if self.stream_ordered:  # the library orders the streams; the GPU finishes it later
                order = StreamOrder(self.device_of(args), comm_log is not None)
                handle = self._stream_handle(self.fn(comm, *args, True), order, group, entry, comm_log)
                handle.wait()
                rt.hold(None, handle, self.driven)  # in flight until the GPU has run it
                return
            order = StreamOrder(self.device_of(args))
            host_args, copy_back = to_host(self.method, args) if self.staged else (args, None)
            method, lib_args, finish = self.backend.prepare(self.method, comm, host_args)  # temporaries
            self._mark_ready(order)
            with nullcontext() if self.turns is None else self.turns.mpi_running():
                self._wait_ready(order)
                started = perf_counter()
                (self.fn if method == self.method else getattr(self.backend, method))(comm, *lib_args, False)
            if finish is not None:
                finish()  # on the caller's stream, which is the issuing one
            if copy_back is not None:
                copy_back()
        except Exception as exc:
            raise rt.op_error(op, group, exc) from exc
        finally:
            waits.pop(thread, None)  # a wait inside may have taken it already
        if comm_log is not None:
            comm_log.record(op, perf_counter() - started)
        if entry is not None:
            entry[DONE] = entry[LIVE][S_DONE] = time_ns()

    def issue(self, group, args):
        """The async call: returns a `StreamHandle`, held in flight until the GPU has run it."""
        self._refuse_capture()
        rt, op, comm = self.rt, self.op, self.comm
        entry = self._entry(group, args, True)
        comm_log = rt.comm_log if self.logged else None
        order = StreamOrder(self.device_of(args), comm_log is not None)
        try:
            if self.stream_ordered:
                inner = self.fn(comm, *args, True)
            else:
                record_on(order.stream, args)
                host_args, copy_back = to_host(self.method, args) if self.staged else (args, None)
                method, lib_args, finish = self.backend.prepare(self.method, comm, host_args)  # temporaries
                self._mark_ready(order)
                inner = self.backend.issue_after(partial(self._wait_ready, order), method, comm, lib_args)
                if finish is not None:
                    inner.then(finish)  # the first finishers: copy-outs, staging's copy-back, then AVG's divide
                if copy_back is not None:
                    inner.then(copy_back)
        except Exception as exc:
            raise rt.op_error(op, group, exc) from exc
        handle = self._stream_handle(inner, order, group, entry, comm_log)
        rt.hold(None if self.p2p else comm, handle, self.driven)
        if self.turns is not None:
            self.turns.mpi_issued(handle)
        if entry is not None:
            entry[RETURNED] = time_ns()
        return handle

    def _stream_handle(self, inner, order, group, entry, comm_log):
        inner.issued(self.inner_op, self.rt.watch, group)  # its waits watched and named; stamped by ours
        return StreamHandle(inner, order, self.op, group, entry, comm_log)

    @staticmethod
    def device_of(args):
        return device_of(args) or _bound
