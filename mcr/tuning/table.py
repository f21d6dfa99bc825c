"""The tuning table: a versioned, human-readable YAML file of backend choices.

    format: mcr-tuning-table
    version: 1
    fingerprint: {hostname: "node*", world_size: 2, ranks_per_node: 2, versions: {...}}
    entries:
      - {op: all_reduce, group_size: 2, dtype: any, min_bytes: 0, max_bytes: 65536,
         backend: mpi, chunk_bytes: 0, predicted: false, latency_us: {mpi: 2.1, gloo: 170.0}}

`max_bytes` is exclusive (null: no upper bound); `dtype` is a torch dtype name or `any`.
`latency_us` keeps every candidate's measurement beside the choice so a reader can see why; a
merged entry shows them at its largest measured size, `latency_at_bytes`. `predicted: true`
marks an entry the performance model decided (a crossover between measured sizes, or another
group size), not a measurement.

Tables written by `python -m mcr.tune` also keep what the choice was made from:

    curves:   # every candidate's latency (µs, slowest rank's median) at every measured size
      - {op: all_reduce, group_size: 2, dtype: float32, bytes: [4, 8, ...],
         latency_us: {mpi: [2.1, 2.2, ...], gloo: [...], mpi/chunk=1M: [null, ..., 16400.0]}}
    model:    # latency = alpha + beta * bytes, fitted per (op, candidate, group size)
      - {op: all_reduce, group_size: 2, candidate: mpi, alpha_us: 2.0, beta_us_per_MiB: 250.0}
"""

from __future__ import annotations

import bisect
import fnmatch
import os
import socket
import tempfile
from dataclasses import asdict, dataclass, field
from typing import ClassVar, Dict, List, Optional

import yaml

FORMAT = "mcr-tuning-table"
VERSION = 1


@dataclass(frozen=True)
class Choice:
    backend: str
    chunk_bytes: int = 0  # > 0: run the op as a sequence of chunks of this size


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

    @property
    def choice(self) -> Choice:
        return Choice(self.backend, self.chunk_bytes)


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


@dataclass
class Fit:
    """latency_us = alpha_us + beta_us_per_MiB * bytes / 2**20 for one (op, candidate, group size)."""

    op: str
    group_size: int
    candidate: str
    alpha_us: float
    beta_us_per_MiB: float  # noqa: N815  (the tuning-table YAML key; MiB is the unit)
    predicted: bool = False

    def latency_us(self, nbytes: int) -> float:
        return self.alpha_us + self.beta_us_per_MiB * nbytes / (1 << 20)


class TuningTableError(ValueError):
    pass


@dataclass
class TuningTable:
    fingerprint: dict
    entries: list
    path: Optional[str] = None
    curves: list = field(default_factory=list)  # [Curve]: what the entries were chosen from
    model: list = field(default_factory=list)  # [Fit]
    online: ClassVar[bool] = False  # a fixed table; mcr.tuning.online.OnlineTuner learns one

    def __post_init__(self):
        # (op, group_size, dtype) -> (sorted lower bounds, entries) for a bisect per lookup
        self._index = {}
        for e in sorted(self.entries, key=lambda e: e.min_bytes):
            lows, rows = self._index.setdefault((e.op, e.group_size, e.dtype), ([], []))
            lows.append(e.min_bytes)
            rows.append(e)

    def lookup(self, op: str, nbytes: int, group_size: int, dtype: str) -> Optional[Choice]:
        for key in ((op, group_size, dtype), (op, group_size, "any")):
            found = self._index.get(key)
            if found is None:
                continue
            lows, rows = found
            i = bisect.bisect_right(lows, nbytes) - 1
            if i >= 0 and (rows[i].max_bytes is None or nbytes < rows[i].max_bytes):
                return rows[i].choice
        return None

    @property
    def device(self) -> str:
        return self.fingerprint.get("device", "cpu")

    def depends_on_size(self, op: str, group_size: int) -> bool:
        """True when this op's choice differs between message sizes at this group size."""
        choices = {e.choice for e in self.entries if e.op == op and e.group_size == group_size}
        return len(choices) > 1

    def backends(self) -> set:
        return {e.backend for e in self.entries}

    # --- files ---------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "fingerprint": self.fingerprint,
            "entries": [asdict(e) for e in self.entries],
            **({"curves": [asdict(c) for c in self.curves]} if self.curves else {}),
            **({"model": [asdict(m) for m in self.model]} if self.model else {}),
        }

    def save(self, path: str) -> None:
        """Write atomically: a reader never sees half a table."""
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tuning-", suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(self.to_dict(), f, sort_keys=False, default_flow_style=None, width=120)
        os.replace(tmp, path)
        self.path = path

    @classmethod
    def load(cls, path: str) -> "TuningTable":
        try:
            with open(path) as f:
                data = yaml.safe_load(f)
        except FileNotFoundError:
            raise TuningTableError(f"tuning table {path} does not exist; write one with `python -m mcr.tune`") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise TuningTableError(f"{path} is not an mcr tuning table (no 'format: {FORMAT}')")
        if data.get("version") != VERSION:
            raise TuningTableError(
                f"{path} has tuning-table version {data.get('version')}, this mcr reads version {VERSION}; re-run `python -m mcr.tune`"
            )
        try:
            entries = [Entry(**e) for e in data.get("entries") or []]
            curves = [Curve(**c) for c in data.get("curves") or []]
            model = [Fit(**m) for m in data.get("model") or []]
        except TypeError as exc:
            raise TuningTableError(f"{path}: bad entry ({exc})") from None
        return cls(fingerprint=data.get("fingerprint") or {}, entries=entries, path=path, curves=curves, model=model)

    def check_fits(self, world_size: int, hostname: Optional[str] = None, ranks_per_node: Optional[int] = None) -> None:
        """Refuse a table measured for another job shape or machine."""
        fp = self.fingerprint
        if fp.get("world_size") not in (None, world_size):
            raise TuningTableError(
                f"tuning table {self.path} was measured on {fp['world_size']} ranks but this job has {world_size}; "
                f"run `python -m mcr.tune` at this scale, or set tuning_predict=true to use its performance model"
            )
        if ranks_per_node is not None and fp.get("ranks_per_node") not in (None, ranks_per_node):
            raise TuningTableError(
                f"tuning table {self.path} was measured with {fp['ranks_per_node']} ranks per node but this job has "
                f"{ranks_per_node}; re-tune with this layout, or set tuning_predict=true to use it anyway"
            )
        pattern = fp.get("hostname")
        hostname = hostname or socket.gethostname()
        if pattern and not fnmatch.fnmatch(hostname, pattern):
            raise TuningTableError(
                f"tuning table {self.path} is for hosts matching {pattern!r}, this is {hostname!r}; "
                f"re-tune here or widen the fingerprint's hostname pattern"
            )
