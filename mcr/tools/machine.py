"""How busy this node was while a benchmark ran: the line every benchmark prints at its end.

A figure taken on a busy machine says nothing about the code, so each benchmark reports, beside
its tables, the load average at its start and end and the CPU time the hypervisor took from
this virtual machine meanwhile (steal time, from /proc/stat): a node where other tenants run
looks idle by its load average, yet its collectives can slow down several times over. Only the
node of the rank that prints (rank 0) is reported.
"""

from __future__ import annotations

import os
import time

STAT = "/proc/stat"
STEAL = 7  # the 8th number of /proc/stat's "cpu" line (after user, nice, system, idle, iowait, irq, softirq)


def cpu_times(stat_text: str) -> list[int]:
    """The numbers of /proc/stat's aggregate "cpu" line (jiffies), [] where there is none."""
    for line in stat_text.splitlines():
        words = line.split()
        if words and words[0] == "cpu":
            return [int(w) for w in words[1:]]
    return []


def steal_share(before: list[int], after: list[int]) -> float | None:
    """The share of CPU time stolen between two `cpu_times`; None where the kernel reports none.
    Guest time is already counted in user and nice, so only the first 8 columns make the total."""
    if len(before) <= STEAL or len(after) <= STEAL:
        return None
    total = sum(after[: STEAL + 1]) - sum(before[: STEAL + 1])
    return (after[STEAL] - before[STEAL]) / total if total > 0 else 0.0


def _read_cpu_times() -> list[int]:
    try:
        with open(STAT) as f:
            return cpu_times(f.read())
    except OSError:  # not Linux: no steal figure
        return []


class Watch:
    """Started where a benchmark starts; `line()` at its end."""

    def __init__(self):
        self._started = time.monotonic()
        self._load = os.getloadavg()
        self._cpu = _read_cpu_times()

    def line(self) -> str:
        load_now = os.getloadavg()
        steal = steal_share(self._cpu, _read_cpu_times())
        stolen = "no steal figure" if steal is None else f"CPU steal {100 * steal:.1f}%"
        return (
            f"# machine: load average {' '.join(f'{v:.2f}' for v in self._load)} at start, "
            f"{' '.join(f'{v:.2f}' for v in load_now)} at end; {stolen} "
            f"over {time.monotonic() - self._started:.0f} s (rank 0's node)"
        )
