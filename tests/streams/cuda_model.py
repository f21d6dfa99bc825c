"""The CPU tier's one stand-in: the CUDA calls the runtime makes, recorded, on a machine without a GPU.

What it stands in for, and nothing else: `torch.cuda`'s streams (the per-thread current stream,
`torch.cuda.stream(s)`), events (record, wait, query, synchronize), the device calls
(`is_available`, `device_count`, `set_device`, properties and capability, capture status),
CUDA futures (`torch.futures.Future(devices=...)`), CUDA-looking tensors (`CudaLike`: CPU memory
whose `is_cuda` is True) and a model of torch's ProcessGroupNCCL (`ProcessGroupNCCLModel`), whose
data really moves between the ranks over a real gloo group while its stream semantics are
recorded as torch 2.13's `collective()`/`pointToPoint()` define them:

- asyncOp false: the kernel goes on the caller's current stream, nothing is stashed, no Work
  comes back (None);
- asyncOp true: the group's own stream waits on an event recorded on the current stream
  (`syncStream`), the kernel goes there, inputs and outputs are stashed, the end event is
  recorded after it; `WorkNCCL::wait` makes the *current* stream wait on that end event and
  releases the stash (on the assumption that the current stream is the tensors'); its future is
  CUDA-aware (whoever takes the value waits on the end event, on their own current stream);
- between `_start_coalescing` and `_end_coalescing` the ops are one NCCL group on the group's
  communicator; a send or receive outside one makes a 2-rank communicator for the pair at
  issue (as torch does without eager init).

Everything lands in `LOG`, one tuple per call: (what, thread name, ...). The GPU never runs on
its own: an event completes when the host synchronizes on it (or its stream, or the device) or
when a test calls `gpu_runs()`, so "still in flight" is a state a test can hold.

`install()` must run before `import mcr` (CUDA futures are subclassed at import). tests/gpu
checks on a real GPU each rule modelled here that one GPU can show.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import itertools
import os
import subprocess
import tempfile
import threading
import types

import torch
import torch.distributed as dist

LOG: list = []
_lock = threading.Lock()
_ids = itertools.count(1)
_local = threading.local()  # .stream (current), .device
_events: list = []  # every event recorded and not yet run
_capturing: set = set()  # streams being captured (global capture mode)
_joined: set = set()  # streams that joined the capture by waiting on a captured one


def log(*what) -> None:
    with _lock:
        LOG.append((what[0], threading.current_thread().name, *what[1:]))


def entries(kind=None, since=0) -> list:
    with _lock:
        return [e for e in LOG[since:] if kind is None or e[0] == kind]


def mark() -> int:
    """The log's length now: `entries(since=mark())` reads what happened after."""
    with _lock:
        return len(LOG)


# --- streams and events ---------------------------------------------------------------------------
class Stream:
    def __init__(self, device=None, priority=0, name=None):
        self.id = next(_ids)
        self.device = _device(device)
        self.name = name or f"stream{self.id}"
        log("new_stream", self.name)

    def wait_event(self, event) -> None:
        log("wait", self.name, event.name)
        if event.stream in _capturing and self not in _capturing:  # a stream that waits on a capturing one joins
            _capturing.add(self)
            _joined.add(self)
            log("capture_join", self.name)

    def wait_stream(self, other) -> None:
        event = Event()
        event.record(other)
        self.wait_event(event)

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def synchronize(self) -> None:
        log("stream_sync", self.name)
        _run(lambda e: e.stream is self)

    def query(self) -> bool:
        return all(e.done for e in _events if e.stream is self)

    def __eq__(self, other):
        return isinstance(other, Stream) and other.id == self.id

    def __hash__(self):
        return self.id

    def __repr__(self):
        return f"<model {self.name}>"


_DEFAULT = {}  # device index -> its legacy default stream


def default_stream(device=None) -> Stream:
    index = _device(device).index
    if index not in _DEFAULT:
        _DEFAULT[index] = Stream(torch.device("cuda", index), name=f"default{index}")
    return _DEFAULT[index]


def current_stream(device=None) -> Stream:
    stream = getattr(_local, "stream", None)
    return stream if stream is not None else default_stream(device)


def set_stream(stream) -> None:
    _local.stream = stream


@contextlib.contextmanager
def stream(s):
    if s is None:
        yield
        return
    before = getattr(_local, "stream", None)
    log("switch", getattr(before, "name", "default"), s.name)
    _local.stream = s
    try:
        yield
    finally:
        _local.stream = before


