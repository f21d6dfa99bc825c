"""The flight recorder: each rank's last N ops, dumped where torch's analyzer reads them.

Every op the runtime routes (`Runtime.call`) is one entry of a bounded ring: the op, its group and
sequence number in that group, sizes and dtype, the backend that ran it and the rule that chose
it, and when it was issued and completed. Nothing is formatted on the hot path; an entry is a
list the runtime fills in. A dump (`dump()`; the watchdog, SIGTERM, SIGUSR1, an uncaught
exception and, when asked, `finalize()` call it) writes one pickle per rank in the format of
torch's own flight recorder (`torch._C._distributed_c10d._dump_fr_trace`, version 2.10), so
`torchfrtrace DIR` names the first collective that did not match across ranks and the ranks
that never reached it.

Where torch's format has no field for mcr's facts, an entry carries extra keys the analyzer
ignores: `mcr_backend` (what ran it: mpi, gloo, mpi/chunk=1M, node:mpi+gloo), `mcr_rule` (the
rung that chose it) and `mcr_nbytes`. `profiling_name` keeps torch's library names, which the
analyzer requires: "gloo:<op>" for CPU tensors and "nccl:<op>" for CUDA ones, whichever mcr
backend ran the op.
"""

from __future__ import annotations

import itertools
import os
import pickle
import sys
import threading
from collections import deque
from threading import get_ident
from time import time_ns

from .files import write_atomic

VERSION = "2.10"  # torch's flight-recorder format this file writes (torch 2.10+)
FILE_PREFIX = "mcr_fr_rank_"  # torchfrtrace takes the rank from the digits after the prefix

# entry fields (a list, so the hot path fills it without a class)
RECORD, ROUTE, GROUP, SEQ, P2P_SEQ, METHOD, PEER, ASYNC, THREAD, CREATED, DONE, RETURNED, STARTED = range(13)

# mcr's op family and backend method -> the name torch's analyzer knows
_TORCH_NAMES = {
    "all_gather_into_tensor": "_all_gather_base",
    "reduce_scatter_tensor": "_reduce_scatter_base",
    "all_to_all_single": "all_to_all",
}
_DTYPE_NAMES = {
    "float32": "Float",
    "float64": "Double",
    "float16": "Half",
    "bfloat16": "BFloat16",
    "int64": "Long",
    "int32": "Int",
    "int16": "Short",
    "int8": "Char",
    "uint8": "Byte",
    "bool": "Bool",
    "complex64": "ComplexFloat",
    "complex128": "ComplexDouble",
}


