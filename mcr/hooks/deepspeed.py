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
   runtime instead. It is DeepSpeed's constructor with two steps kept out: the shared-memory op
   is not built (install() costs no 35-100 s JIT compile) and no process group is started;
4. makes DeepSpeed's device the one the runtime bound (`_match_deepspeed_device`): DeepSpeed
   names its device by LOCAL_RANK, which is no device where a rank sees fewer GPUs than its node
   has ranks (jsrun resource sets, Polaris' affinity script, `srun --gpus-per-task=1`).

Afterwards every deepspeed.comm op (MoE all-to-all, gating all-reduce, ZeRO reduce-scatter and
all-gather, gradient all-reduce, pipeline send/recv) reaches the runtime's per-call choice.
`deepspeed.initialize()` then sees an initialized backend and keeps it. Idempotent.

It was tested with the DeepSpeed versions in `mcr.hooks.versions.TESTED` and warns outside them;
a DeepSpeed whose TorchBackend no longer fits (an op without a `group` argument, no
`build_shm_op`) makes install() fail with a message naming what changed.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os

import torch.distributed as dist

from .. import api
from . import torch_backend, versions

# TorchBackend ops that take a `group`: when torch's default group runs another backend, their
# group None (DeepSpeed's "the world") is redirected to the "mcr" world group. Where `group` sits
# among each op's arguments is read from DeepSpeed's signatures when the class is built, so a
# reordered signature is followed and one without `group` fails install() (see _group_positions).
# Rank and size queries need no redirect: both world groups hold the same ranks.
_GROUP_OPS = (
    "all_reduce",
    "inference_all_reduce",
    "all_reduce_coalesced",
    "reduce",
    "reduce_scatter",
    "broadcast",
    "broadcast_object_list",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_base",
    "all_gather_coalesced",
    "all_gather_object",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "all_to_all",
    "send",
    "recv",
    "isend",
    "irecv",
    "gather",
    "scatter",
    "barrier",
    "monitored_barrier",
)


def install(config=None):
    """Make deepspeed.comm use the runtime; returns the runtime. See the module docstring."""
    import deepspeed.comm as ds_comm_pkg
    import deepspeed.comm.comm as ds_comm

    versions.warn_if_untested("deepspeed", _deepspeed_version())
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
    _match_deepspeed_device(rt)
    cdb = backend_class(world)
    ds_comm.cdb = cdb
    ds_comm_pkg.cdb = cdb
    return rt


def _export_launch_env(rt):
    """DeepSpeed reads these (engine, logging); mpiexec sets none of them, like its mpi_discovery.
    LOCAL_RANK is the launcher's local rank, never the device: DeepSpeed asserts that it equals
    OMPI_COMM_WORLD_LOCAL_RANK (Open MPI, and Spectrum MPI under jsrun) and names node-local
    checkpoint files by it."""
    info = rt.info
    for key, value in (
        ("RANK", info.rank),
        ("WORLD_SIZE", info.world_size),
        ("LOCAL_RANK", info.local_rank),
        ("LOCAL_WORLD_SIZE", info.local_world_size),
    ):
        os.environ.setdefault(key, str(value))


def _match_deepspeed_device(rt):
    """Make DeepSpeed's device for this rank the one the runtime bound (`rt.device`: local rank
    % device count). DeepSpeed takes its device index from LOCAL_RANK, always through its
    accelerator: the engine's `set_device(local_rank)` and `device_name(local_rank)`
    (`_set_distributed_vars`), ZeRO-3's `device_name(os.environ["LOCAL_RANK"])` (zero.Init and
    zero/utils.py), the pipeline module's and AutoTP's. So its CUDA accelerator is replaced by
    one that names the bound device for this local rank and every other index as before."""
    if rt.device is None:
        return  # no GPU: DeepSpeed runs on the CPU
    from deepspeed.accelerator import get_accelerator, set_accelerator
    from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator

    local_rank, accelerator, bound = int(os.environ["LOCAL_RANK"]), get_accelerator(), _accelerator_class()
    if accelerator.device_name() != "cuda":
        return  # DeepSpeed was told to run elsewhere (DS_ACCELERATOR=cpu)
    if type(accelerator) not in (CUDA_Accelerator, bound):
        if rt.device.index != local_rank:
            raise RuntimeError(
                f"mcr.hooks.deepspeed: DeepSpeed's accelerator is {type(accelerator).__name__}, which names local "
                f"rank {local_rank}'s device cuda:{local_rank}, but this rank sees {rt.device} only; use DeepSpeed's "
                "CUDA_Accelerator, or give every rank all of its node's GPUs"
            )
        return
    set_accelerator(bound(local_rank, rt.device.index))


def _make_accelerator_class():
    import torch
    from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator

    def index_of(device):
        if isinstance(device, str) and not device.isdigit():
            device = torch.device(device)
        if isinstance(device, torch.device):
            return device.index
        return None if device is None else int(device)

    class BoundCUDAAccelerator(CUDA_Accelerator):
        """DeepSpeed's CUDA accelerator, where the index `local_rank` names the device mcr bound."""

        def __init__(self, local_rank: int, device_index: int):
            super().__init__()
            self.local_rank, self.bound_index = local_rank, device_index

        def _bound(self, device_index):
            return self.bound_index if index_of(device_index) == self.local_rank else device_index

        def device_name(self, device_index=None):
            return super().device_name(self._bound(device_index))

        def device(self, device_index=None):
            return super().device(self._bound(device_index))

        def set_device(self, device_index):
            super().set_device(self._bound(device_index))

    return BoundCUDAAccelerator


def _make_backend_class():
    from deepspeed.comm.torch import TorchBackend

    ds_torch = importlib.import_module("deepspeed.comm.torch")  # the attribute of that name is torch itself

    class RuntimeCommBackend(TorchBackend):
        """DeepSpeed's torch backend on "mcr" groups, without its shared-memory op."""

        def __init__(self, world_group=None):
            with _without_shm_op(ds_torch):
                super().__init__(backend=torch_backend.BACKEND_NAME, timeout=None, init_method=None, name="mcr")
            self.world_rank, self.world_size = dist.get_rank(), dist.get_world_size()
            self.has_allgather_base = True  # read by all_gather_base; TorchBackend.__init__ never sets it
            self.world_pg = world_group  # None: torch's default group is already "mcr"
            self.world_group = world_group or dist.group.WORLD
            if world_group is not None:
                for name, index in _GROUP_POSITIONS.items():
                    setattr(self, name, _on_world(getattr(self, name), index, world_group))

        def init_process_group(self, *args, **kwargs):
            # install() started torch.distributed. Not "mpi": DeepSpeed's timed_op would add a
            # barrier per op there.
            self.using_mpi = False

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

    _GROUP_POSITIONS.update(_group_positions(RuntimeCommBackend))
    return RuntimeCommBackend


_GROUP_POSITIONS = {}  # op name -> index of `group` among its arguments after self


@contextlib.contextmanager
def _without_shm_op(ds_torch):
    """TorchBackend.__init__ builds DeepSpeed's shared-memory all-reduce (a 35-100 s JIT compile
    on CPU) that only inference_all_reduce would use; the runtime does that reduction instead."""
    if not callable(getattr(ds_torch, "build_shm_op", None)):
        raise RuntimeError(
            f"mcr.hooks.deepspeed: deepspeed {_deepspeed_version()} has no deepspeed.comm.torch.build_shm_op, "
            f"which install() keeps from running; {_TESTED_HINT}"
        )
    build = ds_torch.build_shm_op
    ds_torch.build_shm_op = lambda: None
    try:
        yield
    finally:
        ds_torch.build_shm_op = build


def _group_positions(backend_class):
    """{op: index of `group` after self}, read from each op's signature; a clear error if one has none."""
    positions = {}
    for name in _GROUP_OPS:
        method = getattr(backend_class, name, None)
        if method is None:
            raise RuntimeError(
                f"mcr.hooks.deepspeed: deepspeed {_deepspeed_version()}'s TorchBackend has no {name}(); {_TESTED_HINT}"
            )
        signature = inspect.signature(_undecorated(method, name))
        parameters = list(signature.parameters.values())
        names = [p.name for p in parameters]
        if names[:1] != ["self"] or "group" not in names or parameters[names.index("group")].kind not in _POSITIONAL:
            raise RuntimeError(
                f"mcr.hooks.deepspeed: deepspeed {_deepspeed_version()}'s TorchBackend.{name}{signature} has no "
                f"positional `group` argument to redirect to the mcr world group; {_TESTED_HINT}"
            )
        positions[name] = names.index("group") - 1
    return positions


_POSITIONAL = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.POSITIONAL_ONLY)
_TESTED_HINT = (
    f"the hook was tested with {versions.pip_range('deepspeed')}: install one "
    f"(pip install '{versions.pip_range('deepspeed')}') or update mcr/hooks/deepspeed.py"
)


def _undecorated(function, name):
    """The function `name` under its decorators, for its signature: functools.wraps leaves
    __wrapped__; DeepSpeed's stage_on_cpu does not, but keeps the function in its closure."""
    function = inspect.unwrap(function)
    for _ in range(4):  # decorators stacked a few deep at most
        if function.__name__ == name:
            return function
        inner = [cell.cell_contents for cell in function.__closure__ or () if inspect.isfunction(cell.cell_contents)]
        named = [f for f in inner if f.__name__ == name]
        if len(named) != 1:
            return function  # its signature then shows no `group`, and install() says so
        function = inspect.unwrap(named[0])
    return function


def _deepspeed_version():
    import deepspeed

    return deepspeed.__version__


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
_accelerator = None


def _backend_class():
    # Built on first use: importing deepspeed takes seconds, and `import mcr` must stay light.
    global _class
    if _class is None:
        _class = _make_backend_class()
    return _class


def _accelerator_class():
    global _accelerator
    if _accelerator is None:
        _accelerator = _make_accelerator_class()
    return _accelerator


def __getattr__(name):
    if name == "RuntimeCommBackend":
        return _backend_class()
    if name == "BoundCUDAAccelerator":
        return _accelerator_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
