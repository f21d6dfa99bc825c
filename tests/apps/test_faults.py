"""Training survives a fault: a rank killed mid-training ends the job promptly, its half-made
checkpoint is never used, and `resume=true` continues the loss curve the job was on.

Per trainer and fault, two launches on tiny presets (6 steps, a checkpoint every 2): a rank is
SIGKILLed during step 4's save (tests/apps/scripts/fault.py) - rank 0 after every rank wrote
step 4's checkpoint but before `latest` names it, rank 0 inside the atomic write of `latest`
(before its rename), or rank 1 right after its first file of step 4 - and `latest` must still
name step 2; then the job resumes, under the other launcher, from step 2.
That a resumed run ends on the uninterrupted run's loss is checked in each trainer's own tests.
"""

import os
import re
import time

import pytest
import torch

from apps.common.metrics import read_jsonl
from tests.ranks import REPO, run_ranks

FAULT_SCRIPT = os.path.join(REPO, "tests", "apps", "scripts", "fault.py")
COMMON = ["train.steps=6", "checkpoint.enabled=true", "checkpoint.interval=2", "log_interval=1", "progress=false"]
# trainer -> (launcher of the killed run, launcher of the resumed run)
TRAINERS = {
    "moe": ("mpiexec", "torchrun"),
    "dense": ("torchrun", "mpiexec"),
    "dlrm": ("mpiexec", "torchrun"),
}
# what each launcher prints about a rank SIGKILLed
KILLED = {
    "mpiexec": r"process rank {rank} with PID \d+ on node \S+ exited on\s+signal 9",
    "torchrun": r"rank\s+: {rank} \(local_rank: {rank}\)\n\s+exitcode\s+: -9",
}


def killed_then_resumed(app, fault, tmp_path, overrides=()):
    """Run `app` under scripts/fault.py with FAULT at step 4's save, check the launcher ended the
    job and `latest` stayed at step 2, then resume (the other launcher) and check it continued
    the killed job's loss curve from step 2. Returns the killed run's output."""
    kill_launcher, resume_launcher = TRAINERS[app]
    config = os.path.join(REPO, "configs", app, "tiny.yaml")
    args = ["--config", config, f"out_dir={tmp_path}", "name=run", *COMMON, *overrides]
    run_dir = tmp_path / "run"
    ckpt = run_dir / "checkpoints"

    killed = run_ranks(
        2, [FAULT_SCRIPT, f"{fault}:step_000004", f"apps.{app}", *args], launcher=kill_launcher, timeout=400
    )
    ended = time.time()
    found = re.search(r"fault at ([0-9.]+): rank (\d)", killed.output)
    assert found and killed.returncode != 0, killed.output[-3000:]
    seconds = ended - float(found.group(1))
    print(f"{app}, {fault}: the job ended {seconds:.1f} s after the kill, exit code {killed.returncode}")
    # the launcher ended it, not the watchdog's timeout (how soon depends on the machine's load)
    assert "mcr watchdog:" not in killed.output, killed.output[-3000:]
    assert re.search(KILLED[kill_launcher].format(rank=found.group(2)), killed.output), killed.output[-3000:]
    # step 4's save began, but `latest` still names step 2
    assert (ckpt / "latest").read_text() == "step_000002" and (ckpt / "step_000004").is_dir()
    before = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in before] == [1, 2, 3, 4]

    resumed = run_ranks(2, ["-m", f"apps.{app}", *args, "resume=true"], launcher=resume_launcher, timeout=400).check()
    assert "resuming at step 2 -> 6" in resumed.output, resumed.output[-3000:]
    after = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in after] == [1, 2, 3, 4, 5, 6]  # the killed run's steps 3-4 replaced, not repeated
    # steps 3 and 4 again, from step 2's checkpoint: the loss curve the killed job was on
    torch.testing.assert_close(
        torch.tensor([r["loss"] for r in after[:4]]), torch.tensor([r["loss"] for r in before]), rtol=5e-5, atol=0
    )
    assert (ckpt / "latest").read_text() == "step_000006"
    return killed.output


@pytest.mark.parametrize("app", list(TRAINERS))
def test_a_rank_killed_mid_save_ends_the_job_and_resume_skips_its_checkpoint(app, tmp_path):
    output = killed_then_resumed(app, "mark", tmp_path)
    assert "rank 0 SIGKILLed before marking step_000004 latest" in output


@pytest.mark.parametrize("app", list(TRAINERS))
def test_a_rank_killed_inside_the_atomic_write_of_latest_leaves_it_at_the_previous_checkpoint(app, tmp_path):
    output = killed_then_resumed(app, "rename", tmp_path)
    name = re.search(r"before the rename \((\.tmp-\w+)\)", output)
    assert name, output[-3000:]
    # the killed write's temporary file holds the new tag: only the rename was missing
    assert (tmp_path / "run" / "checkpoints" / name.group(1)).read_text() == "step_000004"


# the layouts in which rank 1 writes files of its own (dense at TP=1 is data parallel: rank 0 alone saves)
SHARD_OVERRIDES = {"moe": (), "dense": ("parallel.tensor=2",), "dlrm": ()}


@pytest.mark.parametrize("app", list(TRAINERS))
def test_a_rank_killed_after_its_first_shard_file_leaves_latest_at_the_previous_checkpoint(app, tmp_path):
    output = killed_then_resumed(app, "shard", tmp_path, SHARD_OVERRIDES[app])
    written = re.search(r"rank 1 SIGKILLed after writing its first file of step_000004: (\S+)", output)
    assert written and os.path.isfile(written.group(1)), output[-3000:]  # a shard on disk, its rank dead
