"""Data, tensor, pipeline and expert parallel degrees, checked once, and the groups built from them.

    dims = ParallelDims(world_size, tp=2, pp=2, keys={"tp": "parallel.tensor", "pp": "parallel.pipeline"})
    ...                                  # (communication started)
    groups = dims.build_groups(rank)     # groups.tp, groups.dp, groups.pp: mcr groups of this rank
    groups = dims.groups_from_grid(grid) # or DeepSpeed's, for an app whose DeepSpeed builds them

Rank layout as Megatron and DeepSpeed lay it out, tensor-parallel ranks adjacent:
`rank = (pp_idx * dp + dp_idx) * tp + tp_idx`, the same ranks as DeepSpeed's
`PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)` (axes pipe, data, model).
An app on DeepSpeed's pipeline or `mpu` takes DeepSpeed's groups (`groups_from_grid`) rather
than building its own over the same ranks: each group is then built once.

Expert parallelism borrows from data parallelism, as in DeepSpeed-MoE: each data-parallel group
splits into dp / ep expert groups of ep consecutive members, and members with the same expert
index form an expert-data group (the ranks of DeepSpeed's `_get_expert_parallel_ranks`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Optional

from .config import ConfigError

DIMS = ("dp", "tp", "pp", "ep")
MEANING = {"dp": "data", "tp": "tensor", "pp": "pipeline", "ep": "expert"}


class Coords(NamedTuple):
    """Where one rank sits: its index along each dimension (ep: its place in its expert group)."""

    pp: int
    dp: int
    tp: int
    ep: int


@dataclass
class ParallelGroups:
    """This rank's mcr groups, one per dimension (a dimension of degree 1 gives a 1-rank group),
    and its coordinates. `ep` / `ep_dp` (expert and expert-data) are None unless asked for."""

    coords: Coords
    tp: object
    dp: object
    pp: object
    ep: Optional[object] = None
    ep_dp: Optional[object] = None


@dataclass
class ParallelDims:
    """`dp=0` fills what tp x pp leave of the world size. `keys` maps a degree to the config key
    that set it, so the error names the user's key (`{"tp": "parallel.tensor"}`)."""

    world_size: int
    dp: int = 0
    tp: int = 1
    pp: int = 1
    ep: int = 1
    keys: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self._check()

    def _check(self) -> None:
        """The one check, before any process group: raise ConfigError naming every degree."""
        w, tp, pp, ep = self.world_size, self.tp, self.pp, self.ep
        problem = fix = None
        if w < 1:
            problem, fix = f"the world size must be >= 1, got {w}", "start at least one rank"
        elif min(tp, pp, ep) < 1 or self.dp < 0:
            bad = [d for d in DIMS if getattr(self, d) < (0 if d == "dp" else 1)]
            problem = f"{self._names(bad)} must be >= 1 (dp may be 0: it fills the rest)"
            fix = "set each to a positive degree"
        elif self.dp == 0 and w % (tp * pp):
            problem = f"tp x pp = {tp * pp} does not divide the world size {w}"
            fix = (
                f"choose {self._names(('tp', 'pp'))} whose product divides {w}, or start a multiple of {tp * pp} ranks"
            )
        elif self.dp and self.dp * tp * pp != w:
            problem = f"dp x tp x pp = {self.dp * tp * pp} is not the world size {w}"
            fix = f"set {self._names(('dp',))} to 0 (fill the rest) or make dp x tp x pp = {w}"
        elif (self.dp or w // (tp * pp)) % ep:
            dp = self.dp or w // (tp * pp)
            problem = f"ep = {ep} must divide dp = {dp} (experts are spread over data-parallel ranks)"
            fix = f"set {self._names(('ep',))} to a divisor of {dp}"
        if problem is not None:
            raise ConfigError(f"bad parallel degrees {self._degrees()} for world size {w}: {problem}; {fix}")
        self.dp = self.dp or w // (tp * pp)

    def _name(self, dim: str) -> str:
        return f"{dim} ({self.keys[dim]!r})" if dim in self.keys else dim

    def _names(self, dims) -> str:
        return " and ".join(self._name(d) for d in dims)

    def _degrees(self) -> str:
        parts = []
        for d in DIMS:
            value = getattr(self, d)
            note = " (fills the rest)" if d == "dp" and value == 0 else ""
            parts.append(f"{self._name(d)}={value}{note}")
        return ", ".join(parts)

    # --- what is enabled ---------------------------------------------------------------------
    @property
    def dp_enabled(self) -> bool:
        return self.dp > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def ep_enabled(self) -> bool:
        return self.ep > 1

    # --- rank layout -------------------------------------------------------------------------
    def rank_of(self, pp: int, dp: int, tp: int) -> int:
        return (pp * self.dp + dp) * self.tp + tp

    def coords(self, rank: int) -> Coords:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is not in the world of {self.world_size} ranks")
        tp = rank % self.tp
        dp = rank // self.tp % self.dp
        pp = rank // (self.tp * self.dp)
        return Coords(pp=pp, dp=dp, tp=tp, ep=dp % self.ep)

    def group_ranks(self, dim: str) -> list[list[int]]:
        """Every group of dimension `dim` (tp, dp, pp, ep, ep_dp), in one fixed order."""
        tp_, dp_, pp_, ep_ = range(self.tp), range(self.dp), range(self.pp), self.ep
        if dim == "tp":
            return [[self.rank_of(p, d, t) for t in tp_] for p in pp_ for d in dp_]
        if dim == "dp":
            return [[self.rank_of(p, d, t) for d in dp_] for p in pp_ for t in tp_]
        if dim == "pp":
            return [[self.rank_of(p, d, t) for p in pp_] for d in dp_ for t in tp_]
        if dim == "ep":  # ep consecutive members of each data-parallel group
            return [dp_ranks[i : i + ep_] for dp_ranks in self.group_ranks("dp") for i in range(0, self.dp, ep_)]
        if dim == "ep_dp":  # members of a data-parallel group with the same place in their expert group
            return [dp_ranks[i::ep_] for dp_ranks in self.group_ranks("dp") for i in range(ep_)]
        raise ValueError(f"unknown parallel dimension {dim!r}; choose tp, dp, pp, ep or ep_dp")

    def build_groups(self, rank: int, experts: bool = False) -> ParallelGroups:
        """Make every group with `mcr.new_group`, in the same order on every rank (each call is
        collective over the world), and return this rank's. Start communication first."""
        import mcr

        dims = ("tp", "dp", "pp") + (("ep", "ep_dp") if experts else ())
        mine = {}
        for dim in dims:
            for ranks in self.group_ranks(dim):
                group = mcr.new_group(ranks)
                if rank in ranks:
                    mine[dim] = group
        return ParallelGroups(coords=self.coords(rank), **mine)

    def groups_from_grid(self, grid) -> ParallelGroups:
        """This rank's TP, DP and PP groups taken from DeepSpeed's `PipelineParallelGrid` (the
        mcr group under each of its torch groups on backend "mcr"), not built again; checked to
        hold this layout's ranks."""
        rank = grid.get_global_rank()
        taken = {
            "tp": grid.get_slice_parallel_group(),
            "dp": grid.get_data_parallel_group(),
            "pp": grid.get_pipe_parallel_group(),
        }
        mine = {}
        for dim, group in taken.items():
            mcr_group = getattr(group, "mcr_group", None)
            if mcr_group is None:
                raise RuntimeError(
                    f"DeepSpeed's {MEANING[dim]}-parallel group is not on backend 'mcr' ({type(group).__name__}); "
                    "start communication with apps.common.comm.setup_deepspeed_comm before building the grid"
                )
            expected = next(ranks for ranks in self.group_ranks(dim) if rank in ranks)
            if list(mcr_group.ranks) != expected:
                raise RuntimeError(
                    f"DeepSpeed's {MEANING[dim]}-parallel group of rank {rank} holds ranks {list(mcr_group.ranks)}, "
                    f"not {expected} as {self} lays them out"
                )
            mine[dim] = mcr_group
        return ParallelGroups(coords=self.coords(rank), **mine)

    def __str__(self) -> str:
        return " x ".join(f"{d} {getattr(self, d)}" for d in ("pp", "dp", "tp")) + (
            f" (ep {self.ep} within dp)" if self.ep_enabled else ""
        )
