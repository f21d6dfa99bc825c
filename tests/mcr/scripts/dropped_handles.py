"""Async ops whose handles the caller drops still complete: their buffers stay alive while the
backend uses them, and their post-steps (AVG's divide, copy-outs) run. Sync ops are interleaved;
every rank's data differs per call and every result is compared whole with a reference
computed locally, after a later blocking op on the same backend and, for the last ones, after
the runtime finalizes.

    script.py VIA CHOICES [ROUNDS [NUMEL]]
        VIA: mcr | torch (torch.distributed on backend "mcr"); CHOICES: comma-separated mpi, gloo,
        auto (the runtime's own choice); through torch, one: the runtime's default backend;
        NUMEL: the all-reduces' elements (default 96), e.g. enough for a table to chunk them
"""

import sys

import torch

import mcr

via, choices = sys.argv[1], sys.argv[2].split(",")
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 60
backend = None
NUMEL = 96  # divisible by the group size (2 or 3 ranks)
AR_NUMEL = int(sys.argv[4]) if len(sys.argv) > 4 else NUMEL  # the all-reduces'

if via == "torch":
    import torch.distributed as dist

    from mcr.hooks.torch_backend import init_process_group

    (choice,) = choices
    init_process_group(backend=choice)  # the runtime's default backend for every op
    rank, n = dist.get_rank(), dist.get_world_size()
    AVG, SUM = dist.ReduceOp.AVG, dist.ReduceOp.SUM

    def all_reduce(t, op, async_op):
        return dist.all_reduce(t, op=op, async_op=async_op)

    def all_gather_into_tensor(out, t):
        return dist.all_gather_into_tensor(out, t, async_op=True)

    def reduce_scatter_tensor(out, t):
        return dist.reduce_scatter_tensor(out, t, async_op=True)

    def all_gather(outs, t):
        return dist.all_gather(outs, t, async_op=True)

    def finalize():
        dist.destroy_process_group()  # the runtime it started ends with it

else:
    mcr.init()
    rank, n = mcr.get_rank(), mcr.get_world_size()
    AVG, SUM = mcr.ReduceOp.AVG, mcr.ReduceOp.SUM

    def all_reduce(t, op, async_op):
        return mcr.all_reduce(t, op=op, async_op=async_op, backend=backend)

    def all_gather_into_tensor(out, t):
        return mcr.all_gather_into_tensor(out, t, async_op=True, backend=backend)

    def reduce_scatter_tensor(out, t):
        return mcr.reduce_scatter_tensor(out, t, async_op=True, backend=backend)

    def all_gather(outs, t):
        return mcr.all_gather(outs, t, async_op=True, backend=backend)

    finalize = mcr.finalize


def data(r, call, numel=NUMEL):
    """Rank r's input to call number `call`: distinct per rank, per call and per element."""
    return torch.arange(numel, dtype=torch.float32) * (r + 2) + 1000.0 * call + 7.0 * r


pending = []  # (name, tensor the op writes, its reference): checked once the op must be done
left_in_flight = []  # each choice's last rounds: only finalize() has to complete them
checked = 0
call = 0


def expect_all(pending):
    global checked
    for name, got, want in pending:
        if not torch.allclose(got, want, rtol=1e-6, atol=1e-4):
            raise AssertionError(f"rank {rank}: {name}: got {got[:6].tolist()}... want {want[:6].tolist()}...")
        checked += 1
    pending.clear()


for choice in choices:  # through mcr: one after another, the last rounds of each left in flight
    backend = None if choice == "auto" else choice
    for i in range(rounds):
        # the pattern of benchmarks' async mode: a fresh tensor, its handle never kept
        all_reduce(data(rank, call, AR_NUMEL), SUM, True)
        call += 1

        t = data(rank, call, AR_NUMEL)
        all_reduce(t, AVG, True)  # AVG is a SUM then a divide the runtime applies on completion
        want = torch.stack([data(r, call, AR_NUMEL) for r in range(n)]).mean(0)
        pending.append((f"all_reduce avg {call}", t, want))
        call += 1

        out = torch.empty(NUMEL * n)
        all_gather_into_tensor(out, data(rank, call))  # the input is a temporary too
        pending.append((f"all_gather_into_tensor {call}", out, torch.cat([data(r, call) for r in range(n)])))
        call += 1

        outs = [torch.empty(NUMEL) for _ in range(n)]
        all_gather(outs, data(rank, call))  # copy-outs from a packed buffer on MPI
        for r in range(n):
            pending.append((f"all_gather {call} part {r}", outs[r], data(r, call)))
        call += 1

        part = torch.empty(NUMEL // n)
        reduce_scatter_tensor(part, data(rank, call))
        whole = torch.stack([data(r, call) for r in range(n)]).sum(0)
        pending.append((f"reduce_scatter_tensor {call}", part, whole.chunk(n)[rank]))
        call += 1

        if i % 7 == 6:  # a blocking op on the same backend: every earlier op there has completed
            t = data(rank, call, AR_NUMEL)
            all_reduce(t, SUM, False)
            want = torch.stack([data(r, call, AR_NUMEL) for r in range(n)]).sum(0)
            pending.append((f"sync all_reduce {call}", t, want))
            call += 1
            expect_all(pending)
    left_in_flight += pending
    pending = []


finalize()  # completes what is still in flight
expect_all(left_in_flight)
print(f"rank {rank}: dropped handles OK {checked} checks via {via} on {','.join(choices)}", flush=True)
