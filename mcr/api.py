"""The public ops. Signatures mirror torch.distributed, plus `backend=` on every op, so
`import mcr as dist` is a drop-in. Each op checks its arguments, sizes its message the way
nccl-tests does (all-gather: the gathered output; reduce-scatter: the input; all-to-all: the
input), asks the runtime for a backend and runs it there.
"""

from __future__ import annotations

import logging
import sys

import torch

from . import config as config_mod
from . import env as launch_env
from .handle import Handle
from .ops import REDUCE_OPS, ReduceOp
from .runtime import Runtime

_runtime: Runtime | None = None
_SUM = ReduceOp.SUM
# Reduce ops travel as names: hashing or comparing torch's ReduceOp costs about 0.3-1 µs each,
# a lookup by identity of the (singleton) enum values costs nothing.
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
def init(config=None, store=None, **kwargs) -> Runtime:
    """Start the runtime on every rank. `config`: RuntimeConfig, dict or omegaconf node;
    keyword arguments override single fields (e.g. `comm_log=True`)."""
    global _runtime
    if _runtime is not None:
        raise RuntimeError("mcr.init() was already called; call mcr.finalize() first")
    cfg = config_mod.load(config, **kwargs)
    _setup_logging()
    _runtime = Runtime(cfg, launch_env.discover(), store=store)
    return _runtime


def finalize() -> None:
    """Print and write the communication log (when enabled) and release the backends."""
    global _runtime
    if _runtime is not None:
        _runtime.finalize()
        _runtime = None


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


def new_group(ranks=None, timeout=None, backend=None, **_torch_kwargs):
    """Collective over the whole world, like torch's. `backend` is accepted for drop-in use and
    ignored: every op on the group still chooses its backend per call."""
    rt = runtime()
    return rt.new_group(range(rt.world_size) if ranks is None else ranks)


# --- argument checks ---------------------------------------------------------------------------
def _check(name, *tensors):
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"mcr.{name}: expected a torch.Tensor, got {type(t).__name__}")
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


def _group(group):
    return runtime().world if group is None else group


def _average(name, tensor, op, group_size):
    """Returns the reduce op's name to run and what to apply afterwards: AVG is SUM then divide."""
    op = _OP_NAME_BY_ID.get(id(op)) or _op_name(op)
    if op != "avg":
        return op, None
    if not tensor.dtype.is_floating_point:
        raise TypeError(f"mcr.{name}: ReduceOp.AVG needs a floating-point tensor, got {tensor.dtype}; use SUM")
    return "sum", lambda t=tensor: t.div_(group_size)


def _device(tensor) -> str:
    return "cuda" if tensor.is_cuda else "cpu"


def _finish(result, async_op, after):
    """Apply a post-step (AVG's divide, copy-outs) now for a sync op, at completion for async."""
    if after is None:
        return result
    if async_op:
        return result.then(after)
    after()
    return None


# --- collectives -------------------------------------------------------------------------------
def all_reduce(tensor, op=_SUM, group=None, async_op=False, backend=None):
    rt = _runtime or runtime()
    g = rt.world if group is None else group
    if not tensor.is_contiguous():
        _check("all_reduce", tensor)
    nbytes = tensor.nbytes
    op, after = _average("all_reduce", tensor, op, g.size)
    b, chunk = rt.choose("all_reduce", nbytes, g, tensor.dtype, _device(tensor), backend, op)
    if chunk and nbytes > chunk:
        return _finish(_chunked_all_reduce(rt, b, g, tensor, op, chunk, async_op), async_op, after)
    result = rt.run("all_reduce", b, g, nbytes, async_op, b.all_reduce, g.comms[b.name], tensor, op, async_op)
    return _finish(result, async_op, after)


