"""The machine line the benchmarks print: steal time read from /proc/stat's "cpu" line."""

import re

import pytest

from mcr.tools.machine import Watch, cpu_times, steal_share

# user nice system idle iowait irq softirq steal guest guest_nice, as the kernel writes them
BEFORE = "cpu  1000 10 500 8000 40 0 50 100 300 0\ncpu0 500 5 250 4000 20 0 25 50 150 0\nintr 1 2 3\n"
AFTER = "cpu  1600 10 700 8900 40 0 50 400 900 0\ncpu0 800 5 350 4450 20 0 25 200 450 0\nintr 4 5 6\n"


def test_cpu_times_reads_the_aggregate_line_only():
    assert cpu_times(BEFORE) == [1000, 10, 500, 8000, 40, 0, 50, 100, 300, 0]
    assert cpu_times("intr 1 2 3\n") == []


def test_steal_is_its_share_of_the_cpu_time_between_two_readings():
    # 2000 jiffies passed (600 user + 200 system + 900 idle + 300 steal); guest time (600 more) is
    # already inside user and must not be counted twice
    assert steal_share(cpu_times(BEFORE), cpu_times(AFTER)) == pytest.approx(300 / 2000)
    assert steal_share(cpu_times(BEFORE), cpu_times(BEFORE)) == 0.0
    assert steal_share([1, 2, 3, 4], [5, 6, 7, 8]) is None  # an old kernel: no steal column


def test_the_line_names_load_at_start_and_end_and_steal():
    line = Watch().line()
    assert re.fullmatch(
        r"# machine: load average (\d+\.\d\d ){3}at start, (\d+\.\d\d ){3}at end; "
        r"(CPU steal \d+\.\d%|no steal figure) over \d+ s \(rank 0's node\)",
        line,
    ), line
