"""Starting the runtime, once per process: the backends, the rendezvous store, every rank's node,
the tuning table checked against the job's shape, and what rank 0 says at start-up. `Runtime`
runs ops on what `start()` returns; nothing here is on an op's path.

The order matters: the device is bound first (`bind_device`: an MPI that sets up CUDA in MPI_Init
does it on the current device), except under jsrun with one GPU per rank, where MPI comes first
(`binds_after_mpi`); then backends that need no store start (MPI, which can hand out the store's
address), then the store, the hostnames (the job's shape), the network check and the table (both
may refuse the job: every rank refuses alike, before gloo connects), then the backends that
rendezvous on the store (gloo, nccl).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from datetime import timedelta
from typing import NamedTuple

import torch
import torch.distributed as dist

from . import env as launch_env
from . import hugepages, netcheck, streams
from .backends import REGISTRY
from .backends.base import BackendUnavailable
from .rank_file import write_rank_file
from .topology import RankGPU, Shape, Topology, binding_problems, node_lines
from .tuning.model import predict_table
from .tuning.table import TuningTable, TuningTables, load_tables

log = logging.getLogger("mcr")


class Started(NamedTuple):
    backends: dict  # name -> a started Backend
    unavailable: dict  # name -> why it cannot run here
    store: object  # the TCP store the torch backends rendezvous on
    topology: Topology  # every rank's node, from the hostnames
    shape: Shape  # the job's nodes and ranks per node
    table: TuningTable | None  # the table file, fitted to `shape` (None: no file, or tuning: auto)
    gpus: list  # every rank's RankGPU: what it bound, its local rank, the GPUs it sees
    binding_problems: list  # shared GPUs and wrapped local ranks (mcr.topology.binding_problems)


class BindingError(RuntimeError):
    """MCR_STRICT_BINDING=1 and two ranks share a GPU or a local rank wrapped: raised on every rank."""


def start(cfg, info: launch_env.LaunchInfo, store=None, op_timeout_s=None) -> Started:
    """`op_timeout_s`: torch's process-group timeout, after which a gloo or nccl op raises
    (default: the watchdog's, or torch's own where the watchdog is off); MPI has none."""
    if cfg.rank_dir:  # first: a rank that dies while starting is named too
        write_rank_file(cfg.rank_dir, info.rank)
    backends, unavailable = {}, {}
    after_mpi = binds_after_mpi(os.environ, visible_gpus())
    if not after_mpi:
        streams.bind_device(info.local_rank)  # before MPI and NCCL start (None: no GPU)
    wanted = cfg.backend_names()
    netcheck.check_names(os.environ, spans_nodes=info.local_world_size < info.world_size)
    table = read_table(cfg)
    # a watchdog of 0 is off, not a zero timeout (gloo's groups then failed to form)
    timeout_s = op_timeout_s or cfg.watchdog_timeout_s or dist.default_pg_timeout.total_seconds()
    start_backends(backends, unavailable, wanted, info, None, timeout_s, cfg)  # no store: they may give its address
    if after_mpi:
        streams.bind_device(info.local_rank)  # the one GPU it sees, now that MPI has started
    if store is None:
        store = make_store(info, backends.get("mpi"), unavailable.get("mpi"))
    # every rank's node, once: from the hostnames, whatever the launcher said about local ranks;
    # and its GPU (bound by the runtime already), so ranks that share one are known alike
    device = streams.bound_device()
    mine = RankGPU(streams.gpu_identity(), device.index if device is not None else -1, info.local_rank, visible_gpus())
    if info.world_size > 1:
        hosts = launch_env.hosts_by_rank(store, info.rank, info.world_size)
        gpus = [RankGPU.parse(v) for v in launch_env.by_rank(store, "gpu", info.rank, info.world_size, mine.text())]
    else:
        hosts, gpus = [socket.gethostname()], [mine]
    topology = Topology(hosts, [gpu.uuid for gpu in gpus])
    problems = binding_problems(hosts, gpus)
    if problems and cfg.strict_binding:  # every rank knows them alike: every rank stops, before gloo connects
        raise BindingError(f"mcr: MCR_STRICT_BINDING=1 and {'; '.join(problems)}")
    shape = topology.shape()
    if "gloo" in wanted and shape.nodes > 1:  # before gloo connects: a wrong network fails named
        netcheck.check_gloo_reach(store, topology, info.rank, os.environ)
    table = fit_table(table, cfg, shape)  # before gloo starts: a refused table stops every rank alike
    start_backends(backends, unavailable, wanted, info, store, timeout_s, cfg)
    return Started(backends, unavailable, store, topology, shape, table, gpus, problems)


def binds_after_mpi(env, gpus: int) -> bool:
    """Whether this rank binds its GPU only after MPI has started: under jsrun (Spectrum MPI: its
    JSM_NAMESPACE_* variables, beside the OMPI_COMM_WORLD_* that name the launcher) where it sees
    one GPU. Spectrum's CUDA hook, which its CUDA-aware path (`--smpiargs="-gpu"`) depends on,
    records GPU memory from MPI_Init on, and OLCF's guide says no CUDA call may come before MPI_Init
    there (docs.olcf.ornl.gov, Summit user guide, "CUDA hook error when program uses CUDA without
    first calling MPI_Init()"). With one GPU per resource set MPI_Init finds that GPU current anyway,
    and NCCL needs the device only before its communicators, which start after MPI. Elsewhere the
    device comes first: Open MPI's smcuda and PSM2 set up CUDA in MPI_Init on the current device."""
    return "JSM_NAMESPACE_RANK" in env and gpus == 1


def visible_gpus() -> int:
    """The GPUs this process sees, counted without a CUDA context (torch asks NVML first; 0 without CUDA)."""
    return torch.cuda.device_count()


def start_backends(backends, unavailable, wanted, info, store, timeout_s, cfg=None) -> None:
    """Start the registered backends (mcr.backends) that need a store, or (store None) those
    that need none; each is started into `backends`, or `unavailable` says why not."""
    for name, entry in REGISTRY.items():
        if entry.cls.needs_store != (store is not None):
            continue
        if name not in wanted:
            unavailable[name] = "not in the configured backends list"
            continue
        try:
            backends[name] = entry.cls.start(info, store, timeout_s, cfg)
        except BackendUnavailable as exc:
            unavailable[name] = str(exc)


def make_store(info, mpi, why_no_mpi):
    """One TCP store for all torch backends' rendezvous."""
    addr, port = info.master_addr, info.master_port
    is_server = info.rank == 0
    if mpi is not None and (addr is None or port is None):
        # MPI gives us a channel: rank 0 publishes its host and a free port.
        addr, port = mpi.world.bcast((addr or socket.gethostname(), port or launch_env.free_port()), root=0)
    elif os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        is_server = False  # torchrun's agent already serves a store on MASTER_PORT
    elif port is not None and info.world_size > 1:
        port += 1  # leave MASTER_PORT free for torch.distributed's own store
    if addr is None or port is None:
        if info.world_size == 1:
            addr, port = "127.0.0.1", launch_env.free_port()
        else:
            # under an MPI launcher the address comes through MPI: say why MPI could not give it
            fix = f"mpi is unavailable ({why_no_mpi}), so " if why_no_mpi and info.launcher != "torchrun" else ""
            raise RuntimeError(
                f"mcr.init: rank {info.rank} of {info.world_size} (launcher {info.launcher}) has no rendezvous "
                f"address; {fix}set MASTER_ADDR and MASTER_PORT, or launch with mpiexec and mpi in the backends"
            )
    store = dist.TCPStore(addr, port, info.world_size, is_server, timedelta(seconds=300), wait_for_workers=False)
    return dist.PrefixStore("mcr/", store)


def read_table(cfg):
    """A table file (or one per device, comma-separated: `TuningTables`) is read before any
    backend starts, so a missing or malformed one stops every rank the same way instead of
    leaving peers mid-handshake."""
    if cfg.tuning is None or cfg.tuning == "auto":
        return None
    return load_tables(cfg.tuning)


def fit_table(table, cfg, shape):
    """The table checked against this job's shape (ranks, nodes, ranks per node), which every
    rank knows alike once the hostnames are exchanged; or, with tuning_predict, reshaped."""
    if table is None:
        return None
    if isinstance(table, TuningTables):  # each device's table, alike
        return TuningTables([fit_table(t, cfg, shape) for t in table.tables])
    if cfg.tuning_predict:  # another scale or machine: this job's group size through the model
        return predict_table(table, shape.ranks, shape.per_node, nodes=shape.nodes)
    table.check_fits(shape.ranks, ranks_per_node=shape.per_node, nodes=shape.nodes)
    return table


def abort_job_on_uncaught_exception(rank: int, dump, abort) -> None:
    """An exception that ends this rank must end the job: exiting normally would run
    MPI_Finalize, which waits for peers that may be waiting for us. `dump(why, frame=...)` keeps
    the flight record first; `abort()` ends the job."""
    previous = sys.excepthook

    def hook(kind, value, traceback):
        # torch's init_process_group wraps this hook and buffers stderr until it returns;
        # we never return, so write to the real stderr or the traceback is lost.
        sys.stderr = sys.__stderr__
        previous(kind, value, traceback)
        while traceback is not None and traceback.tb_next is not None:
            traceback = traceback.tb_next
        dump(f"uncaught {kind.__name__}", frame=traceback and traceback.tb_frame)
        sys.stderr.write(f"mcr: rank {rank} ended with {kind.__name__}; aborting the job\n")
        sys.stderr.flush()
        abort()

    sys.excepthook = hook


# --- what rank 0 says once ---------------------------------------------------------------------
def say_once(started: Started, info, table) -> None:
    """The start-up line (shape, launcher, backends, table and its fingerprint) and the warnings
    about this machine that every run should see once."""
    if "mpi" in started.backends and hugepages.torch_uses_them() is False:
        # MPI's large transfers need huge pages (`mcr.hugepages`)
        log.warning(
            "mcr: large CPU tensors are on 4 KiB pages (torch allocated before mcr was imported, or %s=0), "
            "so MPI's large transfers run up to 2x slower; import mcr first or export %s=1",
            hugepages.ENV,
            hugepages.ENV,
        )
    # the hostnames decide which ranks share a node; say so when the launcher thinks otherwise
    # (containers that all call themselves `localhost`, a wrong LOCAL_WORLD_SIZE)
    hosts = started.topology.hosts
    mine = hosts.count(hosts[info.rank])
    if mine != info.local_world_size:
        log.warning(
            "mcr: %s says %d ranks share this node, but %d ranks have its hostname %r; mcr goes by the hostnames "
            "(the node-aware collectives and the tuning table's shape)",
            info.launcher,
            info.local_world_size,
            mine,
            hosts[info.rank],
        )
    for line in node_lines(hosts, started.gpus):  # each node's ranks and their GPUs
        log.info(line)
    for problem in started.binding_problems:  # MCR_STRICT_BINDING=1 makes each an error
        log.warning("mcr: WARNING: %s", problem)
    mpi = started.backends.get("mpi")
    if mpi is not None and streams.bound_device() is not None:  # what CUDA tensors on MPI will do
        how = "straight to MPI" if mpi.cuda_aware else "staged through pinned host memory"
        log.info("mcr: CUDA tensors on MPI go %s (%s)", how, mpi.cuda_aware_reason)
    have = ", ".join(f"{n} ({b.version()})" for n, b in started.backends.items())
    missing = "; ".join(f"{n}: {why}" for n, why in started.unavailable.items())
    log.info(
        "mcr: %s via %s; backends %s%s; %s",
        started.shape,
        info.launcher,
        have,
        f"; unavailable: {missing}" if missing else "",
        table_text(table),
    )


def table_text(table) -> str:
    if table is None:
        return "no tuning table"
    if table.online:
        return f"tuning online ({table.path})"
    if isinstance(table, TuningTables):
        return "; ".join(f"{device} {table_text(t)}" for device, t in table.by_device.items())
    return f"tuning table {table.path} (measured for {table.shape_text()}; {table.fingerprint_text()})"
