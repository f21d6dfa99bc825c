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
from operator import itemgetter
from threading import get_ident
from time import time_ns

from . import flight_file
from .files import write_atomic

VERSION = "2.10"  # torch's flight-recorder format this file writes (torch 2.10+)
FILE_PREFIX = "mcr_fr_rank_"  # torchfrtrace takes the rank from the digits after the prefix

# entry fields (a list, so the hot path fills it without a class)
# LIVE: the entry's slot in the live file (`mcr.flight_file`: int64 fields, DONE at S_DONE), or
# a scratch one where there is no live file
RECORD, ROUTE, GROUP, SEQ, P2P_SEQ, METHOD, PEER, ASYNC, THREAD, CREATED, DONE, RETURNED, STARTED, LIVE = range(14)
S_DONE = flight_file.S_DONE

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
        self.kept = [] if keep_all else None  # every entry, for a timeline trace (`mcr.trace`)
        self.directory = directory
        self.timeout_ms = int(timeout_s * 1000)
        self.records = itertools.count()  # each entry's record id
        self._dumping = threading.Lock()
        self.live = None  # the ring in a file too (`mcr.flight_file`), where a directory is set
        if directory is not None and size > 0:
            try:
                self.live = flight_file.LiveFile(directory, rank, size, self.timeout_ms)
            except OSError as exc:
                sys.stderr.write(f"mcr: rank {rank} keeps no live flight record in {directory}: {exc}\n")
        self._facts_lines = {}  # (route, method, async, group) ids -> (route, group, its line in the live file)
        # the ring: the oldest entries fall off; with a live file, a list where the entry of record
        # r sits at r % size, the slot it has in the file (where a newer one overwrites it)
        self.ring = deque(maxlen=size) if self.live is None else [None] * size

    def entries(self) -> list:
        """The ring's entries, oldest first."""
        if self.live is None:
            return list(self.ring)
        return sorted((entry for entry in self.ring if entry is not None), key=itemgetter(RECORD))

    def opener(self, route, method, async_op):
        """A function of (group, peer=None, thread=None) that opens a new entry for a call of
        `route` (`method`, blocking or `async_op`) about to run on `group`, puts it in the ring
        and returns it; `entry[DONE]` (ns) is set when the call completes (by the caller for a
        blocking call, by the handle for an async one: `Handle.issued`), with
        `entry[DONE] = entry[LIVE][S_DONE] = time_ns()`, which stamps the live file's slot too.
        `peer`: a send's or receive's; `thread`: the caller's, where it already read it.
        The one place an entry is built: `mcr.runner` and `mcr.streams` make one per route, the
        runtime's chunked and node-aware runs one per call. What is the same for each call is
        looked up here, once: the opener runs on every op (its cost in configs/tuning/:
        vm-n2-bench-flight-recorder.txt, and with a live file vm-flight-live-file-2026-11-28.txt),
        formats nothing and takes no lock (one thread issues a rank's ops; a dump copies the ring
        first). With a live file it packs
        the entry's numbers into the entry's slot there (one `struct.pack_into`, no system call);
        the call's strings go to the file once per group (`_facts_line`)."""
        p2p = route.op.family == "send_recv"
        records, ring, kept, live = self.records, self.ring, self.kept, self.live
        no_slot = flight_file.NO_SLOT
        if live is None:
            append = ring.append
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
                    no_slot,  # its stamps land nowhere
                ]
                append(entry)
                return entry

            return open_entry

        slots, pack, n = live.slots, flight_file.SLOT.pack_into, len(ring)
        seen_info, facts_line = None, 0  # the group of the last call, and its facts' line

        def open_live_entry(group, peer=None, thread=None):
            """The same, and the entry's numbers packed into its slot in the live file."""
            nonlocal seen_info, facts_line
            info = group.info
            if p2p:
                info.p2p_seq += 1
            else:
                info.collective_seq += 1
            now, record = time_ns(), next(records)
            thread = thread or get_ident()
            started = 0 if async_op else now
            if info is not seen_info:
                seen_info, facts_line = info, self._facts_line(route, method, async_op, info)
            i = record % n
            old = ring[i]
            if old is not None:  # the entry this one overwrites: a late DONE of its op stamps no slot
                old[LIVE] = no_slot
            slot = slots[i]
            peer_plus_1 = 0 if peer is None else peer + 1
            pack(slot, 0, record, facts_line, info.collective_seq, info.p2p_seq, peer_plus_1, thread, now, started, 0)
            ring[i] = entry = [
                record,
                route,
                info,
                info.collective_seq,
                info.p2p_seq,
                method,
                peer,
                async_op,
                thread,
                now,
                0,
                0,
                started,
                slot,
            ]
            if kept is not None:
                kept.append(entry)
            return entry

        return open_live_entry

    def _facts_line(self, route, method, async_op, info) -> int:
        """The line of the live file's .ops that holds this call's strings, written on first use."""
        key = (id(route), method, async_op, id(info))
        known = self._facts_lines.get(key)
        if known is None:  # the route and group kept with it: their ids are never reused meanwhile
            known = self._facts_lines[key] = (route, info, self.live.describe(facts(route, method, async_op, info)))
        return known[2]

    @staticmethod
    def waited(entry) -> None:
        """A thread starts waiting on the entry's async op: its stack is now the one to show."""
        if not entry[STARTED]:
            entry[STARTED], entry[THREAD] = time_ns(), get_ident()
            slot = entry[LIVE]
            slot[flight_file.S_THREAD], slot[flight_file.S_STARTED] = entry[THREAD], entry[STARTED]

    def finalize(self) -> None:
        """The rank ended well: its live file says so (it stays, for a record of the whole job)."""
        if self.live is not None:
            self.live.close()

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
            ring = self.entries()
            write_atomic(path, pickle.dumps(self.snapshot(why, frame, ring)), suffix=".partial")
            if self.live is not None and ring and os.path.abspath(directory) == os.path.abspath(self.directory):
                self.live.mark(flight_file.DUMPED_OFFSET, ring[-1][RECORD] + 1)  # `collect` keeps this dump
        return path

    def snapshot(self, why: str, frame=None, ring=None) -> dict:
        stacks = sys._current_frames()  # the pending ops' callers, where they wait now
        if frame is not None:
            stacks[get_ident()] = frame
        ring = self.entries() if ring is None else ring
        described = {}
        entries = []
        for entry in ring:
            key = (id(entry[ROUTE]), entry[METHOD], entry[ASYNC], id(entry[GROUP]))
            if key not in described:
                described[key] = facts(entry[ROUTE], entry[METHOD], entry[ASYNC], entry[GROUP])
            done, thread = entry[DONE], entry[THREAD]
            entries.append(
                _torch_entry(
                    described[key],
                    *(entry[RECORD], entry[SEQ], entry[P2P_SEQ], entry[PEER], thread),
                    *(entry[CREATED], entry[STARTED], done, self.timeout_ms),
                    [] if done else _frames(stacks.get(thread)),
                    _thread_name(thread),
                )
            )
        groups = {_pg_name(g.gid): (_desc(g), list(g.ranks), g.collective_seq) for g in (e[GROUP] for e in ring)}
        return _torch_record(self.rank, why, entries, groups)


