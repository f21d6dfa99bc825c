"""Every op on every backend and on the automatic choice, on real ranks."""

import os
import re

import pytest

from tests.ranks import run_script

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


def expected_checks(rank: int, nprocs: int, num_backends: int, groups=(), node_aware: int = 0) -> int:
    """How many results check_ops.py compares on `rank`: one per op and tensor, counted here
    from the script's plan (world, the subgroup {0, odd ranks}, a singleton, and the `groups`
    given on its command line) so that a skipped op or a lost comparison fails the test.
    `node_aware`: how many node-aware candidates it was given (they run instead of the backends)."""
    runs = node_aware or num_backends + 1  # each backend and the automatic choice

    def per_group(ranks):
        g, last = len(ranks), rank == ranks[-1]  # ranks[-1] is the root of reduce and gather
        reduce_checks = 3 * 5 + 2 * 4  # reduce ops over the float (5 ops) and int (4: no avg) dtypes
        per_reduce_op = 3 + last  # all_reduce, reduce_scatter_tensor, reduce_scatter; reduce at the root
        # broadcast, all_gather (g), all_gather_into_tensor, gather at the root (g), scatter,
        # even and uneven all_to_all_single, list all_to_all (g), send/recv when g > 1
        others = 1 + g + 1 + (g if last else 0) + 1 + 2 + g + (g > 1)
        per_backend = reduce_checks * per_reduce_op + 5 * others  # 5 dtypes
        return 2 * runs * per_backend  # sync and async

    sub = sorted({0} | set(range(1, nprocs, 2)))
    extra = sum(per_group(sorted(g)) for g in groups if rank in g)
    return per_group(list(range(nprocs))) + (per_group(sub) if rank in sub else 0) + per_group([rank]) + extra


@pytest.mark.parametrize(
    "nprocs,launcher,backends",
    [(2, "mpiexec", "['mpi', 'gloo']"), (3, "mpiexec", "['mpi', 'gloo']"), (2, "torchrun", "['gloo']")],
    ids=["2-ranks-mpiexec", "3-ranks-mpiexec", "2-ranks-torchrun"],
)
def test_every_op_matches_local_reference(nprocs, launcher, backends):
    out = run_script(nprocs, os.path.join(SCRIPTS, "check_ops.py"), launcher=launcher).check().output
    oks = re.findall(r"rank (\d+): OK (\d+) checks on backends (\[[^\]]*\])", out)  # ranks may share a line
    assert sorted(int(r) for r, _, _ in oks) == list(range(nprocs)), out[-3000:]
    for r, count, found in oks:
        assert found == backends and int(count) == expected_checks(int(r), nprocs, len(backends.split(","))), oks
    # every op and dtype runs where asked: 16-bit reductions on MPI too (mcr's own MPI ops), no fallback
    assert "cannot run" not in out, out[-3000:]
    if launcher == "mpiexec":  # on the MPI asked for: `make test-mpi` runs this on MPICH and Intel MPI
        library = os.environ.get("EXPECTED_MPI", "Open MPI")
        assert f"backends mpi ({library}" in out, f"not on {library}:\n{out[-3000:]}"


def test_torchrun_reports_mpi_unavailable_once():
    out = run_script(2, os.path.join(SCRIPTS, "check_ops.py"), launcher="torchrun").check().output
    assert out.count("mpi: launched by torchrun, which gives no MPI world") == 1, out[-2000:]


NODE_AWARE = ["node:mpi+gloo", "node:gloo+mpi", "node:mpi+mpi"]


def test_forced_node_aware_candidates_match_local_reference_on_one_node_and_log_under_their_label():
    # one node of 4 ranks: the node-aware ops run their intra-node phases (the inter-node ones on
    # groups of one); groups [0, 1] and [2, 3] as well, and the subgroup {0, 1, 3}
    out = run_script(4, os.path.join(SCRIPTS, "check_ops.py"), *NODE_AWARE, "0,1", "2,3", timeout=400)
    out = out.check().output
    oks = re.findall(r"rank (\d+): OK (\d+) checks", out)
    assert sorted(int(r) for r, _ in oks) == [0, 1, 2, 3], out[-3000:]
    for r, count in oks:
        assert int(count) == expected_checks(int(r), 4, 2, [[0, 1], [2, 3]], node_aware=len(NODE_AWARE)), oks
    assert "cannot run" not in out, out[-3000:]
    # the comm log shows the caller's op under its candidate's label, never its phases
    rows = re.findall(r"^(\w+) +(node:\S+) ", out, re.M)
    assert {op for op, _ in rows} == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}, rows
    assert {label for _, label in rows} == set(NODE_AWARE) and " via node:" not in out, out[-3000:]
    # the ops without a node-aware form said so once each, and ran flat
    assert out.count("node:mpi+gloo (asked for by backend=) has no node-aware broadcast; running broadcast flat") == 1
