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
    result = run_script(
        nprocs, os.path.join(SCRIPTS, "choice.py"), tmp_path / "table.yaml", launcher=launcher, env=WATCHDOG
    )
    # every rank got through every check and ran the uneven all-to-alls on the table's backend
    # (under torchrun the table's mpi falls back to gloo)
    want = ["gloo"] if launcher == "torchrun" else ["mpi"]
    reports = result.check().tagged("CHOICE")
    assert reports == {str(rank): {"uneven all_to_all": want} for rank in range(nprocs)}, result.output[-3000:]


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


class Runs:
    """A backend as the choice sees it: it runs every op on these devices."""

    p2p_tags = True
    call_timeouts = False

    def __init__(self, *devices):
        self.devices = devices

    def supports(self, family, dtype, reduce_op, device_type):
        return device_type in self.devices

    def refusal(self, family, dtype, reduce_op, device_type):

        return None


STARTED = {"nccl": Runs("cuda"), "mpi": Runs("cpu", "cuda"), "gloo": Runs("cpu")}


def pick(device_type, explicit=None, policy=None, table=None):
    import torch

    from mcr.choose import Call, Policy, select_backend

    call = Call("all_reduce", 4096, 2, 1, torch.float32, device_type, "sum", explicit)
    return select_backend(call, policy or Policy({}), STARTED, {}, lambda: table)


def test_a_staged_candidate_runs_its_backend_on_host_copies_of_cuda_tensors_and_plain_on_cpu():
    from mcr.choose import Policy
    from mcr.tuning.table import Choice

    named = [
        {"explicit": "mpi/host"},
        {"policy": Policy({"all_reduce": "mpi/host"})},
        {"policy": Policy({}, default="mpi/host")},
        {"table": (Choice("mpi", host=True), "the tuning table")},
    ]
    for how in named:
        on_gpu, on_cpu = pick("cuda", **how), pick("cpu", **how)
        assert (on_gpu.backend, on_gpu.host, on_gpu.label, on_gpu.notes) == ("mpi", True, "mpi/host", ()), how
        assert (on_cpu.backend, on_cpu.host, on_cpu.label, on_cpu.chosen) == ("mpi", False, "mpi", "mpi/host"), how
    # staged, a backend runs host tensors: gloo (here CPU-only) takes a CUDA call through host memory
    staged = pick("cuda", "gloo/host")
    assert (staged.backend, staged.host, staged.notes) == ("gloo", True, ()), staged
    # NCCL cannot run host copies: the built-in order takes the call, and the note says why
    fallback = pick("cuda", "nccl/host")
    assert (fallback.backend, fallback.host, fallback.chosen) == ("nccl", False, "nccl/host"), fallback
    assert "cannot run all_reduce sum on host copies of cuda float32 tensors" in fallback.notes[0].text


def test_settings_accept_a_staged_backend_where_an_ops_choice_is_named():
    from mcr import config
    from mcr.choose import require

    cfg = config.load(env={}, backend="mpi/host", overrides={"all_reduce": "gloo/host"})
    assert (cfg.backend, cfg.overrides["all_reduce"]) == ("mpi/host", "gloo/host")
    with pytest.raises(config.ConfigError, match=r"unknown backend 'ucc' in 'ucc/host' in backend"):
        config.load(env={}, backend="ucc/host")
    with pytest.raises(config.ConfigError, match=r"unknown backend 'mpi/host' in backends"):
        config.load(env={}, backends="mpi/host")  # which libraries to start: no way of running them
    require("mpi/host", "all_reduce", "asked for by backend=", STARTED, {})
    with pytest.raises(ValueError, match=r"backend 'ucc' \(asked for by backend=\) is unavailable"):
        require("ucc/host", "all_reduce", "asked for by backend=", STARTED, {})


class NoTags(Runs):
    """A library that matches a pair's messages in order, whatever their tags (NCCL)."""

    p2p_tags = False


