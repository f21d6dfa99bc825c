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

Everything lands in `LOG`, one tuple per call: (what, thread name, ...). Each stream keeps its
queue of kernels and event records; an item runs with everything before it on its stream and
everything that stream waited on before it, as on a GPU. NCCL's kernels are held (they need their
peers): they run only when the host synchronizes on them (an event after them, their stream, the
device) or a test calls `gpu_runs()`, so "still in flight" is a state a test can hold; other work
runs when the host synchronizes on it or polls an event after it (`query`). So a host that only
polls an event queued behind an NCCL kernel (the runtime's wait for a host library's ready event,
on a stream that ran a blocking NCCL op) waits until something synchronizes: a scenario doing
that synchronizes first, as NCCL's peers would let the kernel end.

The caching allocator's view of CUDA memory is modelled too: each storage of a CudaLike tensor
has its allocation stream (the current stream where it was made: `cuda_like`,
`torch.empty(..., device="cuda")`, `Tensor.to("cuda")`, or an op's new output), every op on it is
a kernel that touches it on the current stream, `record_stream` marks a stream, and when the
storage is freed the log says which streams touched it off its allocation stream unrecorded (where
the real allocator would hand the block to new work too early). Pinned host memory
(`torch.empty(..., pin_memory=True)`, which CPU torch refuses) is ordinary CPU memory here, logged
as a pinned allocation; copies between it and CudaLike memory are kernels on the current stream.

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
import weakref

import torch
import torch.distributed as dist

LOG: list = []
_lock = threading.RLock()  # re-entered where a storage is freed inside a locked section
_ids = itertools.count(1)
_local = threading.local()  # .stream (current), .device
_streams: list = []  # every stream made: device synchronize and gpu_runs run all their queues
_launches: list = []  # NCCL's kernels, in launch order (`pending_launches`)
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
class _Mark:
    """One item of a stream's queue: a kernel or an event's record. `deps`: what the stream waited
    on before it was queued; `held`: an NCCL kernel, which runs only when the host synchronizes on
    it (its peers must launch theirs) or a test says the GPU runs."""

    __slots__ = ("name", "stream", "deps", "held", "done", "queued")

    def __init__(self, name, stream, deps, held):
        self.name, self.stream, self.deps, self.held = name, stream, deps, held
        self.done = self.queued = False


class Stream:
    def __init__(self, device=None, priority=0, name=None):
        self.id = next(_ids)
        self.device = _device(device)
        self.name = name or f"stream{self.id}"
        self.queue = []  # items not yet run, in order
        self._waits = []  # the items of the events waited on since the last item queued
        with _lock:
            _streams.append(self)
        log("new_stream", self.name)

    def wait_event(self, event) -> None:
        log("wait", self.name, event.name)
        with _lock:
            if event.mark is not None and not event.mark.done:
                self._waits.append(event.mark)
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
        with _lock:
            if self.queue:
                _run(self.queue[-1], force=True)

    def query(self) -> bool:
        with _lock:
            return not self.queue

    def enqueue(self, name, held=False) -> _Mark:
        """Queue an item here (run at once while the GPU keeps up; never, on a captured stream)."""
        with _lock:
            mark, self._waits = _Mark(name, self, self._waits, held), []
            if _keeps_up:
                mark.done = True
            elif self not in _capturing:
                mark.queued = True
                self.queue.append(mark)
            return mark

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
        self.mark = None  # its last record's item
        self.timing = enable_timing
        log("new_event", self.name, enable_timing)

    @property
    def done(self) -> bool:
        return self.mark is None or self.mark.done  # never recorded: complete, as CUDA says

    def record(self, stream=None) -> None:
        stream = stream or current_stream()
        self.stream = stream
        log("record", self.name, stream.name)
        self.mark = stream.enqueue(self.name)

    def wait(self, stream=None) -> None:
        (stream or current_stream()).wait_event(self)

    def query(self) -> bool:
        log("query", self.name)
        _check_capture("query", self.name)
        with _lock:
            return self.mark is None or _run(self.mark, force=False)

    def synchronize(self) -> None:
        log("sync", self.name)
        _check_capture("synchronize", self.name)
        with _lock:
            if self.mark is not None:
                _run(self.mark, force=True)

    def elapsed_time(self, end) -> float:
        return 0.25  # ms: what a comm log reads; never asserted on


def _run(mark, force) -> bool:
    """Run `mark` on the model's GPU with all it comes after: the items before it on its stream
    and, for each, what that stream had waited on. Under `_lock`. Not `force`d (the host polls):
    nothing runs where any of them is held. A captured item never runs. True if it ran."""
    if mark.done:
        return True
    if not mark.queued:
        return False
    todo, ran, seen = [mark], [], set()
    while todo:
        item = todo.pop()
        if item.done or id(item) in seen or not item.queued:
            continue
        queue = item.stream.queue
        upto = next(i for i, queued in enumerate(queue) if queued is item)
        for before in queue[: upto + 1]:
            if id(before) not in seen:
                seen.add(id(before))
                ran.append(before)
                todo.extend(before.deps)
    if not force and any(item.held for item in ran):
        return False
    for item in ran:
        item.done = True
    for stream_ in {id(item.stream): item.stream for item in ran}.values():
        stream_.queue[:] = [item for item in stream_.queue if not item.done]
    return True


_keeps_up = False  # set by gpu_runs(keep_up=True): every item runs as it is queued


def gpu_runs(keep_up=False) -> None:
    """The GPU catches up with everything queued so far; `keep_up`: and with all that follows
    (a script's end: finalize waits for everything)."""
    global _keeps_up
    log("gpu_runs")
    with _lock:
        _keeps_up = keep_up
        _run_all()


def _run_all() -> None:
    for stream_ in list(_streams):
        if stream_.queue:
            _run(stream_.queue[-1], force=True)


def synchronize(device=None) -> None:
    log("device_sync")
    _check_capture("synchronize", "device")
    with _lock:
        _run_all()


def pending_launches() -> list:
    """NCCL's kernels launched and not yet run (not those captured into a graph)."""
    with _lock:
        return [mark.name for mark in _launches if mark.queued and not mark.done]


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
    local_rank = os.environ.get("LOCAL_RANK") or os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")  # torchrun, mpiexec
    uuid = f"GPU-model-{os.uname().nodename}-{local_rank}-{index}"
    return types.SimpleNamespace(
        uuid=uuid, name="model GPU", major=CAPABILITY[0], minor=CAPABILITY[1], total_memory=1 << 34
    )


def get_device_capability(device=None):
    return CAPABILITY


# --- tensors, and the caching allocator's view of them --------------------------------------------
class CudaLike(torch.Tensor):
    """CPU memory that says it is on cuda:0: what the runtime reads of a tensor (`is_cuda`,
    `device`) is a GPU's; its math runs on the CPU, and results stay CudaLike. Each op on it is
    a kernel on the current stream that touches its storage (views and metadata are not)."""

    @property
    def is_cuda(self):
        return True

    @property
    def device(self):
        return torch.device("cuda", current_device())

    @classmethod
    def __torch_function__(cls, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "cpu" or (name == "to" and _target(args[1:], kwargs) == "cpu"):  # device to host
            _kernel("d2h", [args[0]])
            with torch._C.DisableTorchFunctionSubclass():
                return torch.Tensor.clone(args[0])
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        given = _tensors((args, kwargs))
        host = {_key(t) for t in given if not isinstance(t, CudaLike)}
        device = [t for t in given if isinstance(t, CudaLike)]
        made = [t for t in _tensors(out) if _key(t) not in host]
        new = [t for t in made if _key(t) not in {_key(d) for d in device}]
        in_place = (name.endswith("_") and not name.startswith("_")) or name == "__setitem__"
        if name not in _NO_KERNEL and (in_place or new or not made):  # not a view: a kernel
            _kernel(name, device + new)
        return _wrap(out, host)


# what launches no kernel on a tensor: its metadata (a view is told by its output's storage)
_NO_KERNEL = frozenset(
    {"data_ptr", "untyped_storage", "numel", "__get__", "element_size", "size", "dim", "stride"}
    | {"is_contiguous", "storage_offset", "__len__", "is_pinned", "__repr__", "__format__", "get_device"}
    | {"__hash__", "is_floating_point", "is_complex", "__reduce_ex__", "__setstate__"}
)


def _wrap(out, host=frozenset()):
    if type(out) is torch.Tensor:
        return out if _key(out) in host else out.as_subclass(CudaLike)
    if isinstance(out, (list, tuple)):
        return type(out)(_wrap(o, host) for o in out)
    return out


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return _tensors(list(value.values()))
    return []


def _target(args, kwargs):
    """The device type a `to(...)` call names, or None."""
    for where in [kwargs.get("device"), *args]:
        if isinstance(where, (str, torch.device)):
            return torch.device(where).type
    return None


class _Storage:
    """The allocator's record of one CudaLike storage: where it was made, who touched it where."""

    __slots__ = ("label", "stream", "ptr", "nbytes", "streams", "marks", "recorded")

    def __init__(self, label, stream_, ptr, nbytes):
        self.label, self.stream, self.ptr, self.nbytes = label, stream_, ptr, nbytes
        self.streams = set()  # every stream a kernel touched it on
        self.marks = []  # those kernels, while they have not run
        self.recorded = set()  # streams given to record_stream


_storages = {}  # id of a storage's Python object (kept while the storage lives) -> _Storage
_serial = itertools.count(1)


def _key(tensor) -> int:
    with torch._C.DisableTorchFunctionSubclass():
        return id(torch.Tensor.untyped_storage(tensor))


def _info(tensor, label=None, how="tensor") -> _Storage:
    """`tensor`'s storage record; one seen for the first time was made now, on the current stream."""
    with torch._C.DisableTorchFunctionSubclass():
        storage = torch.Tensor.untyped_storage(tensor)
    with _lock:
        info = _storages.get(id(storage))
        if info is None:
            info = _Storage(label or f"{how}#{next(_serial)}", current_stream(), storage.data_ptr(), storage.nbytes())
            _storages[id(storage)] = info
            weakref.finalize(storage, _freed, id(storage)).atexit = False
            log("alloc", info.label, info.stream.name)
        return info


def _kernel(name, tensors, held=False) -> _Mark:
    """A kernel on the current stream that touches the storages of `tensors`."""
    stream_ = current_stream()
    mark = stream_.enqueue(name, held)
    labels = []
    for tensor in tensors:
        info = _info(tensor, how=name)
        with _lock:
            info.streams.add(stream_)
            info.marks = [m for m in info.marks if not m.done] + [mark]
        labels.append(info.label)
    log("touch", name, stream_.name, labels)
    return mark


def record_stream(tensor, stream_) -> None:
    """Tensor.record_stream (torch's parses its stream before any override could see this one's)."""
    info = _info(tensor)
    with _lock:
        info.recorded.add(stream_)
    log("record_stream", info.label, stream_.name)


def _freed(key) -> None:
    """The storage went back to the allocator: the log names each stream that touched it off its
    allocation stream without record_stream (its block could go to new work before they ran)."""
    with _lock:
        info = _storages.pop(key, None)
    if info is not None:
        unrecorded = sorted(s.name for s in info.streams - info.recorded - {info.stream})
        log("free", info.label, info.stream.name, unrecorded)


def cuda_like(tensor: torch.Tensor, name=None) -> CudaLike:
    """`tensor` as device memory made on the current stream (a host-to-device copy there);
    `name`: its label in the log (default: h2d#N)."""
    out = tensor.as_subclass(CudaLike)
    _info(out, name, "h2d")
    _kernel("h2d", [out])
    return out


def label(tensor) -> str:
    return _info(tensor).label


def unfinished(tensor) -> list:
    """The kernels queued on `tensor`'s storage that have not run: a host reading or writing its
    memory now (MPI) would race them."""
    info = _info(tensor)
    with _lock:
        return [mark.name for mark in info.marks if mark.queued and not mark.done]


def unfinished_at(address: int):
    """(label, unfinished kernels) of the storage holding `address`; None for host memory."""
    with _lock:
        for info in _storages.values():
            if info.ptr <= address < info.ptr + max(1, info.nbytes):
                return info.label, [mark.name for mark in info.marks if mark.queued and not mark.done]
    return None


_empty = torch.empty
_to = torch._C.TensorBase.to


def empty(*size, device=None, pin_memory=False, **kwargs):
    """torch.empty: on a CUDA device, CudaLike memory made on the current stream; pinned host
    memory (which CPU torch refuses) is ordinary CPU memory, logged as pinned."""
    if pin_memory:
        tensor = _empty(*size, **kwargs)
        log("pinned", tensor.nbytes)
        return tensor
    if device is not None and torch.device(device).type == "cuda":
        out = _empty(*size, **kwargs).as_subclass(CudaLike)
        _info(out, how="empty")
        return out
    return _empty(*size, device=device, **kwargs)


def to(self, *args, **kwargs):
    """Tensor.to: to a CUDA device, a host-to-device copy into CudaLike memory."""
    if _target(args, kwargs) != "cuda":
        return _to(self, *args, **kwargs)
    rest = [a for a in args if not isinstance(a, (str, torch.device))]
    kwargs = {k: v for k, v in kwargs.items() if k != "device"}
    moved = _to(self, *rest, **kwargs) if rest or kwargs else self
    if isinstance(self, CudaLike):
        return moved
    return cuda_like(moved.clone() if moved is self else moved)


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
        _launches.append(stream.enqueue("nccl group", held=True))
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
            _launches.append(current_stream().enqueue(f"nccl {op}", held=True))
            _finish(run())
            return None
        stream = self._side_stream()
        ready = Event()
        ready.record(current_stream())  # syncStream
        stream.wait_event(ready)
        log("launch", op, stream.name, True, self.name_)
        _launches.append(stream.enqueue(f"nccl {op}", held=True))
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
                tensors[0].as_subclass(torch.Tensor).div_(self._size)  # inside NCCL's kernel
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
    torch.empty = empty
    torch.Tensor.to = to
    torch.Tensor.record_stream = record_stream
    dist.ProcessGroupNCCL = ProcessGroupNCCLModel
    dist.is_nccl_available = lambda: True
    os.environ.setdefault("MCR_BACKENDS", "gloo,nccl")
