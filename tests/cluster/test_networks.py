"""Nodes with two networks: a job from a system file that names the fast interface sends gloo's
and Open MPI's data over it (per-interface byte counters), and a missing, loopback or
unconnected interface, or none where hostnames resolve to 127.0.1.1, stops the job with a
message naming the variable to set."""

from __future__ import annotations

import os
import re
import sys

import pytest

from launch.scripts import Job, write_script
from launch.systems import load_system
from tests.cluster.nodes import FAST_IFACE, sh
from tests.cluster.slurm import ClusterSlurm
from tests.launch.test_slurm import DEADLINE_S, read

MIB = 1 << 20


def system_file(path, interface: str) -> str:
    path.write_text(
        f"scheduler: slurm\nranks_per_node: 2\ncpus_per_task: 1\ninterface: {interface}\n"
        "env:\n  PMIX_MCA_psec: native\n"
    )
    return str(path)


def test_a_job_whose_system_names_the_fast_interface_sends_gloo_and_mpi_data_over_it(cluster_2net, tmp_path):
    slurm = ClusterSlurm(cluster_2net)
    system = load_system(system_file(tmp_path / "two-net.yaml", FAST_IFACE))
    job = Job(system, 2, 600, str(tmp_path / "job"), "traffic", "traffic", [], "tests.cluster.traffic")
    job_id = slurm.submit(write_script(job), cwd=job.job_dir)
    state = slurm.wait([job_id], DEADLINE_S)[job_id]
    out = read(os.path.join(job.job_dir, f"job-{job_id}.out"))
    assert state == "DONE", out[-3000:]
    sent = {(b, i): int(tx) for b, i, _, tx in re.findall(r"traffic: (\w+) (\w+) rx (\d+) tx (\d+)", out)}
    for backend in ("mpi", "gloo"):
        # node1 must send node2 its partial sums of every element: 2 x 16 MiB at least, all on eth1
        assert sent[(backend, FAST_IFACE)] >= 2 * 16 * MIB, (backend, sent)
        assert sent[(backend, "eth0")] < MIB, (backend, sent)  # the management network carries no data


def probe(cluster, env: dict, timeout: float = 120):
    args = ["-N2", "-n2", "--mpi=pmix", sys.executable, "-m", "tests.launch.probe", "backends=mpi,gloo"]
    return ClusterSlurm(cluster).srun(*args, env={"MCR_WATCHDOG_TIMEOUT": "60", **env}, timeout=timeout)


def test_with_no_interface_named_gloo_would_use_127_0_1_1_and_the_job_says_to_set_gloo_socket_ifname(cluster_2net):
    result = probe(cluster_2net, {})
    assert result.returncode != 0
    assert "GLOO_SOCKET_IFNAME unset, so the address node1 resolves to: on node1 that is 127.0.1.1" in result.output
    assert "Set GLOO_SOCKET_IFNAME to the interface of the network that joins them" in result.output


@pytest.mark.parametrize(
    "env,message",
    [
        (
            {"GLOO_SOCKET_IFNAME": "eth9"},
            "GLOO_SOCKET_IFNAME=eth9: node1 has no interface 'eth9' (it has lo 127.0.0.1, eth0",
        ),
        ({"GLOO_SOCKET_IFNAME": "lo"}, "GLOO_SOCKET_IFNAME=lo: on node1 that is loopback only"),
        (
            {"GLOO_SOCKET_IFNAME": FAST_IFACE, "OMPI_MCA_btl_tcp_if_include": "eth9"},
            "OMPI_MCA_btl_tcp_if_include=eth9: node2 has no interface 'eth9'",  # was MPI_ERR_INTERN in MPI's start
        ),
        (
            {"GLOO_SOCKET_IFNAME": FAST_IFACE, "OMPI_MCA_btl_tcp_if_include": "lo"},
            "OMPI_MCA_btl_tcp_if_include=lo: on node2 that is loopback only",  # was a hang in MPI's start
        ),
    ],
    ids=["gloo-missing", "gloo-loopback", "mpi-missing", "mpi-loopback"],
)
def test_a_wrong_interface_stops_the_job_naming_the_variable(cluster_2net, env, message):
    result = probe(cluster_2net, env)
    assert result.returncode != 0 and message in result.output, result.output[-3000:]


def test_a_fast_network_that_does_not_join_the_nodes_stops_the_job_naming_gloo_socket_ifname(cluster_2net):
    link = cluster_2net.link("node2", "fast")
    sh("ip", "link", "set", link, "down")  # node2's eth1 no longer reaches the fast bridge
    try:
        result = probe(cluster_2net, {"GLOO_SOCKET_IFNAME": FAST_IFACE, "OMPI_MCA_btl_tcp_if_include": "eth0"})
    finally:
        sh("ip", "link", "set", link, "up")
    assert result.returncode != 0, result.output[-3000:]
    address = cluster_2net.address("node1", "fast")
    assert f"GLOO_SOCKET_IFNAME=eth1: node2 cannot reach node1 at {address}" in result.output, result.output[-3000:]
