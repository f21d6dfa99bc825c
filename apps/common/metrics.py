"""Metrics for the trainers: a throughput meter, the one-line-per-interval log on rank 0, the
metrics JSONL in the run directory, a progress bar and wandb (offline by default).

    meter = Meter(tokens_per_step=..., samples_per_step=...)
    meter.step(seconds, comm_seconds)        # once per optimizer step
    log.write(step, loss=..., **meter.interval())
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Optional


class Meter:
    """Tokens/s, samples/s and step time (split into compute and communication when the
    communication time is known) over the steps since the last `interval()`."""

    def __init__(self, tokens_per_step: int, samples_per_step: int):
        self.tokens_per_step = tokens_per_step
        self.samples_per_step = samples_per_step
        self._steps, self._seconds, self._comm = 0, 0.0, None

    def step(self, seconds: float, comm_seconds: Optional[float] = None) -> None:
        self._steps += 1
        self._seconds += seconds
        if comm_seconds is not None:
            self._comm = (self._comm or 0.0) + comm_seconds

    def interval(self) -> dict:
        """Averages over the interval; starts the next one."""
        steps, secs = max(1, self._steps), max(self._seconds, 1e-12)
        out = {
            "tokens_per_s": self.tokens_per_step * steps / secs,
            "samples_per_s": self.samples_per_step * steps / secs,
            "step_ms": secs / steps * 1e3,
        }
        if self._comm is not None:
            out["comm_ms"] = self._comm / steps * 1e3
            out["compute_ms"] = max(0.0, out["step_ms"] - out["comm_ms"])
        self._steps, self._seconds, self._comm = 0, 0.0, None
        return out


def format_line(step: int, total: int, values: dict) -> str:
    """`step 20/200 | loss 4.1234 | val 4.3 | 12,345 tok/s | 96.4 samples/s | step 83.0 ms (compute 70.1, comm 12.9)`"""
    parts = [f"step {step}/{total}"]
    for key, label in (("loss", "loss"), ("aux_loss", "aux"), ("val_loss", "val")):
        if key in values:
            parts.append(f"{label} {values[key]:.4f}")
    if "tokens_per_s" in values:
        parts.append(f"{values['tokens_per_s']:,.0f} tok/s")
        parts.append(f"{values['samples_per_s']:,.1f} samples/s")
    if "step_ms" in values:
        split = f" (compute {values['compute_ms']:.1f}, comm {values['comm_ms']:.1f})" if "comm_ms" in values else ""
        parts.append(f"step {values['step_ms']:.1f} ms{split}")
    if "lr" in values:
        parts.append(f"lr {values['lr']:.2e}")
    return " | ".join(parts)


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
    ):
        self.enabled = rank == 0
        self.total = total_steps
        self._file = self._bar = self._wandb = None
        if not self.enabled:
            return
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self._file = open(self.path, "a" if resume else "w", buffering=1)  # line-buffered: readable while running
        if progress:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_steps,
                initial=start_step,
                desc=run_name,
                unit="step",
                file=sys.stderr,
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
        line = format_line(step, self.total, values)
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

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        if self._wandb is not None:
            self._wandb.finish()
        self._file.close()


def read_jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
