"""Per-backend communication log, in the spirit of DeepSpeed's comms logger.

For each (op, backend, message size) the caller asked for: count and total latency, from which
the mean, the algorithmic bandwidth (bytes / time) and the bus bandwidth (nccl-tests' factors)
follow. An op the runtime ran in chunks shows once, whole, under its candidate (`mpi/chunk=1M`).
"""

from __future__ import annotations

import json

from .files import write_atomic
from .ops import bus_factor


class CommLog:
    def __init__(self):
        self._rows = {}  # (op, backend, nbytes, group_size) -> [count, total_s]

    def record(self, op, seconds: float) -> None:
        """`op`: a tuple (op, backend, nbytes, group_size), such as the runtime's OpCall, used
        as the key as it is (the hot path builds no tuple)."""
        row = self._rows.get(op)
        if row is None:
            self._rows[tuple(op)] = [1, seconds]
        else:
            row[0] += 1
            row[1] += seconds

    def rows(self) -> list:
        out = []
        for (op, backend, nbytes, n), (count, total) in sorted(self._rows.items()):
            mean = total / count
            algbw = nbytes / mean / 1e9 if mean > 0 else 0.0
            out.append(
                {
                    "op": op,
                    "backend": backend,
                    "bytes": nbytes,
                    "group_size": n,
                    "count": count,
                    "total_ms": total * 1e3,
                    "mean_us": mean * 1e6,
                    "algbw_GBps": algbw,
                    "busbw_GBps": algbw * bus_factor(op, n),
                }
            )
        return out

    def table(self) -> str:
        header = f"{'op':<15}{'backend':<14}{'size':>10}{'ranks':>6}{'count':>8}{'total ms':>11}{'mean us':>11}{'algbw GB/s':>12}{'busbw GB/s':>12}"
        lines = [header, "-" * len(header)]
        for r in self.rows():
            lines.append(
                f"{r['op']:<15}{r['backend']:<14}{human_bytes(r['bytes']):>10}{r['group_size']:>6}{r['count']:>8}"
                f"{r['total_ms']:>11.2f}{r['mean_us']:>11.1f}{r['algbw_GBps']:>12.3f}{r['busbw_GBps']:>12.3f}"
            )
        return "\n".join(lines)

    def write_json(self, path: str) -> None:
        write_atomic(path, json.dumps(self.rows(), indent=1))


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g}{unit}" if unit == "B" else f"{n:.0f}{unit}" if n == int(n) else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)
