"""The public ops. Signatures mirror torch.distributed, plus `backend=` on every op, so
`import mcr as dist` is a drop-in. Each op checks its arguments, sizes its message the way
nccl-tests does (all-gather: the gathered output; reduce-scatter: the input; all-to-all: the
input), asks the runtime for a backend and runs it there.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from . import config as config_mod
from . import env as launch_env
from .group import Group, route_key
from .handle import Handle
from .ops import REDUCE_OPS, Average, ReduceOp
from .request import Request
from .runtime import Runtime

_runtime: Runtime | None = None
_SUM = ReduceOp.SUM
_Tensor = torch.Tensor
# Reduce ops travel as names: hashing or comparing torch's ReduceOp costs as much as the rest of
# the call's bookkeeping, a lookup by identity of the (singleton) enum values costs nothing.
_OP_NAME_BY_ID = {id(op): name for name, op in REDUCE_OPS.items()}


def _op_name(op) -> str:
    name = _OP_NAME_BY_ID.get(id(op))
    if name is not None:
        return name
    if isinstance(op, str) and op.lower() in REDUCE_OPS:
        return op.lower()
    for name, known in REDUCE_OPS.items():
        if op == known:
            return name
    raise ValueError(
        f"unsupported reduce op {op!r}; use one of ReduceOp.{', ReduceOp.'.join(n.upper() for n in REDUCE_OPS)}"
    )


# --- lifecycle ---------------------------------------------------------------------------------
def init(config=None, store=None, info=None, op_timeout_s=None, **kwargs) -> Runtime:
    """Start the runtime on every rank. `config`: RuntimeConfig, dict or omegaconf node;
    keyword arguments override single fields (e.g. `comm_log=True`). `store`, `info` (the
    rank's place, `mcr.env.LaunchInfo`) and `op_timeout_s` (torch's group timeout) are for the
    torch hook; by default the launcher's, and the watchdog's timeout."""
    global _runtime
    if _runtime is not None:
        raise RuntimeError("mcr.init() was already called; call mcr.finalize() first")
    cfg = config_mod.load(config, **kwargs)
    _setup_logging()
    _runtime = Runtime(cfg, info or launch_env.discover(), store=store, op_timeout_s=op_timeout_s)
    global _exit_registered
    if not _exit_registered:
        atexit.register(_release_at_exit, os.getpid())
        _exit_registered = True
    return _runtime


_exit_registered = False


def _release_at_exit(pid) -> None:
    """A script that ends without finalize(): its groups go while Python still runs
    (`Runtime.release_at_exit`); not in a forked child, whose runtime is its parent's."""
    if _runtime is not None and os.getpid() == pid:
        _runtime.release_at_exit()


def finalize() -> None:
    """Print and write the communication log (when enabled) and release the backends."""
    global _runtime
    if _runtime is not None:
        _runtime.finalize()
        _runtime = None


def abort() -> None:
    """End this rank's communication now, waiting for no op and no peer (torch's abort): ops in
    flight are abandoned and every group aborted (`Runtime.abort`). For a rank about to exit or
    re-raise after a failure; finalize() is the orderly end."""
    global _runtime
    if _runtime is not None:
        rt, _runtime = _runtime, None
        rt.abort()


def dump_flight_record(directory=None):
    """Write this rank's flight record (its last ops, `mcr.flight`) into `directory` (default:
    flight_recorder_dir / MCR_FR_DIR) for `torchfrtrace DIR`; returns the file's path."""
    path = runtime().dump_flight_record("asked for by mcr.dump_flight_record()", directory)
    if path is None and runtime().recorder is not None:
        raise ValueError("mcr.dump_flight_record: no directory; pass one or set MCR_FR_DIR (flight_recorder_dir)")
    return path


def is_initialized() -> bool:
    return _runtime is not None


def runtime() -> Runtime:
    if _runtime is None:
        raise RuntimeError("mcr is not initialized: call mcr.init() first")
    return _runtime


def _setup_logging():
    logger = logging.getLogger("mcr")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def get_rank(group=None) -> int:
    rt = runtime()
    return rt.rank if group is None else group.rank


def get_world_size(group=None) -> int:
    rt = runtime()
    return rt.world_size if group is None else group.size


def get_local_rank() -> int:
    return runtime().info.local_rank


def get_local_world_size() -> int:
    return runtime().info.local_world_size


