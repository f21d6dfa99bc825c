"""The machine fingerprint a tuning table carries, so a table is not used where it was not measured."""

from __future__ import annotations

import os
import re
import socket

import torch

from ..version import __version__


def hostname_pattern(hostnames) -> str:
    """One pattern for the hosts of a job: the exact name on one host without a number, else
    the common prefix of the names without their trailing digits plus '*' ('node17' -> 'node*')."""
    names = sorted(set(hostnames))
    if len(names) == 1 and not re.search(r"\d+$", names[0]):
        return names[0]
    prefix = os.path.commonprefix(names)
    return re.sub(r"\d+$", "", prefix) + "*"


def fingerprint(rt, hostnames=None, device="cpu") -> dict:
    """The job's machine and shape. `hostnames`: every rank's host (default: those the runtime
    learned at start-up). `device`: the device the tensors were measured on; a CUDA table names
    it, its GPU and whether MPI read device memory itself (a CPU table, as before, names none)."""
    versions = {name: str(backend.version()) for name, backend in sorted(rt.backends.items())}
    versions["torch"] = str(torch.__version__)
    versions["mcr"] = __version__
    shape = rt.shape
    found = {
        "hostname": hostname_pattern(hostnames or rt.topology.hosts or [socket.gethostname()]),
        "world_size": rt.world_size,
        "nodes": shape.nodes,
        "ranks_per_node": shape.per_node,  # None: the nodes held different numbers of ranks
    }
    device = torch.device(device)
    if device.type == "cuda":
        found["device"] = "cuda"
        found["gpu"] = torch.cuda.get_device_name(device)
        if "mpi" in rt.backends:  # mpi and mpi/host time the same copies where MPI is not CUDA-aware
            found["mpi_cuda_aware"] = bool(getattr(rt.backends["mpi"], "cuda_aware", False))
        versions["cuda"] = str(torch.version.cuda)
    found["versions"] = versions
    return found
