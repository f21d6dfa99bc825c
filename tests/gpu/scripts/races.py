"""What the GPU scripts share: stream races made visible, data distinct per rank and chunk, and
the checks each rank reports as structured lines.

A race runs one op the way a trainer would, on a side stream, with its buffers filled with
POISON first, and then delays the stream that a wrong runtime would depend on with a long kernel
(`torch.cuda._sleep`), so that the wrong order is the one that shows:

    late-producer        the issuing stream sleeps, then the producer fills the inputs, then the
                         op, then the consumer copies the results (rule 1: an op that reads its
                         inputs before the producer ran reads POISON)
    busy-default-stream  the default stream sleeps; producer, op and consumer on the side stream
                         (rules 2 and 3: a copy-back, AVG's divide or unflatten queued on the
                         default stream of the thread that completed the op lands after the
                         consumer, which then reads the input or POISON)
    wait-elsewhere       (async ops) the issuing stream sleeps, the producer runs, the op is
                         issued, the issuing stream sleeps again (the caller's next compute);
                         then a second stream waits on the handle and consumes (rule 2: wait()
                         orders the stream current at the wait, whatever stream issued the op
                         and wherever its finishers run)

Results are checked whole against values computed here from the seeds, never by the runtime, and
only through the consumer's copies (never after a full synchronize alone, which would hide a
finisher on the wrong stream). With `--device cpu` the same scripts run without streams or
sleeps: that checks their own logic and expected values, not the runtime's stream rules.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
from dataclasses import dataclass, field
from typing import Callable

import torch

POISON = 16384.0  # exact in every dtype used; no result of these ops comes near it
SLEEP_MS = 25.0  # how long a delayed stream sleeps: far longer than any racing host read
LARGE_SLEEP_MS = 150.0  # ... around a 32 MiB op (staging and the host reduction take ms)
VARIANTS_BLOCKING = ("late-producer", "busy-default-stream")
VARIANTS_ASYNC = ("late-producer", "busy-default-stream", "wait-elsewhere")


def arguments(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the script's own logic only")
    parser.add_argument("--sleep-ms", type=float, default=SLEEP_MS)
    parser.add_argument("--node", default="node:mpi+nccl", help="the node-aware candidate (ops.py)")
    return parser.parse_args()


class Gpu:
    """The streams of one rank's races: s1 issues, s2 waits (wait-elsewhere), `default` is the
    stream a wrong runtime would use. On CPU every stream is a no-op."""

    def __init__(self, device: str, sleep_ms: float):
        self.cuda = device == "cuda"
        self.sleep_ms = sleep_ms
        if self.cuda:
            self.device = torch.device("cuda", torch.cuda.current_device())  # the one mcr.init() bound
            self.s1, self.s2 = torch.cuda.Stream(self.device), torch.cuda.Stream(self.device)
            self.default = torch.cuda.default_stream(self.device)
            self.cycles_per_ms = self._cycles_per_ms()
        else:
            self.device = torch.device("cpu")
            self.s1 = self.s2 = self.default = None
            self.cycles_per_ms = 0.0

    def _cycles_per_ms(self) -> float:
        """How many `_sleep` cycles make a millisecond; the largest of three estimates, so a
        sleep lasts at least as long as asked (another process's kernels may share the GPU)."""
        best = 0.0
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(2_000_000)
            end.record()
            end.synchronize()
            best = max(best, 2_000_000 / start.elapsed_time(end))
        return best

    def on(self, stream):
        return torch.cuda.stream(stream) if self.cuda else contextlib.nullcontext()

    def sleep(self, ms: float, stream=None) -> None:
        """A long kernel on `stream` (default: the current one)."""
        if self.cuda:
            with self.on(stream) if stream is not None else contextlib.nullcontext():
                torch.cuda._sleep(int(ms * self.cycles_per_ms))

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


# --- data ------------------------------------------------------------------------------------------
def seed(k: int, r: int, j: int = 0) -> int:
    """Race k's seed for group rank r's chunk j (r < 2, j < 4: 4r + j < 8; a script may add
    multiples of 8 below 24 for ops sharing a race): distinct per rank and chunk within a race,
    and from the last race's (each race has 24 seeds of its own, modulo 61), so a result the
    last race left behind (a reused pinned buffer, a cached route) never passes for this one's."""
    return (4 * r + j + 24 * k) % 61


def pattern(s: int, n: int, dtype) -> torch.Tensor:
    """n small integers from seed s (1..61): two seeds differ in every element; sums of two,
    their halves and maxima are exact in float32, float16 and bfloat16. Period 61."""
    period = (torch.arange(61) * 7 + s * 13) % 61 + 1
    return period.repeat(-(-n // 61))[:n].to(dtype)


def fold(kind: str, tensors, dtype) -> torch.Tensor:
    """The reference reduction, in float64, then rounded to `dtype` (exact for these values)."""
    stacked = torch.stack([t.double() for t in tensors])
    out = {"sum": stacked.sum(0), "avg": stacked.mean(0), "max": stacked.max(0).values}[kind]
    return out.to(dtype)


# --- checks and the lines the tests read -----------------------------------------------------------
class Checks:
    """Counts checks per label and reports failures without raising, so every rank keeps issuing
    the same ops (a rank that stopped would hang its peer) and the run reaches finalize()."""

    def __init__(self, rank: int):
        self.rank = rank
        self.counts: dict = {}
        self.failed: dict = {}

    def expect(self, label: str, what: str, got: torch.Tensor, want: torch.Tensor) -> None:
        got = got.detach().cpu()
        if got.shape != want.shape or got.dtype != want.dtype:
            self.fail(label, f"{what}: got {got.dtype} {tuple(got.shape)}, want {want.dtype} {tuple(want.shape)}")
        elif not torch.equal(got, want):
            self.fail(label, f"{what}: {describe(got, want)}")
        self.counts[label] = self.counts.get(label, 0) + 1

    def expect_true(self, label: str, what: str, ok: bool, why: str = "") -> None:
        if not ok:
            self.fail(label, f"{what}: {why}")
        self.counts[label] = self.counts.get(label, 0) + 1

    def fail(self, label: str, text: str) -> None:
        self.failed[label] = self.failed.get(label, 0) + 1
        if self.failed[label] <= 20:  # the first ones say enough
            print(f"rank {self.rank}: gpu {label} FAILED {text}", flush=True)

    def report(self) -> None:
        for label, count in self.counts.items():
            bad = self.failed.get(label, 0)
            verdict = f"OK {count} checks" if not bad else f"FAILED {bad} of {count} checks"
            print(f"rank {self.rank}: gpu {label} {verdict}", flush=True)


def describe(got: torch.Tensor, want: torch.Tensor) -> str:
    wrong = (got.double() != want.double()).reshape(-1)
    first = int(wrong.nonzero()[0])
    g, w = got.reshape(-1), want.reshape(-1)
    hint = ""
    if bool((g[wrong].double() == POISON).all()):
        hint = " (every wrong element is POISON: the op's result never reached the consumer)"
    return (
        f"{int(wrong.sum())} of {wrong.numel()} elements wrong; first at {first}: got {g[first].item()} "
        f"want {w[first].item()}; got[:6] {g[:6].tolist()} want[:6] {w[:6].tolist()}{hint}"
    )


# --- one op under one race ---------------------------------------------------------------------------
@dataclass
class Case:
    """One op: `ins` (name -> the values its producer writes), `outs` (name -> a tensor of the
    shape and dtype of a buffer it writes), `run(buffers, async_op)` (returns None, or what to
    wait on: a handle, a list of them, or an object whose `wait()` returns more tensors to check,
    by name), `want` (name -> the expected values)."""

    name: str
    ins: dict
    outs: dict
    run: Callable
    want: dict
    sleep_ms: float = 0.0  # 0: the Gpu's
    extra: list = field(default_factory=list)  # (what, ok, why) checks the run itself made


def race(gpu: Gpu, case: Case, variant: str, async_op: bool) -> dict:
    """Run `case` under `variant`; returns the consumer's copies, by name (on the host)."""
    ms = case.sleep_ms or gpu.sleep_ms
    gpu.sync()  # every stream idle: each race starts from nothing queued
    with gpu.on(gpu.s1):
        sources = {k: v.to(gpu.device) for k, v in case.ins.items()}
        shapes = {**case.ins, **case.outs}
        bufs = {k: torch.full(v.shape, POISON, dtype=v.dtype, device=gpu.device) for k, v in shapes.items()}
    gpu.sync()  # the POISON is in memory before anything races
    if variant == "busy-default-stream":
        gpu.sleep(ms, gpu.default)
    with gpu.on(gpu.s1):
        if variant != "busy-default-stream":
            gpu.sleep(ms)
        for k, v in sources.items():
            bufs[k].copy_(v)  # the producer
        pending = case.run(bufs, async_op)
        if variant == "wait-elsewhere":
            gpu.sleep(ms)  # the caller's next compute: finishers on this stream come after it
    with gpu.on(gpu.s2 if variant == "wait-elsewhere" else gpu.s1):
        if async_op:
            for one in pending if isinstance(pending, list) else [pending]:
                if one is None:  # nothing to wait on: the consumer reads whatever is there
                    case.extra.append(("async call", False, "returned None, not a handle"))
                    continue
                more = one.wait()
                if isinstance(more, dict):
                    bufs.update(more)
        elif pending is not None:
            case.extra.append(("blocking call", False, f"returned {pending!r}, not None"))
        got = {k: bufs[k].clone() for k in case.want}  # the consumer
    gpu.sync()
    return {k: v.cpu() for k, v in got.items()}


def run_races(checks: Checks, label: str, gpu: Gpu, make: Callable, tag: str, modes=(False, True)) -> None:
    """`make(k)` builds race k's Case; run it under every variant of each mode and check it."""
    for async_op in modes:
        for variant in VARIANTS_ASYNC if async_op else VARIANTS_BLOCKING:
            k = next(RACE)
            case = make(k)
            what = " ".join(filter(None, (case.name, tag, "async" if async_op else "blocking", variant)))
            try:
                got = race(gpu, case, variant, async_op)
            except ValueError as exc:  # the runtime refused the call, on every rank alike, before any message
                checks.expect_true(label, what, False, f"raised ValueError: {exc}")
                continue
            for name, want in case.want.items():
                checks.expect(label, f"{what} [{name}]", got[name], want)
            for extra, ok, why in case.extra:
                checks.expect_true(label, f"{what} [{extra}]", ok, why)


RACE = itertools.count(1)  # the race number k every seed of a race is drawn from


def mpi_cuda_aware(rt) -> tuple:
    """(whether the runtime hands MPI device memory, why: the reason `mcr.backends.mpi_cuda` gave)."""
    mpi = rt.backends["mpi"]
    return bool(mpi.cuda_aware), mpi.cuda_aware_reason


def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")
