"""A route's two runs, prepared once per route: the hot path.

`Runtime.call` runs each op of a plain route through a closure made here and cached with its
route on the group (`Group.routes`): `prepare_blocking_run` for a blocking call,
`prepare_async_issue` for an async one (on CUDA tensors, `mcr.streams.CudaRoute` has the same
pair under the stream rules). A chunked op makes a pair per chunk size, `Runtime.run` a blocking
run per call for the runtime's own steps (node-aware phases, finalize's barriers), and a
blocking call that MPI cannot run beside a driver thread runs as an issue and a wait.
Each call, in order:

  1. opens the op's flight-recorder entry (`FlightRecorder.opener`; ops of a route only);
  2. blocking: completes the async collectives issued earlier on the same communicator
     (`InFlight`) and registers the op with the watchdog for this thread;
  3. calls the backend, naming the op in any error; a blocking call keeps MPI moving meanwhile
     where rule 3 asks it (`mcr.mpi_driver`);
  4. blocking: times the op into the comm log and stamps its entry done; async: tells the
     handle the runtime's facts (`Handle.issued`: its watch, the comm log timing it, the entry
     to stamp) and keeps it in flight (`mcr.inflight`), waking the progress thread if it sleeps.

What is the same for every call of the route (the op, the backend's method bound to its dtype
and reduce op, the collaborators) is looked up once, here: a 4-byte all-reduce on MPI costs
about a microsecond (configs/tuning/vm-n2-bench-hotpath.txt), and an issue should cost no more
than the blocking call it replaces (`python -m mcr.tools.bench_hooks`). The comm log is read at
each call: the online tuner and tests swap it.
"""

from __future__ import annotations

from threading import get_ident
from time import perf_counter, time_ns

from .flight import DONE, LIVE, RETURNED, S_DONE


def prepare_blocking_run(rt, op, group, fn, comm, call=None, route=None, method=None, logged=True):
    """A function of (group, args) that runs `fn(comm, *args, False)` as one blocking op `op` of
    `group` on runtime `rt` (the group is passed at each call, not held: the group holds this
    function in its cache, and a cycle would keep a destroyed group's threads until a garbage
    collection). `call`: the same as a function of `*args` alone, where the backend has a faster
    one for the route (`Backend.for_route`). `route` and `method`: the call's, for its
    flight-recorder entry (None: the runtime's own step, not recorded). `logged`: False for a
    chunk of an op the comm log counts whole."""
    if call is None:
        call = lambda *args: fn(comm, *args, False)  # noqa: E731
    p2p = op.family == "send_recv"
    in_flight = rt.in_flight
    earlier = in_flight.entries if not p2p else ()  # a send or receive waits for nothing issued before it
    driver = rt.driver
    drives = driver.drives(op.label)  # rule 3: keep MPI moving
    if drives and driver.thread is None:
        # MPI takes no second thread: run it as an async op, driving MPI from here while it waits
        issue = prepare_async_issue(rt, op, group, fn, comm, route=route, method=method, logged=logged, async_op=False)

        def run_aside(group, args):
            if earlier:
                in_flight.complete_earlier(comm)
            issue(group, args).wait()

        return run_aside
    if drives:
        during, inner = driver.thread.during, call
        call = lambda *args: during(lambda: inner(*args))  # noqa: E731
    waits = rt.waits
    open_entry = rt.recorder.opener(route, method, False) if route is not None and rt.recorder is not None else None

    def run(group, args):
        thread = get_ident()
        if open_entry is not None:
            entry = open_entry(group, args[1] if p2p else None, thread)
        if earlier:
            in_flight.complete_earlier(comm)
        comm_log = rt.comm_log if logged else None
        if comm_log is not None:
            started = perf_counter()
        waits[thread] = (op,)  # a fresh object per call: the watchdog times each wait apart
        try:
            call(*args)
        except Exception as exc:
            raise rt.op_error(op, group, exc) from exc
        finally:
            del waits[thread]
        if comm_log is not None:
            comm_log.record(op, perf_counter() - started)
        if open_entry is not None:
            entry[DONE] = entry[LIVE][S_DONE] = time_ns()

    return run


def prepare_async_issue(rt, op, group, fn, comm, call=None, route=None, method=None, logged=True, async_op=True):
    """A function of (group, args) that issues `fn(comm, *args, True)` as async op `op` of `group`
    on runtime `rt` and returns its handle, held in flight (the group is passed at each call, as
    in `prepare_blocking_run`). `call`: the same as a function of `*args` alone, where the backend
    has a faster one for the route (`Backend.for_route(..., async_op=True)`). `route`, `method`
    and `logged`: as for `prepare_blocking_run`. `async_op`: False for a blocking call run this
    way (MPI with no driver thread): its entry says blocking, and its caller waits at once."""
    if call is None:
        call = lambda *args: fn(comm, *args, True)  # noqa: E731
    p2p = op.family == "send_recv"
    held_comm = None if p2p else comm  # a later blocking op waits for earlier collectives only
    driven = op.label in rt.driver.needed
    add, watch, progress = rt.in_flight.add, rt.watch, rt.progress
    open_entry = rt.recorder.opener(route, method, async_op) if route is not None and rt.recorder is not None else None

    def issue(group, args):
        entry = open_entry(group, args[1] if p2p else None) if open_entry is not None else None
        comm_log = rt.comm_log if logged else None
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
