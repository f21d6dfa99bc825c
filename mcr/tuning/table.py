"""The tuning table: a versioned, human-readable YAML file of backend choices.

    format: mcr-tuning-table
    version: 1
    fingerprint: {hostname: "node*", world_size: 4, nodes: 2, ranks_per_node: 2, versions: {...}}
    entries:
      - {op: all_reduce, group_size: 4, nodes: 2, dtype: any, min_bytes: 0, max_bytes: 65536,
         backend: mpi, chunk_bytes: 0, predicted: false, latency_us: {mpi: 2.1, gloo: 170.0}}

`max_bytes` is exclusive (null: no upper bound); `dtype` is a torch dtype name or `any`. `nodes`
(absent: any) is the number of nodes the group spans: a group of 2 ranks inside a node and one
across two nodes are different groups to a table measured on several nodes. A node-aware entry
names its inter-node backend too (`backend: mpi, inter: gloo` is the candidate `node:mpi+gloo`:
intra-node phases on MPI, the inter-node phase on gloo; `mcr.tuning.candidates`). An entry of a
CUDA table may stage the op's tensors through host memory (`backend: mpi, host: true` is the
candidate `mpi/host`).
`latency_us` keeps every candidate's measurement beside the choice so a reader can see why; a
merged entry shows them at its largest measured size, `latency_at_bytes`. `predicted: true`
marks an entry the performance model decided (a crossover between measured sizes, or another
group size), not a measurement.

A table speaks for the tensors of one device, its fingerprint's `device` (absent: cpu; a CUDA
table also names its GPU). A job gives one table per device as a comma-separated list
(`tuning: cpu.yaml,cuda.yaml`), read as `TuningTables`.

Tables written by `python -m mcr.tools.tune` also keep what the choice was made from:

    curves:   # every candidate's latency (µs, slowest rank's median) at every measured size
      - {op: all_reduce, group_size: 2, dtype: float32, bytes: [4, 8, ...],
         latency_us: {mpi: [2.1, 2.2, ...], gloo: [...], mpi/chunk=1M: [null, ..., 16400.0]}}
    model:    # latency = alpha + beta * bytes, fitted per (op, candidate, group size)
      - {op: all_reduce, group_size: 2, candidate: mpi, alpha_us: 2.0, beta_us_per_MiB: 250.0}
"""

from __future__ import annotations

import bisect
import fnmatch
import json
import socket
import zlib
from dataclasses import asdict, dataclass, field
from typing import ClassVar, Dict, List, Optional

import yaml

from ..files import write_atomic

FORMAT = "mcr-tuning-table"
VERSION = 1


@dataclass(frozen=True)
class Choice:
    backend: str  # the backend; for a node-aware candidate, the one of the intra-node phases
    chunk_bytes: int = 0  # > 0: run the op as a sequence of chunks of this size
    inter: str = ""  # set: node-aware, the inter-node phase runs on this backend
    host: bool = False  # CUDA tensors staged through host memory, the backend running on the copies

    @property
    def node_aware(self) -> bool:
        return bool(self.inter)


@dataclass
class Entry:
    op: str
    group_size: int
    min_bytes: int
    max_bytes: Optional[int]
    backend: str
    dtype: str = "any"
    chunk_bytes: int = 0
    predicted: bool = False
    latency_us: Dict[str, float] = field(default_factory=dict)
    latency_at_bytes: Optional[int] = None  # the message size latency_us was measured at
    nodes: Optional[int] = None  # the nodes the group spans; None: any
    inter: str = ""  # node-aware: the inter-node phase's backend
    host: bool = False  # staged through host memory (the candidate BACKEND/host)

    @property
    def choice(self) -> Choice:
        return Choice(self.backend, self.chunk_bytes, self.inter, self.host)


@dataclass
class Curve:
    """One op's measurements at one group size: latency (µs) per candidate label per size;
    None where a candidate was not measured (a chunked candidate below two chunks)."""

    op: str
    group_size: int
    dtype: str
    bytes: List[int]
    latency_us: Dict[str, List[Optional[float]]]
    predicted: bool = False
    nodes: Optional[int] = None  # the nodes the measured group spanned


@dataclass
class Fit:
    """latency_us = alpha_us + beta_us_per_MiB * bytes / 2**20 for one (op, candidate, group size)."""

    op: str
    group_size: int
    candidate: str
    alpha_us: float
    beta_us_per_MiB: float  # noqa: N815  (the tuning-table YAML key; MiB is the unit)
    predicted: bool = False
    nodes: Optional[int] = None

    def latency_us(self, nbytes: int) -> float:
        return self.alpha_us + self.beta_us_per_MiB * nbytes / (1 << 20)


class TuningTableError(ValueError):
    pass


