"""A blocking op's run, prepared once per route: the hot path.

`Runtime.call` runs every blocking op through a closure made here and cached with its route on
the group (`Group.routes`); a chunked op makes one per chunk size, and `Runtime.run` one per call
for the runtime's own steps (node-aware phases, finalize's barriers). The closure does, in order:

  1. opens the op's flight-recorder entry (ops of a route only; stamped done at the end);
  2. completes the async collectives issued earlier on the same communicator (`InFlight`);
  3. registers the op with the watchdog for this thread;
  4. runs the backend's method, keeping MPI moving meanwhile where rule 3 asks it
     (`mcr.mpi_driver`), and names the op in any error;
  5. times it into the comm log (read at each call: the online tuner and tests swap it).

Everything that is the same for every call of the route (the op's name, the backend's method
bound to its dtype and reduce op, the recorder, the watchdog's map) is looked up once, here: a
4-byte all-reduce on MPI costs about a microsecond, so each lookup per call shows
(configs/tuning/vm-n2-bench-hotpath.txt).
"""

from __future__ import annotations

from threading import get_ident
from time import perf_counter, time_ns

from .flight import DONE
from .issuing import prepare_async_issue


def prepare_blocking_run(rt, op, group, fn, comm, call=None, route=None, method=None, logged=True):
    """A function of (group, args) that runs `fn(comm, *args, False)` as one blocking op `op` of
    `group` on runtime `rt` (the group is passed at each call, not held: the group holds this
    function in its cache, and a cycle would keep a destroyed group's threads until a garbage
    collection). `call`: the same as a function of `*args` alone, where the backend
    has a faster one for the route (`Backend.for_route`). `route` and `method`: the call's, for
    its flight-recorder entry (None: the runtime's own step, not recorded). `logged`: False for
    a chunk of an op the comm log counts whole."""
    if call is None:
        call = lambda *args: fn(comm, *args, False)  # noqa: E731
    p2p = op.family == "send_recv"
    in_flight = rt.in_flight
    earlier = in_flight.entries if not p2p else ()  # a send or receive waits for nothing issued before it
    recorder = rt.recorder if route is not None else None
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
    if recorder is not None:
        info, records, append = group.info, recorder.records, recorder.entries.append
        if recorder.kept is not None:  # a trace keeps every entry too
            append = lambda entry: (recorder.entries.append(entry), recorder.kept.append(entry))  # noqa: E731

    def run(group, args):
        thread = get_ident()
        if recorder is not None:  # FlightRecorder.issue's entry, built here: a call less per op
            if p2p:
                info.p2p_seq += 1
            else:
                info.collective_seq += 1
            now = time_ns()
            entry = [
                next(records),
                route,
                info,
                info.collective_seq,
                info.p2p_seq,
                method,
                args[1] if p2p else None,  # the peer
                False,
                thread,
                now,
                0,
                0,
                now,
            ]
            append(entry)
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
        if recorder is not None:
            entry[DONE] = time_ns()

    return run
