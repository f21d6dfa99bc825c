"""Step 2 of every op: the route a call takes.

`mcr.choose.select_backend` is the pure choice; the `Router` gives it what this job knows (its
backends, what each group lacks, the tuning table, `force_backend()`), says each of its notes
once, and returns a `Route`: the backend, a chunk size or a node-aware plan, and the names the
watchdog, comm log and flight recorder use for the op. Every rank of a group decides alike
(mixing rule 1, `mcr.runtime`'s docstring). Routes are kept in one place, the group's cache
(`Group.routes`, under `mcr.group.route_key`), with the runs made for them.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from .backends.base import Backend
from .choose import Call, Policy, require, select_backend, table_rule
from .ops import dtype_name

log = logging.getLogger("mcr")


class OpCall(NamedTuple):
    """An op as the watchdog, the comm log and error messages name it."""

    family: str
    label: str  # the backend as the candidate's label names it: mpi, mpi/chunk=1M, node:mpi+gloo, nccl/host
    nbytes: int
    group_size: int


class NodePlan(NamedTuple):
    """A node-aware candidate resolved to its backends (`mcr.node_aware`)."""

    intra: Backend  # runs the phases inside each node
    inter: Backend  # runs the phase between nodes
    label: str  # node:INTRA+INTER, as the table and the comm log name it


class Route(NamedTuple):
    """Where one kind of call runs: made once per distinct call and kept on the group, so the
    hot path allocates nothing to describe its op."""

    backend: Backend  # a node-aware route: its inter-node backend
    chunk_bytes: int  # > 0: an all-reduce larger than this runs as a train of chunks
    op: OpCall  # the call as the watchdog, comm log and errors name it
    plan: NodePlan | None  # set: run as phases inside and between nodes
    rule: str  # the rung that chose it (`mcr.choose.Selection.rule`), for the flight recorder
    dtype_name: str  # and what the recorder says of the call's tensors
    itemsize: int
    device_type: str
    staged: bool = False  # CUDA tensors through host memory even where the library reads them (X/host)

    def runs_whole(self, nbytes) -> bool:
        """One backend call (not node-aware phases, not a train of chunks)."""
        return self.plan is None and not (self.chunk_bytes and nbytes > self.chunk_bytes)


class Router:
    def __init__(self, cfg, rank, backends, unavailable, topology, table=None):
        """`unavailable`: name -> why, the backends this job could not start; `table`: the
        tuning table (a `TuningTable(s)`, an `mcr.tuning.online.OnlineTuner`, or None)."""
        self.cfg, self.rank, self.backends, self.unavailable = cfg, rank, backends, unavailable
        self.topology = topology
        self.table = table
        self.forced = None  # force_backend(): part of every route's key in the groups' caches
        self._warned = set()

    def force_backend(self, name: str | None) -> None:
        """Run every op that follows on backend `name` (or a node-aware candidate such as
        `node:mpi+gloo`), or (None) choose again as configured. For benchmarks that compare
        backends inside one job; every rank must call it alike."""
        if name is not None:
            self.require(name, "force_backend", "asked for by force_backend()")
        self.forced = name

    def choose(self, family, nbytes, group, dtype, device_type, explicit=None, reduce_op=None):
        """(backend, chunk_bytes) for this call; the same on every rank of the group."""
        return self.route(family, nbytes, group, dtype, device_type, explicit, reduce_op)[:2]

    def route(self, family, nbytes, group, dtype, device_type, explicit=None, reduce_op=None) -> Route:
        """Decide the route of this call now (the runtime keeps it on the group)."""
        if not group.is_member:
            raise ValueError(f"mcr.{family}: rank {self.rank} is not a member of {group}")
        picked = self.select(family, nbytes, group, dtype, device_type, explicit, reduce_op)
        for note in picked.notes:  # a fallback, a node-aware candidate run flat: each said once
            if note.key not in self._warned and (group.rank if note.by_group else self.rank) == 0:
                log.warning("mcr: %s", note.text)
            self._warned.add(note.key)
        backend = self.backends[picked.backend]
        rule = picked.rule if not picked.notes else f"{picked.rule}; {'; '.join(n.text for n in picked.notes)}"
        if picked.intra:
            plan, chunk, staged = NodePlan(self.backends[picked.intra], backend, picked.label), 0, False
        else:
            plan, chunk, staged = None, picked.chunk_bytes, picked.host
        name = backend.name if plan is None else plan.label
        op = OpCall(family, name + ("/host" if staged else ""), nbytes, group.size)  # as the comm log names it
        return Route(backend, chunk, op, plan, rule, dtype_name(dtype), dtype.itemsize, device_type, staged)

    def select(self, family, nbytes, group, dtype, device_type, explicit=None, reduce_op=None):
        """`mcr.choose.select_backend` for a call on `group` (the pure choice `python -m
        mcr.tools.explain` runs too), with what the group lacks: backends with no communicator
        on it, or on its node-local or peer groups (NCCL where two members share a GPU), known
        alike on every member. A send or receive's `reduce_op` "tagged" says it has a tag, a
        barrier's "timed" that it has a timeout of its own."""
        tagged, timed = reduce_op == "tagged", reduce_op == "timed"
        call = Call(
            family, nbytes, group.size, group.nodes, dtype, device_type, None if tagged or timed else reduce_op,
            explicit, group.shape, group.gid, frozenset(group.unavailable), *self._phase_missing(group), tagged, timed,
        )  # fmt: skip
        policy = Policy(self.cfg.overrides, self.cfg.backend, self.forced)
        unavailable = {**self.unavailable, **group.unavailable}
        return select_backend(call, policy, self.backends, unavailable, lambda: self._from_table(call, group))

    def depends_on_size(self, family, group) -> bool:
        """Whether the choice for `family` on `group` can depend on the message size (where
        sizes differ by rank, the runtime then agrees on the largest first)."""
        return self.table is not None and self.table.depends_on_size(family, group.size, group.nodes)

    def require(self, name, family, why):
        require(name, family, why, self.backends, self.unavailable)

    def _phase_missing(self, group):
        """The backends a node-aware op on `group` could not run its intra-node and its
        inter-node phases on (a GPU per rank needed, two ranks of such a group on one GPU)."""
        needy = [name for name, backend in self.backends.items() if backend.gpu_per_rank]
        layout = self.topology.layout(group.ranks) if needy and group.nodes else None
        if layout is None:
            return frozenset(), frozenset()
        shared = self.topology.shared_gpu
        intra = any(shared(ranks) for ranks in layout.local)
        inter = any(shared(ranks) for ranks in layout.peers)
        return frozenset(needy if intra else ()), frozenset(needy if inter else ())

    def _from_table(self, call, group):
        """(Choice, rule) from the tuning table, or None; an online table may measure now, with the group."""
        table = self.table
        if table is None or not table.online:
            return table_rule(table, call)
        if call.device_type != table.device:
            return None
        choice = table.decide(call.family, call.nbytes, group, call.dtype, call.device_type, call.reduce_op)
        return None if choice is None else (choice, f"the tuning table {table.path}")
