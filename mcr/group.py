"""A group of ranks and each backend's communicator for it."""

from __future__ import annotations

from collections.abc import Hashable


def route_key(method, nbytes, tensor, explicit, reduce_op, forced):
    """A call's key in `Group.routes`: what its route and runs depend on beyond the group.
    `forced`: the backend force_backend() names, so forcing one never meets an older call."""
    return (method, nbytes, tensor.dtype, tensor.is_cuda, explicit, reduce_op, forced)


class GroupInfo:
    """What the flight recorder (`mcr.flight`) keeps of a group: its key, ranks and how many ops
    were issued on it, not its communicators, so a group torch destroys takes its threads along."""

    __slots__ = ("gid", "ranks", "rank", "size", "collective_seq", "p2p_seq")

    def __init__(self, gid, ranks, rank):
        self.gid, self.ranks, self.rank, self.size = gid, ranks, rank, len(ranks)
        self.collective_seq = self.p2p_seq = 0


class Group:
    __slots__ = (
        "gid",
        "ranks",
        "rank",
        "size",
        "comms",
        "unavailable",
        "shape",
        "_to_group_rank",
        "info",
        "routes",
        "node_groups",
        "cpu_only",
    )

    def __init__(self, gid: Hashable, ranks, my_global_rank: int, shape=None):
        # the group's key in the flight recorder and the tuner: an int for groups the runtime numbers
        # (0: the world), ("torch", name) for groups torch.distributed creates (mcr.hooks)
        self.gid = gid
        self.ranks = tuple(ranks)
        self.size = len(self.ranks)
        self._to_group_rank = {r: i for i, r in enumerate(self.ranks)}
        self.rank = self._to_group_rank.get(my_global_rank, -1)  # -1: this rank is not a member
        self.comms = {}  # backend name -> that backend's group object
        self.unavailable = {}  # backend name -> why it has none here (NCCL: two members share a GPU)
        self.cpu_only = False  # made for CPU tensors only: no GPU library's communicator (new_group)
        # nodes spanned and ranks per node (`mcr.topology.Shape`): the tuning table's key beside
        # the size, and what node-aware candidates need; None where no topology was given
        self.shape = shape
        self.info = GroupInfo(gid, self.ranks, self.rank)
        # the routes of calls on this group, under `route_key`: (route, blocking run, async issue),
        # the runs None where the route runs in chunks or phases (`Runtime.call`). Kept here, with
        # the communicators the runs hold: a group torch destroys takes them along, and a later
        # group with the same key (torch's hashed names) starts empty
        self.routes = {}
        # its node-local and peer groups (`mcr.node_aware.groups_of`), made the first time a node-aware
        # op runs on it; kept here for the same reason
        self.node_groups = None

    def communicators(self):
        """Every communicator of the group, its node groups' too."""
        yield from self.comms.values()
        if self.node_groups is not None:
            yield from self.node_groups.local.communicators()
            yield from self.node_groups.peers.communicators()

    def release(self, free=None) -> None:
        """Drop the communicators (and those of its node groups): their threads end now.
        `free(backend name, communicator)`: hand each back to its library first."""
        if self.node_groups is not None:
            self.node_groups.local.release(free)
            self.node_groups.peers.release(free)
            self.node_groups = None
        if free is not None:
            for name, comm in self.comms.items():
                free(name, comm)
        self.comms.clear()
        self.routes.clear()  # call()'s cache holds the communicators too

    @property
    def nodes(self):
        """How many nodes the group spans (None: unknown)."""
        return self.shape.nodes if self.shape is not None else None

    @property
    def is_member(self) -> bool:
        return self.rank >= 0

    def group_rank(self, global_rank: int) -> int:
        try:
            return self._to_group_rank[global_rank]
        except KeyError:
            raise ValueError(f"rank {global_rank} is not in this group (ranks {list(self.ranks)})") from None

    def __repr__(self):
        return f"mcr.Group(id={self.gid}, ranks={list(self.ranks)})"
