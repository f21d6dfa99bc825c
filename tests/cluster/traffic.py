"""A job that moves a known amount between nodes on each backend and says which interfaces carried it.

Run by job scripts (`python -m tests.cluster.traffic [key=value ...]`, the trainers' overrides
ignored): every rank all-reduces 16 MiB twice on MPI, then twice on gloo; around each backend's
turn rank 0 reads its node's byte counters (/proc/net/dev: its network namespace's interfaces)
and prints what each interface sent and received."""

import torch

import mcr

MIB = 1 << 20


def counters() -> dict:
    """interface -> (received, sent) bytes on this node."""
    out = {}
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            name, fields = line.split(":", 1)
            values = fields.split()
            out[name.strip()] = (int(values[0]), int(values[8]))
    return out


rt = mcr.init(backends="mpi,gloo")
x = torch.ones(16 * MIB // 4)
for backend in ("mpi", "gloo"):
    mcr.barrier()
    before = counters()
    for _ in range(2):
        mcr.all_reduce(x, backend=backend)
    mcr.barrier()
    after = counters()
    if mcr.get_rank() == 0:
        for iface in sorted(after):
            rx, tx = (after[iface][i] - before.get(iface, (0, 0))[i] for i in (0, 1))
            print(f"traffic: {backend} {iface} rx {rx} tx {tx}", flush=True)
mcr.finalize()
