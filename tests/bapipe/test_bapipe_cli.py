import json

import pytest

from bapipe.__main__ import main
from bapipe.profile import LayerProfile, Profile

CPU_CLUSTER = "configs/bapipe/cpu-2proc.yaml"


@pytest.fixture
def gpt_like_profile(tmp_path):
    """A GPT-like shape: light embedding, eight blocks, a head as heavy as three blocks."""
    layers = (
        [LayerProfile("embed", 1e-4, 4e-3, 8_500_000, 4096, 524_288, optimizer_s=1e-3)]
        + [LayerProfile(f"block{i}", 11e-3, 23e-3, 3_159_040, 8_400_000, 524_288, optimizer_s=1.5e-3) for i in range(8)]
        + [LayerProfile("head", 31e-3, 62e-3, 8_390_656, 17_800_000, 0, optimizer_s=5e-3)]
    )
    path = tmp_path / "gpt.json"
    Profile(layers, model="gpt-like", micro_batch=4).save(path)
    return str(path)


def test_plan_json_gives_boundaries_times_and_memory(gpt_like_profile, capsys):
    assert (
        main(
            [
                "plan",
                "--profile",
                gpt_like_profile,
                "--cluster",
                CPU_CLUSTER,
                "--stages",
                "2",
                "--microbatches",
                "8",
                "--schedule",
                "1f1b",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["boundaries"] == [0, 6] and out["deepspeed_parts"] == [0, 6, 10]
    assert len(out["stage_s"]) == 2 and len(out["stage_memory_bytes"]) == 2
    assert out["iteration_s"] == pytest.approx(out["simulated_iteration_s"], rel=0.05)
    assert out["iteration_s"] < out["baselines"]["uniform"]["iteration_s"]


def test_plan_prints_the_comparison_and_draws_a_timeline(gpt_like_profile, tmp_path, capsys):
    png = tmp_path / "t.png"
    assert (
        main(
            [
                "plan",
                "--profile",
                gpt_like_profile,
                "--cluster",
                CPU_CLUSTER,
                "--stages",
                "2",
                "--microbatches",
                "8",
                "--schedule",
                "gpipe",
                "--timeline",
                str(png),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "vs uniform" in out and "vs parameters" in out and "vs data-parallel" in out and "best:" in out
    assert png.stat().st_size > 0


def test_infeasible_plan_exits_nonzero_with_the_memory_needed(gpt_like_profile, tmp_path, capsys):
    cluster = tmp_path / "tiny.yaml"
    cluster.write_text("devices: [{memory_bytes: 10MiB, count: 2}]\nlink: {latency_s: 0, bandwidth_Bps: 1e9}\n")
    assert (
        main(
            [
                "plan",
                "--profile",
                gpt_like_profile,
                "--cluster",
                str(cluster),
                "--stages",
                "2",
                "--microbatches",
                "8",
                "--schedule",
                "gpipe",
            ]
        )
        == 2
    )
    assert "smallest device memory that would fit" in capsys.readouterr().err


def test_plan_without_stages_searches_and_names_the_winner(gpt_like_profile, capsys):
    assert (
        main(
            [
                "plan",
                "--profile",
                gpt_like_profile,
                "--cluster",
                "configs/bapipe/fpga-4.yaml",
                "--max-microbatches",
                "16",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "won:" in out and "the runner-up" in out


def test_bad_profile_path_is_a_clear_error(tmp_path, capsys):
    assert main(["plan", "--profile", str(tmp_path / "missing.json"), "--cluster", CPU_CLUSTER]) == 1
    assert "python -m bapipe profile" in capsys.readouterr().err


def test_report_runs_on_the_committed_profiles(tmp_path, capsys):
    out = tmp_path / "study.json"
    assert (
        main(["report", "--clusters", "configs/bapipe/gpu-4.yaml", "configs/bapipe/fpga-8.yaml", "--out", str(out)])
        == 0
    )
    rows = json.loads(out.read_text())
    assert {r["model"] for r in rows} == {"vgg16", "resnet50", "gnmt-like"} and len(rows) == 6
    for row in rows:  # the searched best is never beaten by a baseline it was searched against
        assert all(
            row[k]["speedup"] >= 1 - 1e-9
            for k in ("gpipe_uniform_all", "data_parallel")
            if row[k] and row[k]["fits_memory"]
        )
        if row["uniform_same_config"] and row["uniform_same_config"]["fits_memory"]:
            assert row["uniform_same_config"]["speedup"] >= 1 - 1e-9
