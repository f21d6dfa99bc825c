"""Training survives a fault: a rank killed mid-training ends the job promptly, its half-made
checkpoint is never used, and `resume=true` continues the loss curve the job was on.

Per trainer, two launches on tiny presets (6 steps, a checkpoint every 2): rank 0 is SIGKILLed
after every rank wrote step 4's checkpoint but before `latest` names it (tests/apps/
fault_script.py); then the job resumes, under the other launcher, from step 2.
That a resumed run ends on the uninterrupted run's loss is checked in each trainer's own tests.
"""

import os
import re
import time

import pytest
import torch

from apps.common.metrics import read_jsonl
from tests.ranks import REPO, run_ranks

FAULT_SCRIPT = os.path.join(REPO, "tests", "apps", "fault_script.py")
COMMON = ["train.steps=6", "checkpoint.enabled=true", "checkpoint.interval=2", "log_interval=1", "progress=false"]
# trainer -> (launcher of the killed run, launcher of the resumed run)
TRAINERS = {
    "moe": ("mpiexec", "torchrun"),
    "dense": ("torchrun", "mpiexec"),
    "dlrm": ("mpiexec", "torchrun"),
}
# what each launcher prints about rank 0 SIGKILLed
KILLED = {
    "mpiexec": r"process rank 0 with PID \d+ on node \S+ exited on\s+signal 9",
    "torchrun": r"rank\s+: 0 \(local_rank: 0\)\n\s+exitcode\s+: -9",
}


@pytest.mark.parametrize("app", list(TRAINERS))
def test_a_rank_killed_mid_save_ends_the_job_and_resume_skips_its_checkpoint(app, tmp_path):
    kill_launcher, resume_launcher = TRAINERS[app]
    args = ["--config", os.path.join(REPO, "configs", app, "tiny.yaml"), f"out_dir={tmp_path}", "name=run", *COMMON]
    run_dir = tmp_path / "run"
    ckpt = run_dir / "checkpoints"

    killed = run_ranks(2, [FAULT_SCRIPT, "step_000004", f"apps.{app}", *args], launcher=kill_launcher, timeout=400)
    ended = time.time()
    fault = re.search(r"fault at ([0-9.]+)", killed.output)
    assert fault and killed.returncode != 0, killed.output[-3000:]
    seconds = ended - float(fault.group(1))
    print(f"{app}: the job ended {seconds:.1f} s after the kill, exit code {killed.returncode}")
    assert seconds < 60, (seconds, killed.output[-3000:])
    assert re.search(KILLED[kill_launcher], killed.output), killed.output[-3000:]
    # step 4's files were written, but `latest` still names step 2
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