class Event:
    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.name = f"event{next(_ids)}"
        self.stream = None
        self.done = False
        self.timing = enable_timing
        log("new_event", self.name, enable_timing)

    def record(self, stream=None) -> None:
        stream = stream or current_stream()
        self.stream, self.done = stream, False
        log("record", self.name, stream.name)
        if _keeps_up:
            self.done = True
        elif stream not in _capturing:
            with _lock:
                _events.append(self)

    def wait(self, stream=None) -> None:
        (stream or current_stream()).wait_event(self)

    def query(self) -> bool:
        log("query", self.name)
        _check_capture("query", self.name)
        return self.done

    def synchronize(self) -> None:
        log("sync", self.name)
        _check_capture("synchronize", self.name)
        _run(lambda e: e is self)

    def elapsed_time(self, end) -> float:
        return 0.25  # ms: what a comm log reads; never asserted on


def _run(which) -> None:
    """The GPU runs everything up to the events `which` picks (in this model: those events)."""
    with _lock:
        for event in _events:
            if which(event):
                event.done = True
        _events[:] = [e for e in _events if not e.done]


_keeps_up = False  # set by gpu_runs(keep_up=True): every event completes as it is recorded


def gpu_runs(keep_up=False) -> None:
    """The GPU catches up with everything queued so far; `keep_up`: and with all that follows
    (a script's end: finalize waits for everything)."""
    global _keeps_up
    log("gpu_runs")
    _keeps_up = keep_up
    _run(lambda e: True)


def synchronize(device=None) -> None:
    log("device_sync")
    _check_capture("synchronize", "device")
    _run(lambda e: True)


# --- capture --------------------------------------------------------------------------------------
RELAXED = 2  # cudaStreamCaptureModeRelaxed


def _check_capture(what, name) -> None:
    """Under global capture mode a query or synchronize from any thread not in relaxed mode
    invalidates the capture (cudaErrorStreamCaptureUnsupported/Invalidated)."""
    if _capturing and _cudart.model_thread_capture_mode() != RELAXED:
        log("capture_broken", f"{what} {name} during a capture")


def is_current_stream_capturing() -> bool:
    return current_stream() in _capturing


@contextlib.contextmanager
def capture(s):
    """Capture the work queued on `s` (this thread's current stream inside), global mode."""
    with stream(s):
        _capturing.add(s)
        log("capture_begin", s.name)
        try:
            yield
        finally:
            _capturing.difference_update({s, *_joined})
            _joined.clear()
            log("capture_end", s.name)


_cudart = None  # the CUDA runtime's stand-in (cudart_model.c), loaded by install()


def _load_cudart():
    """Build cudart_model.c once per content into /tmp and load it where a CUDA runtime would be
    found (its name holds "libcudart")."""
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cudart_model.c")
    with open(source, "rb") as f:
        digest = hashlib.sha1(f.read()).hexdigest()[:12]
    folder = os.path.join(tempfile.gettempdir(), f"mcr-cudart-model-{digest}")
    path = os.path.join(folder, "libcudart-model.so")
    if not os.path.exists(path):
        os.makedirs(folder, exist_ok=True)
        partial = f"{path}.{os.getpid()}"
        subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", partial, source], check=True)
        os.replace(partial, path)
    return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


# --- device ---------------------------------------------------------------------------------------
GPUS = int(os.environ.get("CUDA_MODEL_GPUS", "1"))
CAPABILITY = tuple(int(x) for x in os.environ.get("CUDA_MODEL_CAPABILITY", "9.0").split("."))


def _device(device=None):
    if device is None:
        return torch.device("cuda", current_device())
    if isinstance(device, int):
        return torch.device("cuda", device)
    device = torch.device(device)
    return device if device.index is not None else torch.device("cuda", current_device())


def current_device() -> int:
    return getattr(_local, "device", 0)


def set_device(device) -> None:
    index = device if isinstance(device, int) else _device(device).index
    _local.device = index
    log("set_device", index)


def get_device_properties(device=None):
    index = _device(device).index
    # one GPU per rank, as under CUDA_VISIBLE_DEVICES per rank: distinct UUIDs, or NCCL is dropped
    uuid = f"GPU-model-{os.uname().nodename}-{os.environ.get('LOCAL_RANK', '0')}-{index}"
    return types.SimpleNamespace(
        uuid=uuid, name="model GPU", major=CAPABILITY[0], minor=CAPABILITY[1], total_memory=1 << 34
    )


def get_device_capability(device=None):
    return CAPABILITY


