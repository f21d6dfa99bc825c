"""torch's ProcessGroupNCCL contract, op by op, for NCCL ops through mcr: 2 ranks on the CPU tier's
stand-in (`tests.streams.cuda_model`). Each scenario reports what the stand-in recorded while it
ran, as `CONTRACT <rank> <scenario> {...}`; tests/streams/test_nccl_contract.py states the rule.
Usage: nccl_contract.py (under torchrun, 2 ranks)."""

import threading
from collections import namedtuple

from tests.streams import cuda_model as cm

cm.install()  # before mcr: its CUDA calls are the stand-in's from here on

import torch  # noqa: E402

import mcr  # noqa: E402
from mcr.hooks.work import handle_work  # noqa: E402
from tests.report import report  # noqa: E402
from tests.streams import mcr_calls, wait_for  # noqa: E402

P2POp = namedtuple("P2POp", "op tensor peer group tag")  # torch's P2POp needs torch's default group
rt = mcr.init()
rank, peer = rt.rank, 1 - rt.rank
pokes = []
if rt.progress is not None:  # observed, not changed: a thread woken per op is what the contract forbids
    poke = rt.progress.poke
    rt.progress.poke = lambda: (pokes.append(threading.current_thread().name), poke())[1]


def data(seed, n=6):
    """Distinct per rank and per element."""
    return cm.cuda_like(torch.arange(n, dtype=torch.float32) + 100 * seed + 1)


def summed(n=6):
    return (sum(torch.arange(n, dtype=torch.float32) + 100 * r + 1 for r in range(rt.world_size))).tolist()


def plain(t):
    return t.as_subclass(torch.Tensor).tolist()


def recorded(since, *kinds, thread=None):
    return [list(e[:1] + e[2:]) for e in cm.entries(since=since) if e[0] in kinds and thread in (None, e[1])]


def scenario(name):
    def run(fn):
        since = cm.mark()
        try:
            value = fn(since)
        except Exception as exc:  # a scenario the runtime cannot run yet reports why, and the rest go on
            value = {"error": f"{type(exc).__name__}: {exc}"}
        report("CONTRACT", rank, name, value=value)

    return run


@scenario("blocking")
def _(since):
    t = data(rank)
    poked = len(pokes)
    mcr.all_reduce(t)
    return {
        "launches": recorded(since, "launch"),
        "waits": recorded(since, "wait", "sync", "stream_sync", "device_sync"),
        "switches": recorded(since, "switch"),
        "new_streams": recorded(since, "new_stream"),
        "stashed": recorded(since, "stash"),
        "events": len(recorded(since, "record")),
        "pokes": len(pokes) - poked,
        "result": plain(t),
        "want": summed(),
    }


@scenario("async_wait")
def _(since):
    t = data(rank)
    handle = mcr.all_reduce(t, async_op=True)
    issued = cm.mark()
    handle.wait()
    return {
        "handle": type(handle).__name__,
        "launches": recorded(since, "launch"),
        "at_wait": recorded(issued, "wait", "release"),
        "result": plain(t),
        "want": summed(),
    }


@scenario("avg")
def _(since):
    t = data(rank)
    mcr.all_reduce(t, op=mcr.ReduceOp.AVG)
    return {
        "reduce_ops": recorded(since, "reduce_op"),
        "launches": recorded(since, "launch"),
        "result": plain(t),
        "want": [x / rt.world_size for x in summed()],
    }


@scenario("no_host_wait")
def _(since):
    first, second = data(rank), data(rank + 10)
    mcr.all_reduce(first, async_op=True)
    issued = cm.mark()
    mcr.all_reduce(second)  # the same communicator: its stream orders them, not the host
    return {
        "between": recorded(issued, "wait", "sync", "query", "release", thread="MainThread"),
        "launches": recorded(issued, "launch"),
    }