def available_backends() -> dict:
    """name -> None when available, else the reason it is not."""
    rt = runtime()
    return {**{n: None for n in rt.backends}, **rt.unavailable}


def new_group(ranks=None, timeout=None, backend=None, cpu_only=False, **_torch_kwargs):
    """Collective over the whole world, like torch's. `backend` is accepted for drop-in use and
    ignored: every op on the group still chooses its backend per call. `cpu_only`: the group
    carries no CUDA tensors, so it gets no NCCL communicator (a CUDA op on it fails)."""
    rt = runtime()
    return rt.new_group(range(rt.world_size) if ranks is None else ranks, cpu_only=cpu_only)


# --- argument checks ---------------------------------------------------------------------------
def _check(name, *tensors):
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"mcr.{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.layout is not torch.strided:
            raise TypeError(
                f"mcr.{name}: {t.layout} tensors are not supported; pass t.to_dense(), or all-reduce them with "
                'dist.all_reduce on backend "mcr", which runs sparse tensors on gloo'
            )
        if not t.is_contiguous():
            raise ValueError(f"mcr.{name}: tensor of shape {tuple(t.shape)} is not contiguous; pass t.contiguous()")


def _same_dtype(name, reference, tensors):
    for t in tensors:
        if t.dtype != reference.dtype:
            raise TypeError(
                f"mcr.{name}: dtypes differ ({reference.dtype} and {t.dtype}); use one dtype for all tensors"
            )


def _group_multiple(name, whole, whole_name, part, part_name, group_size):
    """Tensor collectives: one side holds the group size times the other's elements."""
    if whole.numel() != part.numel() * group_size:
        raise ValueError(
            f"mcr.{name}: {whole_name} has {whole.numel()} elements, expected "
            f"{group_size} x {part.numel()} (group size x {part_name})"
        )


def _list_len(name, what, tensors, group_size):
    if len(tensors) != group_size:
        raise ValueError(f"mcr.{name}: {what} has {len(tensors)} tensors but the group has {group_size} ranks")


def _start(group):
    """The runtime and the group an op runs on (None: the world)."""
    rt = _runtime or runtime()
    return rt, (rt.world if group is None else group)


def _average(name, tensor, op, group_size):
    """Returns the reduce op's name to run and what to apply afterwards: AVG is SUM then divide."""
    op = _OP_NAME_BY_ID.get(id(op)) or _op_name(op)
    if op != "avg":
        return op, None
    if not tensor.dtype.is_floating_point:
        raise TypeError(f"mcr.{name}: ReduceOp.AVG needs a floating-point tensor, got {tensor.dtype}; use SUM")
    return "sum", Average(tensor, group_size)


def _agreed_bytes(rt, family, group, nbytes) -> int:
    """Where message sizes legitimately differ across ranks (uneven all-to-all), the choice is
    made on the largest size in the group (mixing rule 1), which every rank learns through one
    small all-reduce. It is skipped when the choice for this op cannot depend on the size."""
    if not rt.router.depends_on_size(family, group):
        return nbytes
    size = torch.tensor([nbytes], dtype=torch.int64)
    rt.call(Request("all_reduce", "all_reduce", 8, group, size, (size, "max"), reduce_op="max"))
    return int(size.item())


# --- collectives -------------------------------------------------------------------------------
# Each op checks its arguments and sizes its message (the nbytes it passes), then hands the rest
# to Runtime.call: route the call, run the backend's method of the given name, post-step.
def all_reduce(tensor, op=_SUM, group=None, async_op=False, backend=None):
    # the hot path (configs/tuning/vm-n2-bench-hotpath.txt): _start and a SUM's _average inlined,
    # and a SUM whose route is ready runs or issues it directly (under Runtime.call's key for it,
    # `route_key`: a key that misses only takes the long way)
    rt = _runtime or runtime()
    g = rt.world if group is None else group
    if op is _SUM and rt.direct and type(tensor) is _Tensor and tensor.is_contiguous():
        ready = g.routes.get(route_key("all_reduce", tensor.nbytes, tensor, backend, "sum", rt.router.forced))
        if ready is not None and ready[1] is not None:
            return ready[2](g, (tensor, "sum")) if async_op else ready[1](g, (tensor, "sum"))
    if type(tensor) is not torch.Tensor or not tensor.is_contiguous():  # the full check only off the hot path
        _check("all_reduce", tensor)
    if op is _SUM:
        op, after = "sum", None
    else:
        op, after = _average("all_reduce", tensor, op, g.size)
    return rt.call(
        Request("all_reduce", "all_reduce", tensor.nbytes, g, tensor, (tensor, op), backend, async_op, op, after)
    )


