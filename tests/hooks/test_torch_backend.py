"""The torch.distributed backend "mcr" on 2 real ranks: every op, subgroups, DDP."""

import os
import re
import subprocess
import sys

import pytest
import torch.distributed as dist

import mcr  # noqa: F401  (registers the backend)
from tests.hooks.common import HERE, assert_same_losses, families, run, tagged
from tests.ranks import REPO, clean_env, run_script


def test_import_mcr_registers_the_backend():
    assert "MCR" in dist.Backend._plugins
    assert dist.Backend("mcr") == "mcr"


def test_every_op_correct_under_mpiexec_through_mpi():
    out = run("scripts/torch_ops.py", "helper")
    assert "OK 0 mpi" in out and "OK 1 mpi" in out, out[-3000:]


def test_every_op_correct_under_torchrun_init_process_group_mcr():
    out = run("scripts/torch_ops.py", "mcr", launcher="torchrun")
    assert "OK 0 gloo" in out and "OK 1 gloo" in out, out[-3000:]
    assert "gives no MPI world" in out  # the runtime says once why MPI is missing


@pytest.mark.parametrize("launcher", ["torchrun", "mpiexec"])
def test_a_group_made_again_with_the_same_ranks_runs_on_its_own_communicators(launcher):
    # torch gives such groups the same name: a rendezvous or a cache of communicators under that
    # name would hand the new group the destroyed one's addresses or communicators
    out = run("scripts/regroup.py", launcher=launcher, timeout=90)
    assert out.count("regroup OK") == 2, out[-3000:]


@pytest.fixture(scope="module")
def gloo_ddp_losses():
    return tagged(run("scripts/ddp.py", "gloo", launcher="torchrun"), "LOSSES")


def test_ddp_and_fsdp_on_mcr_match_plain_gloo_through_the_runtime(gloo_ddp_losses):
    out = run("scripts/ddp.py", "mcr")
    assert_same_losses(tagged(out, "LOSSES"), gloo_ddp_losses)
    logs = tagged(out, "COMMLOG")
    ddp, fsdp = families(logs["ddp 0"]), families(logs["fsdp 1"])
    assert ddp.get("all_reduce") == {"mpi"}, ddp  # the reducer's buckets, through the runtime's choice
    assert ddp.get("broadcast") == {"mpi"}, ddp  # DDP's initial parameter sync
    assert fsdp.get("all_gather") == {"mpi"} and fsdp.get("reduce_scatter") == {"mpi"}, fsdp


@pytest.mark.parametrize(
    "env",
    [{"MCR_PROGRESS_THREAD": "0"}, {"MPI4PY_RC_THREAD_LEVEL": "single"}],
    ids=["progress_thread_off", "no_mpi_thread_multiple"],
)
def test_ddp_and_fsdp_without_the_progress_thread_match_plain_gloo(gloo_ddp_losses, env):
    """The reducer's futures complete at `get_future()` (no thread sets them later): one set
    there before its op is done hands DDP gradients not yet all-reduced, and the losses drift."""
    out = run("scripts/ddp.py", "mcr", env={**env, "MCR_WATCHDOG_TIMEOUT": "60"}, timeout=150)
    assert_same_losses(tagged(out, "LOSSES"), gloo_ddp_losses)
    assert families(tagged(out, "COMMLOG")["ddp 0"]).get("all_reduce") == {"mpi"}, out[-3000:]


def test_rank_disagreeing_with_the_launcher_is_a_clear_error(monkeypatch):
    """torch told rank 1 of 2 while the launcher says rank 0 of 1: refuse, naming the fix."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    try:
        with pytest.raises(RuntimeError, match=r"torch.distributed says rank 1 of 2.*launcher's rank"):
            dist.init_process_group("mcr", store=dist.HashStore(), rank=1, world_size=2)
    finally:
        if mcr.is_initialized():
            mcr.finalize()
        if dist.is_initialized():
            dist.destroy_process_group()


def test_uncaught_exception_after_init_process_group_prints_its_traceback():
    # torch's excepthook buffers stderr around the runtime's aborting one; nothing may be lost.
    # Both ranks write to one pipe, so their tracebacks may interleave piece by piece (the
    # exception's type and its message are separate writes): look for each piece.
    result = run_script(2, os.path.join(HERE, "scripts", "raise_in_rank.py"), launcher="torchrun", timeout=120)
    assert result.returncode != 0
    for rank in (0, 1):
        assert f"rank {rank} uncaught after init_process_group" in result.output, result.output[-3000:]
        assert f"rank {rank} ended with AssertionError" in result.output, result.output[-3000:]
    assert result.output.count('raise_in_rank.py", line 9, in <module>') == 2, result.output[-3000:]


@pytest.mark.parametrize(
    "launcher,backend,what",
    [
        ("torchrun", "gloo", "world"),
        ("mpiexec", "mpi", "world"),
        ("torchrun", "gloo", "group"),
        ("mpiexec", "mpi", "group"),
    ],
)
def test_abort_with_an_op_in_flight_returns_at_once_and_the_job_goes_on_or_ends(launcher, backend, what):
    # rank 0 aborts with an all-reduce in flight that rank 1 never joins: torch's abort waits for
    # neither. An abort that waited for the op would wait for ever, and the watchdog's 30 s would
    # end the job (exit code 86), its line naming the op: how long the abort took is not asserted
    script = os.path.join(HERE, "scripts", "abort.py")
    result = run_script(2, script, backend, what, launcher=launcher, env={"MCR_WATCHDOG_TIMEOUT": "30"}, timeout=120)
    assert result.returncode == 0 and "mcr watchdog:" not in result.output, result.output[-3000:]
    assert re.search(r"rank 0 aborted in ([0-9.]+) s", result.output), result.output[-3000:]
    if what == "world":  # the runtime is gone and the process exits, its gloo op never joined
        assert "mcr initialized after abort: False" in result.output, result.output[-3000:]
        assert "rank 1 saw rank 0 abort" in result.output, result.output[-3000:]
    else:  # the world's ops, torch's and mcr's, run after a subgroup's abort: (1 + 2) * 2 = 6
        for rank in (0, 1):
            assert f"rank {rank} after the group's abort: [6.0, 6.0]" in result.output, result.output[-3000:]


@pytest.mark.parametrize("world", [2, 3])
def test_spawn_started_ranks_run_without_launcher_variables(world):
    """mp.spawn with a file:// init, as torch's DDP tutorial and test suite start ranks: the rank
    and world size torch was given are the truth; gloo runs on torch's store (no MPI world)."""
    env = {**clean_env(), "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "scripts", "spawn.py"), str(world)],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reports = {int(rank): report for rank, report in tagged(proc.stdout, "SPAWN").items()}  # lines may interleave
    assert sorted(reports) == list(range(world)), proc.stdout[-3000:]
    total = [sum(10 * r + i for r in range(world)) for i in range(4)]
    for rank, got in reports.items():
        assert (got["launcher"], got["rank"], got["world"]) == ("torch", rank, world), got
        assert (got["local_rank"], got["local_world"]) == (rank, world), got  # one host: from the hostnames
        assert got["backends"] == ["gloo"] and got["all_reduce"] == total, got
        assert got["coalesced"] == [[[r, r], [100 + r] * 3] for r in range(world)], got
    assert reports[0]["senders"] == list(range(1, world)), reports[0]
