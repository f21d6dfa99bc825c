"""apps/common: config loading and its errors, data and seeds, checkpoints bookkeeping, metrics
and the run summary (in-process); parallel degrees and their groups (layout in-process, groups
on real ranks)."""

import json
import os
import re
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch

import mcr
from apps.common.checkpoint import latest_tag, mark_latest, step_of, tag_for
from apps.common.comm import CommConfig, check_comm, runtime_config, setup_torch_comm
from apps.common.compare import App, find_app, table
from apps.common.config import ConfigError, choice, load_config, save_resolved
from apps.common.data import ByteTokenizer, DataConfig, TokenBatches
from apps.common.metrics import (
    LM_FIELDS,
    STEP_TIME,
    Meter,
    MetricsLog,
    format_line,
    read_jsonl,
    summarize,
    summary_line,
)
from apps.common.parallel_dims import ParallelDims
from apps.common.seed import batch_generator, step_seed
from launch.options import app_names
from tests.ranks import run_script

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class Inner:
    size: int = 3
    mode: str = choice("fast", "slow")


@dataclass
class Schema:
    name: str = "x"
    inner: Inner = field(default_factory=Inner)
    comm: CommConfig = field(default_factory=CommConfig)


def test_overrides_beat_preset_and_preset_beats_defaults(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("name: from-preset\ninner:\n  size: 5\n")
    cfg = load_config(Schema, ["--config", str(preset), "inner.size=7"])
    assert (cfg.name, cfg.inner.size, cfg.inner.mode) == ("from-preset", 7, "fast")


def test_unknown_key_names_the_key_and_the_valid_keys():
    with pytest.raises(ConfigError, match=r"unknown config key 'inner\.sise'.*valid keys under 'inner': size, mode"):
        load_config(Schema, ["inner.sise=4"])


def test_unknown_key_in_preset_names_the_file(tmp_path):
    preset = tmp_path / "bad.yaml"
    preset.write_text("nmae: typo\n")
    with pytest.raises(
        ConfigError, match=r"unknown config key 'nmae' in .*bad\.yaml.*valid keys at the top level: name, inner, comm"
    ):
        load_config(Schema, ["--config", str(preset)])


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigError, match=r"bad value for config key 'inner\.size'"):
        load_config(Schema, ["inner.size=big"])


def test_value_outside_choices_lists_the_choices():
    with pytest.raises(ConfigError, match=r"bad value 'medium' for config key 'inner\.mode'; choose one of fast, slow"):
        load_config(Schema, ["inner.mode=medium"])


def test_argument_that_is_not_key_value_is_refused():
    with pytest.raises(ConfigError, match="unexpected argument '--stpes'"):
        load_config(Schema, ["--stpes", "3"])


def test_comm_backend_checks_names_and_op_families():
    check_comm(load_config(Schema, ["comm.backend={all_to_all: mpi, default: gloo}"]).comm)
    with pytest.raises(ConfigError, match=r"'comm\.backend'; choose one of auto, mpi, gloo, nccl"):
        check_comm(load_config(Schema, ["comm.backend=mpich"]).comm)
    with pytest.raises(
        ConfigError, match=r"unknown op 'alltoall' in config key 'comm\.backend'; choose from .*all_to_all"
    ):
        check_comm(load_config(Schema, ["comm.backend={alltoall: mpi}"]).comm)
    with pytest.raises(ConfigError, match=r"'comm\.tuning': no such file"):
        check_comm(load_config(Schema, ["comm.tuning=/no/such/table.yaml"]).comm)


def test_per_op_map_becomes_runtime_overrides():
    comm = load_config(Schema, ["comm.backend={all_to_all: mpi, default: gloo}"]).comm
    assert runtime_config(comm) == {
        "backend": "gloo",
        "overrides": {"all_to_all": "mpi"},
        "tuning": None,
        "comm_log": True,
        "comm_log_json": None,
        "flight_recorder_dir": None,
        "trace_dir": None,
    }
    traced = load_config(Schema, ["comm.trace=true"]).comm
    files = runtime_config(traced, "runs/r1/comm_log.json")
    assert (files["flight_recorder_dir"], files["trace_dir"]) == ("runs/r1/flight_recorder", "runs/r1/trace")


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(Schema, ["inner.size=9"])
    save_resolved(cfg, str(tmp_path / "run" / "config.yaml"))
    again = load_config(Schema, ["--config", str(tmp_path / "run" / "config.yaml")])
    assert again == cfg


