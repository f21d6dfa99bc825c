"""Which node each rank runs on, and the shape of the job and of each group.

The runtime learns every rank's hostname once at start-up (an exchange on its store, whatever
the launcher: `env.hosts_by_rank`), so the node of a rank is a fact all ranks share, not each
launcher's idea of local ranks. From it come the job's shape, which a tuning table must match,
and each group's shape (how many nodes it spans, how many of its ranks sit on each), which the
table's entries are keyed by and which the node-aware candidates need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True)
class Shape:
    ranks: int
    nodes: int
    per_node: int | None  # None: the nodes hold different numbers of these ranks
    counts: tuple = ()  # ranks on each node, in node order (what a mixed shape says)

    def __str__(self) -> str:
        if self.per_node is not None:
            return f"{self.ranks} ranks, {self.nodes} node{'s' if self.nodes > 1 else ''} x {self.per_node}"
        return f"{self.ranks} ranks on {self.nodes} nodes ({', '.join(map(str, self.counts))} ranks)"


class Layout(NamedTuple):
    """A node-uniform group split the two ways node-aware collectives need (global ranks):
    `local[k]`, the group's ranks on node k (in rank order); `peers[j]`, the rank with local
    index j on every node (in node order). Nodes are ordered by the group's lowest rank on each."""

    local: list
    peers: list


class Topology:
    def __init__(self, hosts, gpus=None):
        self.hosts = tuple(hosts)
        self.gpus = tuple(gpus) if gpus is not None else ("",) * len(self.hosts)  # each rank's GPU UUID ("": none)
        self.node_names = tuple(dict.fromkeys(self.hosts))  # in order of each node's first rank
        index = {name: i for i, name in enumerate(self.node_names)}
        self.node_of = tuple(index[h] for h in self.hosts)

    def shape(self, ranks=None) -> Shape:
        """The shape of these global ranks (default: the whole job)."""
        ranks = range(len(self.hosts)) if ranks is None else ranks
        counts = {}
        for r in ranks:
            counts[self.node_of[r]] = counts.get(self.node_of[r], 0) + 1
        per = set(counts.values())
        return Shape(sum(counts.values()), len(counts), per.pop() if len(per) == 1 else None, tuple(counts.values()))

    def layout(self, ranks) -> Layout | None:
        """The group's node-local and peer rank lists, or None where its nodes hold different
        numbers of its ranks (no peer group then has one rank per node)."""
        by_node = {}
        for r in sorted(ranks):
            by_node.setdefault(self.node_of[r], []).append(r)
        local = list(by_node.values())
        if len({len(members) for members in local}) != 1:
            return None
        return Layout(local, [list(column) for column in zip(*local)])

    def shared_gpu(self, ranks):
        """Two of these global ranks that share a GPU, or None (ranks without one share none)."""
        seen = {}
        for r in ranks:
            gpu = self.gpus[r]
            if gpu and gpu in seen:
                return seen[gpu], r
            seen[gpu] = r
        return None
