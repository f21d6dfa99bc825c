"""`python -m launch submit` and `sweep` through a real single-node SLURM (see conftest.py).

Jobs are submitted from outside the project with a bare PATH, so the script itself must cd to
the project and find the venv; each trainer's tiny preset runs on 2 tasks under srun --mpi=pmix.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
from omegaconf import OmegaConf

from launch.options import app_names
from launch.scripts import Job, write_script
from launch.submit import job_state, submit, wait
from launch.systems import REPO, load_system
from tests.launch.conftest import OPS_CACHE, write_test_system

APPS = [a for a in app_names() if os.path.isfile(os.path.join(REPO, "configs", a, "tiny.yaml"))]  # every trainer
LAUNCH = f"import sys; sys.path.insert(0, {REPO!r}); from launch.cli import main; sys.exit(main())"
DEADLINE_S = 420  # one tiny job takes about a minute on this machine when it is busy


@pytest.fixture(scope="session")
def system(slurm, ops_cache, tmp_path_factory):
    return write_test_system(tmp_path_factory.mktemp("system") / "local-test.yaml", ops_cache)


def launch(slurm, cwd, *args, returncode=0) -> str:
    """Run `python -m launch ...` as a user would, from `cwd`, with no venv on PATH; its stdout
    (and its stderr, where it must end with `returncode` other than 0)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ["HOME"], "SLURM_CONF": slurm.conf, "WANDB_MODE": "disabled"}
    env.update(slurm.python_env)  # the job's ranks inherit it through sbatch
    proc = subprocess.run(
        [sys.executable, "-c", LAUNCH, *args], cwd=cwd, env=env, text=True, capture_output=True, timeout=900
    )
    assert proc.returncode == returncode, proc.stdout + proc.stderr
    return proc.stdout + (proc.stderr if returncode else "")


def submitted(output: str) -> tuple[str, str, str]:
    job_id = re.search(r"submitted job (\d+) \(slurm\)", output).group(1)
    log = re.search(r"^log: +(\S+)", output, re.M).group(1)
    run_dir = re.search(r"^run dir: +(\S+)", output, re.M).group(1)
    return job_id, log, run_dir


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


@pytest.mark.parametrize("app", APPS)
def test_submit_runs_the_tiny_preset_on_two_tasks_with_mpi(slurm, system, tmp_path, app):
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    out = launch(
        slurm, cwd, "submit", "--system", system, "--nodes", "1", "--time", "0:10:00", "--out", str(tmp_path),
        "--", app, "--config", f"configs/{app}/tiny.yaml", "train.steps=12", "log_interval=4", "comm.backend=auto",
    )  # fmt: skip
    job_id, log, run_dir = submitted(out)
    assert "#SBATCH --ntasks-per-node=2" in out and "--gpus-per-node" not in out
    states = wait("slurm", [job_id], DEADLINE_S)
    log_path, run_path = os.path.join(cwd, log), os.path.join(cwd, run_dir)
    assert states[job_id] == "DONE", f"job {job_id}: {states[job_id]}\n{read(log_path)[-4000:]}"
    assert os.path.basename(run_path) == f"{app}-{job_id}"  # the run dir is named with the job id
    assert os.listdir(cwd) == []  # nothing written where the user submitted from

    summary = json.loads(read(os.path.join(run_path, "summary.json")))
    assert summary["world_size"] == 2 and summary["steps"] == 12 and summary["samples_per_s"] > 0
    metrics = [json.loads(line) for line in read(os.path.join(run_path, "metrics.jsonl")).splitlines()]
    assert [m["step"] for m in metrics] == [4, 8, 12]
    text = read(log_path)
    assert f"job {job_id}: 2 ranks of apps.{app} on local" in text
    assert f":{20000 + int(job_id) % 20000};" in text  # MASTER_PORT from the job id
    assert "mcr communication log" in text
    comm = json.loads(read(os.path.join(run_path, "comm_log.json")))
    assert any(row["backend"] == "mpi" and row["group_size"] == 2 for row in comm), comm  # srun gave MPI a world
    assert os.path.isdir(os.path.join(run_path, "torch_extensions"))  # the job's own ops dir
    built = os.path.join(run_path, "torch_extensions", "fused_adam", "fused_adam.so")
    if os.path.exists(built):  # the DeepSpeed trainers: the seeded op was loaded, not rebuilt
        assert os.stat(built).st_mtime == os.stat(os.path.join(OPS_CACHE, "fused_adam", "fused_adam.so")).st_mtime


