"""gloo and nccl through torch.distributed's C++ process groups.

We construct `ProcessGroupGloo`/`ProcessGroupNCCL` directly on our own store instead of going
through `init_process_group`, so the runtime never touches torch's default group: users can
still call `dist.init_process_group(backend="mcr")` (or any other backend) beside it.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from ..handle import from_torch_work
from ..ops import REDUCE_OPS
from .base import Backend, BackendUnavailable

# The flat all-gather and reduce-scatter on torch's C++ backend objects (what _make_pg builds):
# the public names where this torch offers them there, else the private ones torch 2.13 still
# has (its public all_gather_single/reduce_scatter_single live on ProcessGroup only). Resolved
# once, as Megatron's mappings do.
_CppBackend = torch._C._distributed_c10d.Backend
_AllgatherOptions = torch._C._distributed_c10d.AllgatherOptions  # not re-exported by torch.distributed
_all_gather_single = getattr(_CppBackend, "all_gather_single", None) or _CppBackend._allgather_base
_reduce_scatter_single = getattr(_CppBackend, "reduce_scatter_single", None) or _CppBackend._reduce_scatter_base

# Aborted process groups, kept until the process ends (TorchDistBackend.abort)
ABORTED = []


class TorchDistBackend(Backend):
    _all_gather_single = staticmethod(_all_gather_single)
    _reduce_scatter_single = staticmethod(_reduce_scatter_single)
    p2p_completes_alone = True  # the library marks a send/recv Work done without a wait
    reduce_scatter_completes_alone = True  # ... and a reduce-scatter Work
    stream_ordered = True  # syncStream at issue, the current stream blocked at wait (CUDA tensors)

    def __init__(self, store, rank: int, world_size: int, timeout_s: float):
        # rank and world size: each group's come with new_group()
        self._store = store
        self._timeout = timedelta(seconds=timeout_s)
        # Options objects are built once per (kind, reduce op, async): allocating them per call
        # costs microseconds. `asyncOp` is torch's own flag: false runs an NCCL op on the
        # caller's current stream and returns no Work, as `dist.all_reduce` does.
        self._opts = {}

    def version(self) -> str:
        return f"torch {torch.__version__}"

    def _make_pg(self, store, group_rank, group_size, timeout):
        raise NotImplementedError

    def new_group(self, gid, ranks, group_rank, timeout=None):
        if group_rank < 0:
            return None
        store = dist.PrefixStore(f"{self.name}/{gid}/", self._store)
        return self._make_pg(store, group_rank, len(ranks), timeout or self._timeout)

    def abort(self, comm) -> None:
        """The ProcessGroup's own abort, as torch's _abort_process_group calls it. NCCL's ends
        its ops in flight; gloo's ends none, and its destructor waits for them (up to the op
        timeout), so an aborted group is kept, never destroyed while this process runs."""
        comm.abort()
        ABORTED.append(comm)

    def _handle_or_wait(self, work, async_op, keep=None):
        if async_op:
            return from_torch_work(work, keep)
        if work is not None:  # NCCL with asyncOp false returns none: the op is on the current stream
            work.wait()
        return None

    def _options(self, make, async_op, reduce_op=None):
        """One options object per (kind, reduce op, async), built at first use."""
        key = (make, reduce_op, async_op)
        opts = self._opts.get(key)
        if opts is None:
            opts = self._opts[key] = make()
            opts.asyncOp = async_op
            if reduce_op is not None:
                opts.reduceOp = REDUCE_OPS[reduce_op]
        return opts

    def all_reduce(self, g, tensor, reduce_op, async_op):
        return self._handle_or_wait(
            g.allreduce([tensor], self._options(dist.AllreduceOptions, async_op, reduce_op)), async_op
        )

    def reduce(self, g, tensor, dst, reduce_op, async_op):
        opts = dist.ReduceOptions()
        opts.reduceOp, opts.rootRank, opts.rootTensor, opts.asyncOp = REDUCE_OPS[reduce_op], dst, 0, async_op
        return self._handle_or_wait(g.reduce([tensor], opts), async_op)

    def broadcast(self, g, tensor, src, async_op):
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor, opts.asyncOp = src, 0, async_op
        return self._handle_or_wait(g.broadcast([tensor], opts), async_op)

    def all_gather(self, g, output_list, tensor, async_op):
        opts = self._options(_AllgatherOptions, async_op)
        return self._handle_or_wait(g.allgather([output_list], [tensor], opts), async_op)

    def all_gather_into_tensor(self, g, output, tensor, async_op):
        opts = self._options(_AllgatherOptions, async_op)
        return self._handle_or_wait(self._all_gather_single(g, output, tensor, opts), async_op)

    def gather(self, g, tensor, gather_list, dst, async_op):
        opts = dist.GatherOptions()
        opts.rootRank, opts.asyncOp = dst, async_op
        outputs = [gather_list] if gather_list is not None else []
        return self._handle_or_wait(g.gather(outputs, [tensor], opts), async_op)

    def scatter(self, g, tensor, scatter_list, src, async_op):
        opts = dist.ScatterOptions()
        opts.rootRank, opts.asyncOp = src, async_op
        inputs = [scatter_list] if scatter_list is not None else []
        return self._handle_or_wait(g.scatter([tensor], inputs, opts), async_op)

    def reduce_scatter(self, g, output, input_list, reduce_op, async_op):
        opts = self._options(dist.ReduceScatterOptions, async_op, reduce_op)
        work = g.reduce_scatter([output], [input_list], opts)
        return self._completing(self._handle_or_wait(work, async_op), self.reduce_scatter_completes_alone)

    def reduce_scatter_tensor(self, g, output, input, reduce_op, async_op):
        opts = self._options(dist.ReduceScatterOptions, async_op, reduce_op)
        work = self._reduce_scatter_single(g, output, input, opts)
        return self._completing(self._handle_or_wait(work, async_op), self.reduce_scatter_completes_alone)

    def all_to_all(self, g, output_list, input_list, async_op):
        opts = self._options(dist.AllToAllOptions, async_op)
        return self._handle_or_wait(g.alltoall(output_list, input_list, opts), async_op)

    def all_to_all_single(self, g, output, input, output_splits, input_splits, async_op):
        opts = self._options(dist.AllToAllOptions, async_op)
        work = g.alltoall_base(output, input, output_splits or [], input_splits or [], opts)
        return self._handle_or_wait(work, async_op)

    def send(self, g, tensor, dst, tag, async_op):
        return self._p2p(self._handle_or_wait(g.send([tensor], dst, tag), async_op))

    def recv(self, g, tensor, src, tag, async_op):
        if src is None:  # any source (the runtime issues it async): the Work names the sender
            work = g.recv_anysource([tensor], tag)
            handle = self._p2p(from_torch_work(work))
            handle.source = work._source_rank
            return handle
        return self._p2p(self._handle_or_wait(g.recv([tensor], src, tag), async_op))

    def _p2p(self, handle):
        return self._completing(handle, self.p2p_completes_alone)

    @staticmethod
    def _completing(handle, alone: bool):
        """Mark an async handle whose Work the library sets done only inside its wait()."""
        if handle is not None and not alone:
            handle.completes_alone = False
        return handle

    def barrier(self, g, timeout, async_op):
        opts = self._options(dist.BarrierOptions, async_op)
        if timeout is not None:
            opts = dist.BarrierOptions()
            opts.timeout, opts.asyncOp = timeout, async_op
        return self._handle_or_wait(g.barrier(opts), async_op)


class GlooBackend(TorchDistBackend):
    name = "gloo"
    call_timeouts = True  # ProcessGroupGloo fails an op whose options' timeout passed
    p2p_completes_alone = False  # gloo marks a send/recv Work done only in its wait()
    reduce_scatter_completes_alone = False  # its reduce-scatter Works too (torch 2.13; tests/mcr/test_robustness.py)
    devices = frozenset({"cpu"})
    # the ops ProcessGroupGloo runs on CUDA tensors itself (its Async*CUDAWork classes: pinned
    # copies on a side stream ordered after the caller's, copied back on wait); the runtime
    # stages the others (send/recv, the tensor all-gather and reduce-scatters, the list all-to-all)
    CUDA_METHODS = frozenset(
        {"all_reduce", "reduce", "broadcast", "all_gather", "gather", "scatter", "all_to_all_single"}
    )

    def __init__(self, store, rank, world_size, timeout_s):
        if not dist.is_gloo_available():
            raise BackendUnavailable("this torch build has no gloo")
        super().__init__(store, rank, world_size, timeout_s)
        if torch.cuda.is_available():  # natively or staged by the runtime
            self.devices = frozenset({"cpu", "cuda"})

    @classmethod
    def expected_devices(cls, gpu):
        return frozenset({"cpu", "cuda"} if gpu else {"cpu"})

    def reads_device(self, method, dtype, reduce_op):
        return method in self.CUDA_METHODS

    def _make_pg(self, store, group_rank, group_size, timeout):
        return dist.ProcessGroupGloo(store, group_rank, group_size, timeout)

    def all_to_all(self, g, output_list, input_list, async_op):
        # gloo's list all-to-all needs equal sizes; packing into one uneven all_to_all_single does not
        packed_in = torch.cat([t.reshape(-1) for t in input_list])
        packed_out = torch.empty(sum(t.numel() for t in output_list), dtype=packed_in.dtype)
        work = g.alltoall_base(
            packed_out,
            packed_in,
            [t.numel() for t in output_list],
            [t.numel() for t in input_list],
            self._options(dist.AllToAllOptions, async_op),
        )

        def copy_out():
            for out, part in zip(output_list, packed_out.split([t.numel() for t in output_list])):
                out.copy_(part.view_as(out))

        if async_op:
            return from_torch_work(work, (packed_in, packed_out), copy_out)
        work.wait()
        copy_out()
        return None


# What torch's ProcessGroupNCCL maps to NCCL types and ops (its `ncclDataType` and `ncclOp`):
# no int16, unsigned wider than 8 bits or complex; AVG needs NCCL 2.10, which every torch this
# runs on has. `supports` refuses the rest, so the choice falls back instead of NCCL failing.
NCCL_DTYPES = frozenset(
    {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32, torch.int64}
    | {torch.bool, torch.float8_e5m2, torch.float8_e4m3fn}
)
NCCL_REDUCE_OPS = frozenset({"sum", "avg", "product", "min", "max"})
FP8 = frozenset({torch.float8_e5m2, torch.float8_e4m3fn})


def _device():
    return torch.device("cuda", torch.cuda.current_device())


def _split_color(ranks) -> int:
    """A group's colour for ncclCommSplit: the same on its members, a C int (torch's rule)."""
    return abs(hash(tuple(ranks))) % (1 << 31)


class NcclBackend(TorchDistBackend):
    name = "nccl"
    devices = frozenset({"cuda"})
    closing_barrier = False  # finalize() meets on the host libraries; NCCL's ops are done by then
    p2p_tags = False  # NCCL matches a pair's sends to its receives in order, whatever the tag
    gpu_per_rank = True  # "Duplicate GPU detected": two ranks of a communicator on one GPU
    gpu_native = True  # kernels on CUDA streams: run as torch runs them (mcr.stream_ordered)
    native_avg = True  # ncclAvg (NCCL 2.10+, which every torch this runs on has)
    # the flat all-gather and reduce-scatter through the object, as its own methods
    _all_gather_single = staticmethod(lambda g, *args: getattr(g, _all_gather_single.__name__)(*args))
    _reduce_scatter_single = staticmethod(lambda g, *args: getattr(g, _reduce_scatter_single.__name__)(*args))

    def __init__(self, store, rank, world_size, timeout_s):
        if not torch.cuda.is_available():
            raise BackendUnavailable("no GPU (torch.cuda.is_available() is False)")
        if not dist.is_nccl_available():
            raise BackendUnavailable("this torch build has no NCCL")
        super().__init__(store, rank, world_size, timeout_s)
        self._made = []  # its groups, oldest first: shut down newest first, as torch does
        self._capability = torch.cuda.get_device_capability()  # the bound GPU's (NCCL's fp8 needs sm90)

    @classmethod
    def expected_devices(cls, gpu):
        if not gpu:
            raise BackendUnavailable("no GPU (torch.cuda.is_available() is False)")
        return cls.devices

    def version(self) -> str:
        return "nccl " + ".".join(map(str, torch.cuda.nccl.version()))

    def _handle_or_wait(self, work, async_op, keep=None):
        """An async op's handle is torch's Work itself (`mcr.stream_ordered`); a blocking op ran
        on the caller's current stream and returned none (an older torch's Work is waited on)."""
        if async_op:
            return work
        if work is not None:
            work.wait()
        return None

    def new_group(self, gid, ranks, group_rank, timeout=None):
        """A group every world rank creates (`mcr.new_group`): its communicator split from the
        world's (ncclCommSplit: no new bootstrap), each member's colour its ranks', and every
        other rank taking part with no colour, as NCCL requires and torch's new_group does."""
        world = self._made[0] if self._made else None
        if group_rank < 0:
            if world is not None:
                world.perform_nocolor_split(_device())
            return None
        store = dist.PrefixStore(f"{self.name}/{gid}/", self._store)
        return self._make_pg(store, group_rank, len(ranks), timeout or self._timeout, split=(world, ranks))

    def member_group(self, key, ranks, group_rank, timeout=None):
        """A group its members alone create (torch's hook): a communicator of its own, since a
        split needs every rank of the world."""
        store = dist.PrefixStore(f"{self.name}/{key}/", self._store)
        return self._make_pg(store, group_rank, len(ranks), timeout or self._timeout)

    def _make_pg(self, store, group_rank, group_size, timeout, split=None):
        """Its communicator made now, on the bound device: made lazily, the first op's issue
        would block until every member arrived (a blocking issue breaks the mixing rules: an
        isend before an MPI op on one rank, after it on the peer, would deadlock). `split`:
        (the world's group, this group's world ranks) where every world rank creates it."""
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        if split is not None and split[0] is not None:
            opts.split_from, opts.split_color = split[0], _split_color(split[1])
        pg = dist.ProcessGroupNCCL(store, group_rank, group_size, opts)
        pg.eager_connect_single_device(_device())
        self._made.append(pg)
        return pg

    def release(self, comm) -> None:
        """ProcessGroupNCCL's own end, as torch's destroy_process_group calls it: left to the
        destructor at exit, it warns that destroy_process_group() was not called, and its
        watchdog, still polling, reported an 'unhandled system error' once on the GPU machine."""
        if comm in self._made:
            self._made.remove(comm)
            comm.shutdown()

    def abort(self, comm) -> None:
        if comm in self._made:  # not shut down again at finalize
            self._made.remove(comm)
        super().abort(comm)

    def shutdown(self):
        while self._made:
            self._made.pop().shutdown()

    def supports(self, family, dtype, reduce_op, device_type):
        return (
            device_type == "cuda"
            and dtype in NCCL_DTYPES
            and (reduce_op is None or reduce_op in NCCL_REDUCE_OPS)
            and self.refusal(family, dtype, reduce_op, device_type) is None
        )

    def refusal(self, family, dtype, reduce_op, device_type):
        if reduce_op is not None and dtype in FP8 and self._capability < (9, 0):
            major, minor = self._capability
            return f"reduces float8 only on GPUs of compute capability 9.0 or newer (this one: {major}.{minor})"
        return None

    def reads_device(self, method, dtype, reduce_op):
        return True

    # Every send and receive is an NCCL group on the group's communicator, as in a batch: outside
    # one, ProcessGroupNCCL makes a 2-rank communicator per pair at the first send, blocking at
    # issue until the peer arrives (and its own stream and buffers).
    def send(self, g, tensor, dst, tag, async_op):
        return self.p2p_batch(g, [("send", tensor, dst)], async_op)

    def recv(self, g, tensor, src, tag, async_op):
        if src is None:  # the sender chose NCCL too (it cannot know the receive is from anyone)
            raise ValueError(
                "a receive from any source cannot run on nccl, which has none; pass src, or run both the send "
                "and the receive on a backend that has one (backend='mpi' or 'gloo' on both)"
            )
        return self.p2p_batch(g, [("recv", tensor, src)], async_op)

    def p2p_batch(self, g, ops, async_op):
        """Sends and receives [(\"send\" or \"recv\", tensor, group peer)] as one NCCL group
        (torch's coalescing manager for batch_isend_irecv): one Work for all of them."""
        device = ops[0][1].device
        g._start_coalescing(device)
        for kind, tensor, peer in ops:
            (g.send if kind == "send" else g.recv)([tensor], peer, 0)
        work = g._end_coalescing(device)
        if async_op:
            return work
        if work is not None:
            work.wait()
        return None
