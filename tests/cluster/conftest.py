"""Session fixtures: one emulated cluster of 2 nodes x 2 ranks (tests/cluster/nodes.py) with a
multi-node SLURM on it, shared by every test here and removed at the end, failed tests or not
(and by the next session, if this one is killed); and, for the tests that need them, a second one
whose nodes have two networks.

Elsewhere than as root they skip, naming what is missing; as root (CI runs the suite as root
and installs SLURM) a missing piece fails them, as the single-node SLURM tests do.
"""

from __future__ import annotations

import os

import pytest

from tests.cluster.nodes import Cluster, missing, remove_orphans
from tests.cluster.slurm import ClusterSlurm
from tests.launch import slurm_cluster
from tests.launch.conftest import ops_cache, write_test_system  # noqa: F401 (ops_cache: a fixture used here)

NODES, RANKS_PER_NODE = 2, 2


def require_cluster(slurm: bool = True) -> None:
    why = missing() or (slurm_cluster.missing() if slurm else None)
    if why:
        if os.geteuid() == 0:  # CI: root, with SLURM installed by `make slurm-deps`
            pytest.fail(why)
        pytest.skip(why)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """node1, node2 (and head); every test's tmp_path, the checkout and the venv are visible on
    each node at the same path (they may lie under /tmp, which each node has its own of)."""
    require_cluster()
    nodes = _up(tmp_path_factory, "cluster")
    try:
        yield nodes.up()
    finally:
        nodes.down()


def _up(tmp_path_factory, name, **kwargs):
    remove_orphans()  # what a killed session left (its teardown never ran) goes first
    shared = [str(tmp_path_factory.getbasetemp())]
    state = str(tmp_path_factory.mktemp(name))
    return Cluster(state, NODES, RANKS_PER_NODE, shared=shared, session_owned=True, **kwargs)


@pytest.fixture(scope="session")
def cluster_2net(tmp_path_factory):
    """2 x 2 nodes with a management network (eth0: hostnames, each node's own on 127.0.1.1) and a
    fast one (eth1), with SLURM; the fast links unlimited, as the other cluster's."""
    require_cluster()
    nodes = _up(tmp_path_factory, "cluster2net", fast_network=True)
    try:
        nodes.up()
        ClusterSlurm(nodes).start()
        yield nodes
    finally:
        nodes.down()


@pytest.fixture(scope="session")
def cluster_slurm(cluster, tmp_path_factory):
    """slurmctld on head, a slurmd per node; the cluster's teardown ends them with everything else.
    Its `python` is what the ranks run: a fork server's client, a server on each node."""
    slurm = ClusterSlurm(cluster)
    slurm.start()
    if os.environ.get("TESTS_FORKSERVER") != "0":
        slurm.use_fork_servers(str(tmp_path_factory.mktemp("forkserver")))
    return slurm


@pytest.fixture(scope="session")
def cluster_system(cluster_slurm, ops_cache, tmp_path_factory):  # noqa: F811
    """The `local` system (2 ranks a node) for `launch submit` on the cluster."""
    return write_test_system(tmp_path_factory.mktemp("system") / "local-test.yaml", ops_cache)
