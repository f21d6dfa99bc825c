"""`python -m mcr.tools.bench_hooks` on a real 2-rank job: its three tables are there, whole, and
their derived columns follow from the measured ones. No time is compared with another: which
path is faster is what the command measures (on a quiet machine), not what this test checks: on
a busy one the gaps shrink past any margin (a CI run beside other work: 42.4 µs a call on mcr
against 33.4 on a backend doing nothing, 2.6-3.8x apart when quiet)."""

import re

from tests.ranks import run_ranks

ISSUE_SIZES = [16, 1024, 4096, 16384, 65536, 1048576]


def _rows(out: str, title: str, count: int) -> list[list[str]]:
    """The `count` rows under the table whose title line starts with `title` (after its header and rule)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# " + title))
    rule = next(i for i in range(start, len(lines)) if set(lines[i]) == {"-"})
    return [line.split() for line in lines[rule + 1 : rule + 1 + count]]


def _is_ratio(printed: str, a: float, b: float) -> bool:
    """Whether `printed` (2 decimals) is a / b, where a and b were printed rounded to 2 decimals."""
    r = a / b
    return abs(float(printed) - r) <= 0.0051 + r * (0.0051 / a + 0.0051 / b)


def test_bench_hooks_prints_each_path_the_issue_cost_and_torchs_own_floor():
    args = ["--iters", "400", "--repeat", "1", "--issue-trains", "3"]
    out = run_ranks(2, ["-m", "mcr.tools.bench_hooks", *args], timeout=600).check().output

    per_call = _rows(out, 'backend "mcr" overhead', 6)
    labels = [" ".join(r[:-2]) for r in per_call]
    assert labels == [
        "mpi library",
        "mpi library async+wait",
        "mcr.all_reduce",
        "ProcessGroup.allreduce",
        "dist.all_reduce",
        "functional (C++ caller)",
    ], out[-4000:]
    library = float(per_call[0][-2])
    for row in per_call:  # "over library" is the row's time less the library's
        assert float(row[-2]) > 0 and abs(float(row[-1]) - (float(row[-2]) - library)) < 0.015, row

    issue = _rows(out, "async issue cost", len(ISSUE_SIZES))
    assert [int(r[0]) for r in issue] == ISSUE_SIZES, out[-4000:]
    for size, backend, issued, blocking, ratio, lib_issued, lib_blocking, lib_ratio, nothing_ratio, bound in issue:
        assert backend == "mpi" and float(issued) > 0 and float(blocking) > 0, size
        assert _is_ratio(ratio, float(issued), float(blocking)), (size, issued, blocking, ratio)
        assert _is_ratio(lib_ratio, float(lib_issued), float(lib_blocking)), (size, lib_issued, lib_blocking)
        for printed in (nothing_ratio, bound):  # may print 0.00: a blocking op 200x its issue (CI under load)
            assert re.fullmatch(r"\d+\.\d\d", printed), (size, printed)
        # a sum's ratio lies between its parts' ratios (times unprinted: only that can be checked)
        low, high = sorted((float(lib_ratio), float(nothing_ratio)))
        assert low - 0.01 <= float(bound) <= high + 0.01, (size, lib_ratio, nothing_ratio, bound)

    floor = _rows(out, "torch's own cost", 3)
    assert [" ".join(r[:-5]) for r in floor] == ["dist.all_reduce", "dist.all_reduce async+wait", "functional+wait"]
    dist_mcr, dist_nothing = float(floor[0][-5]), float(floor[0][-4])
    for row in floor:
        on_mcr, on_nothing, less = map(float, row[-5:-2])
        assert on_mcr > 0 and on_nothing > 0 and abs(less - (on_mcr - on_nothing)) < 0.015, row
        assert _is_ratio(row[-2], on_mcr, dist_mcr) and _is_ratio(row[-1], on_nothing, dist_nothing), row
    assert out.count("# machine: load average ") == 1, out[-3000:]  # rank 0's alone