class FlightRecorder:
    def __init__(self, rank: int, size: int, directory: str | None, timeout_s: float, keep_all=False):
        self.rank = rank
        self.entries = deque(maxlen=size)  # bounded: the oldest entries fall off
        self.kept = [] if keep_all else None  # every entry, for a timeline trace (`mcr.trace`)
        self.directory = directory
        self.timeout_ms = int(timeout_s * 1000)
        self.records = itertools.count()  # each entry's record id
        self._dumping = threading.Lock()

    def opener(self, route, method, async_op):
        """A function of (group, peer=None, thread=None) that opens a new entry for a call of
        `route` (`method`, blocking or `async_op`) about to run on `group`, appends it to the ring
        and returns it; `entry[DONE]` (ns) is set when the call completes (by the caller for a
        blocking call, by the handle for an async one: `Handle.issued`). `peer`: a send's or
        receive's; `thread`: the caller's, where it already read it.
        The one place an entry is built: `mcr.runner` and `mcr.streams` make one per route, the
        runtime's chunked and node-aware runs one per call. What is the same for each call is
        looked up here, once: the opener runs on every op (its cost:
        configs/tuning/vm-n2-bench-flight-recorder.txt), formats nothing and takes no lock (one
        thread issues a rank's ops; a dump copies the ring first)."""
        p2p = route.op.family == "send_recv"
        records, append, kept = self.records, self.entries.append, self.kept
        if kept is not None:  # a trace keeps every entry too
            ring_append = append

            def append(entry):
                ring_append(entry)
                kept.append(entry)

        def open_entry(group, peer=None, thread=None):
            info = group.info
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
                peer,
                async_op,
                thread or get_ident(),  # the caller; for an async op, whoever waits on it once one does
                now,
                0,
                0,  # an async call's return to its caller (set by the caller)
                0 if async_op else now,  # started: a blocking call at once, an async one when waited on
            ]
            append(entry)
            return entry

        return open_entry

    @staticmethod
    def waited(entry) -> None:
        """A thread starts waiting on the entry's async op: its stack is now the one to show."""
        if not entry[STARTED]:
            entry[STARTED], entry[THREAD] = time_ns(), get_ident()

    # --- the dump, in torch's format ----------------------------------------------------------
    def dump(self, why: str, directory: str | None = None, frame=None) -> str | None:
        """Write this rank's entries to DIR/mcr_fr_rank_<rank> (atomically: a reader never sees
        half a file) and return the path; None where no directory is set. `frame`: where this
        thread stood when it failed (an exception's innermost frame), for its pending op's stack."""
        directory = directory or self.directory
        if directory is None:
            return None
        path = os.path.join(directory, f"{FILE_PREFIX}{self.rank}")
        with self._dumping:  # a name not ending in digits: the analyzer takes none for a rank's file
            write_atomic(path, pickle.dumps(self.snapshot(why, frame)), suffix=".partial")
        return path

    def snapshot(self, why: str, frame=None) -> dict:
        stacks = sys._current_frames()  # the pending ops' callers, where they wait now
        if frame is not None:
            stacks[get_ident()] = frame
        ring = list(self.entries)
        entries = [self._torch_entry(entry, stacks) for entry in ring]
        groups = {_pg_name(entry[GROUP].gid): entry[GROUP] for entry in ring}
        return {
            "version": VERSION,
            "comm_lib_version": "mcr",
            "pg_config": {
                name: {"name": name, "desc": _desc(g), "ranks": str(list(g.ranks))} for name, g in groups.items()
            },
            "pg_status": {
                name: {
                    "last_enqueued_collective": g.collective_seq,
                    "last_started_collective": -1,
                    "last_completed_collective": max(
                        (e["collective_seq_id"] for e in entries if e["state"] == "completed" and e["pg_name"] == name),
                        default=-1,
                    ),
                }
                for name, g in groups.items()
            },
            "entries": entries,
            "mcr_dump_reason": why,
            "mcr_rank": self.rank,
        }

    def _torch_entry(self, entry, stacks) -> dict:
        route, group, method = entry[ROUTE], entry[GROUP], entry[METHOD]
        op = route.op
        torch_name = _TORCH_NAMES.get(method, method)
        itemsize = route.itemsize or 1
        n = op.nbytes // itemsize
        inputs, outputs = [n], [n]
        if op.family in ("all_gather", "gather"):  # sized by the gathered output
            inputs = [n // group.size]
        elif op.family in ("reduce_scatter", "scatter"):  # sized by the scattered input
            outputs = [n // group.size]
        is_p2p = op.family == "send_recv"
        if is_p2p:
            peer = entry[PEER] if entry[PEER] is not None else -1
            torch_name = f"send {group.rank}->{peer}" if method == "send" else f"recv {group.rank}<-{peer}"
        done = entry[DONE]
        if done:
            state = "completed"
        elif entry[STARTED]:
            state = "started"  # a blocking call, or an async one someone waits on
        else:
            state = "scheduled"
        frames = [] if done else _frames(stacks.get(entry[THREAD]))
        dtype = _DTYPE_NAMES.get(route.dtype_name, route.dtype_name)
        name = _pg_name(group.gid)
        return {
            "record_id": entry[RECORD],
            "pg_id": group.gid if isinstance(group.gid, int) else hash(group.gid) & 0xFFFF,
            "process_group": (name, _desc(group)),
            "pg_name": name,
            "collective_seq_id": entry[SEQ],
            "p2p_seq_id": entry[P2P_SEQ],
            "op_id": entry[SEQ] + entry[P2P_SEQ],
            "profiling_name": f"{'nccl' if route.device_type == 'cuda' else 'gloo'}:{torch_name}",
            "time_created_ns": entry[CREATED],
            "input_sizes": [inputs],
            "output_sizes": [outputs],
            "input_dtypes": [dtype],
            "output_dtypes": [dtype],
            "state": state,
            "time_discovered_started_ns": entry[STARTED] or None,
            "time_discovered_completed_ns": done or None,
            "retired": bool(done),
            "timeout_ms": self.timeout_ms,
            "is_p2p": is_p2p,
            "frames": frames,
            "thread_id": str(entry[THREAD]),
            "thread_name": _thread_name(entry[THREAD]),
            "mcr_backend": op.label,
            "mcr_rule": route.rule,
            "mcr_nbytes": op.nbytes,
        }


def _pg_name(gid) -> str:
    """torch's group name: the hook's groups keep theirs; the runtime's are numbered (0: world)."""
    return str(gid[1]) if isinstance(gid, tuple) else str(gid)


def _desc(group) -> str:
    return "default_pg" if group.gid == 0 else "undefined"


def _frames(frame) -> list:
    """The stack a pending op's caller stands in now, innermost first (torch's order), from the
    public op (`mcr.api`) out: the runtime's own frames above it say nothing to the reader."""
    frames = []
    while frame is not None:
        code = frame.f_code
        frames.append({"name": code.co_name, "filename": code.co_filename, "line": frame.f_lineno})
        frame = frame.f_back
    here = os.path.dirname(os.path.abspath(__file__))
    while frames and frames[0]["filename"].startswith(here) and not frames[0]["filename"].endswith("api.py"):
        frames.pop(0)
    return frames


def _thread_name(ident) -> str:
    for thread in threading.enumerate():
        if thread.ident == ident:
            return thread.name
    return ""
