"""What this rank's device rules out of a config, refused before any process group.

    check_device(cfg, (7, 0))          # a V100: train.precision=bf16 is refused
    check_device(cfg, None)            # no GPU: comm.backend=nccl is refused
    check_device(cfg, rank_capability())   # what check_trainer runs, for the GPU this rank will use

Without it such a preset starts every rank and fails later, inside DeepSpeed or the runtime's
first collective. The rule is a pure function of the config and the GPU's compute capability, so
the tests give it the presets and the capabilities of GPUs they do not have.
"""

from __future__ import annotations

from typing import Optional

from omegaconf import OmegaConf

from .config import ConfigError

# bf16 math needs Ampere (8.0) or newer. torch.cuda.is_bf16_supported() says True on a V100 too
# (it counts emulation), so the capability decides.
BF16_CAPABILITY = (8, 0)


def check_device(cfg, capability: Optional[tuple]) -> None:
    """Raise ConfigError, naming the key and the fix, for what a GPU of `capability` (major,
    minor), or no GPU (None), cannot run. bf16 on the CPU is allowed: DeepSpeed runs it there."""
    precision = OmegaConf.select(cfg, "train.precision")  # only the DeepSpeed trainers have it
    if precision == "bf16" and capability is not None and tuple(capability) < BF16_CAPABILITY:
        have, need = ".".join(map(str, capability)), ".".join(map(str, BF16_CAPABILITY))
        raise ConfigError(
            f"bad value 'bf16' for config key 'train.precision': this GPU has compute capability {have} "
            f"and bf16 needs >= {need} (A100, H100 or newer); use train.precision=fp32"
        )
    if capability is None:
        for key, name in _backends(cfg.comm.backend):
            if name == "nccl":
                raise ConfigError(
                    f"bad value 'nccl' for config key '{key}': NCCL needs a GPU and torch sees none on this "
                    f"rank; use auto, gloo or mpi"
                )


def _backends(backend) -> list:
    """[(config key, backend name)] for `comm.backend`: one name, or a map {op family: name}."""
    if isinstance(backend, str):
        return [("comm.backend", backend)]
    return [(f"comm.backend.{op}", name) for op, name in backend.items()]


def rank_capability() -> Optional[tuple]:
    """(major, minor) of the GPU this rank will use (the trainers take cuda:<local rank>), or
    None where torch sees no GPU and the trainers run on the CPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    from mcr.env import discover

    # % count: a launcher that shows each rank only its own GPU leaves one device visible
    return tuple(torch.cuda.get_device_capability(discover().local_rank % torch.cuda.device_count()))
