"""Merge and draw the timeline traces a run wrote (`mcr.trace`, MCR_TRACE_DIR):

    python -m mcr.tools.trace merge runs/t          # -> runs/t/mcr_trace.json: open in ui.perfetto.dev
    python -m mcr.tools.trace plot runs/t/mcr_trace.json -o step.png   # a picture of it, without a browser

A torch.profiler trace of the same steps saved as `DIR/torch_profile_rank_<rank>.json` is merged
in as that rank's process, on the comm trace's clock.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

from ..trace import FILE_PREFIX

PROFILE_PREFIX = "torch_profile_rank_"  # a torch.profiler trace of the same steps, merged in beside
MERGED = "mcr_trace.json"


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
            edge = 0 if kind == "compute" else 0.2  # compute is many small ops: no outlines
            ax.barh(y, max(width, (t1 - t0) / 2000), left=left, color=colour, edgecolor="black", linewidth=edge)
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
    loop's) as one row (tid 0): the compute between the comm spans. Ops that hold a comm op
    (an autograd function around an all-to-all) give way to their parts, and what runs inside
    a comm op is comm, not compute; a whole step's annotation is left out."""
    ops, comm = {}, {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("cpu_op", "user_annotation"):
            continue
        if e["name"].startswith("mcr:"):
            comm.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
        elif not e["name"].startswith(("step ", "ProfilerStep")):
            ops.setdefault((e["pid"], e["tid"]), []).append(e)
    busiest = {}
    for (pid, tid), spans in ops.items():
        if len(spans) > len(ops.get((pid, busiest.get(pid)), [])):
            busiest[pid] = tid
    outer = []
    for pid, tid in busiest.items():
        inside = comm.get((pid, tid), [])
        end = float("-inf")
        for e in sorted(ops[pid, tid], key=lambda e: (e["ts"], -e["dur"])):
            start, stop = e["ts"], e["ts"] + e["dur"]
            if any(a <= start and stop <= b for a, b in inside) or any(start <= a and b <= stop for a, b in inside):
                continue  # part of a comm op, or holds one: its other parts are drawn instead
            if start >= end:  # not inside the previous outermost op
                outer.append(dict(e, tid=0))
                end = stop
    return outer


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mcr.tools.trace", description=__doc__.split("\n\n")[0])
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
