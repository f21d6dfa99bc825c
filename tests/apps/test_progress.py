"""The trainers' progress bar is drawn only where their output is a terminal; in a pipe (a
batch job's log, CI, `make run | cat`) they print one step line per interval and no frames."""

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest

from apps.common.metrics import STDOUT_TTY_ENV, stdout_is_terminal
from tests.ranks import REPO, rank_env

DENSE_TINY = os.path.join(REPO, "configs", "dense", "tiny.yaml")
# a rank-0 MetricsLog with the bar asked for: three steps, a step line each
BAR_SCRIPT = """
import sys
from apps.common.metrics import MetricsLog
log = MetricsLog(sys.argv[1], 0, 3, run_name="tiny", progress=True)
for step in (1, 2, 3):
    log.advance()
    log.write(step, loss=1.0)
log.close()
"""


def read_through_pty(cmd, env) -> str:
    """Run `cmd` with stdout and stderr on a real terminal (a pty) and return what it drew; the
    terminal writes each newline as CR LF, so a bar's frame is a CR not followed by LF."""
    main, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))  # a window's size, as a real one has
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal)
    os.close(terminal)
    chunks = []
    while True:
        try:
            data = os.read(main, 4096)
        except OSError:  # EIO: every writer closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(main)
    assert proc.wait(timeout=120) == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])  # a pty per rank; the pipe itself
def test_a_tiny_trainer_writing_to_a_pipe_prints_step_lines_and_no_bar_frames(tmp_path, launcher):
    cmd = [sys.executable, "-m", "launch.local", "-n", "2", "--launcher", launcher, "-m", "apps.dense"]
    cmd += ["--config", DENSE_TINY]
    cmd += [f"out_dir={tmp_path}", "name=piped", "progress=true", "log_interval=2"]
    proc = subprocess.run(cmd, cwd=REPO, env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=400)
    out = proc.stdout.decode()  # as bytes: text mode would turn each CR into a newline
    assert proc.returncode == 0, out[-6000:]
    assert "\r" not in out and "piped:" not in out, repr(out[-3000:])  # no frame of a bar named after the run
    steps = [line.split(" | ")[0] for line in out.splitlines() if line.startswith("step ")]
    assert steps == ["step 2/8", "step 4/8", "step 6/8", "step 8/8"], out[-3000:]


def test_a_terminal_gets_the_bar(tmp_path):
    env = rank_env()
    env.pop(STDOUT_TTY_ENV, None)
    out = read_through_pty([sys.executable, "-c", BAR_SCRIPT, str(tmp_path)], env)
    assert re.search(r"\rtiny:\s+\d+%\|.*\| \d/3 \[", out), repr(out)  # tqdm's frames, named after the run
    assert [line for line in re.split(r"\r\n?", out) if line.startswith("step ")] == [
        "step 1/3 | loss 1.0000",
        "step 2/3 | loss 1.0000",
        "step 3/3 | loss 1.0000",
    ], repr(out)


def test_a_terminal_gets_the_bar_through_mpiexec_and_a_log_file_does_not(tmp_path):
    script = tmp_path / "bar.py"
    script.write_text(BAR_SCRIPT)
    cmd = [sys.executable, "-m", "launch.local", "-n", "1", str(script), str(tmp_path)]
    assert re.search(r"\rtiny:\s+\d+%\|", read_through_pty(cmd, rank_env()))
    with open(tmp_path / "job.log", "w") as log:  # a batch job's output file
        subprocess.run(cmd, cwd=REPO, env=rank_env(), stdout=log, stderr=subprocess.STDOUT, timeout=120, check=True)
    logged = (tmp_path / "job.log").read_bytes().decode()  # read_text would turn each CR into a newline
    assert "\r" not in logged and "tiny:" not in logged and "step 3/3 | loss 1.0000" in logged, repr(logged)


def test_a_launcher_that_says_decides_and_open_mpi_alone_means_no_terminal():
    class Terminal:
        def isatty(self):
            return True

    assert stdout_is_terminal({}, Terminal())
    assert not stdout_is_terminal({STDOUT_TTY_ENV: "0"}, Terminal())
    assert not stdout_is_terminal({"OMPI_COMM_WORLD_RANK": "0"}, Terminal())  # mpiexec's own pty
    assert stdout_is_terminal({"OMPI_COMM_WORLD_RANK": "0", STDOUT_TTY_ENV: "1"}, Terminal())
