"""The flight recorder (`mcr.flight`): real 2-rank jobs that hang, disagree, crash or are killed,
their dumps read by torch's own analyzer (`torchfrtrace`), which must name the op and the ranks.
A rank its launcher kills without warning (Hydra's SIGKILL, a few ms after another rank dies)
leaves its record in its live file (`mcr.flight_file`), which `mcr.flight.collect` turns into a
dump, as launch.local does after a failed job."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest

from mcr import flight
from mcr.watchdog import EXIT_CODE
from tests.mcr.tables import size_split_table
from tests.ranks import run_script, run_tool, under_hydra

# what a rank the launcher ended says in its dump: Open MPI's launcher sends SIGTERM first, and
# the rank dumps; Hydra's sends SIGKILL, and the rank's live record is all there is
ENDED_BY_LAUNCHER = flight.LIVE_REASON if under_hydra() else "SIGTERM"

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "flight.py")
ANALYZER = os.path.join(os.path.dirname(sys.executable), "torchfrtrace")


def line_of(text: str) -> int:
    """The script's line that holds `text`: where a pending op's stack must point."""
    with open(SCRIPT) as f:
        return next(n for n, line in enumerate(f, 1) if text in line)


def fr_env(dumps, env=None) -> dict:
    return {"MCR_FR_DIR": str(dumps), "MCR_WATCHDOG_TIMEOUT": "10", "MCR_BACKEND": "mpi", **(env or {})}


def run_flight(tmp_path, mode, env=None, collect=True):
    """The script's job under mpiexec, then (`collect`) what launch.local does after a failed
    job, and a user after one that went wrong (`mcr.tools.flight_collect`): a dump from the live
    record of each rank that left none."""
    dumps = tmp_path / "fr"
    result = run_script(2, SCRIPT, mode, env=fr_env(dumps, env), timeout=180)
    if collect:
        flight.collect(str(dumps))
    return result, dumps


def dumps_of(dumps) -> list:
    return sorted(name for name in os.listdir(dumps) if name.startswith(flight.FILE_PREFIX))


def without_stacks(entries) -> list:
    """Entries as a live record has them: no stacks, no thread names (no one saw them)."""
    return [{k: v for k, v in entry.items() if k not in ("frames", "thread_name")} for entry in entries]


def analyze(dumps) -> str:
    proc = subprocess.run([ANALYZER, str(dumps)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout
    return proc.stdout


def load(dumps, rank):
    with open(dumps / f"mcr_fr_rank_{rank}", "rb") as f:
        return pickle.load(f)


@pytest.mark.parametrize("chosen_by", ["default", "table"])
def test_torch_analyzer_names_the_collective_a_rank_skipped(tmp_path, chosen_by):
    env, backend, rule = {}, "mpi", "the default backend"
    if chosen_by == "table":  # 16-byte all-reduces on gloo, by the table's first entry
        table = size_split_table(tmp_path / "table.yaml", 2)
        env, backend = {"MCR_BACKEND": "auto", "MCR_TUNING_FILE": table}, "gloo"
        rule = f"the tuning table {table} (entry 0: all_reduce [0, 1K))"
    result, dumps = run_flight(tmp_path, "hang", env)
    assert result.returncode != 0, result.output[-3000:]
    assert dumps_of(dumps) == ["mcr_fr_rank_0", "mcr_fr_rank_1"], result.output[-3000:]
    report = analyze(dumps)
    # the first collective not every rank reached: the world's 8th, which rank 1 never issued
    first = report.split("Not all ranks joining collective, sequence number: ")[1]
    assert first.startswith("8\n"), report
    assert "collective: gloo:all_reduce" in first.split("Not all ranks")[0], report
    assert "missing ranks: {1}" in first.split("Not all ranks")[0], report
    assert f"flight.py:{line_of('mcr.all_reduce(t)  # rank 0 waits')}" in report, report
    pending = load(dumps, 0)["entries"][-1]
    assert pending["state"] == "started" and pending["mcr_backend"] == backend, pending
    assert pending["mcr_rule"] == rule, pending
    # on MPI the watchdog ends the hang; gloo's own timeout (the same 10 s) may raise first
    reason = load(dumps, 0)["mcr_dump_reason"]
    assert reason.startswith("watchdog: all_reduce waited") or (backend == "gloo" and reason == "uncaught CommError"), (
        result.output[-3000:]
    )
    if backend == "mpi":
        assert result.returncode == EXIT_CODE, result.output[-3000:]


def test_torch_analyzer_names_the_rank_whose_sizes_differ(tmp_path):
    # Open MPI and MPICH fail the all-reduce; Intel MPI's completes it, the job ends well, and
    # only the records (the ranks' live ones, which collect turns into dumps) show the fault
    result, dumps = run_flight(tmp_path, "mismatch")
    assert dumps_of(dumps) == ["mcr_fr_rank_0", "mcr_fr_rank_1"], result.output[-3000:]
    report = analyze(dumps)
    assert "Collective sequence number: 8 has errors" in report, report
    assert "Culprit rank 1; Error type: SIZE_OR_SYNTAX_MISMATCH" in report, report
    assert "'[[4]]' does not match found input sizes: '[[8]]'" in report, report


def test_an_uncaught_exception_and_the_launchers_end_each_leave_a_record(tmp_path):
    result, dumps = run_flight(tmp_path, "raise")
    assert result.returncode != 0 and "ValueError: a bug in the training script" in result.output, result.output
    assert load(dumps, 1)["mcr_dump_reason"] == "uncaught ValueError", result.output[-3000:]
    assert load(dumps, 0)["mcr_dump_reason"] == ENDED_BY_LAUNCHER, result.output[-3000:]
    waiting = load(dumps, 0)["entries"][-1]  # rank 0 was in the world's 8th collective
    assert (waiting["collective_seq_id"], waiting["state"]) == (8, "started"), waiting
    report = subprocess.run([ANALYZER, str(dumps)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert "missing ranks: {1}" in report.stdout, report.stdout


def test_sigusr1_dumps_a_live_job_and_the_ring_keeps_the_last_n(tmp_path):
    env = {"MCR_FR_SIZE": "16", "MCR_FR_DUMP_ON_FINALIZE": "1"}
    result, dumps = run_flight(tmp_path, "live", env=env, collect=False)
    result.check()
    with open(tmp_path / "sigusr1_rank_1", "rb") as f:
        live = pickle.load(f)
    assert live["mcr_dump_reason"] == "SIGUSR1", live["mcr_dump_reason"]
    waiting = live["entries"][-1]  # rank 1 was in its receive when the signal came
    assert (waiting["profiling_name"], waiting["state"]) == ("gloo:recv 1<-0", "started"), waiting
    assert any(
        f["filename"] == SCRIPT and f["line"] == line_of("the dump names this line") for f in waiting["frames"]
    ), waiting["frames"]
    for rank in (0, 1):
        dump = load(dumps, rank)
        assert dump["mcr_dump_reason"] == "finalize", dump["mcr_dump_reason"]
        records = [e["record_id"] for e in dump["entries"]]
        # 9 ops before the loop, 40 in it, the send or receive: the last 16 of 50, all completed
        assert records == list(range(34, 50)), records
        assert {e["state"] for e in dump["entries"]} == {"completed"}
    assert "Not all ranks" not in analyze(dumps) and "has errors" not in analyze(dumps)
    # each rank's own dumps are newer than its live record: collect keeps them; without one, a
    # rank that finalized gets the same entries from its live record
    assert flight.collect(str(dumps)) == {}
    os.replace(dumps / "mcr_fr_rank_0", tmp_path / "finalize_rank_0")
    assert flight.collect(str(dumps)) == {0: str(dumps / "mcr_fr_rank_0")}
    with open(tmp_path / "finalize_rank_0", "rb") as f:
        finalized = pickle.load(f)
    assert load(dumps, 0)["mcr_dump_reason"] == flight.FINALIZED_REASON
    assert without_stacks(load(dumps, 0)["entries"]) == without_stacks(finalized["entries"])


def test_a_rank_killed_mid_op_leaves_its_record_in_its_live_file(tmp_path):
    """Rank 1 SIGKILLs itself in a receive (no handler runs); launch.local, seeing the job fail,
    writes its dump from its live record, which says what the rank's own dump said a moment
    before (but the stacks). Under Hydra rank 0 is SIGKILLed too, and its record comes the same way."""
    dumps = tmp_path / "fr"
    result = run_tool("launch.local", "-n", "2", SCRIPT, "kill", env=fr_env(dumps), timeout=180)
    assert result.returncode != 0, result.output[-3000:] + result.errors[-3000:]
    said = f"launch.local: rank 1 left no flight-record dump; wrote {dumps / 'mcr_fr_rank_1'} from its live record"
    assert said in result.errors, result.errors[-3000:]
    assert dumps_of(dumps) == ["mcr_fr_rank_0", "mcr_fr_rank_1"], result.errors[-3000:]
    killed = load(dumps, 1)
    assert killed["mcr_dump_reason"] == flight.LIVE_REASON, killed["mcr_dump_reason"]
    with open(tmp_path / "before_kill" / "mcr_fr_rank_1", "rb") as f:
        before = pickle.load(f)
    assert without_stacks(killed["entries"]) == without_stacks(before["entries"])
    assert (killed["pg_config"], killed["pg_status"]) == (before["pg_config"], before["pg_status"])
    # 9 ops before the fault, then the receive it died in
    assert [e["record_id"] for e in killed["entries"]] == list(range(10)), killed["entries"]
    last = killed["entries"][-1]
    assert (last["profiling_name"], last["p2p_seq_id"], last["state"]) == ("gloo:recv 1<-0", 2, "started"), last
    assert load(dumps, 0)["mcr_dump_reason"] == ENDED_BY_LAUNCHER
    waiting = load(dumps, 0)["entries"][-1]
    assert (waiting["collective_seq_id"], waiting["state"]) == (8, "started"), waiting
    assert "missing ranks: {1}" in analyze(dumps).split("Not all ranks joining collective, sequence number: 8")[1]
    pending = flight.open_ops(str(dumps))
    assert pending[0].startswith("all_reduce on backend mpi (group world, seq 8), waiting "), pending
    assert pending[1].startswith("recv from rank 0 on backend mpi (group world, p2p seq 2), waiting "), pending
    assert f"launch.local: rank 1 was last in {pending[1].split(', waiting')[0]}" in result.errors
