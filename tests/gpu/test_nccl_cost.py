"""tests/gpu/scripts/nccl_cost.py's arithmetic on numbers fed to it, on any machine: figures are
medians over rounds with the lowest and highest round, mcr's cost over torch is taken round by
round, each goal is judged on its worst size, and the last line (which `make gpu-check` quotes)
says so; without a GPU the script measures nothing and says why. The measuring itself needs a
GPU (`make gpu-check`)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.scripts import nccl_cost
from tests.gpu.scripts.nccl_cost import Figure, Verdict

KIB, MIB = 1 << 10, 1 << 20


def rounds(torch_us, mcr_us, dist_us=None) -> dict:
    return {"torch": torch_us, "mcr": mcr_us, "dist on mcr": dist_us or [u + 1 for u in mcr_us]}


def test_a_figure_is_the_median_over_rounds_with_the_lowest_and_highest_round():
    assert nccl_cost.figure([30.0, 10.0, 20.0, 90.0]) == Figure(25.0, 10.0, 90.0)  # even: the middle two's mean
    assert nccl_cost.figure([3.0, 1.0, 2.0]) == Figure(2.0, 1.0, 3.0)


def test_the_cost_over_torch_is_the_median_of_the_per_round_differences():
    # a burst of load in round 2 hits both paths: round by round mcr is 5 us slower; the medians'
    # difference (20 - 12 = 8) would charge mcr for torch's lucky rounds
    torch_us, mcr_us = [12.0, 40.0, 10.0, 11.0], [17.0, 45.0, 15.0, 16.0]
    row = nccl_cost.summarize("off", KIB, "blocking", rounds(torch_us, mcr_us))
    assert row["mcr - torch"] == Figure(5.0, 5.0, 5.0)
    assert row["dist on mcr - torch"] == Figure(6.0, 6.0, 6.0)
    assert row["torch"] == Figure(11.5, 10.0, 40.0) and row["mcr"] == Figure(16.5, 15.0, 45.0)
    assert row["per round"]["mcr"] == mcr_us
    with pytest.raises(ValueError):  # rounds that do not pair up are a bug, not a figure
        nccl_cost.difference([1.0, 2.0], [1.0])


def rows():
    """off/blocking: 4.0, 5.0 (the goal exactly), 3.0 us over torch; defaults/blocking: 9.0,
    12.5, 2.0; defaults/async+wait: 30.0 at every size; off/async+wait has no goal."""
    over = {
        ("off", "blocking"): (4.0, 5.0, 3.0),
        ("off", "async+wait"): (99.0, 99.0, 99.0),
        ("defaults", "blocking"): (9.0, 12.5, 2.0),
        ("defaults", "async+wait"): (30.0, 30.0, 30.0),
    }
    out = []
    for (config, way), extra in over.items():
        for nbytes, more in zip(nccl_cost.SIZES, extra):
            out.append(
                nccl_cost.summarize(config, nbytes, way, rounds([10.0, 11.0, 12.0], [10 + more, 11 + more, 12 + more]))
            )
    return out


def test_each_goal_is_judged_on_its_worst_size_and_a_figure_at_the_goal_meets_it():
    assert nccl_cost.verdicts(rows()) == [
        Verdict("off", "blocking", 5.0, 5.0, MIB, True),
        Verdict("defaults", "blocking", 10.0, 12.5, MIB, False),
        Verdict("defaults", "async+wait", 10.0, 30.0, KIB, False),  # every size alike: the first
    ]
    assert nccl_cost.verdicts([r for r in rows() if r["config"] == "off"]) == [
        Verdict("off", "blocking", 5.0, 5.0, MIB, True)
    ]


def test_the_table_shows_every_row_with_its_goal_and_marks_the_worst_size():
    text = nccl_cost.table(rows(), nccl_cost.verdicts(rows()), "# heading")
    lines = [" ".join(line.split()) for line in text.splitlines()]  # the cells, whatever their widths
    assert lines[0] == "# heading" and len(lines) == 3 + 12
    by = {tuple(line.split()[:4]): line.split(" ", 4)[4] for line in lines[3:]}
    assert by["off", "1", "KiB", "blocking"] == "11.0 (10.0-12.0) 15.0 (14.0-16.0) 16.0 (15.0-17.0) +4.0 +5.0 5 met"
    assert by["off", "1", "MiB", "blocking"].endswith("+5.0 +6.0 5 met (worst size)")
    assert by["defaults", "1", "MiB", "blocking"].endswith("+12.5 +13.5 10 MISSED (worst size)")
    assert by["defaults", "64", "MiB", "blocking"].endswith("+2.0 +3.0 10 met")
    assert by["off", "64", "MiB", "async+wait"].endswith("+99.0 +100.0 -")  # no goal, no verdict


def test_the_last_line_names_each_goal_and_fits_gpu_checks_summary():
    line = nccl_cost.last_line(nccl_cost.verdicts(rows()))
    assert line == (
        "nccl cost (mcr over torch, worst size, us/goal): blocking off +5.0/5 met, blocking +12.5/10 MISSED, "
        "async+wait +30.0/10 MISSED"
    )
    worst = [Verdict(c, w, g, 123.4, KIB, False) for c, w, g in nccl_cost.GOALS]  # today's figures are ~100 us
    assert len(nccl_cost.last_line(worst).split(": ", 1)[1]) <= 88  # check.py's summary keeps 88 characters


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the script would measure")
def test_without_a_gpu_it_says_so_and_measures_nothing(capsys, tmp_path):
    assert nccl_cost.main(["--json", str(tmp_path / "figures.json")]) == 0
    assert capsys.readouterr().out.startswith("nccl cost: no GPU here (torch ")
    assert not (tmp_path / "figures.json").exists()
    with pytest.raises(SystemExit) as help_asked:
        nccl_cost.main(["--help"])
    assert help_asked.value.code == 0 and "--device {cuda,cpu}" in capsys.readouterr().out
