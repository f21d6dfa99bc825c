"""DeepSpeed on the runtime: `mcr.hooks.deepspeed.install(config)`.

Call it INSTEAD of `deepspeed.init_distributed()` (or right after it), and BEFORE
`deepspeed.initialize()`, building MoE layers or creating any process group. It

1. starts the runtime with `config` (dict, `mcr.RuntimeConfig` or None for the environment's
   MCR_* settings), or adopts a running one (then `config` must be None);
2. starts torch.distributed on backend "mcr" when it is not running (any launcher, mpiexec
   included); when `deepspeed.init_distributed()` already started it on another backend, it
   makes an "mcr" group over all ranks and DeepSpeed's default group becomes that one;
3. sets `deepspeed.comm.comm.cdb` (the object every `deepspeed.comm` op calls; the
   `deepspeed.comm.cdb` name is a stale copy, set too) to `RuntimeCommBackend`, DeepSpeed's own
   torch backend with its groups made on "mcr" and its shared-memory all-reduce sent to the
   runtime instead. It is not built, so install() costs no 35-100 s JIT compile.

Afterwards every deepspeed.comm op (MoE all-to-all, gating all-reduce, ZeRO reduce-scatter and
all-gather, gradient all-reduce, pipeline send/recv) reaches the runtime's per-call choice.
`deepspeed.initialize()` then sees an initialized backend and keeps it. Idempotent.
"""

from __future__ import annotations

import os

import torch.distributed as dist

from .. import api
from . import torch_backend

# TorchBackend ops and where their `group` sits among the positional arguments (DeepSpeed 0.19;
# comm.py passes it positionally to all_reduce*). When torch's default group runs another
# backend, group None (DeepSpeed's "the world") is redirected to the "mcr" world group.
# Rank and size queries need no redirect: both world groups hold the same ranks.
_GROUP_ARG = {
    "all_reduce": 2,
    "inference_all_reduce": 2,
    "all_reduce_coalesced": 2,
    "reduce": 3,
    "reduce_scatter": 3,
    "broadcast": 2,
    "broadcast_object_list": 2,
    "all_gather": 2,
    "all_gather_into_tensor": 2,
    "all_gather_base": 2,
    "all_gather_coalesced": 2,
    "all_gather_object": 2,
    "reduce_scatter_tensor": 3,
    "all_to_all_single": 4,
    "all_to_all": 2,
    "send": 2,
    "recv": 2,
    "isend": 2,
    "irecv": 2,
    "gather": 3,
    "scatter": 3,
    "barrier": 0,
    "monitored_barrier": 0,
}


def install(config=None):
    """Make deepspeed.comm use the runtime; returns the runtime. See the module docstring."""
    import deepspeed.comm as ds_comm_pkg
    import deepspeed.comm.comm as ds_comm

    backend_class = _backend_class()
    if isinstance(ds_comm.cdb, backend_class):
        if config is not None:
            raise ValueError("mcr.hooks.deepspeed.install: already installed; call it once with the config")
        return api.runtime()
    if api.is_initialized() and config is not None:
        raise ValueError(
            "mcr.hooks.deepspeed.install: mcr.init() already ran; pass the config there, or to install() only"
        )
    if not dist.is_initialized():
        torch_backend.init_process_group(config)  # the runtime it starts ends with destroy_process_group()
        world = None
    else:
        started = not api.is_initialized()
        if started:
            api.init(config)
        if dist.get_backend() == torch_backend.BACKEND_NAME:
            world = None
        else:
            with torch_backend.adopting_runtime(started):  # finalized by destroy_process_group()
                world = dist.new_group(backend=torch_backend.BACKEND_NAME)  # collective: every rank is here
    rt = api.runtime()
    _export_launch_env(rt)
    cdb = backend_class(world)
    ds_comm.cdb = cdb
    ds_comm_pkg.cdb = cdb
    return rt


def _export_launch_env(rt):
    """DeepSpeed reads these (engine, logging); mpiexec sets none of them, like its mpi_discovery."""
    info = rt.info
    for key, value in (
        ("RANK", info.rank),
        ("WORLD_SIZE", info.world_size),
        ("LOCAL_RANK", info.local_rank),
        ("LOCAL_WORLD_SIZE", info.local_world_size),
    ):
        os.environ.setdefault(key, str(value))


def _make_backend_class():
    from deepspeed.comm.backend import Backend
    from deepspeed.comm.torch import TorchBackend, has_all_reduce_coalesced, has_coalescing_manager

    class RuntimeCommBackend(TorchBackend):
        """DeepSpeed's torch backend on "mcr" groups, without its shared-memory op."""

        def __init__(self, world_group=None):
            Backend.__init__(self, name="mcr", rank=dist.get_rank(), size=dist.get_world_size())
            # What TorchBackend.__init__ sets, minus build_shm_op() and init_process_group().
            self.shm_comm_op = None
            self.shm_vector_kernel_level = 0
            self.has_all_reduce_coalesced = has_all_reduce_coalesced()
            self.has_coalescing_manager = has_coalescing_manager()
            self.all_gather_function = self.get_all_gather_function()
            self.reduce_scatter_function = self.get_reduce_scatter_function()
            self.has_allgather_base = True
            self.single_gpu_mode = True
            self.using_mpi = False  # DeepSpeed's timed_op would add a barrier per op on "mpi"
            self.initialized = True
            self.world_pg = world_group  # None: torch's default group is already "mcr"
            self.world_group = world_group or dist.group.WORLD
            if world_group is not None:
                for name, index in _GROUP_ARG.items():
                    setattr(self, name, _on_world(getattr(self, name), index, world_group))

        def init_process_group(self, *args, **kwargs):
            pass  # install() did

        def inference_all_reduce(self, tensor, op, group=None):
            self.all_reduce(tensor, op=op, group=group)
            return tensor

        def batch_isend_irecv(self, p2p_op_list):
            for op in p2p_op_list:
                if op.group is None and self.world_pg is not None:
                    op.group = self.world_pg
            return TorchBackend.batch_isend_irecv(self, p2p_op_list)

        def new_group(self, ranks):
            return dist.new_group(ranks, backend=torch_backend.BACKEND_NAME)

        def get_world_group(self):
            return self.world_group

        def get_backend(self, group=None):
            return torch_backend.BACKEND_NAME

    return RuntimeCommBackend


def _on_world(method, index, world):
    def call(*args, **kwargs):
        if len(args) > index:
            if args[index] is None or args[index] is dist.GroupMember.WORLD:
                args = args[:index] + (world,) + args[index + 1 :]
        elif kwargs.get("group") is None or kwargs["group"] is dist.GroupMember.WORLD:
            kwargs["group"] = world
        return method(*args, **kwargs)

    return call


_class = None


def _backend_class():
    # Built on first use: importing deepspeed takes seconds, and `import mcr` must stay light.
    global _class
    if _class is None:
        _class = _make_backend_class()
    return _class


def __getattr__(name):
    if name == "RuntimeCommBackend":
        return _backend_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
