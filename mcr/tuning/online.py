"""Online tuning (`tuning: auto`): learn the table while the job runs.

The first time a group meets an (op, dtype, power-of-two size bucket), every candidate is timed
right there on scratch buffers of the size met, a few iterations in two interleaved rounds. The timings are agreed
across the group (the slowest rank's median, `mcr.measure.slowest`), so every rank picks the
same winner, and the group sticks to it for that bucket from then on.

Why this is safe inside a running job: all ranks of a group issue the same ops in the same
order, so they all meet a new bucket at the same call and measure together; the measurement
runs through the runtime the tuner was given and names every backend it times or agrees on,
so it never asks the tuner to choose (it cannot recurse); and it only runs ops to completion
on backends whose earlier ops were issued by every rank.
Ops without a collective over the group (send/recv, where only two ranks choose) and
non-CPU tensors are left to the default order.

The learned table is `OnlineTuner.table()`; with `MCR_TUNING_SAVE=path` rank 0 rewrites it
there after each new decision (the runtime reads it back with `tuning: path`).
"""

from __future__ import annotations

from .. import measure
from ..ops import dtype_name
from .candidates import label
from .fingerprint import fingerprint
from .rules import DEFAULT_MARGIN, pick
from .table import Choice, Entry, TuningTable

TUNABLE_ONLINE = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all")


def bucket(nbytes: int) -> tuple:
    """The power-of-two range [low, high) holding nbytes."""
    k = int(nbytes).bit_length()
    return (0 if k == 0 else 1 << (k - 1)), 1 << k


def _group_order(gid) -> tuple:
    """Sort key for a group's key: the runtime's numbered groups first, then torch's named ones."""
    return (0, gid, "") if isinstance(gid, int) else (1, 0, str(gid))


class OnlineTuner:
    online = True

    device = "cpu"  # it measures CPU tensors only

    def __init__(
        self, rt, order, save_path=None, margin=DEFAULT_MARGIN, iters=20, warmup=2, rounds=2, chunks=(1 << 20,)
    ):
        self.rt = rt
        self.order = tuple(order)  # preferred backends first: the incumbent each candidate must beat
        self.save_path = save_path
        self.path = save_path or "learned online (tuning: auto)"  # named in the runtime's log lines
        self.margin, self.iters, self.warmup, self.rounds, self.chunks = margin, iters, warmup, rounds, tuple(chunks)
        self.decisions = {}  # (gid, op, dtype, low) -> (group_size, high, Choice, latency_us, nbytes)
        self.measured = 0  # how many buckets were measured (a test reads it)

    # --- the runtime's interface -------------------------------------------------------------
    def decide(self, family, nbytes, group, dtype, device_type, reduce_op):
        if family not in TUNABLE_ONLINE or device_type != "cpu":
            return None
        low, high = bucket(nbytes)
        key = (group.gid, family, dtype_name(dtype), low)
        found = self.decisions.get(key)
        if found is not None:
            return found[2]
        candidates = self._candidates(family, nbytes, dtype, reduce_op)
        if not candidates:
            return None
        latency = self._measure(family, nbytes, group, dtype, candidates) if len(candidates) > 1 else {}
        labels = [label(c) for c in candidates]
        winner = candidates[labels.index(pick(latency, labels[0], self.margin, labels))] if latency else candidates[0]
        self.decisions[key] = (group.size, high, winner, latency, nbytes)
        if self.save_path and self.rt.rank == 0:
            self.table().save(self.save_path)
        return winner

    def depends_on_size(self, op, group_size, nodes=None) -> bool:
        return op in TUNABLE_ONLINE  # not known before the sizes are met

    # --- measuring ---------------------------------------------------------------------------
    def _candidates(self, family, nbytes, dtype, reduce_op):
        plain = [
            Choice(n)
            for n in self.order
            if n in self.rt.backends and self.rt.backends[n].supports(family, dtype, reduce_op, "cpu")
        ]
        if family != "all_reduce":
            return plain
        return plain + [Choice(c.backend, k) for c in plain for k in self.chunks if nbytes >= 2 * k]

    def _measure(self, family, nbytes, group, dtype, candidates) -> dict:
        rt = self.rt
        saved_log, rt.comm_log = rt.comm_log, None  # the comm log shows the job's traffic, not ours
        try:
            iters = min(self.iters, measure.iterations_for(nbytes))
            timed = [(c.backend, c.chunk_bytes) for c in candidates]
            seconds, _ = measure.compare(rt, family, nbytes, timed, dtype, group, iters, self.warmup, self.rounds)
            out = {label(c): round(t * 1e6, 3) for c, t in zip(candidates, seconds)}
        finally:
            rt.comm_log = saved_log
        self.measured += 1
        return out

    # --- what was learned --------------------------------------------------------------------
    def table(self) -> TuningTable:
        entries = []
        ordered = sorted(
            self.decisions.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[1][0], _group_order(kv[0][0]), kv[0][3])
        )
        for (_gid, op, dtype, low), (size, high, choice, latency, nbytes) in ordered:
            last = entries[-1] if entries else None
            if (
                last is not None
                and (last.op, last.group_size, last.dtype) == (op, size, dtype)
                and last.max_bytes == low
                and last.choice == choice
            ):
                last.max_bytes, last.latency_us, last.latency_at_bytes = high, latency, nbytes
                continue
            if any(
                (e.op, e.group_size, e.dtype) == (op, size, dtype) and e.min_bytes <= low < e.max_bytes for e in entries
            ):
                continue  # another group of this size already decided this bucket
            entries.append(
                Entry(
                    op=op,
                    group_size=size,
                    min_bytes=low,
                    max_bytes=high,
                    backend=choice.backend,
                    dtype=dtype,
                    chunk_bytes=choice.chunk_bytes,
                    latency_us=dict(latency),
                    latency_at_bytes=nbytes,
                )
            )
        fp = fingerprint(self.rt)
        fp["learned_online"] = True
        return TuningTable(fp, entries, self.save_path)

    def lookup(self, op, nbytes, group_size, dtype):
        return self.table().lookup(op, nbytes, group_size, dtype)

    def backends(self) -> set:
        return {d[2].backend for d in self.decisions.values()}
