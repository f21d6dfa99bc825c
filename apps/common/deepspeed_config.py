"""The DeepSpeed settings every DeepSpeed trainer shares, built from its `train` section."""


def deepspeed_config(t) -> dict:
    """Adam with linear warm-up then decay, clipping, ZeRO stage and precision from `t`."""
    return {
        "train_micro_batch_size_per_gpu": t.micro_batch,
        "gradient_accumulation_steps": t.grad_accum,
        "gradient_clipping": t.grad_clip,
        "optimizer": {"type": "Adam", "params": {"lr": t.lr, "betas": [0.9, 0.95], "weight_decay": t.weight_decay}},
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
