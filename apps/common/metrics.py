"""Metrics for the trainers: a throughput meter, the one-line-per-interval log on rank 0 (each
app declares its fields), the metrics JSONL in the run directory, a progress bar (on a terminal
only: elsewhere the step lines alone), wandb (offline by default) and the run summary every
trainer writes.

    meter = Meter(warmup=3, tokens=tokens_per_step, samples=samples_per_step)   # or Meter(samples=...)
    log = MetricsLog(run_dir, rank, steps, fields=LM_FIELDS)
    meter.step(seconds, comm_seconds)        # once per optimizer step
    log.write(step, loss=..., **meter.interval())
    log.close(meter.summary(steps=..., wall_s=..., world_size=..., comm_backend=...))   # summary.json
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Optional

from .config import write_atomic


class Meter:
    """Throughput in each of the app's units (`Meter(tokens=..., samples=...)`: units per
    optimizer step on the whole world) and step time, split into compute and communication
    when the communication time is known. `interval()` averages the steps since the last call;
    `summary()` describes the whole run, less its first `warmup` steps."""

    def __init__(self, warmup: int = 0, **per_step: float):
        if not per_step:
            raise ValueError("Meter needs at least one unit, e.g. Meter(samples=batch_size)")
        self.per_step = per_step  # unit -> count per step; the first is the app's headline unit
        self.warmup = warmup
        self._steps, self._seconds, self._comm = 0, 0.0, None
        self._seen = 0
        self.step_seconds, self.step_comm = [], []  # after warm-up, for the summary

    def step(self, seconds: float, comm_seconds: Optional[float] = None) -> None:
        self._steps += 1
        self._seconds += seconds
        if comm_seconds is not None:
            self._comm = (self._comm or 0.0) + comm_seconds
        self._seen += 1
        if self._seen > self.warmup:
            self.step_seconds.append(seconds)
            self.step_comm.append(comm_seconds)

    def interval(self) -> dict:
        """Averages over the interval; starts the next one."""
        steps, secs = max(1, self._steps), max(self._seconds, 1e-12)
        out = {f"{unit}_per_s": n * steps / secs for unit, n in self.per_step.items()}
        out["step_ms"] = secs / steps * 1e3
        if self._comm is not None:
            out["comm_ms"] = self._comm / steps * 1e3
            out["compute_ms"] = max(0.0, out["step_ms"] - out["comm_ms"])
        self._steps, self._seconds, self._comm = 0, 0.0, None
        return out

    def summary(self, **about) -> dict:
        """The run's summary (see `summarize`); `about`: world_size, comm_backend, steps, ..."""
        return summarize(self.step_seconds, self.step_comm, self.per_step, **about)