def test_a_job_killed_mid_compile_or_mid_run_does_not_hang_the_next(slurm, system, tmp_path):
    app = "moe"
    args = ["--", app, "--config", "configs/moe/tiny.yaml", "train.steps=400", "log_interval=1"]
    # 1. No ops cache: the job JIT-builds FusedAdam in its own TORCH_EXTENSIONS_DIR; kill it mid-build.
    cfg = OmegaConf.load(system)
    cfg.torch_extensions_cache = ""
    cold = tmp_path / "cold.yaml"
    OmegaConf.save(cfg, cold)
    job_id, _, run_dir = submitted(launch(slurm, tmp_path, "submit", "--system", str(cold), "--nodes", "1",
                                          "--out", str(tmp_path / "cold"), "--quiet", *args))  # fmt: skip
    lock = os.path.join(tmp_path, run_dir, "torch_extensions")
    wait_for(lambda: any("lock" in files for _, _, files in os.walk(lock)), 300, f"job {job_id} to start building")
    slurm.run("scancel", job_id)
    # 2. With the cache, kill a job once it is training.
    job2, _, run2 = submitted(launch(slurm, tmp_path, "submit", "--system", system, "--nodes", "1",
                                     "--out", str(tmp_path / "warm"), "--quiet", *args))  # fmt: skip
    metrics = os.path.join(tmp_path, run2, "metrics.jsonl")
    wait_for(lambda: os.path.exists(metrics) and os.path.getsize(metrics) > 0, 300, f"job {job2} to train")
    slurm.run("scancel", job2)
    states = wait("slurm", [job_id, job2], 60)
    assert states == {job_id: "FAILED", job2: "FAILED"}, states  # cancelled
    assert not processes_under(str(tmp_path / "cold")), "processes of the job killed mid-build remain"
    # 3. The next job completes.
    job3, log3, _ = submitted(launch(slurm, tmp_path, "submit", "--system", system, "--nodes", "1",
                                     "--out", str(tmp_path / "next"), "--quiet", "--", app, "--config",
                                     "configs/moe/tiny.yaml", "train.steps=6"))  # fmt: skip
    states = wait("slurm", [job3], DEADLINE_S)
    assert states[job3] == "DONE", read(os.path.join(tmp_path, log3))[-4000:]


def test_sweep_gathers_each_backends_summary_into_a_table_and_plot_one_job_at_a_time(slurm, system, tmp_path):
    # the test partition takes one of a user's jobs at a time (as Polaris' debug-scaling): the
    # second job is submitted only once the first has ended
    cfg = OmegaConf.load(system)
    cfg.queues = [{"name": "debug", "max_nodes": 1, "max_time": "1:00:00", "jobs_per_user": 1}]
    one_at_a_time = tmp_path / "one-at-a-time.yaml"
    OmegaConf.save(cfg, one_at_a_time)
    out = launch(
        slurm, tmp_path, "sweep", "--system", str(one_at_a_time), "--app", "moe", "--nodes", "1",
        "--backends", "gloo,mpi", "--time", "0:10:00", "--deadline", "0:10:00", "--out", str(tmp_path),
        "--", "--config", "configs/moe/tiny.yaml", "train.steps=12",
    )  # fmt: skip
    sweep_dir = re.search(r"table and plot in (\S+)", out).group(1)
    rows = json.loads(read(os.path.join(sweep_dir, "sweep.json")))
    assert [(r["nodes"], r["backend"], r["state"]) for r in rows] == [(1, "gloo", "DONE"), (1, "mpi", "DONE")]
    for r in rows:  # each job really ran with its backend, on 2 ranks, in the queue chosen for it
        assert r["summary"]["comm_backend"] == r["backend"] and r["summary"]["world_size"] == 2
        assert "Partition=debug " in slurm.run("scontrol", "show", "job", r["job_id"]).stdout
    first, second = (slurm.run("scontrol", "show", "job", r["job_id"]).stdout for r in rows)
    ended = re.search(r"EndTime=(\S+)", first).group(1)
    submitted = re.search(r"SubmitTime=(\S+)", second).group(1)
    assert ended <= submitted, (ended, submitted)  # ISO times: the second came after the first had ended
    lines = {line.split()[2]: line for line in read(os.path.join(sweep_dir, "sweep.txt")).splitlines()[3:]}
    tps = rows[1]["summary"]["tokens_per_s"] / rows[0]["summary"]["tokens_per_s"]
    assert lines["mpi"].split()[-2] == f"{(tps - 1) * 100:+.1f}%" and lines["gloo"].split()[-2] == "+0.0%"
    assert os.path.getsize(os.path.join(sweep_dir, "sweep.png")) > 10_000