def _record(row) -> dict:
    """A row as the file holds it: fields older tables never had (nodes, inter, host) only where set."""
    out = asdict(row)
    for key in ("nodes", "inter", "host"):
        if key in out and not out[key]:
            del out[key]
    return out


@dataclass
class TuningTable:
    fingerprint: dict
    entries: list
    path: Optional[str] = None
    curves: list = field(default_factory=list)  # [Curve]: what the entries were chosen from
    model: list = field(default_factory=list)  # [Fit]
    online: ClassVar[bool] = False  # a fixed table; mcr.tuning.online.OnlineTuner learns one

    def __post_init__(self):
        # (op, group_size, nodes, dtype) -> (sorted lower bounds, entries) for a bisect per lookup
        self._index = {}
        self._position = {id(e): i for i, e in enumerate(self.entries)}  # where an entry is in the file
        for e in sorted(self.entries, key=lambda e: e.min_bytes):
            lows, rows = self._index.setdefault((e.op, e.group_size, e.nodes, e.dtype), ([], []))
            lows.append(e.min_bytes)
            rows.append(e)

    def lookup(
        self, op: str, nbytes: int, group_size: int, dtype: str, nodes: Optional[int] = None
    ) -> Optional[Choice]:
        """The choice for a group of `group_size` ranks on `nodes` nodes (see `find`)."""
        entry = self.find(op, nbytes, group_size, dtype, nodes)
        return None if entry is None else entry.choice

    def find(self, op: str, nbytes: int, group_size: int, dtype: str, nodes: Optional[int] = None) -> Optional[Entry]:
        """The entry that decides for a group of `group_size` ranks on `nodes` nodes: one for that
        shape, else one for any shape (tables measured on one node, or before nodes were
        recorded); per key, one for the dtype before one for any dtype. Within a key the entry
        with the largest `min_bytes` at or below `nbytes` decides, or none if it ends below."""
        keys = [(op, group_size, None, dtype), (op, group_size, None, "any")]
        if nodes is not None:
            keys[:0] = [(op, group_size, nodes, dtype), (op, group_size, nodes, "any")]
        for key in keys:
            found = self._index.get(key)
            if found is None:
                continue
            lows, rows = found
            i = bisect.bisect_right(lows, nbytes) - 1
            if i >= 0 and (rows[i].max_bytes is None or nbytes < rows[i].max_bytes):
                return rows[i]
        return None

    def position(self, entry: Entry) -> int:
        """The entry's index in `entries` (counted from 0, as a reader of the file counts them)."""
        return self._position[id(entry)]

    @property
    def device(self) -> str:
        return self.fingerprint.get("device", "cpu")

    def for_device(self, device: str) -> Optional["TuningTable"]:
        """This table where it speaks for `device`'s tensors (as `TuningTables.for_device`)."""
        return self if device == self.device else None

    def depends_on_size(self, op: str, group_size: int, nodes: Optional[int] = None) -> bool:
        """True when this op's choice differs between message sizes for this group shape."""
        choices = {
            e.choice for e in self.entries if e.op == op and e.group_size == group_size and e.nodes in (None, nodes)
        }
        return len(choices) > 1

    def backends(self) -> set:
        return {e.backend for e in self.entries}

    # --- files ---------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "fingerprint": self.fingerprint,
            "entries": [_record(e) for e in self.entries],
            **({"curves": [_record(c) for c in self.curves]} if self.curves else {}),
            **({"model": [_record(m) for m in self.model]} if self.model else {}),
        }

    def save(self, path: str) -> None:
        """Write atomically: a reader never sees half a table."""
        write_atomic(path, yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None, width=120))
        self.path = path

    @classmethod
    def load(cls, path: str) -> "TuningTable":
        try:
            with open(path) as f:
                data = yaml.safe_load(f)
        except FileNotFoundError:
            raise TuningTableError(
                f"tuning table {path} does not exist; write one with `python -m mcr.tools.tune`"
            ) from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise TuningTableError(f"{path} is not an mcr tuning table (no 'format: {FORMAT}')")
        if data.get("version") != VERSION:
            raise TuningTableError(
                f"{path} has tuning-table version {data.get('version')}, this mcr reads version {VERSION}; re-run `python -m mcr.tools.tune`"
            )
        try:
            entries = [Entry(**e) for e in data.get("entries") or []]
            curves = [Curve(**c) for c in data.get("curves") or []]
            model = [Fit(**m) for m in data.get("model") or []]
        except TypeError as exc:
            raise TuningTableError(f"{path}: bad entry ({exc})") from None
        return cls(fingerprint=data.get("fingerprint") or {}, entries=entries, path=path, curves=curves, model=model)

    def check_fits(
        self,
        world_size: int,
        hostname: Optional[str] = None,
        ranks_per_node: Optional[int] = None,
        nodes: Optional[int] = None,
    ) -> None:
        """Refuse a table measured for another job shape (ranks, nodes, ranks per node) or machine.
        `ranks_per_node` None with `nodes` given: this job's nodes hold different numbers of ranks."""
        fp = self.fingerprint
        if fp.get("world_size") not in (None, world_size):
            raise TuningTableError(
                f"tuning table {self.path} was measured on {fp['world_size']} ranks but this job has {world_size}; "
                f"run `python -m mcr.tools.tune` at this scale, or set tuning_predict=true to use its performance model"
            )
        if nodes is not None and fp.get("nodes") not in (None, nodes):
            raise TuningTableError(
                f"tuning table {self.path} was measured on {fp['nodes']} node(s) but this job runs on {nodes}; "
                f"links inside and between nodes differ, so run `python -m mcr.tools.tune` on {nodes} node(s) of this "
                f"machine and use that table"
            )
        per_node_known = ranks_per_node is not None or nodes is not None
        if per_node_known and fp.get("ranks_per_node") not in (None, ranks_per_node):
            has = f"{ranks_per_node}" if ranks_per_node is not None else "different numbers of"
            raise TuningTableError(
                f"tuning table {self.path} was measured with {fp['ranks_per_node']} ranks per node but this job has "
                f"{has} ranks per node; re-tune with this layout, or set tuning_predict=true to use it anyway"
            )
        pattern = fp.get("hostname")
        hostname = hostname or socket.gethostname()
        if pattern and not fnmatch.fnmatch(hostname, pattern):
            raise TuningTableError(
                f"tuning table {self.path} is for hosts matching {pattern!r}, this is {hostname!r}; "
                f"re-tune here or widen the fingerprint's hostname pattern"
            )

    def shape_text(self) -> str:
        """The job shape the table was measured for, as the start-up line names it."""
        fp = self.fingerprint
        parts = [f"{fp['world_size']} ranks" if fp.get("world_size") else "any world size"]
        if fp.get("nodes"):
            parts.append(f"{fp['nodes']} node{'s' if fp['nodes'] > 1 else ''} x {fp.get('ranks_per_node', '?')}")
        elif fp.get("ranks_per_node"):
            parts.append(f"{fp['ranks_per_node']} ranks per node")
        return ", ".join(parts)

    def fingerprint_text(self) -> str:
        """`fingerprint 5f0c2a1e (hosts 'vm', torch 2.13.0, mpi Open MPI v5.0.11, ...)`: a digest
        that tells two tables' machines apart at a glance, and what it was taken from."""
        fp = self.fingerprint
        if not fp:
            return "no fingerprint"
        digest = zlib.crc32(json.dumps(fp, sort_keys=True, default=str).encode())
        parts = [f"hosts {fp['hostname']!r}"] if fp.get("hostname") else []
        if fp.get("device"):
            parts.append(str(fp["device"]))
        if fp.get("gpu"):
            parts.append(str(fp["gpu"]))
        if "mpi_cuda_aware" in fp:
            parts.append("mpi reads device memory" if fp["mpi_cuda_aware"] else "mpi not CUDA-aware")
        parts += [f"{name} {version}" for name, version in (fp.get("versions") or {}).items()]
        return f"fingerprint {digest:08x}" + (f" ({', '.join(parts)})" if parts else "")