def reduce(tensor, dst, op=_SUM, group=None, async_op=False, backend=None):
    rt, g = _start(group)
    _check("reduce", tensor)
    op, after = _average("reduce", tensor, op, g.size)
    root = g.group_rank(dst)
    if root != g.rank:
        after = None  # only the root holds the result
    return rt.call(
        Request("reduce", "reduce", tensor.nbytes, g, tensor, (tensor, root, op), backend, async_op, op, after)
    )


def broadcast(tensor, src, group=None, async_op=False, backend=None):
    rt, g = _start(group)
    _check("broadcast", tensor)
    root = g.group_rank(src)
    return rt.call(Request("broadcast", "broadcast", tensor.nbytes, g, tensor, (tensor, root), backend, async_op))


def all_gather(tensor_list, tensor, group=None, async_op=False, backend=None):
    rt, g = _start(group)
    _check("all_gather", tensor, *tensor_list)
    _list_len("all_gather", "tensor_list", tensor_list, g.size)
    _same_dtype("all_gather", tensor, tensor_list)
    nbytes = tensor.nbytes * g.size  # the gathered output
    return rt.call(Request("all_gather", "all_gather", nbytes, g, tensor, (tensor_list, tensor), backend, async_op))


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False, backend=None):
    rt, g = _start(group)
    _check("all_gather_into_tensor", output_tensor, input_tensor)
    _same_dtype("all_gather_into_tensor", input_tensor, [output_tensor])
    _group_multiple("all_gather_into_tensor", output_tensor, "output", input_tensor, "input", g.size)
    nbytes = output_tensor.nbytes  # the gathered output
    args = (output_tensor, input_tensor)
    return rt.call(Request("all_gather", "all_gather_into_tensor", nbytes, g, input_tensor, args, backend, async_op))


def _rooted(family, tensor, tensors, root_rank, group, async_op, backend):
    """gather and scatter: only the root passes the list; its checks run there alone."""
    rt, g = _start(group)
    root = g.group_rank(root_rank)
    what = "gather_list" if family == "gather" else "scatter_list"
    _check(family, tensor)
    if g.rank == root:
        if tensors is None:
            raise ValueError(f"mcr.{family}: rank {root_rank}, the root, must pass {what}")
        _check(family, *tensors)
        _list_len(family, what, tensors, g.size)
        _same_dtype(family, tensor, tensors)
    else:
        tensors = None
    nbytes = tensor.nbytes * g.size  # the whole list
    return rt.call(Request(family, family, nbytes, g, tensor, (tensor, tensors, root), backend, async_op))


def gather(tensor, gather_list=None, dst=0, group=None, async_op=False, backend=None):
    return _rooted("gather", tensor, gather_list, dst, group, async_op, backend)


def scatter(tensor, scatter_list=None, src=0, group=None, async_op=False, backend=None):
    return _rooted("scatter", tensor, scatter_list, src, group, async_op, backend)


def reduce_scatter(output, input_list, op=_SUM, group=None, async_op=False, backend=None):
    rt, g = _start(group)
    _check("reduce_scatter", output, *input_list)
    _list_len("reduce_scatter", "input_list", input_list, g.size)
    _same_dtype("reduce_scatter", output, input_list)
    op, after = _average("reduce_scatter", output, op, g.size)
    nbytes = output.nbytes * g.size  # the input
    args = (output, input_list, op)
    return rt.call(Request("reduce_scatter", "reduce_scatter", nbytes, g, output, args, backend, async_op, op, after))


def reduce_scatter_tensor(output, input, op=_SUM, group=None, async_op=False, backend=None):
    rt, g = _start(group)
    _check("reduce_scatter_tensor", output, input)
    _same_dtype("reduce_scatter_tensor", output, [input])
    _group_multiple("reduce_scatter_tensor", input, "input", output, "output", g.size)
    op, after = _average("reduce_scatter_tensor", output, op, g.size)
    nbytes = input.nbytes  # the input
    args = (output, input, op)
    return rt.call(
        Request("reduce_scatter", "reduce_scatter_tensor", nbytes, g, input, args, backend, async_op, op, after)
    )


