"""The mixing rules across nodes, with the progress thread off so that nothing but the rules
moves MPI: a rank blocked in gloo keeps its async MPI ops moving (rule 3), and random
interleavings of sync and async ops over every backend complete with the right results.

Across nodes MPI runs over TCP, where a large message moves only while both ranks are inside
MPI calls; on one node the shared-memory transport copies it without the peer's help. So a
broken rule 3 (a rank blocked in gloo no longer driving MPI) deadlocks here while the
single-node test (tests/mcr/test_robustness.py) still passes: these are its guard.
"""

import os
import sys

import pytest

from tests.mcr.test_robustness import SCRIPTS, assert_every_op_checked, size_split_table

# nothing drives MPI behind the rules' back; a deadlock becomes the watchdog's failure naming the op
ENV = {"MCR_PROGRESS_THREAD": "0", "MCR_WATCHDOG_TIMEOUT": "60"}


def test_a_rank_blocked_in_gloo_keeps_its_async_mpi_ops_moving_across_nodes(cluster_slurm):
    # one rank per node: rank 1 waits for an MPI op that needs rank 0's progress while rank 0 waits in gloo
    result = cluster_slurm.srun(
        "-N2", "-n2", "--mpi=pmix", sys.executable, os.path.join(SCRIPTS, "cross_progress.py"), env=ENV
    )
    out = result.check().output
    assert out.count("cross progress OK") == 2 and out.count(": OK") == 8, out[-3000:]


@pytest.mark.parametrize("table", [False, True], ids=["builtin-choice", "size-dependent-table"])
def test_random_interleaving_of_mixed_ops_completes_across_nodes(cluster_slurm, tmp_path, table):
    args = [1000, 21] + ([size_split_table(tmp_path / "table.yaml", 4)] if table else [])
    script = os.path.join(SCRIPTS, "stress.py")
    result = cluster_slurm.srun("-N2", "-n4", "--mpi=pmix", sys.executable, script, *map(str, args), env=ENV)
    assert_every_op_checked(result.check().output, 4, 1000)