# --- tensors and futures --------------------------------------------------------------------------
class CudaLike(torch.Tensor):
    """CPU memory that says it is on cuda:0: what the runtime reads of a tensor (`is_cuda`,
    `device`) is a GPU's; its math runs on the CPU, and results stay CudaLike."""

    @property
    def is_cuda(self):
        return True

    @property
    def device(self):
        return torch.device("cuda", current_device())

    @classmethod
    def __torch_function__(cls, func, types_, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **(kwargs or {}))
        return _wrap(out)


def _wrap(out):
    if type(out) is torch.Tensor:
        return out.as_subclass(CudaLike)
    if isinstance(out, (list, tuple)):
        return type(out)(_wrap(o) for o in out)
    return out


def cuda_like(tensor: torch.Tensor) -> CudaLike:
    return tensor.as_subclass(CudaLike)


_Future = torch.futures.Future


class CudaFuture(_Future):
    """torch's CUDA future: setting it records an event on each device's current stream, and
    whoever takes the value waits on those events on their own current stream."""

    def __init__(self, devices=None):
        super().__init__()
        self.events = []
        self.cuda = bool(devices)

    def set_result(self, result):
        if self.cuda:
            event = Event()
            event.record()
            self.events = [event]
        log("future_set", id(self))
        super().set_result(result)

    def _consumer_waits(self):
        for event in self.events:
            current_stream().wait_event(event)

    def wait(self):
        out = super().wait()
        self._consumer_waits()
        return out

    def value(self):
        out = super().value()
        self._consumer_waits()
        return out


# --- ProcessGroupNCCL ------------------------------------------------------------------------------
class WorkModel(dist.Work):
    """WorkNCCL: an end event on the group's stream, the stash, a CUDA-aware future."""

    def __init__(self, name, end, outputs, stash):
        super().__init__()
        self.name, self.end, self.outputs, self.stash = name, end, outputs, stash
        log("stash", name, len(stash))

    def wait(self, timeout=None):
        current = current_stream()
        current.wait_event(self.end)  # WorkNCCL::synchronizeStream
        log("release", self.name, current.name)  # the stash, as if `current` were its tensors' stream
        self.stash = []
        return True

    def is_completed(self):
        return self.end.query()

    def is_success(self):
        return self.is_completed()

    def get_future(self):
        fut = CudaFuture(devices=["cuda"])
        fut.events = [self.end]  # set under the group's stream: its end event
        _Future.set_result(fut, self.outputs)
        return fut

    def result(self):
        return self.outputs


