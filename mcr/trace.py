"""Timeline traces: every comm op of a run as Chrome/Perfetto trace events, one file per rank,
merged into one file for the job with an arrow from each send to its receive.

    MCR_TRACE_DIR=runs/t python -m launch.local -n 2 my_script.py   # or trace_dir in the config
    python -m mcr.trace merge runs/t          # -> runs/t/mcr_trace.json: open in ui.perfetto.dev
    python -m mcr.trace plot runs/t/mcr_trace.json -o step.png   # a picture of it, without a browser

The flight recorder (`mcr.flight`) records each op once; with a trace directory it also keeps
every entry (not only the last N), and `finalize()` writes them here. Tracks per rank: one per
calling thread (the time the caller spent in the op: a blocking call whole, an async call's
issue) and one per backend (the op from issue to completion; async ops that overlap on one
backend take further lanes, "mpi #2", so every track's spans nest). While a torch.profiler runs,
each op is also a `record_function` span ("mcr:all_reduce") in the profiler's own trace, so the
comm ops line up with the compute there.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

from . import flight

FILE_PREFIX = "mcr_trace_rank_"
PROFILE_PREFIX = "torch_profile_rank_"  # a torch.profiler trace of the same steps, merged in beside
MERGED = "mcr_trace.json"


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
            "backend": op.backend,
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
        tid = _lane(lanes, op.backend, created, done, events, rank)
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
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{FILE_PREFIX}{rank}.json")
    partial = f"{path}.partial"
    with open(partial, "w") as out:
        json.dump({"traceEvents": rank_events(recorder, rank, end_ns), "displayTimeUnit": "ms"}, out)
    os.replace(partial, path)
    return path


# --- merge: one file for the job ------------------------------------------------------------
def merge(directory: str, out: str | None = None) -> str:
    """Every rank's file in `directory` into one (`out`, default DIR/mcr_trace.json), with a flow
    arrow from each send's span to the span of the receive that took it."""
    paths = sorted(glob.glob(os.path.join(directory, f"{FILE_PREFIX}*.json")))
    if not paths:
        raise FileNotFoundError(
            f"no {FILE_PREFIX}<rank>.json files in {directory}; run the job with MCR_TRACE_DIR={directory}"
        )
    events = []
    for path in paths:
        with open(path) as f:
            events += json.load(f)["traceEvents"]
    events += flows(events)
    for path in sorted(glob.glob(os.path.join(directory, f"{PROFILE_PREFIX}*.json"))):
        events += profiler_events(path, int(path[: -len(".json")].rsplit("_", 1)[1]))
    out = out or os.path.join(directory, MERGED)
    with open(out, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    return out


def profiler_events(path: str, rank: int) -> list:
    """A torch.profiler Chrome trace (`export_chrome_trace`) as rank `rank`'s process, on the
    comm trace's clock: its times count from `baseTimeNanoseconds`, ours from the epoch."""
    with open(path) as f:
        trace = json.load(f)
    shift = trace.get("baseTimeNanoseconds", 0) / 1e3
    events = []
    for e in trace["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") in ("process_name", "process_labels", "process_sort_index"):
            continue  # the process is the rank's, named once
        e = dict(e, pid=rank)
        if "ts" in e:
            e["ts"] = float(e["ts"]) + shift
        events.append(e)
    return events


def flows(events) -> list:
    """Arrows send -> recv. On a pair of ranks in one group, sends and receives meet in issue
    order on each backend (MPI's and gloo's non-overtaking rule), so the k-th send from a to b
    is the k-th receive at b from a."""
    sends, recvs = {}, {}
    for e in events:
        if e.get("ph") != "X" or e["tid"] < 1000 or "src" not in e["args"]:
            continue  # backend tracks only: each op once
        a = e["args"]
        key = (tuple(a["group"]), a["src"], a["dst"], a["backend"])
        (sends if e["name"] == "send" else recvs).setdefault(key, []).append(e)
    arrows = []
    for key, sent in sends.items():
        taken = sorted(recvs.get(key, []), key=lambda e: e["ts"])
        for n, (s, r) in enumerate(zip(sorted(sent, key=lambda e: e["ts"]), taken)):
            flow_id = f"{key[1]}->{key[2]}:{key[3]}:{n}"
            common = {"name": "send -> recv", "cat": "p2p", "id": flow_id}
            arrows.append({**common, "ph": "s", "pid": s["pid"], "tid": s["tid"], "ts": s["ts"]})
            end = r["ts"] + r["dur"]  # inside the receive's span: the arrow binds to it
            arrows.append({**common, "ph": "f", "bp": "e", "pid": r["pid"], "tid": r["tid"], "ts": end})
    return arrows


# --- plot: a picture without a browser -------------------------------------------------------
def plot(path: str, out: str, start_ms: float | None = None, span_ms: float | None = None) -> str:
    """Draw the merged trace's spans as a timeline (one row per rank and track) into `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(path) as f:
        events = json.load(f)["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X" and e.get("cat") == "comm"]
    spans += compute_spans(events)
    for e in spans:
        if e["tid"] == 0:
            names[(e["pid"], 0)] = "compute (torch.profiler)"
    t0 = min(e["ts"] for e in spans) / 1e3 + (start_ms or 0.0)
    t1 = t0 + span_ms if span_ms else max(e["ts"] + e["dur"] for e in spans) / 1e3
    rows = sorted({(e["pid"], e["tid"]) for e in spans})
    colours = {}
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(rows) + 1.2))
    for y, row in enumerate(rows):
        for e in spans:
            if (e["pid"], e["tid"]) != row:
                continue
            left, width = e["ts"] / 1e3 - t0, e["dur"] / 1e3
            if left + width < 0 or left > t1 - t0:
                continue
            kind = "compute" if e["tid"] == 0 else e["name"].split(" ")[0]
            colour = colours.setdefault(kind, "0.75" if kind == "compute" else f"C{len(colours) % 10}")
            ax.barh(y, max(width, (t1 - t0) / 2000), left=left, color=colour, edgecolor="black", linewidth=0.2)
    ax.set_yticks(range(len(rows)), [f"rank {pid}: {names.get((pid, tid), tid)}" for pid, tid in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, t1 - t0)
    ax.set_xlabel("ms")
    ax.legend(
        [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()], list(colours), loc="upper right", ncol=4
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return out


def compute_spans(events) -> list:
    """A torch.profiler trace's outermost CPU ops on each rank's busiest thread (the training
    loop's), as one row (tid 0): the compute between the comm spans."""
    ops = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation") and not e["name"].startswith("mcr:"):
            ops.setdefault((e["pid"], e["tid"]), []).append(e)
    busiest = {}
    for (pid, tid), spans in ops.items():
        if len(spans) > len(ops.get((pid, busiest.get(pid)), [])):
            busiest[pid] = tid
    outer = []
    for pid, tid in busiest.items():
        end = float("-inf")
        for e in sorted(ops[pid, tid], key=lambda e: (e["ts"], -e["dur"])):
            if e["ts"] >= end:  # not inside the previous outermost op
                outer.append(dict(e, tid=0))
                end = e["ts"] + e["dur"]
    return outer


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mcr.trace", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="one file for the job from every rank's trace")
    m.add_argument("directory")
    m.add_argument("-o", "--out", default=None)
    p = sub.add_parser("plot", help="draw a merged trace as a timeline image")
    p.add_argument("trace")
    p.add_argument("-o", "--out", required=True)
    p.add_argument("--start-ms", type=float, default=None, help="from this far into the trace")
    p.add_argument("--span-ms", type=float, default=None, help="this much of it")
    args = parser.parse_args(argv)
    try:
        if args.command == "merge":
            print(merge(args.directory, args.out))
        else:
            print(plot(args.trace, args.out, args.start_ms, args.span_ms))
    except (FileNotFoundError, ValueError) as exc:
        print(f"mcr.trace: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
