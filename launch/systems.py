"""System descriptions (configs/systems/*.yaml): scheduler, account, queue, ranks and CPUs per node.

    system = load_system("local", account="proj1")          # a name in configs/systems/ or a path
    queue_for(system, nodes=4, seconds=1800)                # --queue, or the first of `queues` that fits

The schema is an omegaconf structured config, so an unknown key or a bad value is a LaunchError
naming the key and what it accepts. (Read here rather than through apps.common.config, which
imports mcr and so torch: launching stays light.) Wall times come in one format, h:mm:ss, and
`walltime()` writes each scheduler's own form.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Dict, List

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEMS_DIR = os.path.join(REPO, "configs", "systems")


class LaunchError(ValueError):
    """A bad system file, option or app name: the message names it and the fix."""


# srun_mpi "": no --mpi flag, the site's MpiDefault (slurm.conf)
CHOICES = {
    "scheduler": ("slurm", "lsf", "pbs", "cobalt"),
    "srun_mpi": ("pmix", "pmi2", "cray_shasta", "none", ""),
    "gpu_bind": ("per_task", "none"),
}


@dataclass
class QueueRule:
    """A queue and the jobs it takes: `queues` lists them in order of preference."""

    name: str = ""
    min_nodes: int = 1
    max_nodes: int = 1
    max_time: str = "1:00:00"  # h:mm:ss
    jobs_per_user: int = 0  # how many of one user's jobs it holds at once (0: no limit known)

    def takes(self, nodes: int, seconds: int) -> bool:
        return self.min_nodes <= nodes <= self.max_nodes and seconds <= parse_time(self.max_time)

    def __str__(self) -> str:
        limit = f", {self.jobs_per_user} job(s) per user" if self.jobs_per_user else ""
        return f"{self.name} ({self.min_nodes}-{self.max_nodes} nodes, up to {self.max_time}{limit})"


@dataclass
class System:
    name: str = ""  # empty: the file's name
    scheduler: str = "slurm"  # slurm | lsf | pbs | cobalt
    account: str = ""  # SLURM --account, LSF -G (bank), PBS/Cobalt -A (project; required there)
    queue: str = ""  # SLURM --partition, LSF/PBS/Cobalt -q; empty: chosen from `queues`, else the scheduler's default
    queues: List[QueueRule] = field(default_factory=list)  # the first that takes the job's nodes and time
    ranks_per_node: int = 1  # tasks per node: one per GPU on GPU systems, any number on CPU nodes
    gpus_per_node: int = 0  # GPUs per node, one per rank (0: none requested)
    cpus_per_task: int = 1  # cores per rank; also each rank's thread count
    srun_mpi: str = "pmix"  # `srun --mpi=`: pmix for Open MPI 5, pmi2 for MPICH, cray_shasta; "": no flag
    # SLURM: how srun gives each rank its GPU. per_task: --gpus-per-task=1, one GPU per rank fenced
    # off by cgroup; none: --gpu-bind=none, every rank sees its node's GPUs and mcr (or rank_wrapper)
    # picks one, which CUDA IPC between a node's ranks needs (CUDA-aware MPI: docs/launchers.md)
    gpu_bind: str = "per_task"
    launcher_args: str = ""  # added to srun/jsrun/mpirun/mpiexec, e.g. the MPI's GPU switch (jsrun --smpiargs="-gpu")
    rank_wrapper: str = ""  # a command each rank runs the trainer through, e.g. a per-rank CUDA_VISIBLE_DEVICES script
    node_resources: str = ""  # PBS: appended to `-l select=N`, e.g. ":system=polaris"
    directives: list = field(default_factory=list)  # extra scheduler lines, e.g. ["-l filesystems=home:eagle"]
    preamble: list = field(default_factory=list)  # shell lines: module loads, venv/conda activation
    env: Dict[str, str] = field(default_factory=dict)  # variables exported before the ranks start ("": unset)
    # NCCL's network plugin (aws-ofi-nccl on Slingshot): its library directories, put first on
    # LD_LIBRARY_PATH, and the NCCL and libfabric settings the site gives for it (env overrides
    # each); nccl_plugin_off leaves both out and unsets those variables
    nccl_plugin: List[str] = field(default_factory=list)
    nccl_env: Dict[str, str] = field(default_factory=dict)
    nccl_plugin_off: bool = False
    # the fast network's interface on the nodes (e.g. ib0, hsn0): gloo and Open MPI send over it
    # (GLOO_SOCKET_IFNAME, Open MPI's TCP include lists); empty: whatever the hostnames resolve to
    interface: str = ""
    torch_extensions_cache: str = ""  # pre-built DeepSpeed ops, copied into each job's own TORCH_EXTENSIONS_DIR


def system_path(name_or_path: str) -> str:
    if os.path.isfile(name_or_path):
        return name_or_path
    path = os.path.join(SYSTEMS_DIR, f"{name_or_path}.yaml")
    if os.path.isfile(path):
        return path
    known = sorted(f[: -len(".yaml")] for f in os.listdir(SYSTEMS_DIR) if f.endswith(".yaml"))
    raise LaunchError(f"--system: no file {name_or_path!r} and no system of that name; known: {', '.join(known)}")


def load_system(name_or_path: str, **overrides) -> System:
    """Read a system file; `overrides` (account=..., queue=...) replace its values when not None."""
    path = system_path(name_or_path)
    given = OmegaConf.create({key: value for key, value in overrides.items() if value is not None})
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(System), OmegaConf.load(path), given)
    except ConfigKeyError as exc:
        valid = ", ".join(System.__dataclass_fields__)
        raise LaunchError(f"unknown key {exc.full_key!r} in {path}; valid keys: {valid}") from None
    except OmegaConfBaseException as exc:
        raise LaunchError(f"bad value for key {exc.full_key!r} in {path}: {str(exc).splitlines()[0]}") from None
    for key, choices in CHOICES.items():
        if cfg[key] not in choices:
            shown = ", ".join(repr(c) if c == "" else c for c in choices)
            raise LaunchError(f"bad value {cfg[key]!r} for key {key!r} in {path}; choose one of {shown}")
    for key, least in (("ranks_per_node", 1), ("gpus_per_node", 0), ("cpus_per_task", 1)):
        if cfg[key] < least:
            raise LaunchError(f"bad value {cfg[key]} for key {key!r} in {path}: must be >= {least}")
    if cfg.gpus_per_node not in (0, cfg.ranks_per_node):  # the scripts give each rank one GPU
        raise LaunchError(
            f"bad value {cfg.gpus_per_node} for key 'gpus_per_node' in {path}: "
            f"0 or ranks_per_node ({cfg.ranks_per_node}), one rank per GPU"
        )
    if cfg.scheduler in ("pbs", "cobalt") and not cfg.account:
        raise LaunchError(
            f"system {cfg.name or path!r}: {cfg.scheduler} jobs need a project to charge; "
            "give --account PROJECT or set account: in the system file"
        )
    for rule in cfg.queues:
        try:
            parse_time(rule.max_time)
        except LaunchError:
            raise LaunchError(
                f"bad max_time {rule.max_time!r} of queue {rule.name!r} in {path}: give h:mm:ss"
            ) from None
    system = OmegaConf.to_object(cfg)
    system.env = {str(key): str(value) for key, value in system.env.items()}
    system.nccl_env = {str(key): str(value) for key, value in system.nccl_env.items()}
    system.name = system.name or os.path.basename(path)[: -len(".yaml")]
    return system


def queue_for(system: System, nodes: int, seconds: int) -> QueueRule | None:
    """The rule of the queue a job goes to: the first of `system.queues` that takes its node count
    and wall time; None where the system names its queue (`queue`, or --queue) or lists none."""
    if system.queue or not system.queues:
        return None
    for rule in system.queues:
        if rule.takes(nodes, seconds):
            return rule
    known = "; ".join(str(rule) for rule in system.queues)
    raise LaunchError(
        f"no queue of {system.name} takes {nodes} node(s) for {walltime('pbs', seconds)}: {known}; "
        "change --nodes or --time, or name one with --queue"
    )


def queue_name(system: System, nodes: int, seconds: int) -> str:
    """--queue or the system's queue, else the one `queue_for` chooses ("": the scheduler's default)."""
    rule = queue_for(system, nodes, seconds)
    return rule.name if rule is not None else system.queue


def parse_time(text: str) -> int:
    """'h:mm:ss' -> seconds. The one format accepted, so '1:00' cannot mean an hour here and a minute there."""
    match = re.fullmatch(r"(\d+):([0-5]\d):([0-5]\d)", text)
    if not match:
        raise LaunchError(f"--time: bad value {text!r}; give h:mm:ss, e.g. 0:30:00 for half an hour")
    hours, minutes, seconds = map(int, match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total == 0:
        raise LaunchError("--time: must be more than 0:00:00")
    return total


def walltime(scheduler: str, seconds: int) -> str:
    """The scheduler's own form: SLURM and PBS h:mm:ss, LSF -W h:mm, Cobalt -t minutes (rounded up)."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if scheduler in ("slurm", "pbs"):
        return f"{hours}:{minutes:02d}:{secs:02d}"
    whole_minutes = -(-seconds // 60)
    if scheduler == "lsf":
        return f"{whole_minutes // 60}:{whole_minutes % 60:02d}"
    return str(whole_minutes)
