"""What the DeepSpeed trainers (moe, dense) share: their train section, the DeepSpeed settings
built from it, and the engine calls the training loop is given (save, load, learning rate)."""

from __future__ import annotations

from dataclasses import dataclass

from .config import check
from .schema import choice
from .trainer_config import TrainConfig


@dataclass
class DeepSpeedTrainConfig(TrainConfig):
    micro_batch: int = 8  # sequences per data-parallel rank per micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    warmup_steps: int = 10  # linear warm-up, then linear decay to 0 at `steps` (DeepSpeed WarmupDecayLR)
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    zero_stage: int = choice(0, 1, 2)  # DeepSpeed's MoE has no ZeRO-3; the dense trainer's takes 3 too
    precision: str = choice("fp32", "bf16")


def check_deepspeed_train(t) -> None:
    """The checks of the fields `DeepSpeedTrainConfig` adds (`check_trainer` checks the rest)."""
    for key in ("micro_batch", "grad_accum"):
        check(t[key] >= 1, f"train.{key}", f"must be >= 1, got {t[key]}")
    check(t.warmup_steps >= 0, "train.warmup_steps", f"must be >= 0 (0: no warm-up), got {t.warmup_steps}")
    check(t.grad_clip >= 0, "train.grad_clip", f"must be >= 0 (0: no clipping), got {t.grad_clip}")


def deepspeed_config(t) -> dict:
    """Adam with linear warm-up then decay, clipping, ZeRO stage and precision from `t`."""
    import torch

    adam = {"lr": t.lr, "betas": [0.9, 0.95], "weight_decay": t.weight_decay}
    if torch.cuda.is_available():
        # torch's AdamW, the same update: DeepSpeed's FusedAdam is a CUDA op that it would build
        # with nvcc at the first step (CPU runs keep its CPU op, which `make setup` builds)
        adam["torch_adam"] = True
    return {
        "train_micro_batch_size_per_gpu": t.micro_batch,
        "gradient_accumulation_steps": t.grad_accum,
        "gradient_clipping": t.grad_clip,
        "optimizer": {"type": "Adam", "params": adam},
        "scheduler": {
            "type": "WarmupDecayLR",
            "params": {
                "warmup_min_lr": 0.0,
                "warmup_max_lr": t.lr,
                "warmup_num_steps": t.warmup_steps,
                "total_num_steps": t.steps,
                "warmup_type": "linear",
            },
        },
        "zero_optimization": {"stage": t.zero_stage},
        "bf16": {"enabled": t.precision == "bf16"},
        "steps_per_print": 10**9,  # we print our own line
    }


def save_engine(engine, ckpt_dir: str, tag: str, step: int) -> None:
    """Every rank writes its files of checkpoint `tag`; DeepSpeed's save ends with a barrier, so on
    return every rank's files are complete (the loop then points `latest` at it)."""
    engine.save_checkpoint(ckpt_dir, tag=tag, client_state={"step": step}, save_latest=False)


def load_engine(engine, ckpt_dir: str, tag: str) -> None:
    engine.load_checkpoint(ckpt_dir, tag=tag)


def engine_lr(engine) -> float:
    """The learning rate the step line shows (the scheduler's, first parameter group)."""
    return engine.get_lr()[0]