def all_to_all_single(
    output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False, backend=None
):
    rt, g = _start(group)
    _check("all_to_all_single", output, input)
    _same_dtype("all_to_all_single", input, [output])
    _check_splits("input", input, input_split_sizes, g.size)
    _check_splits("output", output, output_split_sizes, g.size)
    nbytes = input.nbytes  # the input
    if input_split_sizes or output_split_sizes:
        nbytes = _agreed_bytes(rt, "all_to_all", g, nbytes)  # uneven: local sizes differ by rank
    out_splits = list(output_split_sizes) if output_split_sizes else None
    in_splits = list(input_split_sizes) if input_split_sizes else None
    args = (output, input, out_splits, in_splits)
    return rt.call(Request("all_to_all", "all_to_all_single", nbytes, g, input, args, backend, async_op))


def _check_splits(which, tensor, splits, group_size):
    if not splits:
        if tensor.numel() and tensor.shape[0] % group_size:
            raise ValueError(
                f"mcr.all_to_all_single: {which} has {tensor.shape[0]} rows, not divisible by the group size "
                f"{group_size}; pass {which}_split_sizes"
            )
        return
    if len(splits) != group_size:
        raise ValueError(
            f"mcr.all_to_all_single: {which}_split_sizes has {len(splits)} entries, the group has {group_size} ranks"
        )
    if any(s < 0 for s in splits):
        raise ValueError(f"mcr.all_to_all_single: {which}_split_sizes {list(splits)} has a negative size")
    rows = tensor.shape[0] if tensor.dim() else 0
    if sum(splits) != rows:
        raise ValueError(
            f"mcr.all_to_all_single: {which}_split_sizes {list(splits)} sum to {sum(splits)} but {which} has {rows} rows"
        )


def _all_to_all_bytes(inputs, outputs):
    """The input's bytes. One pass when every block is a plain contiguous tensor of one dtype (it
    runs per call: MoE and TorchRec send small blocks often); anything else (a subclass such as
    nn.Parameter, or input the full checks refuse by name) is sized after those checks."""
    first, nbytes = inputs[0], 0
    if type(first) is torch.Tensor and type(outputs[0]) is torch.Tensor:
        dtype = first.dtype
        for t in inputs:
            if type(t) is not torch.Tensor or t.dtype is not dtype or not t.is_contiguous():
                break
            nbytes += t.nbytes  # one attribute read cheaper than numel
        else:
            if all(type(t) is torch.Tensor and t.dtype is dtype and t.is_contiguous() for t in outputs):
                return nbytes
    _check("all_to_all", *outputs, *inputs)
    _same_dtype("all_to_all", first, [*inputs, *outputs])
    return sum(t.nbytes for t in inputs)


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False, backend=None):
    rt, g = _start(group)
    _list_len("all_to_all", "output_tensor_list", output_tensor_list, g.size)
    _list_len("all_to_all", "input_tensor_list", input_tensor_list, g.size)
    nbytes = _all_to_all_bytes(input_tensor_list, output_tensor_list)
    own_out, own_in = output_tensor_list[g.rank], input_tensor_list[g.rank]  # rank -1 (no member): refused later
    if own_out.numel() != own_in.numel() and g.rank >= 0:
        raise ValueError(
            f"mcr.all_to_all: rank {g.rank} sends itself {own_in.numel()} elements but receives {own_out.numel()}; "
            "the input and output tensors at a rank's own index must be the same size"
        )
    # Sizes may differ by rank even where this rank's blocks are all one size (its peers' need
    # not be), so every rank agrees; agreed_bytes costs nothing where the choice ignores the size.
    nbytes = _agreed_bytes(rt, "all_to_all", g, nbytes)
    args = (output_tensor_list, input_tensor_list)
    return rt.call(Request("all_to_all", "all_to_all", nbytes, g, input_tensor_list[0], args, backend, async_op))


_NO_TENSOR = torch.empty(0, dtype=torch.uint8)  # what a barrier is chosen for: a CPU op of 0 bytes


