"""What DeepSpeed's engine and ZeRO-3 take as their device on a rank that sees one GPU.

    python -m launch.local -n 2 -m tests.hooks.scripts.deepspeed_device emulated   # on the CPU
    CUDA_VISIBLE_DEVICES=0 python -m launch.local -n 2 -m tests.hooks.scripts.deepspeed_device gpu

A node whose ranks each see one GPU (jsrun resource sets, Polaris' affinity script,
`srun --gpus-per-task=1`). "gpu": on a real one; torch.cuda.set_device records the device it is
given, then sets it. "emulated", on the CPU:
- mcr's side: `mcr.streams.bind_device` applies mcr's rule (local rank % device count) to a device
  count of 1, without asking torch (a CPU build has no device to bind), and each rank's GPU has
  its own identity (`mcr.streams.gpu_identity`);
- DeepSpeed's side: its CUDA accelerator (DS_ACCELERATOR=cuda); torch.cuda.set_device, which a CPU
  build cannot run, only records the device it is given. Nothing else is replaced.

Then `mcr.hooks.deepspeed.install()` and DeepSpeed's own code, as `deepspeed.initialize()` runs it:
the engine's argument checks and `_configure_with_arguments` (under Open MPI's mpiexec, its assert
that LOCAL_RANK equals OMPI_COMM_WORLD_LOCAL_RANK), `_set_distributed_vars` (the engine's
set_device and device), and ZeRO-3's `zero.Init` (its local device and set_device). Every rank
prints `DEVICE <rank> <json>`.
"""

import os
import sys
import threading

os.environ["DS_ACCELERATOR"] = "cuda"

import torch  # noqa: E402

import mcr.hooks.deepspeed  # noqa: E402
import mcr.streams  # noqa: E402
from tests.report import report  # noqa: E402

VISIBLE_GPUS = 1
set_device_calls = []


def recording(set_device):
    def record_set_device(device):  # DeepSpeed's calls: on this thread (the runtime's threads bind too)
        if threading.current_thread() is threading.main_thread():
            set_device_calls.append(
                str(torch.device("cuda", device) if isinstance(device, int) else torch.device(device))
            )
        if set_device is not None:
            set_device(device)

    return record_set_device


def set_devices():
    """The devices torch.cuda.set_device was given since the last call."""
    calls = list(set_device_calls)
    set_device_calls.clear()
    return calls


def emulated_bind_device(local_rank):
    """mcr's rule on a node whose ranks each see one GPU of their own: the device it binds, kept
    where the runtime reads it (`mcr.streams.bound_device`), and that GPU's identity per rank."""
    mcr.streams._bound = torch.device("cuda", local_rank % VISIBLE_GPUS)
    mcr.streams.gpu_identity = lambda: f"GPU-emulated-{local_rank}"
    return mcr.streams._bound


def main(mode):
    if mode == "emulated":
        torch.cuda.set_device = recording(None)
        mcr.streams.bind_device = emulated_bind_device
    else:
        assert torch.cuda.device_count() == VISIBLE_GPUS, f"{torch.cuda.device_count()} GPUs visible, want 1"
        torch.cuda.set_device = recording(torch.cuda.set_device)

    rt = mcr.hooks.deepspeed.install({"backend": "gloo"})
    import deepspeed
    import deepspeed.comm as dist
    from deepspeed.runtime.engine import DeepSpeedEngine

    set_devices()
    engine = type("EngineFields", (), {})()  # the fields these DeepSpeedEngine methods set
    DeepSpeedEngine._do_args_sanity_check(engine, None)
    DeepSpeedEngine._configure_with_arguments(engine, None, None)
    DeepSpeedEngine._set_distributed_vars(engine, None)
    engine_set = set_devices()
    zero3 = deepspeed.zero.Init(config_dict_or_path={"train_batch_size": 2, "zero_optimization": {"stage": 3}})
    report(
        "DEVICE",
        rt.rank,
        value={
            "mcr": str(rt.device),
            "launcher local rank": rt.info.local_rank,
            "LOCAL_RANK": os.environ["LOCAL_RANK"],
            "OMPI_COMM_WORLD_LOCAL_RANK": os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK"),
            "engine local_rank": engine.local_rank,
            "engine device": str(engine.device),
            "engine set_device": engine_set,
            "deepspeed.comm local rank": dist.get_local_rank(),
            "zero3 local_device": str(zero3.local_device),
            "zero3 set_device": set_devices(),
            "current device": str(torch.device("cuda", torch.cuda.current_device())) if mode == "gpu" else None,
        },
    )
    dist.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
