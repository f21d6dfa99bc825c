"""The torch.distributed backend "mcr": `dist.init_process_group(backend="mcr")` runs every
collective of torch, DDP, FSDP and TorchRec through the runtime's per-call choice.

`import mcr` registers it. Two ways to start:

- `dist.init_process_group(backend="mcr")` under torchrun (or any env:// / tcp:// init):
  when the runtime is not running yet, the default group starts it on torch's own store
  (prefix "mcr/"), so no second port is needed. `pg_options` may carry the runtime config
  (a dict or `mcr.RuntimeConfig`).
- `mcr.hooks.torch_backend.init_process_group(config)` under any launcher, mpiexec included
  (which sets no RANK/MASTER_ADDR for torch): starts the runtime first and gives torch the
  runtime's store, rank and world size.

If `mcr.init()` already ran, the default group uses that runtime (and does not finalize it).

`dist.new_group(ranks, backend="mcr")` (or any new_group under an "mcr" default group) builds
an mcr group over the same global ranks. torch calls the creator on member ranks only, so the
group is built among members alone: gloo on the group's store, MPI by MPI_Comm_create_group.

Why a `dist.ProcessGroup` subclass: a Python subclass of the C++ `Backend` has no constructor,
while ProcessGroup's pybind trampoline forwards C++ calls (DDP's reducer, functional
collectives) to these Python methods. The runtime's gloo group is also registered as the
group's cpu backend, and its NCCL group (gloo's where the group has none) as its cuda backend, so
C++ paths that ask for the device backend directly (monitored_barrier, `torch.ops.c10d.*` under
torch.compile) still work; those few calls run there, unchosen. torch's coalescing manager never
reaches them: `_start_coalescing`/`_end_coalescing` are this class's own (NCCL's would turn the
ops between them into null Works), and the Work `_end_coalescing` returns waits for every op
issued in between, whichever backend ran it.

Both lean on torch's backend plugin API, which changes between releases: outside the torch
versions in `mcr.hooks.versions.TESTED`, registering warns with the tested range.
"""

from __future__ import annotations

import contextlib
import itertools
from datetime import timedelta

import torch
import torch.distributed as dist

from .. import api
from .. import env as launch_env
from ..group import Group
from ..ops import ReduceOp
from ..stream_ordered import then
from . import versions
from .work import DONE, HandleWork, handle_work

BACKEND_NAME = "mcr"

_GLOO = dist.ProcessGroup.BackendType.GLOO
_NCCL = dist.ProcessGroup.BackendType.NCCL
_world_epoch = itertools.count()  # distinguishes torch groups across init/destroy cycles
_epoch = 0
_adopt_runtime = False  # see adopting_runtime(): the runtime we started ends with torch's group

_all_reduce = api.all_reduce  # bound once: the hot path skips module lookups
_NO_TIMEOUT = timedelta(0)  # options' timeouts below it are torch's "unset" (kUnsetTimeout, -1 ms)
# torch's ProcessGroup methods give every options argument a default (Python callers leave it
# out: `pg.allreduce([t])`); C++ callers always pass one. Never modified, so shared.
_DEFAULT_OPTS = {
    name: getattr(torch._C._distributed_c10d, name)()
    for name in (
        "AllreduceOptions",
        "AllreduceCoalescedOptions",
        "ReduceOptions",
        "BroadcastOptions",
        "AllgatherOptions",
        "GatherOptions",
        "ScatterOptions",
        "ReduceScatterOptions",
        "AllToAllOptions",
        "BarrierOptions",
    )
}