def _chunked_all_reduce(rt, b, g, tensor, op, chunk_bytes, async_op):
    """Large all-reduces run faster as a train of chunks (they stay in cache); each chunk is
    its own op on the same backend, in the same order on every rank."""
    flat = tensor.view(-1)
    per = max(1, chunk_bytes // tensor.element_size())
    handles = []
    for start in range(0, flat.numel(), per):
        part = flat[start : start + per]
        h = rt.run("all_reduce", b, g, part.nbytes, async_op, b.all_reduce, g.comms[b.name], part, op, async_op)
        handles.append(h)
    if not async_op:
        return None
    handle = Handle(lambda: [h.wait() for h in handles], lambda: all(h.is_completed() for h in handles), keep=tensor)
    rt.hold(g.comms[b.name], handle)  # the caller may drop it: its post-step (AVG) must still run
    return handle


def reduce(tensor, dst, op=_SUM, group=None, async_op=False, backend=None):
    rt, g = runtime(), _group(group)
    _check("reduce", tensor)
    op, after = _average("reduce", tensor, op, g.size)
    root = g.group_rank(dst)
    if root != g.rank:
        after = None
    b, _ = rt.choose("reduce", tensor.nbytes, g, tensor.dtype, _device(tensor), backend, op)
    result = rt.run("reduce", b, g, tensor.nbytes, async_op, b.reduce, g.comms[b.name], tensor, root, op, async_op)
    return _finish(result, async_op, after)


def broadcast(tensor, src, group=None, async_op=False, backend=None):
    rt, g = runtime(), _group(group)
    _check("broadcast", tensor)
    b, _ = rt.choose("broadcast", tensor.nbytes, g, tensor.dtype, _device(tensor), backend)
    return rt.run(
        "broadcast", b, g, tensor.nbytes, async_op, b.broadcast, g.comms[b.name], tensor, g.group_rank(src), async_op
    )


def all_gather(tensor_list, tensor, group=None, async_op=False, backend=None):
    rt, g = runtime(), _group(group)
    _check("all_gather", tensor, *tensor_list)
    _list_len("all_gather", "tensor_list", tensor_list, g.size)
    _same_dtype("all_gather", tensor, tensor_list)
    nbytes = tensor.nbytes * g.size
    b, _ = rt.choose("all_gather", nbytes, g, tensor.dtype, _device(tensor), backend)
    return rt.run("all_gather", b, g, nbytes, async_op, b.all_gather, g.comms[b.name], tensor_list, tensor, async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False, backend=None):
    rt, g = runtime(), _group(group)
    _check("all_gather_into_tensor", output_tensor, input_tensor)
    _same_dtype("all_gather_into_tensor", input_tensor, [output_tensor])
    _group_multiple("all_gather_into_tensor", output_tensor, "output", input_tensor, "input", g.size)
    nbytes = output_tensor.nbytes
    b, _ = rt.choose("all_gather", nbytes, g, input_tensor.dtype, _device(input_tensor), backend)
    return rt.run(
        "all_gather",
        b,
        g,
        nbytes,
        async_op,
        b.all_gather_into_tensor,
        g.comms[b.name],
        output_tensor,
        input_tensor,
        async_op,
    )


def _rooted(family, tensor, tensors, root_rank, group, async_op, backend):
    """gather and scatter: only the root passes the list; its checks run there alone."""
    rt, g = runtime(), _group(group)
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
    nbytes = tensor.nbytes * g.size
    b, _ = rt.choose(family, nbytes, g, tensor.dtype, _device(tensor), backend)
    return rt.run(family, b, g, nbytes, async_op, getattr(b, family), g.comms[b.name], tensor, tensors, root, async_op)


def gather(tensor, gather_list=None, dst=0, group=None, async_op=False, backend=None):
    return _rooted("gather", tensor, gather_list, dst, group, async_op, backend)


def scatter(tensor, scatter_list=None, src=0, group=None, async_op=False, backend=None):
    return _rooted("scatter", tensor, scatter_list, src, group, async_op, backend)


def reduce_scatter(output, input_list, op=_SUM, group=None, async_op=False, backend=None):
    rt, g = runtime(), _group(group)
    _check("reduce_scatter", output, *input_list)
    _list_len("reduce_scatter", "input_list", input_list, g.size)
    _same_dtype("reduce_scatter", output, input_list)
    op, after = _average("reduce_scatter", output, op, g.size)
    nbytes = output.nbytes * g.size
    b, _ = rt.choose("reduce_scatter", nbytes, g, output.dtype, _device(output), backend, op)
    result = rt.run(
        "reduce_scatter", b, g, nbytes, async_op, b.reduce_scatter, g.comms[b.name], output, input_list, op, async_op
    )
    return _finish(result, async_op, after)


def reduce_scatter_tensor(output, input, op=_SUM, group=None, async_op=False, backend=None):
    rt, g = runtime(), _group(group)
    _check("reduce_scatter_tensor", output, input)
    _same_dtype("reduce_scatter_tensor", output, [input])
    _group_multiple("reduce_scatter_tensor", input, "input", output, "output", g.size)
    op, after = _average("reduce_scatter_tensor", output, op, g.size)
    b, _ = rt.choose("reduce_scatter", input.nbytes, g, input.dtype, _device(input), backend, op)
    result = rt.run(
        "reduce_scatter",
        b,
        g,
        input.nbytes,
        async_op,
        b.reduce_scatter_tensor,
        g.comms[b.name],
        output,
        input,
        op,
        async_op,
    )
    return _finish(result, async_op, after)


def all_to_all_single(
    output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False, backend=None
):
    rt, g = runtime(), _group(group)
    _check("all_to_all_single", output, input)
    _same_dtype("all_to_all_single", input, [output])
    _check_splits("input", input, input_split_sizes, g.size)
    _check_splits("output", output, output_split_sizes, g.size)
    nbytes = input.nbytes
    if input_split_sizes or output_split_sizes:
        nbytes = rt.agreed_bytes("all_to_all", g, nbytes)  # uneven: local sizes differ by rank
    b, _ = rt.choose("all_to_all", nbytes, g, input.dtype, _device(input), backend)
    return rt.run(
        "all_to_all",
        b,
        g,
        nbytes,
        async_op,
        b.all_to_all_single,
        g.comms[b.name],
        output,
        input,
        list(output_split_sizes) if output_split_sizes else None,
        list(input_split_sizes) if input_split_sizes else None,
        async_op,
    )


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
    rows = tensor.shape[0] if tensor.dim() else 0
    if sum(splits) != rows or any(s < 0 for s in splits):
        raise ValueError(
            f"mcr.all_to_all_single: {which}_split_sizes {list(splits)} sum to {sum(splits)} but {which} has {rows} rows"
        )


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False, backend=None):
    rt, g = runtime(), _group(group)
    _check("all_to_all", *output_tensor_list, *input_tensor_list)
    _list_len("all_to_all", "output_tensor_list", output_tensor_list, g.size)
    _list_len("all_to_all", "input_tensor_list", input_tensor_list, g.size)
    _same_dtype("all_to_all", input_tensor_list[0], [*input_tensor_list, *output_tensor_list])
    nbytes = sum(t.nbytes for t in input_tensor_list)
    if len({t.numel() for t in input_tensor_list}) > 1 or len({t.numel() for t in output_tensor_list}) > 1:
        nbytes = rt.agreed_bytes("all_to_all", g, nbytes)  # uneven: local sizes differ by rank
    t0 = input_tensor_list[0]
    b, _ = rt.choose("all_to_all", nbytes, g, t0.dtype, _device(t0), backend)
    return rt.run(
        "all_to_all",
        b,
        g,
        nbytes,
        async_op,
        b.all_to_all,
        g.comms[b.name],
        output_tensor_list,
        input_tensor_list,
        async_op,
    )


