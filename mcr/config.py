"""The runtime's settings: a typed schema (typos are errors), filled from config and environment.

Precedence for each field: keyword arguments to `mcr.init()` > environment (`MCR_*`) > config
object > defaults. Per-op overrides come from `overrides` or `MCR_BACKEND_<OP>` variables.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, Optional

from omegaconf import OmegaConf

from . import backends as registry
from .backends.mpi_cuda import check_setting as check_mpi_cuda_aware
from .ops import OP_FAMILIES
from .tuning.candidates import HOST_SUFFIX, NODE_PREFIX, parse_label


@dataclass
class RuntimeConfig:
    # default for every op: auto (tuning table, then built-in order), a backend name or node:INTRA+INTER
    backend: str = "auto"
    overrides: Dict[str, str] = field(default_factory=dict)  # op family -> backend (or node:INTRA+INTER)
    tuning: Optional[str] = None  # path of a tuning table written by `python -m mcr.tools.tune`, or "auto"
    tuning_predict: bool = False  # accept a table from another world size through its performance model
    tuning_save: Optional[str] = None  # with tuning: auto, rank 0 writes the learned table here
    comm_log: bool = False  # keep per-(op, backend, size) timings; table printed at finalize()
    comm_log_json: Optional[str] = None  # where finalize() writes the log as JSON
    watchdog_timeout_s: float = 600.0  # a rank stuck this long in one op aborts the job
    backends: Optional[str] = None  # which backends to start, where available (None: every registered one)
    debug: str = "off"  # detail: before each collective the group's ranks check they make the same call
    progress_thread: bool = True  # a thread completes async ops (and their futures) nobody waits on
    # the flight recorder (`mcr.flight`): the last N ops per rank (0: off), dumped into this
    # directory on a hang, SIGTERM, SIGUSR1, an uncaught exception or mcr.dump_flight_record()
    flight_recorder: int = 2000
    flight_recorder_dir: Optional[str] = None  # no directory: nothing is written
    flight_recorder_dump_on_finalize: bool = False  # also dump at finalize() (a run that ended well)
    trace_dir: Optional[str] = None  # finalize() writes a timeline of every op here (`mcr.trace`)
    # hand CUDA tensors to MPI as device pointers: auto (decided per MPI library, then checked by an
    # all-reduce on the GPU at start), true (the user says so; still checked), false (staged through host memory)
    mpi_cuda_aware: str = "auto"
    # two ranks on one GPU, or a local rank wrapped around the GPUs it sees: an error at start-up
    # instead of a warning (mcr.topology.binding_problems)
    strict_binding: bool = False
    # let a CUDA-aware MPI and NCCL run side by side on the GPU (unsupported by NCCL: they may
    # deadlock); by default they take turns (`mcr.gpu_turns`)
    mpi_nccl_concurrent: bool = False
    # each rank writes its rank, host and PID here at start-up (`mcr.rank_file`), so the launcher's
    # side can name a rank that dies; launch.local and the job scripts set it
    rank_dir: Optional[str] = None

    def backend_names(self) -> list:
        """The backends to start, in the registry's order."""
        if self.backends is None:
            return list(registry.names())
        return [name.strip() for name in self.backends.split(",")]


class ConfigError(ValueError):
    pass


def _check_backend(name: str, where: str, node_aware: bool = True) -> str:
    """A backend name, or (where an op's choice is named) a node-aware candidate node:INTRA+INTER
    or a staged one, BACKEND/host."""
    if node_aware and name.startswith(NODE_PREFIX):
        try:
            choice = parse_label(name)
        except ValueError as exc:
            raise ConfigError(f"{exc} in {where}") from None
        for part in (choice.backend, choice.inter):
            _check_backend(part, f"{name!r} in {where}", node_aware=False)
        return name
    if node_aware and name.endswith(HOST_SUFFIX):  # CUDA tensors staged through host memory
        _check_backend(name.removesuffix(HOST_SUFFIX), f"{name!r} in {where}", node_aware=False)
        return name
    if name not in registry.REGISTRY:
        also = ", BACKEND/host, or node:INTRA+INTER (e.g. node:mpi+gloo)" if node_aware else ""
        raise ConfigError(f"unknown backend {name!r} in {where}; choose one of {', '.join(registry.names())}{also}")
    return name


def _text(var, value):
    return value


def _flag(var, value):
    word = value.strip().lower()
    if word not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
        raise ConfigError(f"bad value {value!r} for {var}: use 1 or 0 (also true/false, yes/no, on/off)")
    return word in ("1", "true", "yes", "on")