class RuntimeProcessGroup(dist.ProcessGroup):
    """One torch process group backed by one mcr Group; ranks in and out are group ranks."""

    def __init__(self, group: Group, owns_runtime: bool = False):
        super().__init__(group.rank, group.size)  # the (store, ...) overload rejects Python subclasses
        self.mcr_group = group
        self._ranks = group.ranks  # group rank -> global rank, for roots and peers
        self._owns_runtime = owns_runtime
        self._coalesced = None  # between _start_coalescing and _end_coalescing: the Works made
        if "gloo" in group.comms:
            self._register_backend(torch.device("cpu"), _GLOO, group.comms["gloo"])
        if "nccl" in group.comms:
            self._register_backend(torch.device("cuda"), _NCCL, group.comms["nccl"])
        elif "gloo" in group.comms and torch.cuda.is_available():
            self._register_backend(torch.device("cuda"), _GLOO, group.comms["gloo"])

    # --- identity ------------------------------------------------------------------------------
    def getBackendName(self):  # noqa: N802  (torch's ProcessGroup method name)
        return BACKEND_NAME

    def name(self):
        return BACKEND_NAME

    def shutdown(self):
        """torch's destroy_process_group: the group's communicators go back to their libraries;
        the default group that started the runtime finalizes it."""
        if self._owns_runtime and api.is_initialized():
            api.finalize()  # prints/writes the comm log when enabled
        elif api.is_initialized() and self.mcr_group is not api.runtime().world:
            api.runtime().release_group(self.mcr_group)
        self._owns_runtime = False

    def abort(self):
        """torch's _abort_process_group: tear down now, without waiting for ops in flight or peers."""
        if self._owns_runtime and api.is_initialized():
            api.abort()
        elif api.is_initialized() and self.mcr_group is not api.runtime().world:
            api.runtime().abort_group(self.mcr_group)
        self._owns_runtime = False

    # --- coalescing: torch's `_coalescing_manager(group, device)` --------------------------------
    def _start_coalescing(self, device):
        if self._coalesced is not None:
            raise RuntimeError("mcr backend: coalescing started twice on one group; end the first block first")
        self._coalesced = []

    def _end_coalescing(self, device):
        """One Work for every op issued since `_start_coalescing` (the runtime runs each at once,
        in order, on its chosen backend; nothing is deferred, so nothing is merged)."""
        works, self._coalesced = self._coalesced or [], None
        handles = [h for work in works for h in (work.handles() if isinstance(work, HandleWork) else [work])]
        return handle_work(handles, []) if handles else DONE

    # --- collectives ---------------------------------------------------------------------------
    def allreduce(self, tensors, opts=_DEFAULT_OPTS["AllreduceOptions"]):
        if len(tensors) != 1:
            return self.allreduce_coalesced(tensors, opts)
        if tensors[0].is_sparse:  # only gloo reduces sparse tensors: run there, unchosen
            return self._on_gloo("sparse all_reduce").allreduce(tensors, opts)
        async_op = opts.asyncOp
        handle = _all_reduce(tensors[0], _op(opts.reduceOp), self.mcr_group, async_op)
        return DONE if handle is None else self._work(handle, tensors)

    def allreduce_coalesced(self, tensors, opts=_DEFAULT_OPTS["AllreduceCoalescedOptions"]):
        """One all-reduce on a flat copy: many small tensors cost one op, not many."""
        if not tensors:
            return DONE
        flat = torch.cat([t.reshape(-1) for t in tensors])
        handle = api.all_reduce(flat, _op(opts.reduceOp), self.mcr_group, True)
        handle = then(handle, lambda: _unflatten(flat, tensors))
        return self._work_or_wait(handle, tensors, opts.asyncOp)

    def reduce(self, tensors, opts=_DEFAULT_OPTS["ReduceOptions"]):
        tensor = tensors[opts.rootTensor]
        handle = api.reduce(tensor, self._ranks[opts.rootRank], _op(opts.reduceOp), self.mcr_group, opts.asyncOp)
        return self._work(handle, tensors)

    def broadcast(self, tensors, opts=_DEFAULT_OPTS["BroadcastOptions"]):
        tensor = tensors[opts.rootTensor]
        handle = api.broadcast(tensor, self._ranks[opts.rootRank], self.mcr_group, opts.asyncOp)
        return self._work(handle, tensors)

    def allgather(self, output_lists, inputs, opts=_DEFAULT_OPTS["AllgatherOptions"]):
        _single("allgather", inputs)
        outputs = output_lists[0]
        handle = api.all_gather(outputs, inputs[0], self.mcr_group, opts.asyncOp)
        # the future carries what NCCL's does, [ranks' tensors stacked], which comm hooks index as
        # value()[0][rank] or [rank, ...] (torch's quantization hooks); made only when asked for
        return self._work(handle, lambda: [torch.stack(outputs)])

    def all_gather_single(self, output, input, opts=_DEFAULT_OPTS["AllgatherOptions"]):
        handle = api.all_gather_into_tensor(output, input, self.mcr_group, opts.asyncOp)
        return self._work(handle, [output])

    _allgather_base = all_gather_single  # the pre-2.13 name, still called by some libraries

    def allgather_coalesced(self, output_lists, inputs, opts=_DEFAULT_OPTS["AllgatherOptions"]):
        # torch's lists are per rank, then per tensor: output_lists[rank][i] receives inputs[i] of rank
        handles = [
            api.all_gather([per_rank[i] for per_rank in output_lists], t, self.mcr_group, True)
            for i, t in enumerate(inputs)
        ]
        return self._work_or_wait(handles, output_lists, opts.asyncOp)

    def all_gather_single_coalesced(self, outputs, inputs, opts=_DEFAULT_OPTS["AllgatherOptions"]):
        handles = [api.all_gather_into_tensor(o, i, self.mcr_group, True) for o, i in zip(outputs, inputs)]
        return self._work_or_wait(handles, outputs, opts.asyncOp)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_lists, inputs, opts=_DEFAULT_OPTS["GatherOptions"]):
        _single("gather", inputs)
        gather_list = output_lists[0] if output_lists else None
        handle = api.gather(inputs[0], gather_list, self._ranks[opts.rootRank], self.mcr_group, opts.asyncOp)
        return self._work(handle, output_lists)

    def scatter(self, outputs, input_lists, opts=_DEFAULT_OPTS["ScatterOptions"]):
        _single("scatter", outputs)
        scatter_list = input_lists[0] if input_lists else None
        handle = api.scatter(outputs[0], scatter_list, self._ranks[opts.rootRank], self.mcr_group, opts.asyncOp)
        return self._work(handle, outputs)

    def reduce_scatter(self, outputs, input_lists, opts=_DEFAULT_OPTS["ReduceScatterOptions"]):
        _single("reduce_scatter", outputs)
        handle = api.reduce_scatter(outputs[0], input_lists[0], _op(opts.reduceOp), self.mcr_group, opts.asyncOp)
        return self._work(handle, outputs)

    def reduce_scatter_single(self, output, input, opts=_DEFAULT_OPTS["ReduceScatterOptions"]):
        handle = api.reduce_scatter_tensor(output, input, _op(opts.reduceOp), self.mcr_group, opts.asyncOp)
        return self._work(handle, [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=_DEFAULT_OPTS["ReduceScatterOptions"]):
        op = _op(opts.reduceOp)
        handles = [api.reduce_scatter_tensor(o, i, op, self.mcr_group, True) for o, i in zip(outputs, inputs)]
        return self._work_or_wait(handles, outputs, opts.asyncOp)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_to_all_single(self, output, input, output_splits, input_splits, opts=_DEFAULT_OPTS["AllToAllOptions"]):
        # Uneven splits (TorchRec's KJT exchange) differ by rank; the runtime agrees on one
        # size before choosing, so every rank picks the same backend (api.all_to_all_single).
        handle = api.all_to_all_single(
            output, input, output_splits or None, input_splits or None, self.mcr_group, opts.asyncOp
        )
        return self._work(handle, [output])

    alltoall_base = all_to_all_single

    def alltoall(self, outputs, inputs, opts=_DEFAULT_OPTS["AllToAllOptions"]):
        handle = api.all_to_all(outputs, inputs, self.mcr_group, opts.asyncOp)
        return self._work(handle, outputs)

    def barrier(self, opts=_DEFAULT_OPTS["BarrierOptions"]):
        timeout = opts.timeout if opts.timeout >= _NO_TIMEOUT else None  # unset: negative
        return self._work(api.barrier(self.mcr_group, opts.asyncOp, timeout=timeout), [])

    # --- point to point: torch's send/recv have no async flag; torch waits when it must -------
    def send(self, tensors, dst, tag):
        return self._work(api.isend(tensors[0], self._ranks[dst], self.mcr_group, tag), tensors)

    def recv(self, tensors, src, tag):
        return self._work(api.irecv(tensors[0], self._ranks[src], self.mcr_group, tag), tensors)

    def recv_anysource(self, tensors, tag):
        return self._work(api.irecv(tensors[0], None, self.mcr_group, tag), tensors)

    # --- helpers -------------------------------------------------------------------------------
    def _on_gloo(self, what):
        gloo = self.mcr_group.comms.get("gloo")
        if gloo is None:
            why = api.available_backends().get("gloo") or "not started"
            raise ValueError(f"mcr backend: {what} runs on gloo, which is unavailable here ({why})")
        return gloo

    def _work(self, handle, result):
        """The Work for an op's handle (None: a blocking op, done); kept while coalescing. A GPU
        library's op (NCCL) is torch's Work already: its future is torch's CUDA-aware one."""
        if handle is None:
            return DONE
        work = handle if isinstance(handle, dist.Work) else handle_work(handle, result)
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    def _work_or_wait(self, handles, result, async_op):
        """Coalesced ops run async inside; a blocking caller gets them finished."""
        work = self._work(handles, result)
        if async_op:
            return work
        work.wait()
        return DONE


# torch hands a fresh ReduceOp per call; mapping it (by its enum's int, the cheapest key: a
# pybind enum hashes slowly) to one canonical enum object lets the groups' route caches
# match by identity.
_CANONICAL_OPS = {
    int(op): op
    for op in (
        ReduceOp.SUM,
        ReduceOp.AVG,
        ReduceOp.PRODUCT,
        ReduceOp.MIN,
        ReduceOp.MAX,
        ReduceOp.BAND,
        ReduceOp.BOR,
        ReduceOp.BXOR,
    )
}


_TORCH_SUM, _SUM = dist.ReduceOp.SUM, _CANONICAL_OPS[int(ReduceOp.SUM)]


def _op(reduce_op):
    if reduce_op == _TORCH_SUM:  # the usual op, by the cheapest test (half the lookup's cost)
        return _SUM
    op = _CANONICAL_OPS.get(reduce_op.op.value)
    if op is None:
        raise ValueError(
            f"mcr backend: reduce op {reduce_op.op} is not supported (PREMUL_SUM: scale the tensor, then use SUM)"
        )
    return op


def _single(name, tensors):
    if len(tensors) != 1:
        raise ValueError(
            f"mcr backend: {name} takes one tensor per rank, got {len(tensors)} (multi-device lists are not supported)"
        )


def _unflatten(flat, tensors):
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


# --- creating groups ---------------------------------------------------------------------------
def _world_runtime(opts, pg_options):
    """The runtime for torch's default group: the running one, or one started on torch's store.
    Where no launcher started this process (`mp.spawn`, notebooks, torch's test suite), the rank
    and world size torch was given are the truth: the runtime starts from them (gloo on torch's
    store, no MPI world)."""
    global _epoch
    _epoch = next(_world_epoch)
    if api.is_initialized():
        if pg_options is not None:
            raise ValueError(
                "mcr backend: pg_options carries a runtime config, but mcr.init() already ran; "
                "pass the config to mcr.init() or drop pg_options"
            )
        rt, owned = api.runtime(), _adopt_runtime
    else:
        store = dist.PrefixStore("mcr/", opts.store)
        info = launch_env.discover()
        if info.launcher == "single" and (opts.group_rank, opts.group_size) != (0, 1):
            info = launch_env.from_torch(opts.group_rank, opts.group_size, store)
        rt, owned = api.init(pg_options, store=store, info=info, op_timeout_s=opts.timeout.total_seconds()), True
    if (rt.rank, rt.world_size) != (opts.group_rank, opts.group_size):
        if owned:
            api.finalize()
        raise RuntimeError(
            f"mcr backend: torch.distributed says rank {opts.group_rank} of {opts.group_size}, but the launcher "
            f"({rt.info.launcher}) says rank {rt.rank} of {rt.world_size}; pass the launcher's rank and world size "
            "or use mcr.hooks.torch_backend.init_process_group()"
        )
    return rt, owned


def _create(opts, pg_options):
    """The creator torch calls (extended API) for the default group and every new group."""
    ranks = list(opts.global_ranks_in_group)
    if not ranks:  # torch passes no ranks for the default group
        rt, owned = _world_runtime(opts, pg_options)
        return RuntimeProcessGroup(rt.world, owns_runtime=owned)
    if not api.is_initialized():
        raise RuntimeError(
            "mcr backend: new_group(backend='mcr') needs the runtime on every rank; call mcr.init() "
            "(or init_process_group(backend='mcr')) first"
        )
    rt = api.runtime()
    if dist.get_rank() != rt.rank:
        raise RuntimeError(
            f"mcr backend: torch's global rank {dist.get_rank()} differs from the runtime's {rt.rank}; "
            "initialize torch.distributed with the launcher's ranks"
        )
    # built by its members alone (torch never calls non-members); torch releases it, not finalize()
    group = rt.member_group(("torch", f"{_epoch}/{opts.group_id}"), ranks, opts.timeout, keep=False)
    return RuntimeProcessGroup(group, owns_runtime=_adopt_runtime)


_torch_batch_isend_irecv = dist.batch_isend_irecv


def batch_isend_irecv(p2p_op_list):
    """torch's `dist.batch_isend_irecv`, which `register` puts in its place: a batch of CUDA
    tensors on a group of backend "mcr" is `mcr.batch_isend_irecv` (one NCCL group on the
    group's communicator, as torch's coalescing manager makes it for a plain NCCL group: torch
    takes that path only where `type(group) is ProcessGroup`, never for a subclass, and would
    send each op alone, each pair on a communicator of its own); anything else is torch's."""
    group = p2p_op_list[0].group if p2p_op_list else None
    if group is None and dist.is_initialized():
        group = dist.distributed_c10d._get_default_group()
    if isinstance(group, RuntimeProcessGroup) and p2p_op_list[0].tensor.is_cuda:
        return api.batch_isend_irecv(p2p_op_list)
    return _torch_batch_isend_irecv(p2p_op_list)


def register() -> None:
    """Register backend "mcr" with torch.distributed (idempotent; `import mcr` calls it), and
    put `batch_isend_irecv` above in place of torch's (a name bound before `import mcr`, as by
    `from torch.distributed import batch_isend_irecv`, keeps torch's)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.batch_isend_irecv = dist.distributed_c10d.batch_isend_irecv = batch_isend_irecv
    versions.warn_if_untested("torch", torch.__version__)
    devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=devices)
    records_itself(BACKEND_NAME)  # every op, in mcr/flight.py's dump, which torch's analyzer reads


def records_itself(backend_name: str) -> None:
    """Tell torch (2.15 and later) not to attach its Python flight-recorder hook to the groups of
    `backend_name`: the hook fails on a group with no default backend, as ours are ("Could not find
    the default backend type 0"). Older torch attaches none."""
    self_recording = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if self_recording is not None:
        self_recording.add(backend_name)


def init_process_group(config=None, timeout=None, **mcr_kwargs) -> None:
    """Start the runtime (unless running) and torch.distributed on backend "mcr" with the
    runtime's store, rank and world size: works under mpiexec, srun, jsrun and torchrun."""
    if api.is_initialized() and (config is not None or mcr_kwargs):
        raise ValueError("mcr.hooks.torch_backend.init_process_group: mcr.init() already ran; pass the config there")
    started = not api.is_initialized()
    rt = api.init(config, **mcr_kwargs) if started else api.runtime()
    kwargs = {"timeout": timeout} if timeout is not None else {}
    with adopting_runtime(started):
        dist.init_process_group(
            BACKEND_NAME, store=dist.PrefixStore("torch/", rt.store), rank=rt.rank, world_size=rt.world_size, **kwargs
        )


@contextlib.contextmanager
def adopting_runtime(adopt: bool = True):
    """Groups created inside finalize the runtime when torch destroys them (destroy_process_group)."""
    global _adopt_runtime
    _adopt_runtime = adopt
    try:
        yield
    finally:
        _adopt_runtime = False


register()
