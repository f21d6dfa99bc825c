"""Which node each rank runs on, and the shape of the job and of each group.

The runtime learns every rank's hostname once at start-up (an exchange on its store, whatever
the launcher: `env.hosts_by_rank`), so the node of a rank is a fact all ranks share, not each
launcher's idea of local ranks. From it come the job's shape, which a tuning table must match,
and each group's shape (how many nodes it spans, how many of its ranks sit on each), which the
table's entries are keyed by and which the node-aware candidates need. Each rank's GPU comes with it (`RankGPU`): what rank 0
says of every node at start-up (`node_lines`), and the bindings it warns about (`binding_problems`).
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


class RankGPU(NamedTuple):
    """The GPU a rank bound at start-up, as every rank learns it: its UUID ("" without one), its
    index among the GPUs the rank sees (-1: none), the rank's local rank and how many GPUs it sees."""

    uuid: str
    index: int
    local_rank: int
    visible: int

    def text(self) -> str:
        return f"{self.uuid}|{self.index}|{self.local_rank}|{self.visible}"

    @classmethod
    def parse(cls, text: str) -> "RankGPU":
        uuid, index, local_rank, visible = text.rsplit("|", 3)
        return cls(uuid, int(index), int(local_rank), int(visible))

    @property
    def wrapped(self) -> bool:
        """A local rank past the several GPUs it sees, which `local_rank % count` folded back onto
        another rank's. (One GPU seen is the launcher's choice: a GPU per rank by CUDA_VISIBLE_DEVICES.)"""
        return self.visible > 1 and self.local_rank >= self.visible


def node_lines(hosts, gpus) -> list:
    """One line per node: its ranks and the GPU each bound (`gpus`: each rank's RankGPU)."""
    by_node = {}
    for rank, (host, gpu) in enumerate(zip(hosts, gpus)):
        by_node.setdefault(host, []).append((rank, gpu))
    lines = []
    for host, ranks in by_node.items():
        if not any(gpu.uuid for _, gpu in ranks):
            lines.append(f"mcr: node {host}: ranks {', '.join(str(r) for r, _ in ranks)}, no GPU")
            continue
        placed = [f"rank {r} cuda:{gpu.index} {gpu.uuid[:12]}" if gpu.uuid else f"rank {r} no GPU" for r, gpu in ranks]
        lines.append(f"mcr: node {host}: {', '.join(placed)}")
    return lines


def binding_problems(hosts, gpus) -> list:
    """Ranks that share a GPU (no NCCL for a group holding both) and local ranks that wrapped
    around the GPUs they see, each naming the ranks and the fix."""
    problems, first = [], {}
    for rank, (host, gpu) in enumerate(zip(hosts, gpus)):
        if gpu.wrapped:
            problems.append(
                f"rank {rank} on node {host} has local rank {gpu.local_rank} but sees {gpu.visible} GPUs, so it "
                f"took GPU {gpu.index} (local rank % {gpu.visible}): start at most {gpu.visible} ranks on the node"
            )
        if gpu.uuid and gpu.uuid in first:
            problems.append(
                f"ranks {first[gpu.uuid]} and {rank} on node {host} SHARE GPU {gpu.uuid}: NCCL is dropped for every "
                "group holding both; give each rank its own GPU (one rank per GPU, and CUDA_VISIBLE_DEVICES per "
                "rank or every GPU visible)"
            )
        first.setdefault(gpu.uuid, rank)
    return problems