def _count(var, value):
    try:
        count = int(value)
    except ValueError:
        count = -1
    if count < 0:
        raise ConfigError(f"bad value {value!r} for {var}: give a number of entries (0 turns it off), e.g. {var}=2000")
    return count


def _seconds(var, value):
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"bad value {value!r} for {var}: give a number of seconds, e.g. {var}=600") from None


# environment variable -> (config field, parser whose errors name the variable)
ENV_VARS = {
    "MCR_BACKEND": ("backend", _text),
    "MCR_BACKENDS": ("backends", _text),
    "MCR_TUNING_FILE": ("tuning", _text),
    "MCR_TUNING_PREDICT": ("tuning_predict", _flag),
    "MCR_TUNING_SAVE": ("tuning_save", _text),
    "MCR_COMM_LOG": ("comm_log", _flag),
    "MCR_COMM_LOG_JSON": ("comm_log_json", _text),
    "MCR_WATCHDOG_TIMEOUT": ("watchdog_timeout_s", _seconds),
    "MCR_DEBUG": ("debug", _text),
    "MCR_PROGRESS_THREAD": ("progress_thread", _flag),
    "MCR_FR_SIZE": ("flight_recorder", _count),
    "MCR_FR_DIR": ("flight_recorder_dir", _text),
    "MCR_FR_DUMP_ON_FINALIZE": ("flight_recorder_dump_on_finalize", _flag),
    "MCR_TRACE_DIR": ("trace_dir", _text),
    "MCR_MPI_CUDA_AWARE": ("mpi_cuda_aware", _text),
    "MCR_STRICT_BINDING": ("strict_binding", _flag),
    "MCR_MPI_NCCL_CONCURRENT": ("mpi_nccl_concurrent", _flag),
    "MCR_RANK_DIR": ("rank_dir", _text),
}


def load(config=None, env=None, **kwargs) -> RuntimeConfig:
    """Build the runtime config. `config` may be a RuntimeConfig, a dict or an omegaconf node."""
    env = os.environ if env is None else env
    schema = OmegaConf.structured(RuntimeConfig)
    layers = [schema]
    if config is not None:
        layers.append(OmegaConf.create(config) if isinstance(config, dict) else OmegaConf.structured(config))
    unknown = [
        var for var in env if var.startswith("MCR_") and var not in ENV_VARS and not var.startswith("MCR_BACKEND_")
    ]
    if unknown:  # a misspelt setting would otherwise be ignored without a word
        raise ConfigError(
            f"unknown environment variable {', '.join(sorted(unknown))}; mcr reads {', '.join(ENV_VARS)} "
            "and MCR_BACKEND_<OP>"
        )
    from_env = {}
    for var, (key, parse) in ENV_VARS.items():
        if env.get(var):
            from_env[key] = parse(var, env[var])
    env_overrides = {
        key[len("MCR_BACKEND_") :].lower(): value for key, value in env.items() if key.startswith("MCR_BACKEND_")
    }
    if env_overrides:
        from_env["overrides"] = env_overrides
    layers += [OmegaConf.create(from_env), OmegaConf.create(kwargs)]
    try:
        merged = OmegaConf.merge(*layers)
    except Exception as exc:  # omegaconf names the bad key and the schema
        raise ConfigError(f"bad mcr runtime config: {exc}") from exc
    cfg: RuntimeConfig = OmegaConf.to_object(merged)
    if cfg.backend != "auto":
        _check_backend(cfg.backend, "backend (MCR_BACKEND)")
    for op, name in cfg.overrides.items():
        if op not in OP_FAMILIES:
            raise ConfigError(
                f"unknown op {op!r} in backend overrides (MCR_BACKEND_{op.upper()}); "
                f"choose one of {', '.join(OP_FAMILIES)}"
            )
        if name != "auto":
            _check_backend(name, f"the override for {op}")
    if cfg.flight_recorder < 0:
        raise ConfigError(f"bad value {cfg.flight_recorder} for flight_recorder (MCR_FR_SIZE): give 0 (off) or more")
    try:
        cfg.mpi_cuda_aware = check_mpi_cuda_aware(cfg.mpi_cuda_aware)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.debug not in ("off", "detail"):
        raise ConfigError(f"bad value {cfg.debug!r} for debug (MCR_DEBUG); choose off or detail")
    for name in cfg.backend_names():
        _check_backend(name, "backends", node_aware=False)
    return cfg
