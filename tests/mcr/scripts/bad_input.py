"""Each bad call raises a clear error before any communication, on every rank.

The test runs it under mpiexec with MCR_BACKENDS=mpi,nccl and MCR_BACKEND_BROADCAST=gloo (an override
naming a backend not started; no backend for an int16 reduction), and under torchrun with
MCR_BACKEND=mpi (a default naming a backend torchrun cannot start).
"""

import re

import torch

import mcr
from mcr.runtime import CommError


def expect_error(pattern, call):
    try:
        call()
    except (ValueError, TypeError, RuntimeError) as exc:
        if isinstance(exc, CommError) or not re.search(pattern, str(exc)):
            raise AssertionError(f"error {exc!r} does not match {pattern!r}") from exc
        print("raised:", exc, flush=True)
        return
    raise AssertionError(f"no error for {pattern!r}")


expect_error(r"mcr is not initialized: call mcr.init\(\) first", lambda: mcr.all_reduce(torch.ones(2)))
rt = mcr.init()
expect_error(r"mcr.init\(\) was already called; call mcr.finalize\(\) first", mcr.init)
launcher = rt.info.launcher
n = mcr.get_world_size()
rank = mcr.get_rank()
have = "gloo" if launcher == "torchrun" else "mpi"  # a backend this run has
t = torch.ones(2)

# --- backends the call, an override or the default names, and none at all ---------------------
expect_error(
    r"backend 'ucc' .*unavailable: unknown backend; choose one of mpi, gloo, nccl",
    lambda: mcr.all_reduce(torch.ones(2), backend="ucc"),
)
expect_error(r"backend 'nccl' .*unavailable: no GPU", lambda: mcr.all_reduce(torch.ones(2), backend="nccl"))
if launcher == "torchrun":
    expect_error(
        r"backend 'mpi' \(asked for by backend=\) is unavailable: launched by torchrun, which gives no MPI world",
        lambda: mcr.all_reduce(torch.ones(2), backend="mpi"),
    )
    expect_error(
        r"mcr.all_gather: backend 'mpi' \(the default backend\) is unavailable: launched by torchrun",
        lambda: mcr.all_gather_into_tensor(torch.empty(2 * n), t),
    )
else:
    expect_error(
        r"mcr.broadcast: backend 'gloo' \(the override for broadcast\) is unavailable: not in the configured backends",
        lambda: mcr.broadcast(torch.ones(2), 0),
    )
    expect_error(
        r"mcr.all_reduce: no available backend \(mpi\) can run sum on cpu int16 tensors",
        lambda: mcr.all_reduce(torch.ones(2, dtype=torch.int16)),
    )

# --- groups ------------------------------------------------------------------------------------
expect_error(rf"new_group: ranks \[-1, {n}\] are not in the world of {n} ranks", lambda: mcr.new_group([0, n, -1]))
expect_error(r"new_group: no ranks given", lambda: mcr.new_group([]))
solo = mcr.new_group([0])  # collective: every rank creates it
if rank != 0:
    expect_error(rf"mcr.all_reduce: rank {rank} is not a member of mcr.Group", lambda: mcr.all_reduce(t, group=solo))
    expect_error(rf"mcr.barrier: rank {rank} is not a member", lambda: mcr.barrier(group=solo, backend=have))
expect_error(r"rank 5 is not in this group", lambda: mcr.broadcast(torch.ones(2), 5, backend=have))

