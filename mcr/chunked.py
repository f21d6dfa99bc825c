"""A large all-reduce as a train of chunks (the candidate `X/chunk=N`): they stay in cache, so
the train runs faster than one call. Each chunk is its own op on the same backend, in the same
order on every rank; the comm log shows the caller's op under its candidate's name
(`mpi/chunk=1M`), not the chunks.
"""

from __future__ import annotations

from time import perf_counter

from .handle import Handle
from .runner import prepare_async_issue, prepare_blocking_run
from .streams import CudaRoute, StreamHandle, StreamOrder
from .tuning.candidates import label
from .tuning.table import Choice


def run_chunked(rt, route, group, tensor, reduce_op, async_op):
    """All-reduce `tensor` on runtime `rt` along `route` (its `chunk_bytes` set) in chunks;
    async: one handle for the train, held in flight so its finishers (AVG) run even if dropped."""
    backend = route.backend
    fn, comm = backend.all_reduce, group.comms[backend.name]
    flat = tensor.view(-1)
    per = max(1, route.chunk_bytes // tensor.element_size())
    started, comm_log = perf_counter(), rt.comm_log
    whole = route.op._replace(label=label(Choice(backend.name, route.chunk_bytes)))
    prepare = prepare_async_issue if async_op else prepare_blocking_run
    order = StreamOrder(tensor.device, comm_log is not None) if tensor.is_cuda else None
    handles, runs = [], {}  # runs: a chunk's function by its size (all but the last share one)
    for start in range(0, flat.numel(), per):
        part = flat[start : start + per]
        run = runs.get(part.nbytes)
        if run is None:
            op = route.op._replace(nbytes=part.nbytes)
            if order is not None:  # CUDA tensors: each chunk under the stream rules
                cuda = CudaRoute(
                    rt, op, backend, "all_reduce", comm, None, route.staged, False, reduce_op, tensor.dtype
                )
                run = runs[part.nbytes] = cuda.issue if async_op else cuda.run
            else:
                run = runs[part.nbytes] = prepare(rt, op, group, fn, comm, logged=False)
        handles.append(run(group, (part, reduce_op)))
    if not async_op:
        if comm_log is not None and order is None:  # on CUDA the chunks' GPU times are not summed here
            comm_log.record(whole, perf_counter() - started)
        return None
    handle = Handle(lambda: [h.wait() for h in handles], lambda: all(h.is_completed() for h in handles), tensor)
    if order is not None:  # the whole op's finishers (AVG) on the issuing stream, after every chunk
        handle = StreamHandle(handle, order, whole, group, None, comm_log)
    else:
        if comm_log is not None:
            handle.then(lambda: comm_log.record(whole, perf_counter() - started))
        handle.op = whole
    rt.hold(comm, handle)  # the caller may drop it: its post-step (AVG) must still run
    return handle
