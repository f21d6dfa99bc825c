"""`mcr.measure`, the timer under mcr.tools.tune and mcr.tools.bench: pacing on real 1- and 2-rank
jobs; a CUDA call's timing and which candidates are measured, through a runtime that only records
(no GPU needed)."""

import re

import pytest
import torch

from tests.ranks import run_ranks

PACED = """
import statistics, time
import mcr
from mcr import measure
rt = mcr.init()
for pace in (False, True):
    spans = []  # each call's own time, as the call itself sees it

    def call():
        start = time.perf_counter()
        time.sleep(0.005)
        spans.append(time.perf_counter() - start)

    started = time.perf_counter()
    median = measure.time_call(rt, call, iters=6, warmup=0, pace=pace)
    wall = time.perf_counter() - started
    print(f"pace={pace} median={median:.6f} own={statistics.median(spans):.6f} fastest={min(spans):.6f} "
          f"wall={wall:.6f}", flush=True)
mcr.finalize()
"""


def test_a_paced_timing_idles_after_each_call_as_long_as_the_fastest_took_and_reports_the_call_alone():
    out = run_ranks(1, ["-c", PACED]).check().output
    pattern = r"pace=(\w+) median=(\S+) own=(\S+) fastest=(\S+) wall=(\S+)"
    got = {pace: tuple(map(float, rest)) for pace, *rest in re.findall(pattern, out)}
    assert set(got) == {"False", "True"}, out[-3000:]
    for median, own, fastest, _ in got.values():
        # what it reports is the call's own time: with the idle after each call counted in, a
        # sample would hold a whole fastest call more (no speed is compared: a time with itself)
        assert own <= median < own + fastest / 2, got
    _, _, fastest, paced_wall = got["True"]
    assert paced_wall >= 6 * 2 * fastest, got  # six calls, each followed by an idle as long as the fastest


# each call is a barrier; rank 1's first one works SKEW_S after it, so rank 1 leaves it SKEW_S
# after rank 0 does (as a rank leaves an all-to-all once its own data is in)
SKEW_S = 0.5
SKEWED = f"""
import time
import mcr
from mcr import measure
rt = mcr.init()
first = [rt.rank == 1]

def call():
    mcr.barrier(backend="gloo")
    if first[0]:
        first[0] = False
        time.sleep({SKEW_S})

median = measure.time_call(rt, call, iters=9, warmup=0, backend="gloo", pace=True)
print(f"rank {{rt.rank}} median={{median:.4f}}", flush=True)
mcr.finalize()
"""


def test_a_paced_timing_puts_ranks_back_in_step_after_one_late_call():
    # idling as long as its last call took, the rank that left early idles less, reaches the
    # next barrier first and waits there for the other: the skew stays, every other call holds it
    # (medians of about SKEW_S). Back in step, a call is a barrier: a skew far above any barrier's
    # time on a busy machine keeps this a test of the skew, not of the barrier's speed.
    out = run_ranks(2, ["-c", SKEWED]).check().output
    medians = [float(m) for m in re.findall(r"rank \d median=(\S+)", out)]
    assert len(medians) == 2 and max(medians) < SKEW_S / 2, out[-3000:]


def test_tune_and_bench_pace_by_default_only_where_the_job_spans_nodes():
    from mcr.measure import paced

    assert [paced(None, nodes) for nodes in (None, 1, 2, 8)] == [False, False, True, True]
    assert paced(False, 2) is False and paced(True, 1) is True  # --no-pace and --pace win


class Recorder:
    """A runtime that records what it is asked to run: (op family, tensor device, backend=)."""

    def __init__(self, backends=None):
        from types import SimpleNamespace

        from mcr.topology import Shape

        self.backends, self.unavailable, self.ran = backends or {}, {}, []
        self.router = self  # measure routes through `rt.router.select`
        comms = {name: object() for name in self.backends}
        self.world = SimpleNamespace(size=4, nodes=2, shape=Shape(4, 2, 2, (2, 2)), gid=0, comms=comms, unavailable={})

    def call(self, request):
        self.ran.append((request.family, request.tensor.device.type, request.explicit))

    def select(self, family, nbytes, group, dtype, device_type, explicit=None, reduce_op=None):
        """`Router.select` on these backends: what the group lacks is what it names unavailable."""
        from mcr.choose import Call, Policy, select_backend

        missing = frozenset(group.unavailable)
        call = Call(family, nbytes, group.size, group.nodes, dtype, device_type, reduce_op, explicit, None, 0, missing)
        return select_backend(call, Policy({}), self.backends, {**self.unavailable, **group.unavailable}, lambda: None)


def test_a_cuda_call_is_timed_to_a_synchronize_after_each_call_and_ranks_meet_on_cpu(monkeypatch):
    from mcr import measure

    rt, device = Recorder(), torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda on: rt.ran.append(("synchronize", on)))
    measure.time_call(rt, lambda: rt.ran.append("call"), iters=3, warmup=2, backend="nccl", device=device)
    calls = [i for i, what in enumerate(rt.ran) if what == "call"]
    assert len(calls) == 5 and all(rt.ran[i + 1] == ("synchronize", device) for i in calls), rt.ran
    # the barrier and the agreement on the slowest rank: CPU tensors, on the runtime's choice (not nccl)
    assert [r for r in rt.ran if r != "call" and r[0] != "synchronize"] == [
        ("barrier", "cpu", None),
        ("all_reduce", "cpu", None),
    ]
    rt.ran.clear()
    measure.time_call(rt, lambda: rt.ran.append("call"), iters=3, warmup=2, backend="mpi")  # CPU: as before
    assert rt.ran == ["call"] * 2 + [("barrier", "cpu", "mpi")] + ["call"] * 3 + [("all_reduce", "cpu", "mpi")]


def test_a_candidate_is_measured_only_where_the_runtime_runs_it_as_named():
    from mcr.measure import runs_as_named

    class Runs:
        def __init__(self, *devices):
            self.devices = devices

        def supports(self, family, dtype, reduce_op, device_type):
            return device_type in self.devices

        def refusal(self, family, dtype, reduce_op, device_type):

            return None

    rt = Recorder({"nccl": Runs("cuda"), "mpi": Runs("cpu", "cuda"), "gloo": Runs("cpu")})
    runs = {
        name: runs_as_named(rt, name, "all_reduce", torch.float32, None, "cuda")
        for name in ("nccl", "mpi", "gloo", "nccl/host", "mpi/host", "gloo/host", "node:nccl+mpi", "node:gloo+nccl")
    }
    assert [name for name, yes in runs.items() if yes] == ["nccl", "mpi", "mpi/host", "gloo/host", "node:nccl+mpi"]
    assert not runs_as_named(rt, "ucc", "all_reduce", torch.float32)  # not started here
    assert not runs_as_named(rt, "node:nccl+mpi", "broadcast", torch.float32, None, "cuda")  # no node-aware form
    # a group where NCCL has no communicator (two members share a GPU): the runtime would not use it
    rt.world.unavailable["nccl"] = "two members share a GPU"
    assert not runs_as_named(rt, "nccl", "all_reduce", torch.float32, None, "cuda")
    assert runs_as_named(rt, "mpi", "all_reduce", torch.float32, None, "cuda")


def test_device_cuda_without_a_gpu_names_the_problem_and_the_fix():
    from mcr.measure import device_problem

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    said = device_problem("cuda")
    assert said.startswith("--device cuda: ") and "leave --device out to measure CPU tensors" in said, said
    assert device_problem("cpu") is None