def test_a_group_whose_members_share_a_gpu_chooses_without_nccl_and_refuses_it_by_name():
    import torch

    from mcr.choose import Call, Policy, select_backend
    from mcr.tuning.table import Choice

    share = {"nccl": "ranks 0 and 1 of the group share a GPU, and nccl needs one GPU per rank"}
    flat = Call("all_reduce", 4096, 2, 1, torch.float32, "cuda", "sum", missing=frozenset(share))
    picked = select_backend(flat, Policy({}), STARTED, share, lambda: None)
    assert (picked.backend, picked.notes) == ("mpi", ()), picked  # the built-in order skips it
    with pytest.raises(ValueError, match="backend 'nccl' .* share a GPU"):
        select_backend(flat._replace(explicit="nccl"), Policy({}), STARTED, share, lambda: None)
    # a table naming it falls back, naming why
    picked = select_backend(flat, Policy({}), STARTED, share, lambda: (Choice("nccl"), "the table"))
    assert picked.backend == "mpi" and "share a GPU" in picked.notes[0].text, picked


def test_a_node_aware_route_runs_nccl_where_its_phase_groups_have_a_gpu_each():
    import torch

    from mcr.choose import Call, Policy, select_backend
    from mcr.topology import Shape

    # 2 ranks on one node sharing a GPU: no NCCL on the world group or its node-local group, but
    # each peer group (one rank per node) has one
    share = {"nccl": "ranks 0 and 1 of the group share a GPU"}
    call = Call("all_reduce", 4096, 2, 1, torch.float32, "cuda", "sum", "node:mpi+nccl", Shape(2, 1, 2, (2,)), 0)
    call = call._replace(missing=frozenset(share), missing_intra=frozenset(share))
    picked = select_backend(call, Policy({}), STARTED, share, lambda: None)
    assert (picked.intra, picked.backend, picked.notes) == ("mpi", "nccl", ()), picked
    picked = select_backend(call._replace(explicit="node:nccl+mpi"), Policy({}), STARTED, share, lambda: None)
    assert not picked.intra and "peer groups" in picked.notes[0].text, picked  # flat, and says why


def test_a_tagged_send_is_not_chosen_for_a_library_that_ignores_tags():
    import torch

    from mcr.choose import Call, Policy, select_backend

    started = {**STARTED, "nccl": NoTags("cuda")}
    call = Call("send_recv", 64, 2, 1, torch.float32, "cuda")
    assert select_backend(call, Policy({}), started, {}, lambda: None).backend == "nccl"
    picked = select_backend(call._replace(tagged=True), Policy({}), started, {}, lambda: None)
    assert picked.backend == "mpi", picked


class Timed(Runs):
    """A library that takes a timeout per call (gloo)."""

    call_timeouts = True


def test_a_barrier_with_a_timeout_runs_where_the_library_takes_one_and_says_so_where_none_does():
    import torch

    from mcr.choose import Call, Policy, select_backend

    started = {**STARTED, "gloo": Timed("cpu")}
    call = Call("barrier", 0, 2, 1, torch.uint8, "cpu")
    assert select_backend(call, Policy({}), started, {}, lambda: None).backend == "mpi"
    timed = call._replace(timed=True)
    picked = select_backend(timed, Policy({}), started, {}, lambda: None)
    assert (picked.backend, picked.notes) == ("gloo", ()), picked  # the built-in order: the first that can
    picked = select_backend(timed, Policy({"barrier": "mpi"}), started, {}, lambda: None)
    assert (
        picked.backend == "gloo" and "mpi (the override for barrier) takes no timeout per call" in picked.notes[0].text
    )
    with pytest.raises(
        ValueError, match=r"timeout per call needs a backend that takes one \(gloo\), and none of mpi does"
    ):
        select_backend(timed, Policy({}), {"mpi": Runs("cpu")}, {}, lambda: None)
