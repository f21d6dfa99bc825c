"""The dense trainer (apps.dense) on 1, 2 and 4 real ranks with real DeepSpeed.

Every parallel layout trains the tiny preset with the same seed and data as one rank and must
give the same loss curve. Tolerance 2e-5 on losses ~4: fp32 throughout, and the layouts differ
only in the order of some sums (TP's split matmuls and cross-entropy, the pipeline's loss
aggregation), measured at <= 5e-7 over the 8 steps; Adam's early, nearly sign-like updates
could amplify such differences, so the bound leaves a 40x margin. A layout that computed
anything differently (a missing TP all-reduce, a wrong gradient norm, misrouted pipeline
activations) is off by 1e-3 or more from step 2 or 4.
"""

import glob
import json
import os
import re

import pytest
import torch

from apps.common.config import ConfigError, load_config
from apps.dense.config import DenseConfig, check_resume_layout, validate
from apps.dense.train import main
from tests.ranks import REPO, run_ranks, run_tool

TINY = os.path.join(REPO, "configs", "dense", "tiny.yaml")
CLUSTER = os.path.join(REPO, "configs", "bapipe", "cpu-2proc.yaml")
TOL = 2e-5


def train(out_dir, name, *overrides, nprocs=2, timeout=400, fails=False):
    result = run_ranks(
        nprocs,
        ["-m", "apps.dense", "--config", TINY, f"out_dir={out_dir}", f"name={name}", *overrides],
        timeout=timeout,
    )
    assert (result.returncode != 0) == fails, result.output[-6000:]
    run_dir = os.path.join(out_dir, name)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        metrics = [json.loads(line) for line in f]
    return result.output, metrics, run_dir


def compare(out_dir, backend, *overrides):
    """One job through `python -m apps.dense.compare`, as a user runs it: (its table, metrics, run dir)."""
    args = ["--config", TINY, "--backends", backend, f"--out={out_dir}", *overrides]
    out = run_tool("apps.dense.compare", *args).check().output
    table = out[out.index("Dense GPT (Megatron-style) throughput: tiny.yaml, 2 ranks") :]
    run_dir = os.path.join(out_dir, f"compare-dense-{backend}-r0")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        metrics = [json.loads(line) for line in f]
    return table, metrics, run_dir


def pipeline_with_failed_save_then_resume(out_dir):
    """PP=2 saves at step 5, then stage 1 fails to write its shard of step 8 (a directory is in
    the way of the head's file): `latest` must stay at step 5. With the path cleared, resume=true
    continues from step 5. Returns (the failed run, the resumed run)."""
    blocker = os.path.join(out_dir, "pp2", "checkpoints", "step_000008", "layer_03-model_00-model_states.pt")
    os.makedirs(blocker)
    failed = train(out_dir, "pp2", "parallel.pipeline=2", "checkpoint.interval=5", fails=True)
    os.rmdir(blocker)
    return failed, train(out_dir, "pp2", "parallel.pipeline=2", "checkpoint.interval=5", "resume=true")


def losses(metrics):
    return [m["loss"] for m in metrics]