def test_batches_depend_only_on_step_rank_and_split():
    cfg = DataConfig()
    a = TokenBatches(cfg, 64, 16, 4, seed=1, rank=0)
    b = TokenBatches(cfg, 64, 16, 4, seed=1, rank=0)
    assert torch.equal(a.get(7)[0], b.get(7)[0])  # a resumed run reads the same batch
    assert not torch.equal(a.get(7)[0], a.get(8)[0])
    assert not torch.equal(a.get(7)[0], TokenBatches(cfg, 64, 16, 4, seed=1, rank=1).get(7)[0])
    assert not torch.equal(a.get(7)[0], a.get(7, "val")[0])
    x, y = a.get(3)
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one


def test_synthetic_stream_follows_its_transition_table():
    data = TokenBatches(DataConfig(branching=2), 32, 20, 8, seed=3, rank=0)
    x, y = data.get(0)
    allowed = data.successors[x]  # (batch, seq, branching)
    assert (allowed == y.unsqueeze(-1)).any(-1).all()


def test_text_file_is_read_as_bytes_with_a_held_out_tail(tmp_path):
    text = "héllo wörld " * 200
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    data = TokenBatches(DataConfig(kind="text", path=str(path), val_fraction=0.25), 256, 8, 2, seed=0, rank=0)
    raw = text.encode("utf-8")
    assert data.splits["val"].tolist() == list(raw[len(data.splits["train"]) :])
    assert ByteTokenizer.decode(ByteTokenizer.encode("héllo")) == "héllo"
    x, _ = data.get(0)
    assert bytes(x[0].tolist()) in raw


def test_latest_points_at_newest_complete_tag_and_old_ones_are_pruned(tmp_path):
    ckpt = str(tmp_path)
    assert latest_tag(ckpt) is None
    for step in (10, 20, 30):
        os.makedirs(os.path.join(ckpt, tag_for(step)))
        mark_latest(ckpt, tag_for(step), keep=2)
    assert latest_tag(ckpt) == "step_000030" and step_of(latest_tag(ckpt)) == 30
    assert sorted(d for d in os.listdir(ckpt) if d.startswith("step_")) == ["step_000020", "step_000030"]
    assert not [f for f in os.listdir(ckpt) if f.startswith(".tmp")]  # the rename left no temp file


def test_latest_naming_a_missing_tag_means_no_checkpoint(tmp_path):
    (tmp_path / "latest").write_text("step_000040")
    assert latest_tag(str(tmp_path)) is None


def test_meter_splits_step_time_into_compute_and_comm():
    meter = Meter(tokens=1000, samples=10)
    meter.step(0.1, 0.02)
    meter.step(0.3, 0.06)
    m = meter.interval()
    assert m["tokens_per_s"] == pytest.approx(5000) and m["samples_per_s"] == pytest.approx(50)
    assert (m["step_ms"], m["comm_ms"], m["compute_ms"]) == pytest.approx((200, 40, 160))
    meter.step(0.5)
    assert "comm_ms" not in meter.interval()  # not measurable: no split is claimed


def test_metrics_line_and_jsonl(tmp_path, capsys):
    log = MetricsLog(str(tmp_path), rank=0, total_steps=10, progress=False)
    log.write(5, loss=2.5, tokens_per_s=1234.0, samples_per_s=5.0, step_ms=10.0, comm_ms=4.0, compute_ms=6.0)
    log.close()
    out = capsys.readouterr().out
    assert "step 5/10 | loss 2.5000 | 1,234 tok/s | 5.0 samples/s | step 10.0 ms (compute 6.0, comm 4.0)" in out
    assert read_jsonl(str(tmp_path / "metrics.jsonl"))[0]["loss"] == 2.5
    silent = MetricsLog(str(tmp_path / "other"), rank=1, total_steps=10)
    silent.write(1, loss=1.0)
    assert not (tmp_path / "other").exists() and capsys.readouterr().out == ""
    assert format_line(1, 2, {}) == "step 1/2"