def barrier(group=None, async_op=False, device_ids=None, backend=None):
    rt, g = runtime(), _group(group)
    b, _ = rt.choose("barrier", 0, g, torch.uint8, "cpu", backend)
    return rt.run("barrier", b, g, 0, async_op, b.barrier, g.comms[b.name], async_op)


# --- point to point ----------------------------------------------------------------------------
# send and recv share the family "send_recv" so both sides always pick the same backend.
def _p2p(name, method, tensor, peer, group, tag, async_op, backend):
    rt, g = runtime(), _group(group)
    _check(name, tensor)
    if peer is None:
        raise ValueError(f"mcr.{name}: pass the peer rank (receiving from any source is not supported)")
    b, _ = rt.choose("send_recv", tensor.nbytes, g, tensor.dtype, _device(tensor), backend)
    return rt.run(
        "send_recv",
        b,
        g,
        tensor.nbytes,
        async_op,
        getattr(b, method),
        g.comms[b.name],
        tensor,
        g.group_rank(peer),
        tag,
        async_op,
    )


def send(tensor, dst, group=None, tag=0, backend=None):
    _p2p("send", "send", tensor, dst, group, tag, False, backend)


def recv(tensor, src=None, group=None, tag=0, backend=None) -> int:
    _p2p("recv", "recv", tensor, src, group, tag, False, backend)
    return src


def isend(tensor, dst, group=None, tag=0, backend=None) -> Handle:
    return _p2p("isend", "send", tensor, dst, group, tag, True, backend)


def irecv(tensor, src=None, group=None, tag=0, backend=None) -> Handle:
    return _p2p("irecv", "recv", tensor, src, group, tag, True, backend)
