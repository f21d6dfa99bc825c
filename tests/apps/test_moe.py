"""The MoE trainer on 2 real ranks (mpiexec, and torchrun for one case) with real DeepSpeed.

The tiny preset trains in a few seconds; runs shared between tests are made once per module.
"""

import json
import math
import os

import pytest
import torch

from apps.common.config import ConfigError, load_config
from apps.moe.config import MoEConfig, validate
from apps.moe.train import main
from tests.ranks import REPO, run_ranks, run_tool

TINY = os.path.join(REPO, "configs", "moe", "tiny.yaml")
STOCK_DEEPSPEED = os.path.join(REPO, "tests", "apps", "scripts", "moe_stock_deepspeed.py")
SLOW_RANK0 = os.path.join(REPO, "tests", "apps", "scripts", "slow_rank0.py")
# Backend choices: each goes through the mcr runtime (mcr.hooks.deepspeed).
BACKENDS = {
    "gloo": "comm.backend=gloo",
    "mpi": "comm.backend=mpi",
    "auto": "comm.backend=auto",
    "per-op": "comm.backend={all_to_all: mpi, default: gloo}",
    "online": "comm.tuning=auto",  # online tuning inside DeepSpeed's groups (some hold no rank 0)
}


def train(tmp_dir, name, *overrides, nprocs=2, launcher="mpiexec", timeout=300):
    result = run_ranks(
        nprocs,
        ["-m", "apps.moe", "--config", TINY, f"out_dir={tmp_dir}", f"name={name}", "log_interval=1", *overrides],
        launcher=launcher,
        timeout=timeout,
    ).check()
    run_dir = os.path.join(tmp_dir, name)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        metrics = [json.loads(line) for line in f]
    return result.output, metrics, run_dir


@pytest.fixture(scope="module")
def backend_runs(tmp_path_factory):
    """backend choice -> (output, metrics, run_dir); each run made on first use."""
    out_dir = str(tmp_path_factory.mktemp("moe"))
    cache = {}

    def get(choice):
        if choice not in cache:
            cache[choice] = train(out_dir, f"tiny-{choice}", BACKENDS[choice])
        return cache[choice]

    return get


@pytest.mark.parametrize("choice", list(BACKENDS))
def test_loss_decreases_on_the_tiny_preset(backend_runs, choice):
    _, metrics, _ = backend_runs(choice)
    losses = [m["loss"] for m in metrics]
    assert len(losses) == 30 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5, losses
    assert metrics[-1]["val_loss"] < losses[0] - 0.5
    assert metrics[-1]["tokens_per_s"] > 0 and metrics[-1]["aux_loss"] > 0


@pytest.mark.parametrize("choice", ["mpi", "auto", "per-op", "online"])
def test_every_backend_choice_gives_the_same_losses_as_gloo(backend_runs, choice):
    reference = [m["loss"] for m in backend_runs("gloo")[1]]
    losses = [m["loss"] for m in backend_runs(choice)[1]]
    assert losses == pytest.approx(reference, abs=1e-4)


def test_losses_through_mcr_equal_stock_deepspeed_on_gloo_without_mcr(backend_runs, tmp_path):
    _, metrics, run_dir = backend_runs("gloo")
    out = tmp_path / "reference.json"
    result = run_ranks(2, [STOCK_DEEPSPEED, run_dir, str(out)], launcher="torchrun", timeout=300).check()
    assert "mcr not loaded" in result.output
    reference = json.loads(out.read_text())
    # Exact, not approximate: at 2 ranks every reduction adds two numbers (the same sum in either
    # order, whichever backend or algorithm runs it), all-to-all and broadcast move bytes, and
    # both runs use the same kernels, threads, seeds and batches. Any difference is a bug in how
    # the runtime moves data. (More ranks may sum in a different order: allow ~1e-6 there.)
    assert [m["loss"] for m in metrics] == reference


