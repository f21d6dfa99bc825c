"""The training loop every trainer runs. It decides when to log, evaluate, checkpoint, stop and
where to resume; the trainer gives it what only the trainer knows: one optimizer step, an
evaluation, and how to write (and read) a checkpoint.

    start = resume(cfg, ckpt_dir, load)      # load(tag): restore checkpoint `tag`; 0 when none
    loop = TrainLoop(cfg, run_dir, start, fields, tokens=..., samples=...)   # units per step
    loop.log.print(banner)                   # the metrics log (rank 0 writes, see apps.common.metrics)
    loop.run(train_step, evaluate, ckpt_dir, save, lr=...)
    summary = loop.finish(**about)           # rank 0 prints it and writes summary.json

`train_step(step)` returns this rank's losses for the step ({"loss": ...}); the loop averages them
over the log interval and the ranks. `evaluate()` returns values every rank agrees on
({"val_loss": ...}). `save(tag, step)` writes this rank's files of checkpoint `tag` and returns on
rank 0 only once every rank's files are complete; rank 0 then points `latest` at it, so a job
killed mid-save resumes from the previous complete checkpoint.

Call it after communication is set up: ranks come from torch.distributed's default group.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Optional

import torch
import torch.distributed as dist

from .checkpoint import latest_tag, mark_latest, step_of, tag_for
from .comm import comm_seconds
from .config import to_dict
from .metrics import Meter, MetricsLog


def all_ranks_sum(values: list) -> list:
    buf = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(buf)
    return buf.tolist()


def all_ranks_mean(values: list) -> list:
    return [v / dist.get_world_size() for v in all_ranks_sum(values)]


def resume(cfg, ckpt_dir: str, load: Callable[[str], None]) -> int:
    """The step this run starts after: with resume=true and a complete checkpoint, `load(tag)`
    restores it and its step is returned; else 0."""
    tag = latest_tag(ckpt_dir) if cfg.resume else None
    if tag is None:
        return 0
    load(tag)
    return step_of(tag)


def end_step(train, start: int) -> int:
    """The last step of this run: train.steps, or earlier by train.stop_after (a job time limit)."""
    return min(train.steps, start + train.stop_after) if train.stop_after else train.steps


class StepProfiler:
    """torch.profiler over `count` steps from `first`, its Chrome trace written beside the comm
    trace (`<run dir>/trace/torch_profile_rank_<rank>.json`), where `python -m mcr.tools.trace
    merge` puts both on one clock: the comm spans beside the forward and backward of those steps."""

    def __init__(self, run_dir: str, first: int, count: int):
        self.path = os.path.join(run_dir, "trace", f"torch_profile_rank_{dist.get_rank()}.json")
        self.first, self.last = first, first + count - 1
        self.profile = self.span = None

    def before(self, step: int) -> None:
        if step == self.first:
            self.profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.profile.__enter__()
        if self.profile is not None:
            self.span = torch.profiler.record_function(f"step {step}")
            self.span.__enter__()

    def after(self, step: int) -> None:
        if self.profile is None:
            return
        self.span.__exit__(None, None, None)
        if step == self.last:
            self.profile.__exit__(None, None, None)
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self.profile.export_chrome_trace(self.path)
            self.profile = None


class Cadence:
    """The steps (counted from 1) at which a run that ends at `end` logs, evaluates and saves."""

    def __init__(self, cfg, end: int):
        self.cfg, self.end = cfg, end

    def logs_at(self, step: int) -> bool:
        """Every log_interval steps, at the run's end, and wherever it evaluates: an evaluation
        goes on a metrics line, so one between two logging steps gets a line of its own."""
        return step % self.cfg.log_interval == 0 or step == self.end or self.evaluates_at(step)

    def evaluates_at(self, step: int) -> bool:
        """Every eval_interval steps, and at the end of the schedule (not of a run cut short by
        stop_after)."""
        every = self.cfg.eval_interval
        return bool(every and step % every == 0) or step == self.cfg.train.steps

    def saves_at(self, step: int) -> bool:
        every = self.cfg.checkpoint.interval
        return self.cfg.checkpoint.enabled and ((every and step % every == 0) or step == self.end)


class TrainLoop:
    """One run from `start` to its end: the throughput meter, the metrics log and the cadence."""

    def __init__(self, cfg, run_dir: str, start: int, fields, **per_step: float):
        self.cfg, self.start, self.end = cfg, start, end_step(cfg.train, start)
        self.cadence = Cadence(cfg, self.end)
        warmup = max(1, (self.end - start) // 10)  # the first steps warm up; the summary skips them
        self.meter = Meter(warmup, **per_step)
        comm = cfg.comm
        first = min(start + warmup + 1, self.end)
        self.profiler = StepProfiler(run_dir, first, comm.profile_steps) if comm.trace and comm.profile_steps else None
        self.log = MetricsLog(
            run_dir,
            dist.get_rank(),
            cfg.train.steps,
            wandb_mode=cfg.wandb,
            run_name=cfg.name,
            config=to_dict(cfg),
            resume=start > 0,
            progress=cfg.progress,
            start_step=start,
            fields=fields,
        )
        self.wall_s = 0.0

    def run(
        self,
        train_step: Callable[[int], dict],
        evaluate: Callable[[], dict],
        ckpt_dir: str,
        save: Callable[[str, int], None],
        lr: Optional[Callable[[], float]] = None,
    ) -> None:
        """Steps start+1 ... end; `lr()`, when given, goes on each metrics line."""
        sums, seen = {}, 0
        started = time.perf_counter()
        for step in range(self.start + 1, self.end + 1):
            comm0, t0 = comm_seconds(), time.perf_counter()
            if self.profiler is not None:
                self.profiler.before(step)
            losses = train_step(step)
            if self.profiler is not None:
                self.profiler.after(step)
            seconds = time.perf_counter() - t0
            self.meter.step(seconds, None if comm0 is None else comm_seconds() - comm0)
            for key, value in losses.items():
                sums[key] = sums.get(key, 0.0) + value
            seen += 1
            self.log.advance()

            if self.cadence.logs_at(step):
                values = dict(zip(sums, all_ranks_mean([total / seen for total in sums.values()])))
                values.update(self.meter.interval())
                if lr is not None:
                    values["lr"] = lr()
                if self.cadence.evaluates_at(step):
                    values.update(evaluate())
                self.log.write(step, **values)
                sums, seen = {}, 0
            if self.cadence.saves_at(step):
                tag = tag_for(step)
                save(tag, step)
                if dist.get_rank() == 0:  # save returned here once every rank's files were complete
                    mark_latest(ckpt_dir, tag, keep=self.cfg.checkpoint.keep)
        self.wall_s = time.perf_counter() - started

    def finish(self, **about) -> dict:
        """The run's summary (rank 0 prints its line and writes summary.json); `about` adds to it."""
        summary = self.meter.summary(
            steps=self.end - self.start,
            world_size=dist.get_world_size(),
            comm_backend=to_dict(self.cfg.comm)["backend"],
            wall_s=self.wall_s,
            **about,
        )
        self.log.close(summary)
        return summary
