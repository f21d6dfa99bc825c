"""Uneven all-to-alls (local sizes differ by rank), both forms, and even ones, with no other op
of 8 bytes: the comm log's 8-byte all-reduces are then the runtime's size agreements alone.
Results are checked whole; data is distinct per rank, call and element. Usage: agreed_size.py
(the table, if any, through MCR_TUNING_FILE; the log through MCR_COMM_LOG_JSON)."""

import torch

import mcr

mcr.init()
rank, n = mcr.get_rank(), mcr.get_world_size()
UNITS = (4, 16, 256, 1024, 2048)  # elements; no call has ranks on both sides of a 1 KiB boundary


def data(r, call, to, numel):
    """What rank r sends rank `to` in call number `call`: distinct per rank, call, peer and element."""
    return torch.arange(numel, dtype=torch.float32) + 100000.0 * call + 1000.0 * r + 10.0 * to


def splits(me, unit):
    """Uneven and different on each rank, yet consistent: rank me sends rank j what j expects from me."""
    sends = [((me + j) % 3 + 1) * unit for j in range(n)]
    receives = [((j + me) % 3 + 1) * unit for j in range(n)]
    return sends, receives


call = uneven = 0
for unit in UNITS:
    sends, receives = splits(rank, unit)
    inp = torch.cat([data(rank, call, j, s) for j, s in enumerate(sends)])
    out = torch.empty(sum(receives))
    mcr.all_to_all_single(out, inp, receives, sends)
    assert torch.equal(out, torch.cat([data(j, call, rank, s) for j, s in enumerate(receives)])), (rank, call)
    call, uneven = call + 1, uneven + 1

    outs = [torch.empty(s) for s in receives]
    mcr.all_to_all(outs, [data(rank, call, j, s) for j, s in enumerate(sends)])
    assert torch.equal(torch.cat(outs), torch.cat([data(j, call, rank, s) for j, s in enumerate(receives)]))
    call, uneven = call + 1, uneven + 1

    out = torch.empty(n * unit)  # even, no split sizes: the size is the same everywhere, nothing to agree
    mcr.all_to_all_single(out, torch.cat([data(rank, call, j, unit) for j in range(n)]))
    assert torch.equal(out, torch.cat([data(j, call, rank, unit) for j in range(n)])), (rank, call)
    call += 1
mcr.finalize()
print(f"rank {rank}: agreed size ran {call} all-to-alls, {uneven} uneven", flush=True)
