"""Cluster description: devices (speed, memory) and the links between them.

YAML, e.g. ``configs/bapipe/fpga-8.yaml``::

    name: fpga-8
    devices:                      # in pipeline order; `count` repeats an entry
      - {name: fpga, memory_bytes: 512MiB, speed: 40, count: 8}
    link: {latency_s: 2.0e-6, bandwidth_Bps: 12.5e9}       # between neighbouring stages
    allreduce: {latency_s: 5.0e-6, bandwidth_Bps: 12.5e9}  # one ring hop; defaults to `link`
    bytes_per_param_state: 16     # weights + gradients + optimizer state per parameter

A layer takes its profiled time divided by the device's ``speed``. A link can instead be read
from mcr's tuning table: ``link: {tuning_table: path.yaml, op: all_reduce}``.
"""

import re
from dataclasses import dataclass, field

import yaml

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
    "tb": 1e12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_number(value, what):
    """Numbers may be written 16e9, 16GiB or 16 GB; YAML reads 16e9 as a string, so both pass here."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    match = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([A-Za-z]*)\s*", str(value))
    unit = match.group(2).lower() if match else None
    if match and unit in _UNITS:
        try:
            return float(match.group(1)) * _UNITS[unit]
        except ValueError:
            pass
    raise ValueError(f"{what} is {value!r}: write a number such as 16e9 or 16GiB")


@dataclass(frozen=True)
class Device:
    name: str
    memory_bytes: float
    speed: float = 1.0  # relative to the machine the profile was measured on


@dataclass(frozen=True)
class Link:
    latency_s: float
    bandwidth_Bps: float  # noqa: N815  (the cluster YAML key; B is bytes, b would be bits)

    def time(self, nbytes):
        return self.latency_s + nbytes / self.bandwidth_Bps if nbytes > 0 else 0.0

    def ring_allreduce_time(self, nbytes, ranks):
        """Ring all-reduce: 2(n-1) steps, each moving nbytes/n over one hop."""
        if ranks <= 1 or nbytes <= 0:
            return 0.0
        return 2 * (ranks - 1) * (self.latency_s + nbytes / ranks / self.bandwidth_Bps)


@dataclass
class Cluster:
    devices: list
    link: Link
    allreduce: Link
    bytes_per_param_state: float = 16.0
    name: str = "cluster"
    notes: dict = field(default_factory=dict)

    @property
    def size(self):
        return len(self.devices)

    @staticmethod
    def load(path) -> "Cluster":
        try:
            with open(path) as f:
                raw = yaml.safe_load(f)
        except OSError as err:
            raise ValueError(f"cannot read cluster {path}: {err}; see configs/bapipe/ for examples") from err
        return Cluster.from_dict(raw, source=str(path))

    @staticmethod
    def from_dict(raw, source="cluster") -> "Cluster":
        if not isinstance(raw, dict) or not isinstance(raw.get("devices"), list) or not raw["devices"]:
            raise ValueError(f"{source}: a cluster needs a non-empty `devices` list (each with memory_bytes and speed)")
        unknown = set(raw) - {"name", "devices", "link", "allreduce", "bytes_per_param_state", "notes"}
        if unknown:
            raise ValueError(
                f"{source}: unknown keys {sorted(unknown)}; allowed: name, devices, link, "
                "allreduce, bytes_per_param_state, notes"
            )
        devices = []
        for i, entry in enumerate(raw["devices"]):
            if not isinstance(entry, dict) or "memory_bytes" not in entry:
                raise ValueError(f"{source}: device {i} needs memory_bytes (and speed, default 1)")
            speed = parse_number(entry.get("speed", 1.0), f"{source}: device {i} speed")
            if speed <= 0:
                raise ValueError(f"{source}: device {i} speed must be positive")
            device = Device(
                str(entry.get("name", f"dev{i}")),
                parse_number(entry["memory_bytes"], f"{source}: device {i} memory_bytes"),
                speed,
            )
            devices += [device] * int(entry.get("count", 1))
        if "link" not in raw:
            raise ValueError(f"{source}: `link` (latency_s, bandwidth_Bps between neighbouring stages) is missing")
        link = _link(raw["link"], f"{source}: link")
        allreduce = _link(raw["allreduce"], f"{source}: allreduce") if "allreduce" in raw else link
        return Cluster(
            devices,
            link,
            allreduce,
            parse_number(raw.get("bytes_per_param_state", 16), f"{source}: bytes_per_param_state"),
            name=str(raw.get("name", source)),
            notes=raw.get("notes") or {},
        )


def _link(raw, what):
    if not isinstance(raw, dict):
        raise ValueError(f"{what} must be a mapping with latency_s and bandwidth_Bps (or tuning_table)")
    if "tuning_table" in raw:
        return link_from_tuning_table(raw["tuning_table"], raw.get("op", "all_reduce"))
    missing = {"latency_s", "bandwidth_Bps"} - set(raw)
    if missing:
        raise ValueError(f"{what} lacks {sorted(missing)}")
    link = Link(
        parse_number(raw["latency_s"], f"{what} latency_s"), parse_number(raw["bandwidth_Bps"], f"{what} bandwidth_Bps")
    )
    if link.latency_s < 0 or link.bandwidth_Bps <= 0:
        raise ValueError(f"{what}: latency must be >= 0 and bandwidth > 0")
    return link


def fit_link(points):
    """Latency + bytes/bandwidth through (bytes, seconds) points: mcr's alpha-beta fit
    (`mcr.tuning.model.fit`, least squares on the relative error)."""
    from mcr.tuning.model import fit

    sizes, seconds = zip(*points)
    latency_s, seconds_per_byte = fit(sizes, seconds)
    if seconds_per_byte <= 0:
        raise ValueError("the measured times do not grow with message size; cannot fit a bandwidth")
    return Link(latency_s, 1.0 / seconds_per_byte)


def link_from_tuning_table(path, op="all_reduce"):
    """Fit a link to the chosen backend's latencies in mcr's tuning table (``python -m mcr.tools.tune``).

    Each entry's ``latency_us`` was measured at ``latency_at_bytes`` (older tables: taken as the
    geometric middle of [min_bytes, max_bytes)). An all-reduce row over a group of g ranks is
    converted to one ring hop."""
    try:
        with open(path) as f:
            table = yaml.safe_load(f)
    except OSError as err:
        raise ValueError(f"cannot read tuning table {path}: {err}; write one with `python -m mcr.tools.tune`") from err
    if not isinstance(table, dict) or table.get("format") != "mcr-tuning-table":
        raise ValueError(f"{path} is not an mcr tuning table (no 'format: mcr-tuning-table')")
    rows = [e for e in table.get("entries", []) if e.get("op") == op and e.get("backend") in e.get("latency_us", {})]
    points, group = [], 2
    for e in rows:
        low, high = max(e["min_bytes"], 1), e.get("max_bytes")
        size = e.get("latency_at_bytes") or ((low * high) ** 0.5 if high else low)
        points.append((size, e["latency_us"][e["backend"]] * 1e-6))
        group = e.get("group_size", group)
    if len(points) < 2:
        raise ValueError(f"{path} has fewer than two measured {op} rows; cannot fit latency and bandwidth")
    fitted = fit_link(points)
    if op == "all_reduce":  # the table times a whole ring; the cluster describes one hop
        steps = 2 * (group - 1)
        return Link(fitted.latency_s / steps, fitted.bandwidth_Bps * steps / group)
    return fitted