class TuningTables:
    """One fixed table per device, as a job names them (`tuning: cpu.yaml,cuda.yaml`): a call is
    chosen from the table of its tensors' device. The runtime uses it as it uses one table:
    `online`, `for_device` (through `mcr.choose.table_rule`), `depends_on_size`, `path`."""

    online = False

    def __init__(self, tables):
        self.tables = tuple(tables)  # in the order named
        self.by_device = {}
        for table in self.tables:
            other = self.by_device.setdefault(table.device, table)
            if other is not table:
                raise TuningTableError(
                    f"tuning tables {other.path} and {table.path} are both for {table.device} tensors; "
                    f"give one table per device (e.g. tuning: cpu.yaml,cuda.yaml)"
                )
        self.path = ",".join(str(t.path) for t in self.tables)  # as named: the log lines show it

    def for_device(self, device: str) -> Optional[TuningTable]:
        return self.by_device.get(device)

    def depends_on_size(self, op: str, group_size: int, nodes: Optional[int] = None) -> bool:
        """True when any table's choice for this op differs between message sizes: the runtime
        agrees on an uneven op's size before choosing, whatever its device."""
        return any(t.depends_on_size(op, group_size, nodes) for t in self.tables)


def load_tables(paths: str):
    """The table a job names (`tuning:`, MCR_TUNING_FILE): one file, read as a `TuningTable`, or
    several separated by commas, one per device, read as `TuningTables`."""
    names = [p.strip() for p in str(paths).split(",") if p.strip()]
    if len(names) <= 1:
        return TuningTable.load(names[0] if names else str(paths))
    return TuningTables([TuningTable.load(p) for p in names])