def summarize(step_seconds: list, step_comm: list, per_step: dict, **about) -> dict:
    """One summary for every trainer: the median step (it resists the noise of a shared
    machine) and the fastest decile (the least-disturbed steps), throughput in each unit at
    both, the median communication time per step and the compute time left, plus `about`.
    `throughput` names the headline key, which the compare table ranks by."""
    median = statistics.median(step_seconds) if step_seconds else float("nan")
    fast = sorted(step_seconds)[len(step_seconds) // 10] if step_seconds else float("nan")
    comms = [c for c in step_comm if c is not None]
    comm_ms = statistics.median(comms) * 1e3 if comms else None
    out = dict(about)
    out.update(
        median_step_ms=median * 1e3,
        p10_step_ms=fast * 1e3,
        comm_ms=comm_ms,
        compute_ms=None if comm_ms is None else max(0.0, median * 1e3 - comm_ms),
        throughput=f"{next(iter(per_step))}_per_s",
    )
    for unit, n in per_step.items():
        out[f"{unit}_per_s"] = n / median
        out[f"p10_{unit}_per_s"] = n / fast
    return out


def summary_line(summary: dict) -> str:
    """`done: 30 steps in 8.1 s; median step 83.0 ms, 12,345 tok/s, 96.4 samples/s, comm 12.9 ms/step`"""
    rates = ", ".join(
        UNIT_TEXT.get(key, "{:,.1f} " + key).format(summary[key])
        for key in summary
        if key.endswith("_per_s") and not key.startswith("p10_")
    )
    comm = f", comm {summary['comm_ms']:.1f} ms/step" if summary.get("comm_ms") is not None else ""
    return (
        f"done: {summary['steps']} steps in {summary['wall_s']:.1f} s; "
        f"median step {summary['median_step_ms']:.1f} ms, {rates}{comm}"
    )


def write_summary(run_dir: str, summary: dict) -> None:
    """`<run_dir>/summary.json`, atomically (compare reads it). Call on one rank."""
    write_atomic(os.path.join(run_dir, "summary.json"), json.dumps(summary, indent=1))


# --- the one line per interval -------------------------------------------------------------------
# A field is (key, format): a format string for the value, or a function of all the values
# that returns the text (or None to leave the field out). Each app declares its own list.
def _step_time(values: dict) -> Optional[str]:
    if "step_ms" not in values:
        return None
    split = f" (compute {values['compute_ms']:.1f}, comm {values['comm_ms']:.1f})" if "comm_ms" in values else ""
    return f"step {values['step_ms']:.1f} ms{split}"


UNIT_TEXT = {"tokens_per_s": "{:,.0f} tok/s", "samples_per_s": "{:,.1f} samples/s"}
STEP_TIME = ("step_ms", _step_time)  # `step 83.0 ms (compute 70.1, comm 12.9)`
LR = ("lr", "lr {:.2e}")
LM_FIELDS = (  # language-model trainers (moe, dense)
    ("loss", "loss {:.4f}"),
    ("aux_loss", "aux {:.4f}"),
    ("val_loss", "val {:.4f}"),
    ("tokens_per_s", UNIT_TEXT["tokens_per_s"]),
    ("samples_per_s", UNIT_TEXT["samples_per_s"]),
    STEP_TIME,
    LR,
)


def format_line(step: int, total: int, values: dict, fields=LM_FIELDS) -> str:
    """`step 20/200 | loss 4.1234 | val 4.3 | 12,345 tok/s | 96.4 samples/s | step 83.0 ms (compute 70.1, comm 12.9)`:
    each field present in `values`, in the order `fields` gives."""
    parts = [f"step {step}/{total}"]
    for key, fmt in fields:
        if callable(fmt):
            text = fmt(values)
            if text is not None:
                parts.append(text)
        elif key in values:
            parts.append(fmt.format(values[key]))
    return " | ".join(parts)


# Set by `python -m launch.local` for its ranks: "1" if its own stdout is a terminal, else "0".
STDOUT_TTY_ENV = "LAUNCH_STDOUT_TTY"


def stdout_is_terminal(environ=None, stdout=None) -> bool:
    """Whether what this process prints reaches a terminal, where a progress bar's carriage
    returns redraw one line; in a batch job's log, CI or a pipe they pile up as frames. A
    launcher that said so decides; under Open MPI without that, no: mpiexec hands every rank a
    pty of its own whatever its own output goes to (a file in sbatch and bsub jobs)."""
    environ = os.environ if environ is None else environ
    said = environ.get(STDOUT_TTY_ENV)
    if said in ("0", "1"):
        return said == "1"
    if "OMPI_COMM_WORLD_RANK" in environ:
        return False
    stdout = sys.stdout if stdout is None else stdout
    try:
        return stdout.isatty()
    except (AttributeError, ValueError):  # replaced or closed
        return False


class MetricsLog:
    """Rank 0 writes; other ranks make every call a no-op, so trainers need no `if rank == 0`."""

    def __init__(
        self,
        run_dir: str,
        rank: int,
        total_steps: int,
        wandb_mode: str = "disabled",
        run_name: str = "run",
        config: Optional[dict] = None,
        resume: bool = False,
        progress: bool = True,
        start_step: int = 0,
        fields=LM_FIELDS,
    ):
        self.enabled = rank == 0
        self.total = total_steps
        self.fields = fields
        self._file = self._bar = self._wandb = None
        if not self.enabled:
            return
        self.run_dir = run_dir
        self.path = os.path.join(run_dir, "metrics.jsonl")
        if resume:
            _keep_records_until(self.path, start_step)
        self._file = open(self.path, "a" if resume else "w", buffering=1)  # line-buffered: readable while running
        if progress and stdout_is_terminal():  # elsewhere (a batch log, CI, a pipe) the step lines alone
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_steps,
                initial=start_step,
                desc=run_name,
                unit="step",
                file=sys.stdout,  # drawn where the step lines go, and only if that is a terminal
                dynamic_ncols=True,
                leave=False,
                mininterval=1.0,
            )
        if wandb_mode != "disabled":
            import wandb

            self._wandb = wandb.init(
                project="mcr-dl",
                name=run_name,
                dir=run_dir,
                mode=wandb_mode,
                config=config,
                resume="allow" if resume else None,
            )

    def write(self, step: int, **values) -> None:
        if not self.enabled:
            return
        record = {"step": step, "time": time.time(), **values}
        self._file.write(json.dumps(record) + "\n")
        line = format_line(step, self.total, values, self.fields)
        if self._bar is not None:
            self._bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)
        if self._wandb is not None:
            self._wandb.log(values, step=step)

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def print(self, text: str) -> None:
        if self.enabled:
            (self._bar.write if self._bar is not None else print)(text)

    def close(self, summary: Optional[dict] = None) -> None:
        """End the log; with the run's `summary`, print its line and write summary.json."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        if summary is not None:
            print(summary_line(summary), flush=True)
            write_summary(self.run_dir, summary)
        if self._wandb is not None:
            self._wandb.finish()
        self._file.close()


def _keep_records_until(path: str, step: int) -> None:
    """A resumed run logs again the steps after its checkpoint: drop the records an interrupted
    run wrote for them (and a line cut short by a kill), so each step appears once."""
    if not os.path.isfile(path):
        return
    kept = []
    with open(path) as f:
        for line in f:
            try:
                if json.loads(line)["step"] <= step:
                    kept.append(line)
            except (ValueError, KeyError, TypeError):
                pass
    write_atomic(path, "".join(kept))


def read_jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