def test_one_config_error_class_in_the_repository():
    assert ConfigError is mcr.ConfigError
    with pytest.raises(mcr.ConfigError):  # an app's config error is the runtime's
        load_config(Schema, ["inner.size=big"])


def test_bad_comm_config_fails_before_torch_starts_a_process_group():
    with pytest.raises(ConfigError, match=r"'comm\.backend'; choose one of"):
        setup_torch_comm(CommConfig(backend="mpich"))
    assert not torch.distributed.is_initialized() and not mcr.is_initialized()


# --- seeds -------------------------------------------------------------------------------------
def test_seeds_are_the_values_the_moe_losses_were_recorded_with():
    # Changing either formula changes every trainer's losses for the same train.seed.
    assert step_seed(1234, 7, 1) == 1234 * 1_000_003 + 7 * 4099 + 1
    g = batch_generator(1234, 7, 1, "val")
    expected = torch.Generator().manual_seed(((1234 * 1_000_003 + 7) * 4099 + 1) * 2 + 1)
    assert torch.equal(torch.rand(4, generator=g), torch.rand(4, generator=expected))
    draws = {
        tuple(torch.rand(3, generator=batch_generator(1, step, rank, split)).tolist())
        for step in (1, 2)
        for rank in (0, 1)
        for split in ("train", "val")
    }
    assert len(draws) == 8  # every (step, rank, split) draws its own numbers


# --- metrics lines and the summary -------------------------------------------------------------
def test_each_app_declares_its_line_fields():
    dlrm_fields = (("loss", "loss {:.4f}"), ("auc", "auc {:.4f}"), ("samples_per_s", "{:,.0f} samples/s"), STEP_TIME)
    values = {"loss": 0.5, "auc": 0.75, "samples_per_s": 12345.6, "step_ms": 8.0, "tokens_per_s": 1.0}
    assert (
        format_line(3, 9, values, dlrm_fields) == "step 3/9 | loss 0.5000 | auc 0.7500 | 12,346 samples/s | step 8.0 ms"
    )
    lm = format_line(3, 9, {**values, "lr": 1e-3}, LM_FIELDS)
    assert lm == "step 3/9 | loss 0.5000 | 1 tok/s | 12,345.6 samples/s | step 8.0 ms | lr 1.00e-03"  # no auc


def test_summary_in_the_apps_unit_skips_warmup_and_splits_comm(tmp_path, capsys):
    meter = Meter(warmup=2, samples=100)
    for seconds, comm in [(9.0, 1.0), (9.0, 1.0)] + [(0.1 * i, 0.01 * i) for i in range(1, 11)]:
        meter.step(seconds, comm)
    s = meter.summary(steps=12, wall_s=20.0, world_size=2, comm_backend="gloo")
    # timed steps 0.1 .. 1.0 s: median 0.55 s, fastest decile (index 1) 0.2 s, comm median 55 ms
    assert s["median_step_ms"] == pytest.approx(550) and s["p10_step_ms"] == pytest.approx(200)
    assert (s["comm_ms"], s["compute_ms"]) == pytest.approx((55, 495))
    assert s["throughput"] == "samples_per_s" and "tokens_per_s" not in s
    assert (s["samples_per_s"], s["p10_samples_per_s"]) == pytest.approx((100 / 0.55, 100 / 0.2))
    assert (s["world_size"], s["comm_backend"], s["steps"]) == (2, "gloo", 12)
    assert summary_line(s) == "done: 12 steps in 20.0 s; median step 550.0 ms, 181.8 samples/s, comm 55.0 ms/step"
    MetricsLog(str(tmp_path / "other"), rank=1, total_steps=12).close(s)  # rank 1: nothing written
    MetricsLog(str(tmp_path), rank=0, total_steps=12, progress=False).close(s)
    assert json.loads((tmp_path / "summary.json").read_text()) == s and not (tmp_path / "other").exists()
    assert capsys.readouterr().out == summary_line(s) + "\n"


def test_summary_without_comm_timings_claims_no_split():
    s = summarize([0.2, 0.4], [None, None], {"tokens": 10, "samples": 1}, steps=2, wall_s=1.0)
    assert s["comm_ms"] is None and s["compute_ms"] is None and s["throughput"] == "tokens_per_s"
    assert summary_line(s).endswith("median step 300.0 ms, 33 tok/s, 3.3 samples/s")


