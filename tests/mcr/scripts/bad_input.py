"""Each bad call raises a clear error before any communication, on every rank."""

import re

import torch

import mcr

rt = mcr.init()
launcher = rt.info.launcher
n = mcr.get_world_size()


def expect_error(pattern, call):
    try:
        call()
    except (ValueError, TypeError) as exc:
        if not re.search(pattern, str(exc)):
            raise AssertionError(f"error {exc!r} does not match {pattern!r}") from exc
        print("raised:", exc, flush=True)
        return
    raise AssertionError(f"no error for {pattern!r}")


expect_error(
    r"backend 'ucc' .*unavailable: unknown backend; choose one of mpi, gloo, nccl",
    lambda: mcr.all_reduce(torch.ones(2), backend="ucc"),
)
expect_error(r"backend 'nccl' .*unavailable: no GPU", lambda: mcr.all_reduce(torch.ones(2), backend="nccl"))
if launcher == "torchrun":
    expect_error(
        r"backend 'mpi' .*unavailable: launched by torchrun, which gives no MPI world",
        lambda: mcr.all_reduce(torch.ones(2), backend="mpi"),
    )
expect_error(r"not contiguous; pass t.contiguous\(\)", lambda: mcr.all_reduce(torch.ones(4, 4).t()))
expect_error(
    r"input_split_sizes \[1, 1\] sum to 2 but input has 3 rows",
    lambda: mcr.all_to_all_single(torch.empty(2), torch.empty(3), [1, 1], [1, 1]),
)
expect_error(
    r"output_split_sizes has 3 entries, the group has 2 ranks",
    lambda: mcr.all_to_all_single(torch.empty(3), torch.empty(2), [1, 1, 1], [1, 1]),
)
expect_error(
    r"dtypes differ \(torch.float32 and torch.int64\)",
    lambda: mcr.all_gather_into_tensor(torch.empty(2 * n, dtype=torch.int64), torch.ones(2)),
)
expect_error(
    r"output has 3 elements, expected 2 x 2", lambda: mcr.all_gather_into_tensor(torch.empty(3), torch.ones(2))
)
expect_error(
    r"ReduceOp.AVG needs a floating-point tensor",
    lambda: mcr.all_reduce(torch.ones(2, dtype=torch.int32), op=mcr.ReduceOp.AVG),
)
expect_error(r"rank 5 is not in this group", lambda: mcr.broadcast(torch.ones(2), 5))
mcr.barrier()
print(f"rank {mcr.get_rank()}: bad input OK", flush=True)
mcr.finalize()
