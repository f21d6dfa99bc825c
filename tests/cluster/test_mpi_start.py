"""No rank sends before every rank has finished MPI_Init (mcr.backends.pmix_fence).

Rank 0 hears of each PMIx fence a second late (late_fence.c, preloaded into it alone), as a rank
does whose node learns of the fence last. Under SLURM the ranks of node2 then leave MPI_Init while
rank 0 is still inside it; mcr's start of MPI must hold them until rank 0 is out."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

HELD_US = 1_000_000
ROW = r"mpi start: rank (\d) host (\S+) init ([\d.]+) started ([\d.]+)"
HERE = "tests/cluster"


def build_shim(tmp_path) -> str:
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build tests/cluster/late_fence.c")
    shim = str(tmp_path / "late_fence.so")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", shim, f"{HERE}/late_fence.c", "-ldl"], check=True)
    return shim


def test_mcrs_mpi_start_holds_every_rank_until_the_last_has_left_mpi_init(cluster_slurm, tmp_path):
    shim = build_shim(tmp_path)
    rank0_late = f'if [ "$SLURM_PROCID" = 0 ]; then export LD_PRELOAD={shim} LATE_FENCE_US={HELD_US}; fi; exec "$@"'
    probe = [sys.executable, "-m", "tests.cluster.mpi_start_probe"]
    out = cluster_slurm.srun("-N2", "-n4", "--mpi=pmix", "sh", "-c", rank0_late, "sh", *probe).check().output
    rows = {int(r): (host, float(init), float(started)) for r, host, init, started in re.findall(ROW, out)}
    assert sorted(rows) == [0, 1, 2, 3], out[-3000:]
    assert out.count("late fence: held") >= 4, out[-3000:]  # MPI_Init's fences on rank 0, each held
    rank0_host, rank0_init, _ = rows[0]
    # the hazard is there: a rank of the other node left MPI_Init (where SLURM lets it) well before rank 0
    other_node = {r: row for r, row in rows.items() if row[0] != rank0_host}
    assert other_node and min(init for _, init, _ in other_node.values()) < rank0_init - HELD_US / 2e6, rows
    early = {r: round(rank0_init - started, 3) for r, (_, _, started) in rows.items() if started < rank0_init}
    assert not early, f"ranks out of mcr's MPI start this many s before rank 0 left MPI_Init: {early}\n{rows}"
