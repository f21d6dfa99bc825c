"""The performance model: α-β fit, prediction for other group sizes, and the CLI that prints it."""

import pytest

from mcr.tuning.model import fit, predict_curve, predict_table
from mcr.tuning.rules import entries_for
from mcr.tuning.table import Curve, TuningTable
from tests.ranks import run_tool

SIZES = [2**k for k in range(2, 27)]


def test_fit_recovers_known_alpha_and_beta():
    alpha, beta = 3.5, 2.5e-4  # µs, µs per byte
    assert fit(SIZES, [alpha + beta * s for s in SIZES]) == (
        pytest.approx(alpha, rel=1e-6),
        pytest.approx(beta, rel=1e-6),
    )


def test_fit_on_noisy_data_stays_close():
    alpha, beta = 20.0, 1e-3
    noise = [1 + 0.04 * ((-1) ** i) for i in range(len(SIZES))]  # ±4 %
    a, b = fit(SIZES, [(alpha + beta * s) * e for s, e in zip(SIZES, noise)])
    assert a == pytest.approx(alpha, rel=0.1) and b == pytest.approx(beta, rel=0.1)


def test_fit_never_returns_a_negative_term():
    a, b = fit([1, 2, 4, 8], [10, 9, 8, 7])  # falling latency: best line has beta < 0
    assert a >= 0 and b >= 0


def _curve(group_size=2):
    # mpi: alpha 2 µs, beta 1e-3 µs/B; gloo: alpha 200 µs, beta 2e-4 µs/B -> crossover near 247 KB
    lat = {"mpi": [2 + 1e-3 * s for s in SIZES], "gloo": [200 + 2e-4 * s for s in SIZES]}
    return Curve("all_reduce", group_size, "float32", SIZES, lat)


def test_prediction_scales_latency_and_bandwidth_terms_by_the_group_size():
    c8 = predict_curve(_curve(), 8)
    # all-reduce: alpha x log2(8)/log2(2) = 3, beta x (2*7/8)/(2*1/2) = 1.75
    small, large = 0, len(SIZES) - 1
    assert c8.latency_us["mpi"][small] == pytest.approx(3 * 2 + 1.75 * 1e-3 * 4, rel=1e-3)
    assert c8.latency_us["gloo"][large] == pytest.approx(3 * 200 + 1.75 * 2e-4 * SIZES[large], rel=1e-3)
    assert c8.predicted and c8.group_size == 8


def test_predicted_table_marks_every_new_entry_and_keeps_measured_ones():
    measured = _curve()
    table = TuningTable(
        {"world_size": 2, "hostname": "vm", "ranks_per_node": 2}, entries_for(measured), None, [measured]
    )
    predicted = predict_table(table, 8, ranks_per_node=8)
    new = [e for e in predicted.entries if e.group_size == 8]
    assert new and all(e.predicted for e in new)
    assert [e for e in predicted.entries if e.group_size == 2] == table.entries
    assert {e.backend for e in new} == {"mpi", "gloo"}
    assert predicted.fingerprint["world_size"] == 8 and predicted.fingerprint["predicted_from"]["world_size"] == 2
    predicted.check_fits(8, hostname="vm", ranks_per_node=8)  # now fits the 8-rank job


def test_predict_world_size_command_prints_the_predicted_table(tmp_path):
    measured = _curve()
    path = tmp_path / "t.yaml"
    TuningTable({"world_size": 2, "hostname": "vm"}, entries_for(measured), None, [measured]).save(str(path))
    out = run_tool("mcr.tools.tune", "--table", path, "--predict-world-size", "4", timeout=120)
    assert out.returncode == 0, out.errors
    assert "tuning table for 4 ranks" in out.output and "predicted from 2 ranks" in out.output
    assert "# all_reduce, group of 4" in out.output and "predicted" in out.output.split("group of 4")[1]
