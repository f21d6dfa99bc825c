"""The timeline trace (`mcr.trace`): a real traced 2-rank run, merged; every op on every rank,
an arrow from each send to its receive, spans that nest, and torch.profiler's spans around ours."""

from __future__ import annotations

import json
import os
from collections import Counter

from tests.ranks import run_script, run_tool

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "traced.py")
STEPS = 3


def traced_run(tmp_path, *args):
    trace_dir = tmp_path / "trace"
    run_script(2, SCRIPT, *args, env={"MCR_TRACE_DIR": str(trace_dir)}, timeout=180).check()
    return trace_dir


def merge(trace_dir) -> list:
    out = run_tool("mcr.tools.trace", "merge", trace_dir)
    assert out.returncode == 0 and "RuntimeWarning" not in out.output + out.errors, out.output + out.errors
    with open(trace_dir / "mcr_trace.json") as f:
        return json.load(f)["traceEvents"]


def tracks(events) -> dict:
    by_track = {}
    for e in events:
        if e["ph"] == "X" and e.get("cat") == "comm":
            by_track.setdefault((e["pid"], e["tid"]), []).append(e)
    return by_track


def test_every_op_of_every_rank_is_in_the_merged_trace_with_send_to_recv_arrows(tmp_path):
    events = merge(traced_run(tmp_path))
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    for rank in (0, 1):
        backend = Counter(e["name"] for e in events if e["ph"] == "X" and e["pid"] == rank and e["tid"] >= 1000)
        caller = Counter(e["name"] for e in events if e["ph"] == "X" and e["pid"] == rank and e["tid"] < 1000)
        ops = {"all_reduce": 2, "all_gather_into_tensor": 1, "broadcast": 1, "send": 1, "recv": 1}
        assert backend == {name: STEPS * count for name, count in ops.items()}, backend
        ops["all_gather_into_tensor (issue)"] = ops.pop("all_gather_into_tensor")  # the async one
        assert caller == {name: STEPS * count for name, count in ops.items()}, caller
        assert names[(rank, 1)] == "caller" and names[(rank, 1000)] == "backend mpi", names
    spans = [e for e in events if e["ph"] == "X"]
    big = [e for e in spans if e["name"] == "all_reduce" and e["args"]["bytes"] == 1 << 16]
    assert len(big) == 2 * 2 * STEPS and all(e["args"]["rule"] == "the built-in order" for e in big), big[0]
    assert {tuple(e["args"]["group"]) for e in spans if e["name"] == "broadcast"} == {(0, 1)}
    # one arrow per send, from its span on the sender to the span of the matching receive
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(starts) == len(ends) == 2 * STEPS and starts.keys() == ends.keys(), (starts, ends)
    backend_spans = [e for e in spans if e["tid"] >= 1000]
    for flow_id, start in starts.items():
        end = ends[flow_id]
        src, dst = start["pid"], end["pid"]
        sent = sorted((e for e in backend_spans if e["name"] == "send" and e["pid"] == src), key=lambda e: e["ts"])
        taken = sorted(
            (e for e in backend_spans if e["name"] == "recv" and e["pid"] == dst and e["args"]["src"] == src),
            key=lambda e: e["ts"],
        )
        k = [e["ts"] for e in sent].index(start["ts"])  # the arrow leaves the k-th send from src to dst ...
        assert sent[k]["args"]["dst"] == dst != src, (start, end)
        recv = taken[k]  # ... and lands in the k-th receive at dst from src: non-overtaking order
        assert recv["tid"] == end["tid"] and recv["ts"] <= end["ts"] <= recv["ts"] + recv["dur"], (end, recv)
        assert start["ts"] <= end["ts"], (start, end)  # a receive ends after its send began


def test_spans_on_each_track_nest_and_async_ops_take_lanes(tmp_path):
    events = merge(traced_run(tmp_path))
    for track, spans in tracks(events).items():
        spans.sort(key=lambda e: e["ts"])
        for a, b in zip(spans, spans[1:]):  # one after the other: a track's calls never overlap
            assert a["ts"] + a["dur"] <= b["ts"], (track, a, b)
    # the 64 KiB all-reduce ran while the async all-gather was in flight on the same backend
    lanes = {e["args"]["name"] for e in events if e["name"] == "thread_name" and e["pid"] == 0}
    assert "backend mpi #2" in lanes, lanes


def test_torch_profiler_spans_wrap_each_op_on_one_clock(tmp_path):
    trace_dir = tmp_path / "trace"
    trace_dir.mkdir()
    profile = str(trace_dir / "torch_profile_rank_{rank}.json")
    traced_run(tmp_path, "profile", profile)
    events = merge(trace_dir)
    for rank in (0, 1):
        ours = sorted(
            (e for e in events if e.get("cat") == "comm" and e["pid"] == rank and e["tid"] == 1), key=lambda e: e["ts"]
        )
        theirs = sorted((e for e in events if e["name"].startswith("mcr:") and e["pid"] == rank), key=lambda e: e["ts"])
        assert len(theirs) == len(ours) == 6 * STEPS, (len(theirs), len(ours))
        for mine, span in zip(ours, theirs):
            assert span["name"] == "mcr:" + mine["name"].split(" ")[0], (span, mine)
            # the profiler's span holds ours, to within a millisecond of clock difference
            assert span["ts"] - 1e3 <= mine["ts"] and mine["ts"] + mine["dur"] <= span["ts"] + span["dur"] + 1e3
