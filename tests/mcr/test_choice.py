"""Backend choice: precedence, identical on all ranks, and visible in the comm log."""

import json
import os
import re

import pytest

from tests.ranks import run_script

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")
WATCHDOG = {"MCR_WATCHDOG_TIMEOUT": "60"}  # ranks that chose differently hang: fail naming the op


@pytest.mark.parametrize("nprocs,launcher", [(2, "mpiexec"), (3, "mpiexec"), (2, "torchrun")])
def test_uneven_all_to_all_choice_is_identical_on_all_ranks(tmp_path, nprocs, launcher):
    out = (
        run_script(nprocs, os.path.join(SCRIPTS, "choice.py"), tmp_path / "table.yaml", launcher=launcher, env=WATCHDOG)
        .check()
        .output
    )
    assert out.count("choice OK") == nprocs, out[-3000:]


FAMILIES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


def all_reduce_on_mpi_table(path, world_size):
    from mcr.tuning.table import Entry, TuningTable

    entry = Entry(op="all_reduce", group_size=world_size, min_bytes=0, max_bytes=None, backend="mpi")
    TuningTable(fingerprint={"world_size": world_size}, entries=[entry]).save(str(path))
    return str(path)


def backends_by_op(log_path):
    by_op = {}
    for row in json.loads(log_path.read_text()):
        by_op.setdefault(row["op"], set()).add(row["backend"])
    return by_op


# Each rung of the choice, with calls that name no backend (except the first rung's all_reduce):
# (what the user sets, argv, the backend every op family must have used).
RUNGS = {
    "backend= over a per-op override": (
        {"MCR_BACKEND": "gloo", "MCR_BACKEND_ALL_REDUCE": "gloo"},
        ["explicit"],
        {"all_reduce": "mpi"},
    ),
    "per-op override over the table": (
        {"MCR_BACKEND": "gloo", "MCR_BACKEND_ALL_REDUCE": "gloo", "MCR_TUNING_FILE": "TABLE"},
        [],
        {"all_reduce": "gloo"},
    ),
    "table over the default": ({"MCR_BACKEND": "gloo", "MCR_TUNING_FILE": "TABLE"}, [], {"all_reduce": "mpi"}),
    "default over the built-in order": ({"MCR_BACKEND": "gloo"}, [], {"all_reduce": "gloo"}),
    "built-in order": ({}, [], {family: "mpi" for family in FAMILIES}),
}


@pytest.mark.parametrize("rung", list(RUNGS))
def test_each_rung_of_the_choice_decides_exactly_the_ops_it_covers(tmp_path, rung):
    env, argv, special = RUNGS[rung]
    env = {key: all_reduce_on_mpi_table(tmp_path / "t.yaml", 2) if v == "TABLE" else v for key, v in env.items()}
    log_path = tmp_path / "comm.json"
    env["MCR_COMM_LOG_JSON"] = str(log_path)
    out = run_script(2, os.path.join(SCRIPTS, "precedence.py"), *argv, env=env).check().output
    assert out.count("precedence ran") == 2, out[-3000:]
    default = env.get("MCR_BACKEND", "mpi")
    want = {family: {special.get(family, default)} for family in FAMILIES}
    got = {family: backends for family, backends in backends_by_op(log_path).items() if family in FAMILIES}
    assert got == want, (rung, got)


def test_force_backend_moves_every_op_that_follows_and_none_gives_the_choice_back(tmp_path):
    # the same calls before, under and after force_backend("gloo"): the runtime caches each call's
    # route, and a cache that outlived force_backend would keep them all on mpi
    log_path = tmp_path / "comm.json"
    out = run_script(2, os.path.join(SCRIPTS, "precedence.py"), "forced", env={"MCR_COMM_LOG_JSON": str(log_path)})
    assert out.check().output.count("precedence ran") == 2
    counts = {}
    for row in json.loads(log_path.read_text()):
        if row["op"] in FAMILIES:
            counts.setdefault(row["op"], {})[row["backend"]] = row["count"]
    assert counts == {family: {"mpi": 2, "gloo": 1} for family in FAMILIES}, counts