def test_a_sweep_whose_submit_is_refused_cancels_the_jobs_it_had_submitted_and_names_them(slurm, system, tmp_path):
    # as Polaris' debug queue refuses 3 nodes: here the 2-node jobs go to a partition this
    # cluster lacks, which sbatch refuses, after the 1-node job is in
    cfg = OmegaConf.load(system)
    cfg.queues = [
        {"name": "debug", "max_nodes": 1, "max_time": "1:00:00"},
        {"name": "nosuchpartition", "min_nodes": 2, "max_nodes": 4, "max_time": "1:00:00"},
    ]
    two_queues = tmp_path / "two-queues.yaml"
    OmegaConf.save(cfg, two_queues)
    err = launch(
        slurm, tmp_path, "sweep", "--system", str(two_queues), "--app", "moe", "--nodes", "1,2", "--backends", "gloo",
        "--time", "0:10:00", "--out", str(tmp_path), "--", "--config", "configs/moe/tiny.yaml", "train.steps=400",
        returncode=2,
    )  # fmt: skip
    first = re.search(r"1 node\(s\) x gloo: job (\d+)", err).group(1)
    assert re.search(r"the job for 2 node\(s\) x gloo was refused: sbatch .* failed .*partition", err, re.S), err
    assert f"sweep: cancelled {first} (1 node(s) x gloo)" in err and "NOT cancelled" not in err, err
    assert wait("slurm", [first], 60) == {first: "FAILED"}  # no longer queued or running
    assert "JobState=CANCELLED" in slurm.run("scontrol", "show", "job", first).stdout


def test_preflight_job_passes_on_two_cpu_ranks_and_fails_naming_the_rank_when_their_cores_collide(
    slurm, system, tmp_path
):
    out = launch(slurm, tmp_path, "preflight", "--system", system, "--nodes", "1", "--out", str(tmp_path), "--submit")
    assert "python -m mcr.tools.preflight" in out  # the script it wrote and submitted
    assert re.search(r"^0 +\S+ +0 +\(unset\) +no GPU +- +all +no GPU +ok +ok$", out, re.M), out
    assert "preflight: every check passed (2 ranks on 1 node(s))" in out
    # the same job with every rank bound to core 0 (a wrapper standing in for a wrong --cpu-bind)
    cfg = OmegaConf.load(system)
    cfg.rank_wrapper = "taskset -c 0"
    pinned = tmp_path / "pinned.yaml"
    OmegaConf.save(cfg, pinned)
    out = launch(
        slurm, tmp_path, "preflight", "--system", str(pinned), "--nodes", "1", "--out", str(tmp_path / "pinned"),
        "--submit", "--quiet", returncode=1,
    )  # fmt: skip
    assert "rank 1 (" in out and ") is bound to cores 0 that rank 0 is bound to too. Fix: give each rank" in out, out
    assert "preflight: 1 problem(s) (2 ranks on 1 node(s))" in out