# --- arguments ---------------------------------------------------------------------------------
expect_error(r"unsupported reduce op 'median'; use one of ReduceOp.SUM", lambda: mcr.all_reduce(t, op="median"))
expect_error(r"mcr.all_reduce: expected a torch.Tensor, got list", lambda: mcr.all_reduce([1.0, 2.0]))
expect_error(r"mcr.broadcast: expected a torch.Tensor, got int", lambda: mcr.broadcast(3, 0))
expect_error(r"mcr.all_gather: expected a torch.Tensor, got str", lambda: mcr.all_gather(["a"] * n, t))
expect_error(r"mcr.send: expected a torch.Tensor, got NoneType", lambda: mcr.send(None, 0))
expect_error(r"not contiguous; pass t.contiguous\(\)", lambda: mcr.all_reduce(torch.ones(4, 4).t()))
expect_error(
    r"ReduceOp.AVG needs a floating-point tensor",
    lambda: mcr.all_reduce(torch.ones(2, dtype=torch.int32), op=mcr.ReduceOp.AVG),
)
expect_error(
    r"dtypes differ \(torch.float32 and torch.int64\)",
    lambda: mcr.all_gather_into_tensor(torch.empty(2 * n, dtype=torch.int64), torch.ones(2)),
)
expect_error(
    r"output has 3 elements, expected 2 x 2", lambda: mcr.all_gather_into_tensor(torch.empty(3), torch.ones(2))
)
expect_error(
    r"mcr.reduce_scatter_tensor: input has 3 elements, expected 2 x 2",
    lambda: mcr.reduce_scatter_tensor(torch.empty(2), torch.empty(3)),
)
# wrong list lengths, for every op that takes a list
short, long = [torch.ones(2)] * (n - 1), [torch.ones(2)] * (n + 1)
expect_error(
    rf"mcr.all_gather: tensor_list has {n + 1} tensors but the group has {n} ranks", lambda: mcr.all_gather(long, t)
)
expect_error(
    rf"mcr.reduce_scatter: input_list has {n - 1} tensors but the group has {n} ranks",
    lambda: mcr.reduce_scatter(torch.empty(2), short),
)
expect_error(
    rf"mcr.all_to_all: output_tensor_list has {n - 1} tensors but the group has {n} ranks",
    lambda: mcr.all_to_all(short, [torch.ones(2)] * n),
)
expect_error(
    rf"mcr.all_to_all: input_tensor_list has {n + 1} tensors but the group has {n} ranks",
    lambda: mcr.all_to_all([torch.empty(2)] * n, long),
)
mismatched = [torch.empty(3 if peer == rank else 2) for peer in range(n)]
expect_error(
    rf"mcr.all_to_all: rank {rank} sends itself 2 elements but receives 3",
    lambda: mcr.all_to_all(mismatched, [torch.ones(2)] * n),
)
if rank == 0:  # the root checks its list; a non-root would go on to communicate
    expect_error(rf"mcr.gather: gather_list has {n + 1} tensors", lambda: mcr.gather(t, long, dst=0))
    expect_error(rf"mcr.scatter: scatter_list has {n - 1} tensors", lambda: mcr.scatter(t, short, src=0))
    expect_error(r"mcr.gather: rank 0, the root, must pass gather_list", lambda: mcr.gather(t, None, dst=0))
    expect_error(r"mcr.scatter: rank 0, the root, must pass scatter_list", lambda: mcr.scatter(t, None, src=0))
# all-to-all splits
expect_error(
    rf"input has 3 rows, not divisible by the group size {n}; pass input_split_sizes",
    lambda: mcr.all_to_all_single(torch.empty(3), torch.empty(3)),
)
expect_error(
    r"input_split_sizes \[1, 1\] sum to 2 but input has 3 rows",
    lambda: mcr.all_to_all_single(torch.empty(2), torch.empty(3), [1, 1], [1, 1]),
)
expect_error(
    r"output_split_sizes has 3 entries, the group has 2 ranks",
    lambda: mcr.all_to_all_single(torch.empty(3), torch.empty(2), [1, 1, 1], [1, 1]),
)
expect_error(
    r"input_split_sizes \[3, -1\] has a negative size",
    lambda: mcr.all_to_all_single(torch.empty(2), torch.empty(2), [1, 1], [3, -1]),
)
# point to point
expect_error(r"mcr.send: pass the destination rank", lambda: mcr.send(t, None))
expect_error(r"mcr.isend: pass the destination rank", lambda: mcr.isend(t, None))
expect_error(
    r"mcr.all_reduce: torch.sparse_coo tensors are not supported; pass t.to_dense\(\)",
    lambda: mcr.all_reduce(torch.ones(2).to_sparse()),
)

mcr.barrier(backend=have)
print(f"rank {rank}: bad input OK", flush=True)
mcr.finalize()