def test_comm_log_json_and_bus_bandwidth_factors_at_3_ranks(tmp_path):
    # at 2 ranks the all-reduce factor 2(n-1)/n equals 1; at 3 every factor differs from 1
    log_path = tmp_path / "comm.json"
    env = {"MCR_COMM_LOG_JSON": str(log_path)}
    out = run_script(3, os.path.join(SCRIPTS, "precedence.py"), env=env).check().output
    assert "mcr communication log (rank 0)" in out and "busbw GB/s" in out
    rows = json.loads(log_path.read_text())
    factors = {"all_reduce": 4 / 3, "all_gather": 2 / 3, "reduce_scatter": 2 / 3, "all_to_all": 2 / 3, "broadcast": 1}
    assert {row["op"] for row in rows} >= set(factors), rows
    for row in rows:
        if row["op"] in factors:
            assert row["count"] == 1 and row["mean_us"] > 0, row
            assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * factors[row["op"]]), row


def table_naming(path, backend, world_size, families):
    from mcr.tuning.table import Entry, TuningTable

    entries = [Entry(op=op, group_size=world_size, min_bytes=0, max_bytes=None, backend=backend) for op in families]
    TuningTable(fingerprint={"world_size": world_size}, entries=entries).save(str(path))
    return str(path)


# (backend the table names, what the user sets, why that backend is not running here)
NOT_RUNNING = {
    "nccl-on-cpu": ("nccl", {}, "no GPU (torch.cuda.is_available() is False)"),
    "excluded": ("gloo", {"MCR_BACKENDS": "mpi"}, "not in the configured backends list"),
}


@pytest.mark.parametrize("case", list(NOT_RUNNING))
def test_a_table_naming_a_backend_not_running_warns_once_on_rank_0_naming_it_and_why(tmp_path, case):
    import torch

    backend, env, why = NOT_RUNNING[case]
    if backend == "nccl" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU, so nccl runs; the case needs a machine without one")
    families = ("all_reduce", "all_gather")
    table = table_naming(tmp_path / "table.yaml", backend, 2, families)
    env = {**env, "MCR_TUNING_FILE": table, **WATCHDOG}
    out = run_script(2, os.path.join(SCRIPTS, "fallback.py"), env=env).check().output
    assert out.count("fallback ran 64 calls") == 2, out[-3000:]
    warned = re.findall(r"rank (\d+) warned: (.*)", out)
    # once per op family, whatever the sizes and however often; rank 0 only
    want = [
        (
            "0",
            f"mcr: {backend} (the tuning table {table} (entry {i}: {f} [0, inf))) is unavailable ({why}); using mpi for {f}",
        )
        for i, f in enumerate(families)
    ]
    assert sorted(warned) == sorted(want), out[-3000:]


# Tables for the all-to-all's size agreement: (entries as (op, min, max, backend), whether the
# all-to-all's choice depends on its size, so uneven calls must agree on one size first)
AGREEMENT_TABLES = {
    "all-to-all-split-by-size": ([("all_to_all", 0, 1024, "gloo"), ("all_to_all", 1024, None, "mpi")], True),
    "all-to-all-on-one-backend": ([("all_to_all", 0, None, "gloo")], False),
    "split-into-the-same-choice": ([("all_to_all", 0, 1024, "mpi"), ("all_to_all", 1024, None, "mpi")], False),
    "another-op-split-by-size": (
        [("all_reduce", 0, 1024, "gloo"), ("all_reduce", 1024, None, "mpi"), ("all_to_all", 0, None, "mpi")],
        False,
    ),
    "no-table": (None, False),
}


@pytest.mark.parametrize("case", list(AGREEMENT_TABLES))
def test_uneven_all_to_alls_agree_on_a_size_exactly_when_the_choice_depends_on_it(tmp_path, case):
    from mcr.tuning.table import Entry, TuningTable

    rows, depends = AGREEMENT_TABLES[case]
    log_path = tmp_path / "comm.json"
    env = {"MCR_COMM_LOG": "1", "MCR_COMM_LOG_JSON": str(log_path), **WATCHDOG}
    if rows is not None:
        entries = [Entry(op=op, group_size=2, min_bytes=lo, max_bytes=hi, backend=b) for op, lo, hi, b in rows]
        env["MCR_TUNING_FILE"] = str(tmp_path / "table.yaml")
        TuningTable(fingerprint={"world_size": 2}, entries=entries).save(env["MCR_TUNING_FILE"])
    out = run_script(2, os.path.join(SCRIPTS, "agreed_size.py"), env=env).check().output
    assert out.count("agreed size ran 15 all-to-alls, 10 uneven") == 2, out[-3000:]
    # the script issues no 8-byte op of its own: each 8-byte all-reduce is one agreement (an int64 MAX)
    agreements = sum(
        row["count"] for row in json.loads(log_path.read_text()) if row["op"] == "all_reduce" and row["bytes"] == 8
    )
    assert agreements == (10 if depends else 0), (case, agreements)
