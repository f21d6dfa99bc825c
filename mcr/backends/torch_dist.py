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
_all_gather_single = getattr(_CppBackend, "all_gather_single", None) or _CppBackend._allgather_base
_reduce_scatter_single = getattr(_CppBackend, "reduce_scatter_single", None) or _CppBackend._reduce_scatter_base

# Aborted process groups, kept until the process ends (TorchDistBackend.abort)
ABORTED = []


class TorchDistBackend(Backend):
    p2p_completes_alone = True  # the library marks a send/recv Work done without a wait
    reduce_scatter_completes_alone = True  # ... and a reduce-scatter Work
    stream_ordered = True  # syncStream at issue, the current stream blocked at wait (CUDA tensors)

    def __init__(self, store, rank: int, world_size: int, timeout_s: float):
        # rank and world size: each group's come with new_group()
        self._store = store
        self._timeout = timedelta(seconds=timeout_s)
        # Options objects are built once: allocating them per call costs microseconds.
        self._allreduce_opts = {}
        self._reduce_scatter_opts = {}
        self._barrier_opts = dist.BarrierOptions()
        self._all_to_all_opts = dist.AllToAllOptions()

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

    @staticmethod
    def _handle_or_wait(work, async_op, keep=None):
        if async_op:
            return from_torch_work(work, keep)
        work.wait()
        return None

    @staticmethod
    def _reduce_opts(cache, make, reduce_op):
        opts = cache.get(reduce_op)
        if opts is None:
            opts = cache[reduce_op] = make()
            opts.reduceOp = REDUCE_OPS[reduce_op]
        return opts

    def _ar_opts(self, reduce_op):
        return self._reduce_opts(self._allreduce_opts, dist.AllreduceOptions, reduce_op)

    def all_reduce(self, g, tensor, reduce_op, async_op):
        return self._handle_or_wait(g.allreduce([tensor], self._ar_opts(reduce_op)), async_op)

    def reduce(self, g, tensor, dst, reduce_op, async_op):
        opts = dist.ReduceOptions()
        opts.reduceOp, opts.rootRank, opts.rootTensor = REDUCE_OPS[reduce_op], dst, 0
        return self._handle_or_wait(g.reduce([tensor], opts), async_op)

    def broadcast(self, g, tensor, src, async_op):
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = src, 0
        return self._handle_or_wait(g.broadcast([tensor], opts), async_op)

    def all_gather(self, g, output_list, tensor, async_op):
        return self._handle_or_wait(g.allgather([output_list], [tensor]), async_op)

    def all_gather_into_tensor(self, g, output, tensor, async_op):
        return self._handle_or_wait(_all_gather_single(g, output, tensor), async_op)

    def gather(self, g, tensor, gather_list, dst, async_op):
        opts = dist.GatherOptions()
        opts.rootRank = dst
        outputs = [gather_list] if gather_list is not None else []
        return self._handle_or_wait(g.gather(outputs, [tensor], opts), async_op)

    def scatter(self, g, tensor, scatter_list, src, async_op):
        opts = dist.ScatterOptions()
        opts.rootRank = src
        inputs = [scatter_list] if scatter_list is not None else []
        return self._handle_or_wait(g.scatter([tensor], inputs, opts), async_op)

    def _rs_opts(self, reduce_op):
        return self._reduce_opts(self._reduce_scatter_opts, dist.ReduceScatterOptions, reduce_op)

    def reduce_scatter(self, g, output, input_list, reduce_op, async_op):
        work = g.reduce_scatter([output], [input_list], self._rs_opts(reduce_op))
        return self._completing(self._handle_or_wait(work, async_op), self.reduce_scatter_completes_alone)

    def reduce_scatter_tensor(self, g, output, input, reduce_op, async_op):
        work = _reduce_scatter_single(g, output, input, self._rs_opts(reduce_op))
        return self._completing(self._handle_or_wait(work, async_op), self.reduce_scatter_completes_alone)

    def all_to_all(self, g, output_list, input_list, async_op):
        return self._handle_or_wait(g.alltoall(output_list, input_list, self._all_to_all_opts), async_op)

    def all_to_all_single(self, g, output, input, output_splits, input_splits, async_op):
        work = g.alltoall_base(output, input, output_splits or [], input_splits or [], self._all_to_all_opts)
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
        opts = self._barrier_opts
        if timeout is not None:
            opts = dist.BarrierOptions()
            opts.timeout = timeout
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
            self._all_to_all_opts,
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


class NcclBackend(TorchDistBackend):
    name = "nccl"
    devices = frozenset({"cuda"})
    closing_barrier = False  # finalize() meets on the host libraries; NCCL's ops are done by then
    p2p_tags = False  # NCCL matches a pair's sends to its receives in order, whatever the tag
    gpu_per_rank = True  # "Duplicate GPU detected": two ranks of a communicator on one GPU

    def __init__(self, store, rank, world_size, timeout_s):
        if not torch.cuda.is_available():
            raise BackendUnavailable("no GPU (torch.cuda.is_available() is False)")
        if not dist.is_nccl_available():
            raise BackendUnavailable("this torch build has no NCCL")
        super().__init__(store, rank, world_size, timeout_s)
        self._made = []  # its groups, oldest first: shut down newest first, as torch does

    @classmethod
    def expected_devices(cls, gpu):
        if not gpu:
            raise BackendUnavailable("no GPU (torch.cuda.is_available() is False)")
        return cls.devices

    def version(self) -> str:
        return "nccl " + ".".join(map(str, torch.cuda.nccl.version()))

    def _make_pg(self, store, group_rank, group_size, timeout):
        """Its communicator made now, on the bound device: made lazily, the first op's issue
        would block until every member arrived (a blocking issue breaks the mixing rules: an
        isend before an MPI op on one rank, after it on the peer, would deadlock)."""
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        pg = dist.ProcessGroupNCCL(store, group_rank, group_size, opts)
        pg.eager_connect_single_device(torch.device("cuda", torch.cuda.current_device()))
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
        return device_type == "cuda" and dtype in NCCL_DTYPES and (reduce_op is None or reduce_op in NCCL_REDUCE_OPS)

    def reads_device(self, method, dtype, reduce_op):
        return True

    def recv(self, g, tensor, src, tag, async_op):
        if src is None:  # the sender chose NCCL too (it cannot know the receive is from anyone)
            raise ValueError(
                "a receive from any source cannot run on nccl, which has none; pass src, or run both the send "
                "and the receive on a backend that has one (backend='mpi' or 'gloo' on both)"
            )
        return super().recv(g, tensor, src, tag, async_op)