def facts(route, method, async_op, info) -> dict:
    """What an entry's dump says of its call and group: the same for every call of a route on a
    group (the live file writes it once, as JSON)."""
    op = route.op
    return {
        "method": method,
        "family": op.family,
        "nbytes": op.nbytes,
        "itemsize": route.itemsize,
        "dtype": route.dtype_name,
        "device_type": route.device_type,
        "backend": op.label,
        "rule": route.rule,
        "async": async_op,
        "pg_name": _pg_name(info.gid),
        "pg_id": info.gid if isinstance(info.gid, int) else hash(info.gid) & 0xFFFF,
        "pg_desc": _desc(info),
        "ranks": [int(r) for r in info.ranks],
        "group_rank": info.rank,
        "group_size": info.size,
    }


def _torch_record(rank, why, entries, groups) -> dict:
    """A rank's dump in torch's format, from its entries (`_torch_entry`); `groups`: {name:
    (description, ranks, the sequence number of its last collective)}."""
    return {
        "version": VERSION,
        "comm_lib_version": "mcr",
        "pg_config": {
            name: {"name": name, "desc": desc, "ranks": str(ranks)} for name, (desc, ranks, _) in groups.items()
        },
        "pg_status": {
            name: {
                "last_enqueued_collective": last,
                "last_started_collective": -1,
                "last_completed_collective": max(
                    (e["collective_seq_id"] for e in entries if e["state"] == "completed" and e["pg_name"] == name),
                    default=-1,
                ),
            }
            for name, (_, _, last) in groups.items()
        },
        "entries": entries,
        "mcr_dump_reason": why,
        "mcr_rank": rank,
    }