def barrier(group=None, async_op=False, device_ids=None, backend=None, timeout=None):
    """`timeout` (a timedelta or seconds): fail with a RuntimeError once this barrier waited
    that long, as torch's `dist.barrier(timeout=)` on gloo does; it runs on a backend that takes
    a timeout per call (gloo). The watchdog (MCR_WATCHDOG_TIMEOUT) still bounds every wait."""
    rt, g = _start(group)
    if timeout is not None and not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=timeout)
    timed = "timed" if timeout is not None else None
    return rt.call(Request("barrier", "barrier", 0, g, _NO_TENSOR, (timeout,), backend, async_op, timed))


# --- point to point ----------------------------------------------------------------------------
# send and recv share the family "send_recv" so both sides always pick the same backend. A receive
# from any source (src=None) is chosen the same way: the receiver knows the size and dtype too.
def _p2p(name, method, tensor, peer, group, tag, async_op, backend):
    rt, g = _start(group)
    _check(name, tensor)
    if peer is None and method == "send":
        raise ValueError(f"mcr.{name}: pass the destination rank")
    args = (tensor, None if peer is None else g.group_rank(peer), tag)
    tagged = "tagged" if tag else None  # both sides know the tag: a library without tags is not chosen
    return rt.call(Request("send_recv", method, tensor.nbytes, g, tensor, args, backend, async_op, tagged))


def send(tensor, dst, group=None, tag=0, backend=None):
    _p2p("send", "send", tensor, dst, group, tag, False, backend)


def recv(tensor, src=None, group=None, tag=0, backend=None) -> int:
    """Returns the sender's global rank (`src`, or whoever sent when src is None)."""
    if src is not None:
        _p2p("recv", "recv", tensor, src, group, tag, False, backend)
        return src
    handle = _p2p("recv", "recv", tensor, None, group, tag, True, backend)
    handle.wait()
    return source_rank(handle, group)


def isend(tensor, dst, group=None, tag=0, backend=None) -> Handle:
    return _p2p("isend", "send", tensor, dst, group, tag, True, backend)


def irecv(tensor, src=None, group=None, tag=0, backend=None) -> Handle:
    """src=None receives from any source: `source_rank(handle)` names the sender once done."""
    return _p2p("irecv", "recv", tensor, src, group, tag, True, backend)


def batch_isend_irecv(p2p_ops) -> list:
    """Sends and receives issued together, as torch's `dist.batch_isend_irecv` (`dist.P2POp`s,
    or anything with their `op`, `tensor`, `peer`, `group` and `tag`; `op` is `isend`/`irecv`,
    torch's or mcr's). Their order between sends and receives does not matter. Where every op
    runs on a GPU library (NCCL) they are one NCCL group on the group's communicator and one
    Work comes back; elsewhere each is issued as `isend`/`irecv` and a handle per op comes back."""
    if not p2p_ops:
        raise ValueError("mcr.batch_isend_irecv: no ops given; pass a list of dist.P2POp(isend|irecv, tensor, peer)")
    rt = runtime()
    batch = [_batched(rt, p) for p in p2p_ops]
    return rt.batch_p2p(batch)


_SENDS = (isend, dist.isend)
_RECEIVES = (irecv, dist.irecv)


def _batched(rt, p2p):
    """(group, method, tensor, group peer, tag) of one op of a batch, checked."""
    group = getattr(p2p.group, "mcr_group", p2p.group)  # a torch group on backend "mcr": its runtime group
    g = rt.world if group is None else group
    if not isinstance(g, Group):
        raise ValueError(f"mcr.batch_isend_irecv: group {p2p.group!r} is not a group of backend 'mcr'; use one")
    if p2p.op in _SENDS:
        method = "send"
    elif p2p.op in _RECEIVES:
        method = "recv"
    else:
        raise ValueError(f"mcr.batch_isend_irecv: op {p2p.op!r} is neither isend nor irecv")
    _check(f"batch_isend_irecv ({method})", p2p.tensor)
    if p2p.peer is None:
        raise ValueError("mcr.batch_isend_irecv: every op needs its peer (no receive from any source in a batch)")
    return g, method, p2p.tensor, g.group_rank(p2p.peer), p2p.tag or 0


def source_rank(handle: Handle, group=None) -> int:
    """The global rank that sent what a completed `irecv(src=None)` received."""
    if handle.source is None:
        raise ValueError("mcr.source_rank: the handle is not a receive from any source (irecv with src=None)")
    handle.wait()
    return _start(group)[1].ranks[handle.source()]
