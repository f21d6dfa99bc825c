"""Pipeline stage boundaries: `parallel.partition: planner | uniform | parameters`.

`planner` is bapipe's exact planner (`bapipe.explore.optimal_plan`, 1F1B, `train.grad_accum`
micro-batches, data-parallel replicas) on the cluster file `parallel.cluster`, fed with a
profile of this model's pipeline layers: read from `parallel.profile`, or measured now with
`bapipe.profile.profile_stack` (thread CPU time per layer, forward and backward). The profile
is of the whole-width layers (no tensor parallelism): tensor parallelism divides every layer's
matrices alike, so it scales the stage costs together and leaves the best cut where it was.
`uniform` and `parameters` are DeepSpeed's own methods, passed to `PipelineModule`.
"""

from __future__ import annotations

import torch

from apps.dense.model import ModelConfig, TensorParallel, layer_specs, lm_loss


def model_stack(cfg: ModelConfig, seed: int, micro_batch: int):
    """The pipeline layers as a bapipe LayerStack (no tensor parallelism), for profiling."""
    from bapipe.models import LayerStack

    def make_batch(batch):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len + 1), generator=g)
        return ids[:, :-1], ids[:, 1:]

    layers = [cls(*args) for cls, args in layer_specs(cfg, TensorParallel(None), seed)]
    return LayerStack("apps.dense.gpt", layers, make_batch, lm_loss)


def plan_parts(cfg, stages: int, replicas: int, profile_out: str) -> tuple[list, dict]:
    """bapipe's optimal 1F1B partition: (DeepSpeed `parts`, the plan as JSON). Saves the profile used."""
    from bapipe.cluster import Cluster
    from bapipe.explore import CostModel, optimal_plan
    from bapipe.profile import Profile, profile_stack

    if cfg.parallel.profile:
        profile = Profile.load(cfg.parallel.profile)
    else:
        threads = torch.get_num_threads()  # profile_stack times one thread; the trainer keeps its own
        profile = profile_stack(model_stack(cfg.model, cfg.train.seed, cfg.train.micro_batch), cfg.train.micro_batch)
        torch.set_num_threads(threads)
    profile.save(profile_out)
    cost = CostModel(profile, Cluster.load(cfg.parallel.cluster), stages, cfg.train.grad_accum, "1f1b", replicas)
    plan = optimal_plan(cost)
    return plan.deepspeed_parts, plan.to_json()
