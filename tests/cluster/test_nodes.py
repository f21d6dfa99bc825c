"""The cluster itself: nodes look like separate machines, links can be slowed, and nothing it
made outlives it, whether the test using it failed or its own start did."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.cluster.conftest import require_cluster
from tests.cluster.nodes import Cluster, ClusterError, sh
from tests.ranks import REPO


def namespaces_and_links(prefix: str) -> str:
    found = sh("ip", "netns", "list").stdout + sh("ip", "-o", "link").stdout
    return "\n".join(line for line in found.splitlines() if f"{prefix}-" in line)


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"  # a zombie has ended
    except OSError:
        return False


def test_without_root_the_cluster_tests_skip_saying_why(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.skip.Exception, match="need root"):
        require_cluster()


def test_as_root_a_missing_tool_fails_the_cluster_tests_naming_it(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # as CI runs them
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *args: None if name == "nsenter" else which(name, *args))
    with pytest.raises(pytest.fail.Exception, match="nsenter not found"):
        require_cluster(slurm=False)


def test_each_node_has_its_own_hostname_hosts_file_and_tmp(cluster, tmp_path):
    (tmp_path / "shared.txt").write_text("on every node")
    mine = f"/tmp/mine-{os.getpid()}"
    for node in cluster.nodes:
        cluster.run(node, ["sh", "-c", f"echo {node} > {mine}"])
    for node, other in zip(cluster.nodes, reversed(cluster.nodes)):
        assert cluster.run(node, ["hostname"]).stdout.strip() == node
        assert cluster.run(node, ["getent", "hosts", other]).stdout.split()[0] == cluster.address(other)
        assert cluster.run(node, ["cat", mine]).stdout.strip() == node  # its own /tmp
        assert cluster.run(node, ["cat", str(tmp_path / "shared.txt")]).stdout == "on every node"  # shared paths
    assert not os.path.exists(mine)  # the machine's /tmp untouched


def test_a_rate_limits_every_link_between_nodes(tmp_path):
    require_cluster(slurm=False)
    receive = textwrap.dedent("""
        import socket, sys, time
        server = socket.create_server(("", 5001))
        print("listening", flush=True)
        conn, _ = server.accept()
        start, got = time.monotonic(), 0
        while chunk := conn.recv(1 << 16):
            got += len(chunk)
        print(got, time.monotonic() - start, flush=True)
    """)
    send = "import socket, sys; socket.create_connection((sys.argv[1], 5001)).sendall(bytes(int(sys.argv[2])))"
    seconds = {}
    sizes = {None: 4 << 20, "40mbit": 4 << 20, "2gbit": 2 << 20}
    for rate, size in sizes.items():
        nodes = Cluster(str(tmp_path / f"rate-{rate}"), 2, 1, rate=rate)
        try:
            nodes.up()
            receiver = nodes.popen("node2", [sys.executable, "-c", receive], stdout=subprocess.PIPE, text=True)
            assert receiver.stdout.readline() == "listening\n"
            nodes.run("node1", [sys.executable, "-c", send, nodes.address("node2"), str(size)], timeout=60)
            got, seconds[rate] = receiver.communicate(timeout=60)[0].split()
            assert int(got) == size
        finally:
            nodes.down()
    # 4 MiB at 40 Mbit/s: 0.84 s (less the first burst); unlimited, a veth pair moves it in milliseconds
    assert float(seconds["40mbit"]) > 0.6 and float(seconds[None]) < 0.3, seconds
    # 2 MiB at 2 Gbit/s: 7.3 ms after the burst (256 KiB) passes at once; a burst of 10 ms of
    # traffic (2.5 MB) would pass all of it at the veth's speed
    assert float(seconds["2gbit"]) > 0.005, seconds


def test_a_failing_test_leaves_no_namespace_link_or_process_behind(tmp_path):
    """A session whose only test fails with the cluster up, SLURM's daemons started (and never
    stopped) and a process of its own still running on node2: once that session ends, nothing of
    the cluster is left."""
    require_cluster()
    (tmp_path / "conftest.py").write_text("from tests.cluster.conftest import cluster  # noqa: F401\n")
    (tmp_path / "test_inner.py").write_text(
        textwrap.dedent("""
        import json, os
        from tests.cluster.slurm import ClusterSlurm

        def test_fails_with_the_cluster_up(cluster):
            ClusterSlurm(cluster).start()
            left = cluster.popen("node2", ["sleep", "600"])
            pids = [p for node in cluster.keepers for p in cluster.pids(node)]
            with open(os.environ["RECORD"], "w") as f:
                json.dump({"prefix": cluster.prefix, "pids": pids, "left": left.pid}, f)
            raise RuntimeError("the test fails with the cluster up")
    """)
    )
    record = tmp_path / "record.json"
    env = dict(os.environ, PYTHONPATH=REPO, RECORD=str(record))
    inner = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "base")]
    proc = subprocess.run(inner, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "RuntimeError: the test fails with the cluster up" in proc.stdout, proc.stdout
    made = json.loads(record.read_text())
    assert len(made["pids"]) >= 3 + 3  # 3 keepers, slurmctld, a slurmd per node
    assert not namespaces_and_links(made["prefix"])
    assert not [pid for pid in [*made["pids"], made["left"]] if running(pid)]


def test_a_cluster_whose_session_was_killed_goes_when_the_next_session_starts(tmp_path):
    """A session SIGKILLed with its cluster up (a CI timeout; its teardown never runs) leaves the
    cluster and a process on node2; the next session's fixture removes them before making its own,
    and leaves a cluster made from the command line (which outlives its maker) alone."""
    require_cluster(slurm=False)
    kept = Cluster(str(tmp_path / "cli"), 1, 1).up()  # as `python -m tests.cluster up` makes it
    (tmp_path / "conftest.py").write_text("from tests.cluster.conftest import cluster  # noqa: F401\n")
    (tmp_path / "test_inner.py").write_text(
        textwrap.dedent("""
        import json, os, signal

        def test_killed_with_the_cluster_up(cluster):
            if os.path.exists(os.environ["RECORD"]):
                return  # the next session: its fixture has run
            left = cluster.popen("node2", ["sleep", "600"])
            pids = [p for node in cluster.keepers for p in cluster.pids(node)]
            with open(os.environ["RECORD"], "w") as f:
                json.dump({"prefix": cluster.prefix, "pids": pids, "left": left.pid}, f)
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    )
    record = tmp_path / "record.json"
    env = dict(os.environ, PYTHONPATH=REPO, RECORD=str(record))
    inner = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "base")]
    try:
        killed = subprocess.run(inner, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert killed.returncode == -signal.SIGKILL, killed.stdout
        made = json.loads(record.read_text())
        assert namespaces_and_links(made["prefix"]) and running(made["left"])  # left behind
        shutil.rmtree(tmp_path / "base")
        following = subprocess.run(inner, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert following.returncode == 0, following.stdout
        assert not namespaces_and_links(made["prefix"])
        assert not [pid for pid in [*made["pids"], made["left"]] if running(pid)]
        assert namespaces_and_links(kept.prefix)
    finally:
        kept.down()


def test_a_failed_up_removes_what_it_had_made(tmp_path, monkeypatch):
    require_cluster(slurm=False)
    add_node = Cluster._add_node

    def node2_fails(self, node, deadline_s):
        if node == "node2":
            raise ClusterError("node2 cannot be made")
        add_node(self, node, deadline_s)

    monkeypatch.setattr(Cluster, "_add_node", node2_fails)
    nodes = Cluster(str(tmp_path), 2, 1)
    with pytest.raises(ClusterError, match="node2 cannot be made"):
        nodes.up()
    made = list(nodes.keepers.values())
    assert len(made) == 2  # head and node1 had been made
    assert not namespaces_and_links(nodes.prefix) and not [pid for pid in made if running(pid)]


def test_the_cli_replaces_a_cluster_runs_on_a_node_and_takes_it_down_twice(tmp_path):
    require_cluster(slurm=False)

    def cli(*args):
        cmd = [sys.executable, "-m", "tests.cluster", *args[:1], "--state", str(tmp_path), *args[1:]]
        return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)

    first = cli("up", "--no-slurm", "--nodes", "2")
    assert first.returncode == 0, first.stderr
    first_prefix = json.loads((tmp_path / "cluster.json").read_text())["prefix"]
    second = cli("up", "--no-slurm", "--nodes", "3")  # up again: the first cluster goes
    assert second.returncode == 0, second.stderr
    prefix = json.loads((tmp_path / "cluster.json").read_text())["prefix"]
    try:
        assert not namespaces_and_links(first_prefix) and namespaces_and_links(prefix)
        on_node3 = cli("run", "node3", "--", "hostname")
        assert (on_node3.returncode, on_node3.stdout) == (0, "node3\n"), on_node3.stderr
        rsh = subprocess.run([str(tmp_path / "rsh"), "-x", "node2", "hostname"], capture_output=True, text=True)
        assert rsh.stdout == "node2\n", rsh.stderr  # Open MPI's way in: ssh options first
    finally:
        down = cli("down")
    assert down.returncode == 0 and cli("down").returncode == 0, down.stderr
    assert not namespaces_and_links(prefix)


@pytest.mark.skipif(os.environ.get("TESTS_FORKSERVER") == "0", reason="TESTS_FORKSERVER=0: every rank fresh")
def test_each_rank_forks_from_the_server_on_its_own_node(cluster_slurm):
    # the client finds its node's server by the hostname: one on the wrong node would run the rank
    # in that node's namespaces, under that node's name
    probe = os.path.join(REPO, "tests", "cluster", "fork_probe.py")
    out = cluster_slurm.srun("-N2", "-n4", "--mpi=pmix", cluster_slurm.python, probe).check().output
    seen = sorted(line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("fork-probe: "))
    assert seen == [f"rank {r} on node{1 + r // 2} forked True" for r in range(4)], out[-3000:]
