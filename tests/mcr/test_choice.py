"""Backend choice: precedence, identical on all ranks, and visible in the comm log."""

import json
import os

import pytest

from tests.ranks import run_script

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


@pytest.mark.parametrize("nprocs,launcher", [(2, "mpiexec"), (3, "mpiexec"), (2, "torchrun")])
def test_uneven_all_to_all_choice_is_identical_on_all_ranks(tmp_path, nprocs, launcher):
    out = (
        run_script(nprocs, os.path.join(SCRIPTS, "choice.py"), tmp_path / "table.yaml", launcher=launcher)
        .check()
        .output
    )
    assert out.count("choice OK") == nprocs, out[-3000:]


def test_override_precedence_and_comm_log_json(tmp_path):
    log_path = tmp_path / "comm.json"
    env = {
        "MCR_BACKEND": "gloo",
        "MCR_BACKEND_ALL_REDUCE": "mpi",
        "MCR_COMM_LOG": "1",
        "MCR_COMM_LOG_JSON": str(log_path),
    }
    out = run_script(2, os.path.join(SCRIPTS, "stress.py"), 60, 7, env=env).check().output
    assert "mcr communication log (rank 0)" in out and "busbw GB/s" in out
    rows = json.loads(log_path.read_text())
    by_op = {}
    for row in rows:
        by_op.setdefault(row["op"], set()).add(row["backend"])
    explicit = {"all_reduce"}  # the stress test also passes backend= explicitly to random ops
    assert "mpi" in by_op["all_reduce"], by_op
    for row in rows:
        assert row["count"] > 0 and row["mean_us"] > 0
        factor = {"all_reduce": 2 * (2 - 1) / 2, "all_gather": 0.5, "reduce_scatter": 0.5, "all_to_all": 0.5}.get(
            row["op"], 1.0
        )
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * factor)
    assert explicit <= set(by_op)