def _torch_entry(facts, record, seq, p2p_seq, peer, thread, created, started, done, timeout_ms, frames, thread_name):
    method = facts["method"]
    torch_name = _TORCH_NAMES.get(method, method)
    n = facts["nbytes"] // (facts["itemsize"] or 1)
    inputs, outputs = [n], [n]
    if facts["family"] in ("all_gather", "gather"):  # sized by the gathered output
        inputs = [n // facts["group_size"]]
    elif facts["family"] in ("reduce_scatter", "scatter"):  # sized by the scattered input
        outputs = [n // facts["group_size"]]
    is_p2p = facts["family"] == "send_recv"
    if is_p2p:
        peer = peer if peer is not None else -1
        me = facts["group_rank"]
        torch_name = f"send {me}->{peer}" if method == "send" else f"recv {me}<-{peer}"
    if done:
        state = "completed"
    elif started:
        state = "started"  # a blocking call, or an async one someone waits on
    else:
        state = "scheduled"
    dtype = _DTYPE_NAMES.get(facts["dtype"], facts["dtype"])
    name = facts["pg_name"]
    return {
        "record_id": record,
        "pg_id": facts["pg_id"],
        "process_group": (name, facts["pg_desc"]),
        "pg_name": name,
        "collective_seq_id": seq,
        "p2p_seq_id": p2p_seq,
        "op_id": seq + p2p_seq,
        "profiling_name": f"{'nccl' if facts['device_type'] == 'cuda' else 'gloo'}:{torch_name}",
        "time_created_ns": created,
        "input_sizes": [inputs],
        "output_sizes": [outputs],
        "input_dtypes": [dtype],
        "output_dtypes": [dtype],
        "state": state,
        "time_discovered_started_ns": started or None,
        "time_discovered_completed_ns": done or None,
        "retired": bool(done),
        "timeout_ms": timeout_ms,
        "is_p2p": is_p2p,
        "frames": frames,
        "thread_id": str(thread),
        "thread_name": thread_name,
        "mcr_backend": facts["backend"],
        "mcr_rule": facts["rule"],
        "mcr_nbytes": facts["nbytes"],
    }


# --- the record of a rank that ended without a dump, from its live file ---------------------------
LIVE_REASON = "ended without a dump (from the live record)"
FINALIZED_REASON = "finalized without a dump (from the live record)"


def from_live(record: flight_file.LiveRecord) -> dict:
    """A rank's dump in torch's format from its live file: what `snapshot()` writes, without the
    stacks (no one saw them) and thread names."""
    entries, groups = [], {}
    for record_id, line, seq, p2p_seq, peer_plus_1, thread, created, started, done in record.slots:
        call = record.facts[line]
        peer = peer_plus_1 - 1 if peer_plus_1 else None
        entries.append(
            _torch_entry(call, record_id, seq, p2p_seq, peer, thread, created, started, done, record.timeout_ms, [], "")
        )
        groups[call["pg_name"]] = (call["pg_desc"], call["ranks"], seq)  # oldest first: the last one stays
    why = FINALIZED_REASON if record.state == flight_file.FINALIZED else LIVE_REASON
    return _torch_record(record.rank, why, entries, groups)


def collect(directory: str) -> dict:
    """Write DIR/mcr_fr_rank_<r> from the live file of each rank that left no dump of its last
    ops (killed without warning, or ended well with no dump asked for), so `torchfrtrace DIR`
    reads every rank; {rank: path} of those written. A dump the rank wrote itself is kept (it
    has the stacks) unless the rank issued ops after it, or it is from an earlier run."""
    written = {}
    for rank, path in sorted(flight_file.live_files(directory).items()):
        try:
            record = flight_file.read(path)
        except (OSError, ValueError) as exc:
            sys.stderr.write(f"mcr.flight.collect: rank {rank}'s live record is unreadable: {exc}\n")
            continue
        dump = os.path.join(directory, f"{FILE_PREFIX}{rank}")
        newest = record.slots[-1][flight_file.S_RECORD] + 1 if record.slots else 0
        if record.dumped and record.dumped >= newest and os.path.exists(dump):
            continue
        write_atomic(dump, pickle.dumps(from_live(record)), suffix=".partial")
        written[rank] = dump
    return written


def collect_and_tell(directory: str, who: str) -> list:
    """`collect(directory)`, and what `who` (launch.local, launch.dead_rank, mcr.tools.flight_collect)
    says of it: a line for each rank written and for the op each rank was last in and not done."""
    written = collect(directory)
    lines = [
        f"{who}: rank {r} left no flight-record dump; wrote {path} from its live record" for r, path in written.items()
    ]
    lines += [f"{who}: rank {rank} was last in {line}" for rank, line in open_ops(directory).items()]
    if written:
        lines.append(f"{who}: read every rank's record with: torchfrtrace {directory}")
    return lines


def open_ops(directory: str) -> dict:
    """{rank: one line naming the op the rank was last in and not done}, from the live files in
    `directory` (ranks with none pending left out), e.g. "all_reduce on backend mpi (group
    world, seq 8), waiting 3.2 s": for a launcher's message on a rank that died or hung."""
    lines, now = {}, time_ns()
    for rank, path in sorted(flight_file.live_files(directory).items()):
        try:
            record = flight_file.read(path)
        except (OSError, ValueError):
            continue
        pending = [slot for slot in record.slots if not slot[flight_file.S_DONE]]
        if pending:
            lines[rank] = _open_op_line(record, pending[-1], now)
    return lines


def _open_op_line(record, slot, now) -> str:
    record_id, line, seq, p2p_seq, peer_plus_1, _, created, started, _ = slot
    call = record.facts[line]
    group = "world" if call["pg_desc"] == "default_pg" else f"{call['pg_name']}, ranks {call['ranks']}"
    op = call["method"]
    if call["family"] == "send_recv":
        if peer_plus_1:
            op += f" {'to' if call['method'].endswith('send') else 'from'} rank {call['ranks'][peer_plus_1 - 1]}"
        where = f"group {group}, p2p seq {p2p_seq}"
    else:
        where = f"group {group}, seq {seq}"
    since = f"waiting {(now - started) / 1e9:.1f} s" if started else f"issued {(now - created) / 1e9:.1f} s ago"
    return f"{op} on backend {call['backend']} ({where}), {since}"


def _pg_name(gid) -> str:
    """torch's group name: the hook's groups keep theirs; the runtime's are numbered (0: world)."""
    return str(gid[1]) if isinstance(gid, tuple) else str(gid)


def _desc(info) -> str:
    return "default_pg" if info.gid == 0 else "undefined"


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
