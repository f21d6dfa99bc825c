"""Measure the point-to-point link between two local processes (gloo send/recv on loopback) and
fit latency + bytes/bandwidth, for the ``link`` entry of a cluster file describing this machine."""

import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .cluster import fit_link

SIZES = [2**k for k in range(12, 23, 2)]  # 4 KiB .. 4 MiB, around a pipeline's activations


def _ping_pong(rank, port, repeats, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    points = []
    for size in SIZES:
        buf = torch.zeros(size // 4)
        times = []
        for _ in range(repeats + 2):
            start = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            times.append((time.perf_counter() - start) / 2)  # one way
        points.append((size, statistics.median(times[2:])))
    if rank == 0:
        queue.put(points)
    dist.destroy_process_group()


def measure_p2p(repeats=20):
    """Returns (Link, [(bytes, seconds)]) for gloo send/recv between two processes here."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mp.start_processes(_ping_pong, args=(port, repeats, queue), nprocs=2, start_method="spawn")
    points = queue.get(timeout=60)
    return fit_link(points), points
