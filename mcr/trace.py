"""Timeline traces: every comm op of a run as Chrome/Perfetto trace events, one file per rank
(`python -m mcr.tools.trace merge` makes one file for the job, with send -> recv arrows).

    MCR_TRACE_DIR=runs/t python -m launch.local -n 2 my_script.py   # or trace_dir in the config

The flight recorder (`mcr.flight`) records each op once; with a trace directory it also keeps
every entry (not only the last N), and `finalize()` writes them here. Tracks per rank: one per
calling thread (the time the caller spent in the op: a blocking call whole, an async call's
issue) and one per backend (the op from issue to completion; async ops that overlap on one
backend take further lanes, "mpi #2", so every track's spans nest). While a torch.profiler runs,
each op is also a `record_function` span ("mcr:all_reduce") in the profiler's own trace, so the
comm ops line up with the compute there.
"""

from __future__ import annotations

import json
import os

from . import flight
from .files import write_atomic

FILE_PREFIX = "mcr_trace_rank_"


def rank_events(recorder, rank: int, end_ns: int) -> list:
    """Trace events for every op `recorder` kept, on `rank` (the trace's process)."""
    events = [_meta("process_name", rank, 0, f"rank {rank}"), _meta("process_sort_index", rank, 0, rank)]
    callers, lanes = {}, {}  # thread ident -> tid; backend -> [(tid, end of its last span)]
    for entry in recorder.kept:
        route, group, method = entry[flight.ROUTE], entry[flight.GROUP], entry[flight.METHOD]
        created, done = entry[flight.CREATED], entry[flight.DONE] or end_ns
        op = route.op
        args = {
            "bytes": op.nbytes,
            "backend": op.label,
            "rule": route.rule,
            "dtype": route.dtype_name,
            "group": list(group.ranks),
            "seq": entry[flight.SEQ] if op.family != "send_recv" else entry[flight.P2P_SEQ],
            "async": entry[flight.ASYNC],
        }
        if not entry[flight.DONE]:
            args["state"] = "never completed"
        if op.family == "send_recv" and entry[flight.PEER] is not None:
            me, peer = group.ranks[group.rank], group.ranks[entry[flight.PEER]]
            args["src"], args["dst"] = (me, peer) if method == "send" else (peer, me)
        thread = entry[flight.THREAD]
        if thread not in callers:
            callers[thread] = len(callers) + 1
            name = "caller" if len(callers) == 1 else f"caller (thread {thread})"
            events.append(_meta("thread_name", rank, callers[thread], name))
        returned = done if not entry[flight.ASYNC] else entry[flight.RETURNED] or created
        caller_name = method if not entry[flight.ASYNC] else f"{method} (issue)"
        events.append(_span(caller_name, rank, callers[thread], created, returned, args))
        tid = _lane(lanes, op.label, created, done, events, rank)
        events.append(_span(method, rank, tid, created, done, args))
    return events


def _lane(lanes, backend, start, end, events, rank) -> int:
    """The first of the backend's lanes free at `start`, or a new one: spans on a track never overlap."""
    mine = lanes.setdefault(backend, [])
    for i, (tid, busy_until) in enumerate(mine):
        if busy_until <= start:
            mine[i] = (tid, end)
            return tid
    tid = 1000 + sum(len(taken) for taken in lanes.values())  # caller tracks are numbered from 1
    mine.append((tid, end))
    name = f"backend {backend}" + (f" #{len(mine)}" if len(mine) > 1 else "")
    events.append(_meta("thread_name", rank, tid, name))
    return tid


def _span(name, pid, tid, start_ns, end_ns, args) -> dict:
    return {
        "name": name,
        "cat": "comm",
        "ph": "X",
        "pid": pid,
        "tid": tid,
        "ts": start_ns / 1e3,  # µs, the format's unit
        "dur": max(end_ns - start_ns, 0) / 1e3,
        "args": args,
    }


def _meta(what, pid, tid, value) -> dict:
    key = "sort_index" if what.endswith("sort_index") else "name"
    return {"name": what, "ph": "M", "pid": pid, "tid": tid, "args": {key: value}}


def write_rank(recorder, rank: int, directory: str, end_ns: int) -> str:
    path = os.path.join(directory, f"{FILE_PREFIX}{rank}.json")
    write_atomic(path, json.dumps({"traceEvents": rank_events(recorder, rank, end_ns), "displayTimeUnit": "ms"}))
    return path
