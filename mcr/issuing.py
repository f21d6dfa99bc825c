"""An async op's issue, prepared once per route: what `dist.all_reduce(..., async_op=True)` pays.

The async twin of `mcr.blocking`: `Runtime.call` issues every async op of a plain route through
a closure made here and cached with its route on the group (`Group.routes`); an async chunked op
issues its chunks through one per chunk size, and a blocking call that MPI cannot run beside a
driver thread runs as an issue and a wait. The closure does, in order:

  1. opens the op's flight-recorder entry (started when someone waits, done when it completes);
  2. issues the backend's nonblocking call, naming the op in any error;
  3. tells the handle the runtime's facts (`Handle.issued`: its watch, the comm log timing it);
  4. keeps the handle in flight (`mcr.inflight`) and wakes the progress thread if it sleeps.

An issue should cost no more than the blocking call it replaces (issue 21), so what is the same
for every call of the route is looked up here once, as the blocking closure does
(its cost: `python -m mcr.tools.bench_hooks`, the async issue table).
"""

from __future__ import annotations

from time import perf_counter, time_ns

from .flight import RETURNED


def prepare_async_issue(rt, op, group, fn, comm, call=None, route=None, method=None, logged=True, async_op=True):
    """A function of (group, args) that issues `fn(comm, *args, True)` as async op `op` of `group`
    on runtime `rt` and returns its handle, held in flight (the group is passed at each call, not
    held, as in `mcr.blocking.prepare_blocking_run`). `call`: the same as a function of `*args` alone, where
    the backend has a faster one for the route (`Backend.for_route(..., async_op=True)`).
    `route` and `method`: the call's, for its flight-recorder entry (None: a chunk of an op, not
    recorded). `logged`: False for a chunk of an op the comm log counts whole. `async_op`: False
    for a blocking call run this way (`mcr.blocking`, MPI with no driver thread): its entry says
    blocking, and its caller waits at once."""
    if call is None:
        call = lambda *args: fn(comm, *args, True)  # noqa: E731
    p2p = op.family == "send_recv"
    held_comm = None if p2p else comm  # a later blocking op waits for earlier collectives only
    driven = op.label in rt.driver.needed
    add, watch, progress = rt.in_flight.add, rt.watch, rt.progress
    recorder = rt.recorder if route is not None else None

    def issue(group, args):
        entry = (
            recorder.issue(route, group, method, async_op, args[1] if p2p else None) if recorder is not None else None
        )
        comm_log = rt.comm_log if logged else None  # read at each call: the online tuner and tests swap it
        started = perf_counter() if comm_log is not None else 0.0
        try:
            handle = call(*args)
        except Exception as exc:
            raise rt.op_error(op, group, exc) from exc
        handle.issued(op, watch, group, comm_log, started, entry)
        add(held_comm, handle, driven)
        if progress is not None and progress.idle:
            progress.poke()
        if entry is not None and async_op:
            entry[RETURNED] = time_ns()
        return handle

    return issue