def test_comm_table_printed_at_the_end_names_the_chosen_backends(backend_runs):
    output, metrics, _ = backend_runs("per-op")
    table = output[output.index("mcr communication log") :]
    assert any(line.startswith("all_to_all") and " mpi " in line for line in table.splitlines()), table
    assert any(line.startswith("all_reduce") and " gloo " in line for line in table.splitlines()), table
    assert "comm_ms" in metrics[-1]  # the step time is split once the runtime measures comm


@pytest.mark.parametrize("choice", ["gloo", "mpi"])
def test_single_backend_choice_runs_every_deepspeed_collective_on_it(backend_runs, choice):
    output = backend_runs(choice)[0]
    rows = [line.split() for line in output[output.index("mcr communication log") :].splitlines()[3:] if line.strip()]
    rows = [r for r in rows if len(r) == 9]  # op backend size ranks count total mean algbw busbw
    assert {r[0] for r in rows} >= {"all_reduce", "all_to_all", "broadcast"}
    assert {r[1] for r in rows} == {choice}


def test_run_directory_holds_resolved_config_metrics_and_summary(backend_runs):
    output, metrics, run_dir = backend_runs("gloo")
    assert output.count("step 30/30 | loss") == 1  # rank 0 prints, once
    resolved = load_config(MoEConfig, ["--config", os.path.join(run_dir, "config.yaml")])
    assert resolved.log_interval == 1 and resolved.model.ep_size == 2 and resolved.comm.backend == "gloo"
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    assert summary["steps"] == 30 and summary["world_size"] == 2 and summary["tokens_per_s"] > 0
    assert "done: 30 steps" in output and f"{summary['tokens_per_s']:,.0f} tok/s" in output


def test_resume_continues_the_same_loss_curve(backend_runs, tmp_path):
    _, full, _ = backend_runs("gloo")  # the uninterrupted run: 30 steps
    common = (BACKENDS["gloo"], "checkpoint.interval=5", "checkpoint.keep=2")
    train(str(tmp_path), "parts", *common, "train.stop_after=13")  # stops at 13, saved at 5, 10 and 13
    output, parts, run_dir = train(str(tmp_path), "parts", *common, "resume=true")
    assert "resuming at step 13" in output
    assert [m["step"] for m in parts] == list(range(1, 31))
    assert [m["loss"] for m in parts] == pytest.approx([m["loss"] for m in full], abs=1e-5)
    ckpt = os.path.join(run_dir, "checkpoints")
    assert open(os.path.join(ckpt, "latest")).read() == "step_000030"
    assert sorted(d for d in os.listdir(ckpt) if d.startswith("step_")) == ["step_000025", "step_000030"]
    with open(os.path.join(run_dir, "config.yaml")) as f:
        assert "resume: true" in f.read()


def test_text_file_under_torchrun_with_zero2_and_top2_trains_and_reports_validation_loss(tmp_path):
    text = os.path.join(REPO, "README.md")
    output, metrics, _ = train(
        str(tmp_path),
        "text",
        "data.kind=text",
        f"data.path={text}",
        "eval_interval=10",
        "train.zero_stage=2",
        "model.top_k=2",
        "comm.backend=gloo",
        launcher="torchrun",
    )
    assert "ZeRO-2" in output and "top-2" in output
    vals = [m["val_loss"] for m in metrics if "val_loss" in m]
    assert len(vals) == 3 and vals[-1] < vals[0]
    assert metrics[-1]["loss"] < metrics[0]["loss"] - 0.5


# --- config errors: before any process group ------------------------------------------------
@pytest.mark.parametrize(
    "override, message",
    [
        ("model.top_k=3", r"bad value 3 for config key 'model\.top_k'; choose one of 1, 2"),
        ("comm.backend=nccl2", r"'comm\.backend'; choose one of auto, mpi, gloo, nccl"),
        ("train.zero_stage=3", r"config key 'train\.zero_stage'; choose one of 0, 1, 2"),
        ("model.num_expert=4", r"unknown config key 'model\.num_expert'.*valid keys under 'model': .*num_experts"),
        ("model.ep_size=3", r"'model\.ep_size'.*must divide"),
        ("data.kind=text", r"'data\.path'.*needs an existing file"),
    ],
)
def test_bad_config_fails_before_any_process_group(override, message):
    with pytest.raises(ConfigError, match=message):
        main(["--config", TINY, override])
    assert not torch.distributed.is_initialized()
    import deepspeed.comm.comm as ds_comm

    assert ds_comm.cdb is None