# --- parallel degrees --------------------------------------------------------------------------
def test_dp_fills_the_rest_and_enabled_flags_follow_the_degrees():
    dims = ParallelDims(16, tp=2, pp=2, ep=2)
    assert (dims.dp, dims.tp, dims.pp, dims.ep) == (4, 2, 2, 2)
    assert (dims.dp_enabled, dims.tp_enabled, dims.pp_enabled, dims.ep_enabled) == (True, True, True, True)
    one = ParallelDims(1)
    assert (one.dp, one.dp_enabled, one.tp_enabled, one.pp_enabled, one.ep_enabled) == (1, False, False, False, False)
    assert ParallelDims(8, dp=4, tp=2).dp == 4


@pytest.mark.parametrize(
    "world, degrees, problem",
    [
        (6, {"tp": 4}, r"tp x pp = 4 does not divide the world size 6; choose tp \('parallel\.tensor'\) and pp"),
        (8, {"dp": 3, "tp": 2}, r"dp x tp x pp = 6 is not the world size 8; set dp to 0"),
        (8, {"tp": 2, "ep": 3}, r"ep = 3 must divide dp = 4.*; set ep to a divisor of 4"),
        (4, {"tp": 0}, r"tp \('parallel\.tensor'\) must be >= 1"),
    ],
)
def test_bad_degrees_name_every_degree_the_world_size_and_the_fix(world, degrees, problem):
    with pytest.raises(ConfigError) as exc:
        ParallelDims(world, keys={"tp": "parallel.tensor", "pp": "parallel.pipeline"}, **degrees)
    message = str(exc.value)
    every = {"dp": 0, "tp": 1, "pp": 1, "ep": 1, **degrees}
    assert message.startswith(
        f"bad parallel degrees dp={every['dp']}{' (fills the rest)' if not every['dp'] else ''}, "
        f"tp ('parallel.tensor')={every['tp']}, pp ('parallel.pipeline')={every['pp']}, ep={every['ep']} "
        f"for world size {world}: "
    ), message
    assert re.search(problem, message), message


@pytest.mark.parametrize("pp, dp, tp", [(1, 4, 1), (2, 2, 2), (2, 1, 4), (4, 2, 1), (3, 2, 2)])
def test_rank_layout_is_deepspeeds_pipe_model_data_topology(pp, dp, tp):
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    topo = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
    dims = ParallelDims(pp * dp * tp, tp=tp, pp=pp)
    for rank in range(dims.world_size):
        c = topo.get_coord(rank)
        assert dims.coords(rank)[:3] == (c.pipe, c.data, c.model)
        assert dims.rank_of(c.pipe, c.data, c.model) == rank
    # DeepSpeed's own pipeline and data-parallel groups (PipelineParallelGrid) hold the same ranks
    assert dims.group_ranks("pp") == topo.get_axis_comm_lists("pipe")
    assert dims.group_ranks("dp") == topo.get_axis_comm_lists("data")
    assert dims.group_ranks("tp") == topo.get_axis_comm_lists("model")


def test_groups_taken_from_deepspeeds_grid_must_hold_the_layouts_ranks():
    def grid(tp_ranks, on_mcr=True):  # rank 1 of tp 2 x dp 2: tp [0, 1], dp [1, 3], pp [1]
        def group(ranks):  # a torch group on backend "mcr" carries its mcr group; another's does not
            return SimpleNamespace(mcr_group=SimpleNamespace(ranks=tuple(ranks))) if on_mcr else object()

        return SimpleNamespace(
            get_global_rank=lambda: 1,
            get_slice_parallel_group=lambda: group(tp_ranks),
            get_data_parallel_group=lambda: group([1, 3]),
            get_pipe_parallel_group=lambda: group([1]),
        )

    dims = ParallelDims(4, tp=2)
    groups = dims.groups_from_grid(grid([0, 1]))
    assert (groups.tp.ranks, groups.dp.ranks, groups.pp.ranks, groups.coords.dp) == ((0, 1), (1, 3), (1,), 0)
    with pytest.raises(RuntimeError, match=r"tensor-parallel group of rank 1 holds ranks \[1, 2\], not \[0, 1\]"):
        dims.groups_from_grid(grid([1, 2]))
    with pytest.raises(RuntimeError, match="not on backend 'mcr'.*setup_deepspeed_comm"):
        dims.groups_from_grid(grid([0, 1], on_mcr=False))


