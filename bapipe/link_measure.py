"""Measure the point-to-point link between two local processes (gloo send/recv on loopback) and
fit latency + bytes/bandwidth, for the ``link`` entry of a cluster file describing this machine.

The timing is the runtime's own (`mcr.measure.time_op("send_recv")`: half a ping-pong, the
slower rank's median), so bapipe and `mcr.tools.tune` measure a link the same way."""

import os

import torch.multiprocessing as mp

from .cluster import fit_link

SIZES = [2**k for k in range(12, 23, 2)]  # 4 KiB .. 4 MiB, around a pipeline's activations


def _ping_pong(rank, port, repeats, queue):
    import torch

    import mcr
    from mcr.measure import time_op

    # the two processes are a torchrun-style job of two ranks on this host
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    mcr.init(backends="gloo")
    points = [
        (size, time_op(mcr.runtime(), "send_recv", size, backend="gloo", iters=repeats, warmup=2)[0]) for size in SIZES
    ]
    if rank == 0:
        queue.put(points)
    mcr.finalize()


def measure_p2p(repeats=20):
    """Returns (Link, [(bytes, seconds)]) for gloo send/recv between two processes here."""
    from mcr.env import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mp.start_processes(_ping_pong, args=(free_port(), repeats, queue), nprocs=2, start_method="spawn")
    points = queue.get(timeout=60)
    return fit_link(points), points