@scenario("future_settled_aside")
def _(since):
    compute = torch.cuda.Stream()  # the trainer's stream (DDP's backward runs on such a one)
    with torch.cuda.stream(compute):
        t = data(rank)
        handle = mcr.all_reduce(t, async_op=True)
        future = handle_work(handle, [t]).get_future()  # DDP's reducer chains on this future
    rt.callbacks.stop()  # returns once the callback thread has set every future queued so far
    return {
        "settled": future.done(),
        "compute_waits": [e for e in recorded(since, "wait", "release") if compute.name in e],
        "switches_to_compute": [e for e in recorded(since, "switch") if e[-1] == compute.name][1:],  # after ours
        "threads_on_compute": sorted({e[1] for e in cm.entries(since=since) if compute.name in e[2:]}),
    }


@scenario("p2p_batch")
def _(since):
    send, got = data(rank), cm.cuda_like(torch.zeros(6))
    ops = [P2POp(mcr.irecv, got, peer, None, 0), P2POp(mcr.isend, send, peer, None, 0)]  # a receive first
    works = mcr.batch_isend_irecv(ops)
    for work in works:
        work.wait()
    return {
        "works": len(works),
        "groups": recorded(since, "group_start", "group_end"),
        "launches": recorded(since, "launch"),
        "communicators": recorded(since, "nccl_comm"),
        "got": plain(got),
        "want": plain(data(peer)),
    }


@scenario("lone_send")
def _(since):
    send, got = data(rank + 20), cm.cuda_like(torch.zeros(6))
    if rank == 0:
        mcr.send(send, peer)
        mcr.recv(got, peer)
    else:
        mcr.recv(got, peer)
        mcr.send(send, peer)
    return {"communicators": recorded(since, "nccl_comm"), "got": plain(got), "want": plain(data(peer + 20))}


@scenario("call_count")
def _(since):
    t = data(rank)
    mcr.all_reduce(t)  # the route is made: count a call of a made route
    calls = mcr_calls(lambda: mcr.all_reduce(t))
    return {"calls": calls}


def kept():
    """The ops the runtime holds: GPU ops it reads later, and any other handle in flight."""
    return len(getattr(rt, "stream_ops", ())) + len(rt.in_flight.handles())


def in_graph(since, graph):
    return {graph.name} | {e[1] for e in recorded(since, "capture_join")}


@scenario("capture")
def _(since):
    mcr.all_reduce(data(rank), async_op=True)  # the GPU has not run it: the watchdog reads it every tick
    held = kept()
    graph = torch.cuda.Stream()
    with cm.capture(graph):
        began = cm.mark()
        t = data(rank)
        mcr.all_reduce(t)
        mcr.all_reduce(t, async_op=True)
        held_in_capture = kept() - held
        try:
            mcr.all_reduce(data(rank), backend="gloo")  # host-driven: no graph can hold it
            refused = None
        except RuntimeError as exc:
            refused = str(exc)
        ticked = wait_for(lambda: any(e[:2] == ("query", "mcr-watchdog") for e in cm.entries(since=began)), 30)
    return {
        "held_in_capture": held_in_capture,
        "events_outside_the_graph": [e for e in recorded(began, "record") if e[-1] not in in_graph(began, graph)],
        "watchdog_looked_during_capture": ticked,
        "broken": [e for e in cm.entries(since=since) if e[0] == "capture_broken"],
        "refused": refused,
    }


@scenario("groups")
def _(since):
    whole = mcr.new_group([0, 1])
    made = recorded(since, "nccl_comm", "nccl_nocolor_split")
    mark = cm.mark()
    mcr.new_group([0])  # rank 1 is no member, yet takes part in the split with no colour
    alone = recorded(mark, "nccl_comm", "nccl_nocolor_split")
    mark = cm.mark()
    cpu = mcr.new_group([0, 1], cpu_only=True)
    cpu_made = recorded(mark, "nccl_comm", "nccl_nocolor_split")
    t = torch.full((3,), float(rank + 1))
    mcr.all_reduce(t, group=cpu)
    try:
        mcr.all_reduce(data(rank), group=cpu)
        refused = None
    except ValueError as exc:
        refused = str(exc)
    x = data(rank)
    mcr.all_reduce(x, group=whole)
    return {
        "made": made,
        "alone": alone,
        "cpu_made": cpu_made,
        "cpu_result": t.tolist(),
        "refused": refused,
        "on_split": plain(x) == summed(),
    }


cm.gpu_runs(keep_up=True)
mcr.finalize()
