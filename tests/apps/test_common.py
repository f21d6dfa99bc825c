"""apps/common: config loading and its errors, data, checkpoints bookkeeping, metrics (in-process)."""

import os
from dataclasses import dataclass, field

import pytest
import torch

from apps.common.checkpoint import latest_tag, mark_latest, step_of, tag_for
from apps.common.comm import CommConfig, check_comm, runtime_config
from apps.common.config import ConfigError, choice, load_config, save_resolved
from apps.common.data import ByteTokenizer, DataConfig, TokenBatches
from apps.common.metrics import Meter, MetricsLog, format_line, read_jsonl


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
    with pytest.raises(ConfigError, match=r"'comm\.backend'; choose one of auto, gloo, mpi, nccl"):
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
    }


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
    meter = Meter(tokens_per_step=1000, samples_per_step=10)
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