def processes_under(path: str) -> list[int]:
    """Pids whose working directory or command line lies under `path` (compilers run in the ops dir)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            cmdline = read(f"/proc/{pid}/cmdline")
        except OSError:
            continue
        if cwd.startswith(path) or path in cmdline:
            found.append(int(pid))
    return found


def wait_for(predicate, timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.5)


@pytest.mark.parametrize("plugin", ["pmix", "pmi2"])
def test_srun_plugins_give_an_mpi_world_or_name_the_plugin_to_use(slurm, system, tmp_path, plugin):
    s = load_system(system, srun_mpi=plugin)
    job = Job(s, 1, 600, str(tmp_path / "job"), "probe", "probe", ["backends=mpi,gloo"], module="tests.launch.probe")
    job_id = submit("slurm", write_script(job), cwd=job.job_dir)
    assert wait("slurm", [job_id], DEADLINE_S)[job_id] == "DONE"
    text = read(os.path.join(job.job_dir, f"job-{job_id}.out"))
    rows = re.findall(r"probe: rank (\d+) local (\d+) of (\d+) world (\d+)", text)
    assert sorted(tuple(map(int, r)) for r in rows) == [(0, 0, 2, 2), (1, 1, 2, 2)], text
    assert f"probe: launcher srun --mpi={plugin}" in text
    if plugin == "pmix":  # the Open MPI wheel speaks PMIx: a 2-rank MPI world
        assert "probe: backends mpi, gloo" in text, text
        assert "probe: mpi_yield_when_idle 1" in text, text  # the runtime's own default; the script sets none
    else:  # it does not speak PMI-2: singletons, so MPI is unavailable, and the message says what to use
        assert "probe: backends gloo" in text, text
        assert "srun --mpi=pmi2 started this rank" in text and "Open MPI 5 needs srun --mpi=pmix" in text, text


def test_job_state_of_an_unknown_job_is_gone(slurm):
    assert job_state("slurm", "999999") == "GONE"


def test_a_controller_that_does_not_answer_leaves_the_job_unknown_not_gone(slurm, tmp_path, monkeypatch):
    # a busy controller times out (the cluster SLURM's log: "slurm_msg_sendto ... missing socket"), and
    # a job taken for gone while it runs ended tests/cluster's trainer test once; here none listens
    conf = tmp_path / "slurm.conf"
    text = open(os.environ["SLURM_CONF"]).read()
    conf.write_text(
        (
            re.sub(r"(?m)^SlurmctldPort=.*$", "SlurmctldPort=1", text)
            if "SlurmctldPort=" in text
            else text + "SlurmctldPort=1\n"
        )
        + "MessageTimeout=2\n"  # scontrol gives up sooner (the default, 10 s, made this test 18 s)
    )
    monkeypatch.setenv("SLURM_CONF", str(conf))
    assert job_state("slurm", "1") is None


def test_a_rank_killed_under_srun_fails_the_job_and_resume_continues_its_run(slurm, system, tmp_path):
    # rank 0 SIGKILLed after every rank wrote step 4's checkpoint, before `latest` names it
    common = ["train.steps=6", "checkpoint.enabled=true", "checkpoint.interval=2", "log_interval=1", "progress=false"]
    args = ["step_000004", "apps.moe", "--config", "configs/moe/tiny.yaml", *common]
    job = Job(load_system(system), 1, 600, str(tmp_path / "job"), "moe", "moe", args, module="tests.apps.scripts.fault")
    job_id = submit("slurm", write_script(job), cwd=job.job_dir)
    assert wait("slurm", [job_id], DEADLINE_S)[job_id] == "FAILED"  # srun --kill-on-bad-exit ended the job
    text = read(os.path.join(job.job_dir, f"job-{job_id}.out"))
    assert "rank 0 SIGKILLed before marking step_000004 latest" in text and "task 0: Killed" in text, text[-3000:]
    run_dir = os.path.join(job.job_dir, f"moe-{job_id}")
    assert read(os.path.join(run_dir, "checkpoints", "latest")) == "step_000002"

    # the user resubmits the run as it was: same run dir, its saved settings, resume=true
    out = launch(slurm, tmp_path, "submit", "--system", system, "--nodes", "1", "--resume", run_dir, "--", "moe")
    resumed, log, shown_run_dir = submitted(out)
    assert os.path.samefile(os.path.join(tmp_path, shown_run_dir), run_dir)
    states = wait("slurm", [resumed], DEADLINE_S)
    text = read(os.path.join(tmp_path, log))
    assert states[resumed] == "DONE" and "resuming at step 2 -> 6" in text, text[-3000:]
    steps = [json.loads(line)["step"] for line in read(os.path.join(run_dir, "metrics.jsonl")).splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]  # the killed job's steps 3-4 replaced, not repeated
    assert read(os.path.join(run_dir, "checkpoints", "latest")) == "step_000006"


def test_a_rank_killed_under_srun_is_named_with_the_host_from_its_rank_file(slurm, system, tmp_path):
    # tests/mcr/scripts/hang.py: rank 1 SIGKILLs itself while rank 0 waits in an MPI all-reduce
    events = tmp_path / "events"
    events.mkdir()
    args = ["kill", "op", "mpi", str(events)]
    job = Job(load_system(system), 1, 600, str(tmp_path / "job"), "hang", "hang", args, module="tests.mcr.scripts.hang")
    job_id = submit("slurm", write_script(job), cwd=job.job_dir)
    assert wait("slurm", [job_id], DEADLINE_S)[job_id] == "FAILED"  # srun --kill-on-bad-exit ended the job
    text = read(os.path.join(job.job_dir, f"job-{job_id}.out"))
    assert "task 1: Killed" in text, text[-3000:]  # srun's own words
    # the survivor's op: srun's SIGTERM comes first, and rank 0 names the op it was waiting in
    assert re.search(r"rank 0 was ended by SIGTERM .* in all_reduce on backend mpi", text), text[-3000:]
    rank_file = json.loads(read(os.path.join(job.job_dir, f"hang-{job_id}", "ranks", "rank-1.json")))
    # the job script's last word: launch.dead_rank, from srun's line and the rank file
    assert text.rstrip().endswith(f"mcr: rank 1 (host {rank_file['host']}) died"), text[-3000:]
