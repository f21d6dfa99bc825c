"""The one place a trainer's communication is set up, one call per kind of app, before the model:
`setup_deepspeed_comm(cfg.comm)` (DeepSpeed apps) or `setup_torch_comm(cfg.comm)` (torch.distributed
apps: DDP, TorchRec). Both start the mcr runtime, so `mcr.new_group` works after either (e.g.
`ParallelDims.build_groups`). Then `comm_seconds()` for the step-time split, `finalize_comm()` at
the end (prints the comm table).

`comm.backend` is `auto | gloo | mpi | nccl` or a map `{op family: backend, default: backend}`;
`comm.tuning` is a tuning-table file written by `python -m mcr.tools.tune`, or `auto` (tuned online).
Every collective goes through the mcr runtime, which picks the backend per call.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Optional

from .config import ConfigError


@dataclass
class CommConfig:
    backend: Any = "auto"  # auto | a backend (gloo, mpi, nccl: mcr.backends) | {op family: backend, default: backend}
    tuning: Optional[str] = None  # tuning table from `python -m mcr.tools.tune`, or auto
    log: bool = True  # keep per-(op, backend, size) timings; the table is printed at the end
    trace: bool = False  # a timeline of every comm op in <run dir>/trace (python -m mcr.tools.trace merge)
    profile_steps: int = 2  # with trace: this many steps after the warm-up also under torch.profiler


def op_families() -> tuple:
    from mcr.ops import OP_FAMILIES

    return OP_FAMILIES


def backend_choices() -> tuple:
    """auto, or one of the backends mcr registers (mcr.backends)."""
    from mcr.backends import names

    return ("auto", *names())


def check_comm(comm, key: str = "comm") -> None:
    """Raise ConfigError, naming the key and the valid choices, for a bad comm section."""
    backend, choices = comm.backend, backend_choices()
    if isinstance(backend, str):
        if backend not in choices:
            raise ConfigError(
                f"bad value {backend!r} for config key '{key}.backend'; choose one of "
                f"{', '.join(choices)}, or a map {{op family: backend}}"
            )
    elif hasattr(backend, "items"):
        families = op_families() + ("default",)
        for op, name in backend.items():
            if op not in families:
                raise ConfigError(f"unknown op {op!r} in config key '{key}.backend'; choose from {', '.join(families)}")
            if name not in choices:
                raise ConfigError(
                    f"bad value {name!r} for config key '{key}.backend.{op}'; choose one of {', '.join(choices)}"
                )
    else:
        raise ConfigError(
            f"bad value {backend!r} for config key '{key}.backend'; choose one of {', '.join(choices)} or a map"
        )
    if comm.tuning not in (None, "auto") and not os.path.isfile(comm.tuning):
        raise ConfigError(
            f"bad value {comm.tuning!r} for config key '{key}.tuning': no such file; "
            "give a table written by `python -m mcr.tools.tune`, auto, or null"
        )


def runtime_config(comm, comm_log_json: Optional[str] = None) -> dict:
    """The mcr RuntimeConfig (as a dict) that `comm` asks for. The run's other comm files go
    beside `comm_log_json` (the run dir): the flight recorder's dumps, and the trace if asked."""
    if isinstance(comm.backend, str):
        default, overrides = comm.backend, {}
    else:
        overrides = {op: name for op, name in comm.backend.items() if op != "default"}
        default = comm.backend.get("default", "auto")
    run_dir = os.path.dirname(comm_log_json) if comm_log_json else None
    return {
        "backend": default,
        "overrides": overrides,
        "tuning": comm.tuning,
        "comm_log": bool(comm.log),
        "comm_log_json": comm_log_json,
        "flight_recorder_dir": os.path.join(run_dir, "flight_recorder") if run_dir else None,
        "trace_dir": os.path.join(run_dir, "trace") if run_dir and comm.trace else None,
    }


def venv_ninja_first() -> None:
    """Put this Python's own `ninja` first on PATH, as the job scripts do. DeepSpeed builds its ops
    with the first ninja on PATH, and a build log that another ninja version wrote makes it rebuild
    every op from scratch (35-60 s a job here, with `make setup`'s build and the system's ninja)."""
    bindir = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "")
    if os.path.exists(os.path.join(bindir, "ninja")) and path.split(os.pathsep)[0] != bindir:
        os.environ["PATH"] = bindir + os.pathsep + path


def setup_deepspeed_comm(comm, comm_log_json: Optional[str] = None) -> None:
    """For DeepSpeed apps: start DeepSpeed's communication on the mcr runtime as `comm` asks.
    Call once, before the model, instead of `deepspeed.init_distributed()`: afterwards every
    deepspeed.comm op (MoE all-to-all, gating and gradient all-reduce, ZeRO's collectives,
    pipeline send/recv) goes through the runtime's per-call backend choice."""
    check_comm(comm)
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # quiet DeepSpeed's accelerator probing
    venv_ninja_first()
    from mcr.hooks import deepspeed as deepspeed_hook

    deepspeed_hook.install(runtime_config(comm, comm_log_json))


def setup_torch_comm(comm, comm_log_json: Optional[str] = None) -> None:
    """For torch.distributed apps (DDP, TorchRec): start the runtime and torch's default process
    group on backend "mcr" as `comm` asks, under any launcher (mpiexec included). Every
    collective on that group, or on groups made from it, goes through the runtime's choice."""
    check_comm(comm)
    from mcr.hooks import torch_backend

    torch_backend.init_process_group(runtime_config(comm, comm_log_json))


def comm_seconds() -> Optional[float]:
    """Seconds spent in communication so far on this rank, when the runtime measures it."""
    import mcr

    if not mcr.is_initialized() or mcr.runtime().comm_log is None:
        return None
    return sum(row["total_ms"] for row in mcr.runtime().comm_log.rows()) / 1e3


def finalize_comm() -> None:
    """Shut communication down; the runtime then prints its table on rank 0 (when logging is
    on) and writes the comm-log JSON."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()  # the "mcr" default group finalizes the runtime it started
    import mcr

    if mcr.is_initialized():
        mcr.finalize()
