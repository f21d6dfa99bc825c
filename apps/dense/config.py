"""The dense trainer's config schema (typos are errors) and the checks a schema cannot express,
all made before any process group exists.

Presets live in configs/dense/; `python -m apps.dense --config configs/dense/tiny.yaml parallel.tensor=2`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Optional

from apps.common.config import ConfigError, check, choice
from apps.common.data import DataConfig, check_data
from apps.common.deepspeed_config import DeepSpeedTrainConfig, check_deepspeed_train
from apps.common.parallel_dims import ParallelDims
from apps.common.trainer_config import TrainerConfig, check_trainer
from apps.dense.model import ModelConfig

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class ParallelConfig:
    tensor: int = 1  # TP: ranks sharing each layer's weights (adjacent ranks, as Megatron)
    pipeline: int = 1  # PP: pipeline stages (DeepSpeed's PipelineModule, 1F1B); data parallel fills the rest
    sequence: bool = False  # sequence parallel: TP all-reduces become reduce-scatter/all-gather pairs
    partition: str = choice("planner", "uniform", "parameters")  # how the layers are cut into stages
    profile: Optional[str] = None  # planner: a bapipe profile file to plan from (null: profile the layers now)
    cluster: str = os.path.join(REPO, "configs", "bapipe", "cpu-2proc.yaml")  # planner: the bapipe cluster file


@dataclass
class DenseTrainConfig(DeepSpeedTrainConfig):
    zero_stage: int = choice(0, 1, 2, 3)  # 3 shards the parameters too (no pipeline: DeepSpeed allows 0-1 there)


@dataclass
class DenseConfig(TrainerConfig):  # name, out_dir, resume, comm, checkpoint, log_interval, eval_interval, ...
    name: str = "dense"
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: DenseTrainConfig = field(default_factory=DenseTrainConfig)  # grad_accum: the 1F1B micro-batches
    eval_iters: int = 4  # validation batches per evaluation


def num_pipeline_layers(model: ModelConfig) -> int:
    return model.n_layer + 2  # embedding, the transformer layers, the head


def validate(cfg, world_size: int) -> ParallelDims:
    """Every check that needs no process group: run before any is created. Returns the degrees."""
    m, p, t = cfg.model, cfg.parallel, cfg.train
    dims = ParallelDims(
        world_size, tp=p.tensor, pp=p.pipeline, keys={"tp": "parallel.tensor", "pp": "parallel.pipeline"}
    )  # data parallel fills the rest
    tp, pp = dims.tp, dims.pp
    check(
        m.d_model % tp == 0,
        "model.d_model",
        f"hidden size {m.d_model} is not divisible by parallel.tensor={tp}; use a multiple of {tp}",
    )
    check(
        m.n_head % tp == 0,
        "model.n_head",
        f"{m.n_head} heads are not divisible by parallel.tensor={tp}; each TP rank needs whole heads",
    )
    check(m.d_model % m.n_head == 0, "model.d_model", f"{m.d_model} is not divisible by model.n_head={m.n_head}")
    check(
        m.vocab_size % tp == 0,
        "model.vocab_size",
        f"vocabulary {m.vocab_size} is not divisible by parallel.tensor={tp}; pad it to a multiple of {tp}",
    )
    if p.sequence:
        check(tp > 1, "parallel.sequence", "sequence parallelism needs parallel.tensor > 1")
        check(
            m.seq_len % tp == 0,
            "model.seq_len",
            f"{m.seq_len} is not divisible by parallel.tensor={tp}, as sequence parallelism needs",
        )
    layers = num_pipeline_layers(m)
    check(
        pp <= layers,
        "parallel.pipeline",
        f"{pp} stages but the model has {layers} pipeline layers (embedding, {m.n_layer} transformer "
        f"layers, head); use at most {layers} stages or more model.n_layer",
    )
    check(
        pp == 1 or t.zero_stage <= 1,
        "train.zero_stage",
        f"ZeRO-{t.zero_stage} does not work with a pipeline (DeepSpeed allows stage 0-1 with parallel.pipeline > 1)",
    )
    if pp > 1 and p.partition == "planner":
        check(
            p.profile is None or os.path.isfile(p.profile),
            "parallel.profile",
            f"no such file {p.profile!r}; give a profile from `python -m bapipe profile`, or null to profile now",
        )
        check(os.path.isfile(p.cluster), "parallel.cluster", f"no such file {p.cluster!r}; give a bapipe cluster file")
        _check_planner_inputs(p, layers, pp * dims.dp)
    check(cfg.eval_iters >= 1, "eval_iters", f"must be >= 1, got {cfg.eval_iters}")
    check_data(cfg.data, m.vocab_size)
    check_trainer(cfg)
    check_deepspeed_train(t)
    return dims


LAYOUT_FILE = "layout.json"  # in each checkpoint tag: how the model was cut when it was saved


def checkpoint_layout(cfg, dims: ParallelDims) -> dict:
    """What a checkpoint's shards depend on, by config key: the model's shapes, the TP and PP cut,
    ZeRO stage and precision (their optimizer files), and with ZeRO the data-parallel degree."""
    m, t = cfg.model, cfg.train
    layout = {f"model.{k}": m[k] for k in ("vocab_size", "seq_len", "n_layer", "n_head", "d_model", "ffn_mult")}
    layout |= {"parallel.tensor": dims.tp, "parallel.pipeline": dims.pp}
    layout |= {"train.zero_stage": t.zero_stage, "train.precision": t.precision}
    if t.zero_stage > 0:  # ZeRO shards the optimizer state across the data-parallel ranks
        layout["data-parallel degree"] = dims.dp
    return layout


def check_resume_layout(cfg, dims: ParallelDims, ckpt_dir: str, tag: Optional[str]) -> None:
    """resume=true: the checkpoint must have been saved with this run's layout (its shards are
    per TP/PP rank); checked here, not as a shape error deep inside DeepSpeed's load."""
    path = os.path.join(ckpt_dir, tag or "", LAYOUT_FILE)
    if not cfg.resume or tag is None or not os.path.isfile(path):
        return
    with open(path) as f:
        saved = json.load(f)
    now = checkpoint_layout(cfg, dims)
    differ = [f"{key}={saved[key]} (this run: {now[key]})" for key in now if key in saved and saved[key] != now[key]]
    if differ:
        raise ConfigError(
            f"resume=true, but checkpoint {tag} in {ckpt_dir} was saved with {', '.join(differ)}; "
            "resume with the checkpoint's values, or start afresh (resume=false or another name)"
        )


def _check_planner_inputs(p, layers: int, devices: int) -> None:
    """The planner's profile must describe this model, and its cluster hold every stage replica."""
    from bapipe.cluster import Cluster
    from bapipe.profile import Profile

    try:
        cluster = Cluster.load(p.cluster)
    except ValueError as exc:
        raise ConfigError(f"bad value for config key 'parallel.cluster': {exc}") from None
    try:
        profile = Profile.load(p.profile) if p.profile else None
    except ValueError as exc:
        raise ConfigError(f"bad value for config key 'parallel.profile': {exc}") from None
    check(
        cluster.size >= devices,
        "parallel.cluster",
        f"cluster {cluster.name} has {cluster.size} devices; the planner needs one per stage replica "
        f"(pipeline x data = {devices}); describe a larger cluster or use parallel.partition=uniform",
    )
    check(
        profile is None or profile.num_layers == layers,
        "parallel.profile",
        f"{p.profile} profiles {profile and profile.num_layers} layers, this model has {layers} pipeline layers",
    )