@pytest.mark.parametrize("world, tp, pp, ep", [(16, 2, 1, 4), (8, 1, 1, 2), (16, 2, 2, 2), (4, 1, 1, 4)])
def test_expert_groups_are_deepspeeds(world, tp, pp, ep):
    from deepspeed.utils.groups import _get_expert_parallel_ranks

    ep_groups, ep_dp_groups = _get_expert_parallel_ranks(world, tp, ep, pp)
    dims = ParallelDims(world, tp=tp, pp=pp, ep=ep)
    assert sorted(dims.group_ranks("ep")) == sorted(ep_groups)
    assert sorted(dims.group_ranks("ep_dp")) == sorted(ep_dp_groups)
    for rank in range(world):  # the coordinate is the place in the expert group
        assert next(g for g in dims.group_ranks("ep") if rank in g).index(rank) == dims.coords(rank).ep


@pytest.mark.parametrize(
    "kind, nprocs, tp, pp, ep",
    [("torch", 4, 2, 1, 2), ("deepspeed", 2, 1, 2, 1)],
    ids=["torch-tp2-dp2-ep2", "deepspeed-pp2"],
)
def test_groups_built_on_real_ranks_hold_the_layouts_ranks(kind, nprocs, tp, pp, ep):
    script = os.path.join(HERE, "scripts", "parallel_groups.py")
    result = run_script(nprocs, script, kind, tp, pp, ep, timeout=300).check()
    # every rank checked each of its groups on every started backend (mpi and gloo)
    dims = 5 if ep > 1 else 3
    for rank in range(nprocs):
        assert f"OK rank {rank} " in result.output and f"checked {dims * 2}" in result.output, result.output


# --- compare -----------------------------------------------------------------------------------
def _summary(rate, unit="tokens", comm=1.0):
    per_step = {unit: rate / 10} if unit == "samples" else {unit: rate / 10, "samples": rate / 1000}
    s = summarize([0.1], [None if comm is None else comm / 1e3], per_step, steps=1, wall_s=1.0)
    s["p10_" + s["throughput"]] = rate * 1.5  # distinct from the median
    return s


def test_compare_table_reports_gain_over_each_single_backend():
    rows = {"gloo": [_summary(1000), _summary(1200)], "mpi": [_summary(2200)], "auto": [_summary(2420), None]}
    text = table(rows, 2, "x", "DS-MoE")
    lines = text.splitlines()
    assert lines[0].startswith("DS-MoE throughput: x, 2 ranks, 2 run(s) per backend")
    assert lines[1].split() == "backend tokens/s samples/s step ms compute comm p10 tokens/s vs gloo vs mpi".split()
    auto = next(line for line in lines if line.startswith("auto")).split()
    # 2420 vs gloo's median 1100, vs mpi's 2200; step 100 ms = compute 99 + comm 1
    assert auto == ["auto", "2,420", "24.2", "100.0", "99.0", "1.0", "3,630", "+120.0%", "+10.0%"]
    assert "failed" in table({"gloo": [_summary(1)], "mpi": [None]}, 2, "x")


def test_compare_table_ranks_by_the_apps_own_unit():
    rows = {"gloo": [_summary(500, "samples")], "auto": [_summary(600, "samples", comm=None)]}
    lines = table(rows, 4, "default.yaml", "DLRM").splitlines()
    assert lines[1].split() == "backend samples/s step ms compute comm p10 samples/s vs gloo".split()
    assert next(line for line in lines if line.startswith("auto")).split() == [
        "auto",
        "600.0",
        "100.0",
        "-",
        "-",
        "900",
        "+20.0%",
    ]


def test_compare_finds_each_apps_own_settings_and_refuses_unknown_apps():
    assert find_app("moe") == App("moe", title="DS-MoE") and "moe" in app_names()
    assert find_app("moe").default_config.endswith(os.path.join("configs", "moe", "default.yaml"))
    with pytest.raises(SystemExit, match=r"unknown app 'mooe'; choose from .*moe"):
        find_app("mooe")