def test_bad_config_under_mpiexec_exits_with_one_message_when_rank_0_is_last_to_fail():
    # rank 0 reaches the error 3 s after rank 1: rank 1's exit must not get it killed before it says why
    args = [SLOW_RANK0, "3", "apps.moe", "--config", TINY, "train.zero_stage=4"]
    result = run_ranks(2, args, timeout=120)
    assert result.returncode != 0
    assert (
        result.output.count("config error: bad value 4 for config key 'train.zero_stage'; choose one of 0, 1, 2") == 1
    )
    assert "No existing process group" not in result.output  # no DeepSpeed groups were made


@pytest.mark.parametrize("preset", sorted(os.listdir(os.path.join(REPO, "configs", "moe"))))
def test_every_preset_validates(preset):
    cfg = load_config(MoEConfig, ["--config", os.path.join(REPO, "configs", "moe", preset)])
    world = 128 if cfg.model.num_experts >= 64 else 2  # the paper preset is for a GPU cluster
    validate(cfg, world)


def test_compare_runs_the_preset_on_each_backend_and_tabulates_them(tmp_path):
    args = ["--config", TINY, "--backends", "gloo,mpi", f"--out={tmp_path}", "train.steps=8"]
    out = run_tool("apps.moe.compare", *args).check().output
    table = out[out.index("DS-MoE throughput: tiny.yaml, 2 ranks") :].splitlines()
    assert table[1].split() == "backend tokens/s samples/s step ms compute comm p10 tokens/s vs gloo vs mpi".split()
    for choice in ("gloo", "mpi"):
        row = next(line for line in table if line.startswith(choice)).split()
        assert float(row[1].replace(",", "")) > 0, row
        with open(tmp_path / f"compare-moe-{choice}-r0" / "summary.json") as f:
            summary = json.load(f)  # the job ran on the backend its row names
        assert (summary["comm_backend"], summary["steps"]) == (choice, 8)
        assert row[1] == f"{summary['tokens_per_s']:,.0f}"
    assert (tmp_path / "compare-moe.txt").read_text().strip() == "\n".join(table).strip()


def test_comm_trace_writes_the_timeline_beside_the_metrics_interleaved_with_torch_profiler(tmp_path):
    """comm.trace=true: every rank's comm timeline and a torch.profiler trace of two steps after the
    warm-up land in <run dir>/trace; merged, each profiled step's span holds that step's comm ops."""
    _, metrics, run_dir = train(str(tmp_path), "traced", "comm.trace=true", "train.steps=6")
    trace_dir = os.path.join(run_dir, "trace")
    files = sorted(os.listdir(trace_dir))
    assert files == [f"{kind}_rank_{r}.json" for kind in ("mcr_trace", "torch_profile") for r in (0, 1)], files
    run_tool("mcr.tools.trace", "merge", trace_dir).check()
    with open(os.path.join(trace_dir, "mcr_trace.json")) as f:
        events = json.load(f)["traceEvents"]
    for rank in (0, 1):
        steps = [e for e in events if e["pid"] == rank and e.get("ph") == "X" and e["name"].startswith("step ")]
        assert [e["name"] for e in steps] == ["step 2", "step 3"], steps  # warm-up: 1 step of 6
        comm = [e for e in events if e["pid"] == rank and e.get("cat") == "comm" and e["tid"] < 1000]
        for step in steps:
            inside = [e for e in comm if step["ts"] <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"]]
            names = {e["name"] for e in inside}
            assert "all_to_all_single" in names and "all_reduce" in names, (step["name"], names)  # MoE and grads
    assert len(metrics) == 6