def placements(run_dir, nprocs):
    out = []
    for rank in range(nprocs):
        with open(os.path.join(run_dir, "placement", f"rank{rank}.json")) as f:
            out.append(json.load(f))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name -> (output, metrics, run_dir), each made on first use."""
    out_dir = str(tmp_path_factory.mktemp("dense"))
    skewed = os.path.join(out_dir, "skewed-profile.json")
    # A profile whose first layer costs 4x the others: the planner must cut right after it.
    layer = {"param_bytes": 10000, "activation_bytes": 8192, "output_bytes": 8192}
    times = [(0.004, 0.008)] + [(0.001, 0.002)] * 3
    profile = {"layers": [{"name": str(i), "forward_s": f, "backward_s": b, **layer} for i, (f, b) in enumerate(times)]}
    with open(skewed, "w") as f:
        json.dump(profile, f)
    launches = {
        "one-rank": lambda: train(out_dir, "one-rank", "progress=true", "wandb=offline", nprocs=1),
        "tp2-zero2": lambda: compare(out_dir, "mpi", "parallel.tensor=2", "train.zero_stage=2"),
        "pp2": lambda: pipeline_with_failed_save_then_resume(out_dir),
        "tp2-pp2-sp": lambda: train(
            out_dir,
            "tp2-pp2-sp",
            "parallel.tensor=2",
            "parallel.pipeline=2",
            "parallel.sequence=true",
            f"parallel.profile={skewed}",
            nprocs=4,
        ),
    }
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = launches[name]()
        return cache[name]

    get.skewed = skewed
    return get


def test_one_rank_reference_learns(runs):
    _, metrics, _ = runs("one-rank")
    assert len(metrics) == 8 and metrics[-1]["loss"] < metrics[0]["loss"] - 0.3
    assert metrics[-1]["val_loss"] < metrics[0]["loss"]


def test_step_lines_without_a_bar_in_a_pipe_and_offline_wandb_run(runs):
    output, _, run_dir = runs("one-rank")
    # progress=true, but the output is a pipe: no bar (a terminal gets one: tests/apps/test_progress.py)
    assert "one-rank:" not in output, output[-3000:]  # no frame of the bar, named after the run
    assert re.search(r"^step 8/8 \| loss \d\.\d{4} \| val \d\.\d{4} \| [\d,]+ tok/s", output, re.M), output[-3000:]
    (wandb_file,) = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))
    with open(wandb_file, "rb") as f:
        assert b"val_loss" in f.read()  # the run's metrics went to the offline run


def test_tensor_parallel_with_zero2_matches_one_rank(runs):
    _, metrics, run_dir = runs("tp2-zero2")
    with open(os.path.join(run_dir, "ds_config.json")) as f:  # what DeepSpeed was given
        assert json.load(f)["zero_optimization"] == {"stage": 2}
    assert losses(metrics) == pytest.approx(losses(runs("one-rank")[1]), abs=TOL)


def test_compare_tabulates_the_dense_run_with_its_step_split(runs):
    table, _, run_dir = runs("tp2-zero2")  # that run went through `python -m apps.dense.compare`
    lines = table.splitlines()
    assert lines[1].split() == "backend tokens/s samples/s step ms compute comm p10 tokens/s vs mpi".split()
    row = next(line for line in lines if line.startswith("mpi")).split()
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)  # the job ran the backend and layout asked for
    assert (summary["comm_backend"], summary["steps"], summary["parallel"]) == ("mpi", 8, "pp 1 x dp 1 x tp 2")
    # TP's all-reduces go through the runtime, so the step splits into compute and comm
    assert summary["comm_ms"] > 0 and row[1] == f"{summary['tokens_per_s']:,.0f}"
    assert row[4:6] == [f"{summary['compute_ms']:.1f}", f"{summary['comm_ms']:.1f}"]


def test_pipeline_resumes_from_the_last_checkpoint_every_rank_saved_and_matches_one_rank(runs):
    failed, resumed = runs("pp2")
    output, metrics, run_dir = resumed
    assert "PipelineEngine" in failed[0] and "open file failed with strerror: Is a directory" in failed[0]
    assert "resuming at step 5" in output  # `latest` stayed at step 5: stage 1 never saved step 8
    # the resumed run replaced the failed run's records of steps 6-8 with its own, on the same curve
    assert [m["step"] for m in metrics] == list(range(1, 9))
    assert losses(metrics) == pytest.approx(losses(runs("one-rank")[1]), abs=TOL)
    with open(os.path.join(run_dir, "checkpoints", "latest")) as f:
        assert f.read() == "step_000008"
    with open(os.path.join(run_dir, "partition.json")) as f:
        parts = json.load(f)["parts"]
    for p in placements(run_dir, 2):  # the resumed run built the stages the first one planned
        assert p["layers"] == list(range(parts[p["stage"]], parts[p["stage"] + 1]))
    with open(os.path.join(run_dir, "profile.json")) as f:
        assert len(json.load(f)["layers"]) == 4  # profiled on the spot: embedding, 2 layers, head


def test_resume_with_another_layout_fails_before_any_process_group(runs):
    run_dir = runs("pp2")[1][2]  # the resumed run; its checkpoints record the layout they were saved with
    out_dir, name = os.path.split(run_dir)
    argv = ["--config", TINY, f"out_dir={out_dir}", f"name={name}", "resume=true"]
    with pytest.raises(ConfigError) as error:  # this process is a world of one: PP=2 cannot resume here
        main(argv + ["model.d_model=64", "train.zero_stage=1"])
    assert str(error.value) == (
        f"resume=true, but checkpoint step_000008 in {run_dir}/checkpoints was saved with model.d_model=32 "
        "(this run: 64), parallel.pipeline=2 (this run: 1), train.zero_stage=0 (this run: 1); "
        "resume with the checkpoint's values, or start afresh (resume=false or another name)"
    )
    assert not torch.distributed.is_initialized()
    fresh = load_config(DenseConfig, argv[:-1] + ["resume=false", "model.d_model=64"])  # a new run may differ
    check_resume_layout(fresh, validate(fresh, 1), os.path.join(run_dir, "checkpoints"), "step_000008")


def test_tensor_pipeline_and_sequence_parallel_on_4_ranks_matches_one_rank(runs):
    output, metrics, _ = runs("tp2-pp2-sp")
    assert "pp 2 x dp 1 x tp 2 (sequence parallel)" in output
    assert losses(metrics) == pytest.approx(losses(runs("one-rank")[1]), abs=TOL)
    # rank 0's comm table at the end (rank 0 is stage 0, the embedding alone): the sequence split's
    # backward all-gathers on the TP group, and the activations go to stage 1 through the runtime
    table = output[output.index("mcr communication log (rank 0)") :]
    rows = [r for r in (line.split() for line in table.splitlines()[3:]) if len(r) == 9]
    assert {("all_gather", "2"), ("send_recv", "4")} <= {(r[0], r[3]) for r in rows}, table  # op, ranks


def test_planner_partition_is_the_one_deepspeed_built(runs):
    from bapipe.cluster import Cluster
    from bapipe.explore import CostModel, optimal_plan
    from bapipe.profile import Profile

    output, _, run_dir = runs("tp2-pp2-sp")
    want = optimal_plan(CostModel(Profile.load(runs.skewed), Cluster.load(CLUSTER), 2, 2, "1f1b")).deepspeed_parts
    assert want == [0, 1, 4]  # not DeepSpeed's uniform [0, 2, 4]: the heavy first layer stands alone
    assert f"stages {want} (planner)" in output
    held = {(p["stage"], p["tensor"]): p["layers"] for p in placements(run_dir, 4)}
    assert held == {(0, 0): [0], (0, 1): [0], (1, 0): [1, 2, 3], (1, 1): [1, 2, 3]}


def test_checkpoint_holds_every_tensor_and_pipeline_ranks_shard(runs):
    _, _, run_dir = runs("tp2-pp2-sp")
    ckpt = os.path.join(run_dir, "checkpoints")
    with open(os.path.join(ckpt, "latest")) as f:
        tag = f.read()
    files = set(os.listdir(os.path.join(ckpt, tag)))
    layers = {f"layer_{layer:02d}-model_{tp:02d}-model_states.pt" for layer in range(4) for tp in range(2)}
    assert layers <= files, sorted(files)
    # the two shards of a TP-sliced weight differ: each rank saved its own slice
    a, b = (torch.load(os.path.join(ckpt, tag, f"layer_01-model_{tp:02d}-model_states.pt")) for tp in range(2))
    assert a["qkv.weight"].shape == b["qkv.weight"].shape == (48, 32) and not torch.equal(
        a["qkv.weight"], b["qkv.weight"]
    )


# --- config errors: before any process group ------------------------------------------------
@pytest.mark.parametrize(
    "world, overrides, message",
    [
        (4, ["parallel.tensor=3"], r"tp \('parallel.tensor'\) and pp \('parallel.pipeline'\) whose product divides 4"),
        (8, ["parallel.tensor=2", "parallel.pipeline=3"], r"tp x pp = 6 does not divide the world size 8"),
        (4, ["parallel.tensor=4", "model.n_head=6", "model.d_model=48"], r"'model.n_head'.*6 heads"),
        (2, ["parallel.tensor=2", "model.vocab_size=65"], r"'model.vocab_size'.*65 is not divisible"),
        (4, ["parallel.tensor=4", "model.d_model=30", "model.n_head=4"], r"'model.d_model'.*hidden size 30"),
        (8, ["parallel.pipeline=8"], r"'parallel.pipeline'.*8 stages but the model has 4 pipeline layers"),
        (2, ["parallel.pipeline=2", "train.zero_stage=2"], r"'train.zero_stage'.*ZeRO-2 does not work with a pipeline"),
        (2, ["parallel.pipeline=2", "train.zero_stage=3"], r"'train.zero_stage'.*ZeRO-3 does not work with a pipeline"),
        (2, ["train.zero_stage=4"], r"bad value 4 for config key 'train.zero_stage'; choose one of 0, 1, 2, 3"),
        (1, ["parallel.sequence=true"], r"'parallel.sequence'.*needs parallel.tensor > 1"),
        (4, ["parallel.tensor=2", "parallel.sequence=true", "model.seq_len=15"], r"'model.seq_len'.*15"),
        (4, ["parallel.pipeline=2", "parallel.cluster=nope.yaml"], r"'parallel.cluster'.*no such file"),
        (8, ["parallel.pipeline=2"], r"'parallel.cluster'.*2 devices; the planner needs one per stage replica"),
        (2, ["parallel.partition=greedy"], r"'parallel.partition'; choose one of planner, uniform, parameters"),
    ],
)
def test_bad_parallel_settings_are_refused_with_the_key_and_the_fix(world, overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(load_config(DenseConfig, ["--config", TINY, *overrides]), world)


def test_bad_config_fails_before_any_process_group():
    with pytest.raises(ConfigError, match="does not divide the world size 1"):
        main(["--config", TINY, "parallel.tensor=2"])  # this process is a world of one
    assert not torch.distributed.is_initialized()
    import deepspeed.comm.comm as ds_comm

    assert ds_comm.cdb is None


def test_bad_config_under_mpiexec_exits_with_one_message():
    result = run_ranks(2, ["-m", "apps.dense", "--config", TINY, "model.n_head=3", "parallel.tensor=2"], timeout=300)
    assert result.returncode != 0
    assert result.output.count("config error: bad value for config key 'model.n_head': 3 heads") == 1


@pytest.mark.parametrize("preset", sorted(os.listdir(os.path.join(REPO, "configs", "dense"))))
def test_every_preset_validates(preset):
    cfg = load_config(DenseConfig, ["--config", os.path.join(REPO, "configs", "dense", preset)])
    world = 32 if cfg.model.n_layer >= 24 else 2  # the paper preset is for 32 GPUs
    validate(cfg, world)