class ProcessGroupNCCLModel:
    """The ProcessGroupNCCL surface the runtime calls, its data moved by a real gloo group."""

    class Options:
        def __init__(self):
            self._timeout = None
            self.split_from = None
            self.split_color = None
            self.is_high_priority_stream = False

    def __init__(self, store, rank, size, opts=None):
        self._gloo = dist.ProcessGroupGloo(store, rank, size, (opts and opts._timeout) or _DEFAULT_TIMEOUT)
        self._rank, self._size = rank, size
        self.name_ = f"nccl{next(_ids)}"
        self._stream = None
        self._coalescing = None  # the ops of an open NCCL group
        split = opts.split_from.name_ if opts is not None and opts.split_from is not None else None
        log("nccl_comm", self.name_, size, split)

    def rank(self):
        return self._rank

    def size(self):
        return self._size

    def eager_connect_single_device(self, device):
        log("nccl_connect", self.name_, str(device))

    def perform_nocolor_split(self, device):
        log("nccl_nocolor_split", self.name_)

    def shutdown(self):
        log("nccl_shutdown", self.name_)

    def abort(self):
        log("nccl_abort", self.name_)

    def _start_coalescing(self, device):
        log("group_start", self.name_)
        self._coalescing = []

    def _end_coalescing(self, device):
        ops, self._coalescing = self._coalescing, None
        log("group_end", self.name_, [op for op, _, _ in ops])
        for _, _, work in ops:
            _finish(work)
        if not ops:
            return None
        stream = self._side_stream()
        end = Event()
        end.record(stream)
        return WorkModel("group", end, [], [t for _, t, _ in ops])

    def _side_stream(self):
        if self._stream is None:
            self._stream = Stream(name=f"{self.name_}-stream")
        return self._stream

    def _launch(self, op, opts_async, tensors, outputs, run, peer=None):
        """One NCCL kernel, as `collective()` or `pointToPoint()` launches it."""
        if self._coalescing is not None:  # inside a group: launched at its end, on the group's comm
            self._coalescing.append((op, [*tensors, *outputs][0], run()))  # all posted, then waited
            log("launch", op, "group", True, self.name_)
            return None
        if peer is not None:
            log("nccl_comm", f"{self.name_}-pair-{min(self._rank, peer)}:{max(self._rank, peer)}", 2, None)
        if not opts_async:
            log("launch", op, current_stream().name, False, self.name_)
            _finish(run())
            return None
        stream = self._side_stream()
        ready = Event()
        ready.record(current_stream())  # syncStream
        stream.wait_event(ready)
        log("launch", op, stream.name, True, self.name_)
        _finish(run())
        end = Event()
        end.record(stream)
        return WorkModel(op, end, outputs, [*tensors, *outputs])

    # collectives: the options' asyncOp decides, as in torch 2.13
    def allreduce(self, tensors, opts):
        op = opts.reduceOp
        avg = op == dist.ReduceOp.AVG
        if avg:
            o = dist.AllreduceOptions()
            o.reduceOp = dist.ReduceOp.SUM
        log("reduce_op", "allreduce", next(k for k, v in _REDUCE_NAMES.items() if op == v))

        def run():
            self._gloo.allreduce([t.as_subclass(torch.Tensor) for t in tensors], o if avg else opts).wait()
            if avg:
                tensors[0].div_(self._size)
            return None

        return self._launch("allreduce", opts.asyncOp, tensors, tensors, run)

    def broadcast(self, tensors, opts):
        run = lambda: self._gloo.broadcast([t.as_subclass(torch.Tensor) for t in tensors], opts)
        return self._launch("broadcast", opts.asyncOp, tensors, tensors, run)

    def _allgather_base(self, output, input, opts):
        run = lambda: self._gloo._allgather_base(
            output.as_subclass(torch.Tensor), input.as_subclass(torch.Tensor)
        ).wait()
        return self._launch("allgather_base", opts.asyncOp, [input], [output], run)

    def _reduce_scatter_base(self, output, input, opts):
        def run():
            o = output.as_subclass(torch.Tensor)
            parts = list(input.as_subclass(torch.Tensor).chunk(self._size))
            return self._gloo.reduce_scatter([o], [parts], opts)

        return self._launch("reduce_scatter_base", opts.asyncOp, [input], [output], run)

    def alltoall_base(self, output, input, output_splits, input_splits, opts):
        def run():
            return self._gloo.alltoall_base(
                output.as_subclass(torch.Tensor), input.as_subclass(torch.Tensor), output_splits, input_splits, opts
            )

        return self._launch("alltoall_base", opts.asyncOp, [input], [output], run)

    def barrier(self, opts):
        return self._launch("barrier", opts.asyncOp, [], [], lambda: self._gloo.barrier(opts))

    # point to point: always async in torch (a Work per call)
    def send(self, tensors, dst, tag):
        run = lambda: self._gloo.send([tensors[0].as_subclass(torch.Tensor)], dst, 0)
        return self._launch("send", True, tensors, [], run, peer=dst)

    def recv(self, tensors, src, tag):
        run = lambda: self._gloo.recv([tensors[0].as_subclass(torch.Tensor)], src, 0)
        return self._launch("recv", True, [], tensors, run, peer=src)


def _finish(gloo_work) -> None:
    """The data's real move, over gloo, done before the call returns (its order is the model's)."""
    if gloo_work is not None:
        gloo_work.wait()


_DEFAULT_TIMEOUT = __import__("datetime").timedelta(seconds=120)
_REDUCE_NAMES = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "product": dist.ReduceOp.PRODUCT}
_REDUCE_NAMES.update(min=dist.ReduceOp.MIN, max=dist.ReduceOp.MAX)


# --- install --------------------------------------------------------------------------------------
def install() -> None:
    """Replace the CUDA calls above in this process (before `import mcr`)."""
    global _cudart
    _cudart = _load_cudart()
    cuda = torch.cuda
    for name, value in {
        "is_available": lambda: True,
        "device_count": lambda: GPUS,
        "current_device": current_device,
        "set_device": set_device,
        "get_device_properties": get_device_properties,
        "get_device_capability": get_device_capability,
        "current_stream": current_stream,
        "default_stream": default_stream,
        "set_stream": set_stream,
        "stream": stream,
        "Stream": Stream,
        "Event": Event,
        "synchronize": synchronize,
        "is_current_stream_capturing": is_current_stream_capturing,
    }.items():
        setattr(cuda, name, value)
    cuda.nccl = types.SimpleNamespace(version=lambda: (2, 27, 3))
    torch.futures.Future = CudaFuture
    dist.ProcessGroupNCCL = ProcessGroupNCCLModel
    dist.is_nccl_available = lambda: True
    os.environ.setdefault("MCR_BACKENDS", "gloo,nccl")
