"""Nodes of an emulated cluster on this one machine: Linux namespaces on a bridge.

Each node is a network namespace with its own hostname (UTS namespace), its own /tmp and an
/etc/hosts naming every node (mount namespace), joined by a veth pair (its eth0) to a bridge; the
`head` node holds the controller daemons. Links between nodes can be rate-limited with tc tbf
(netem, for delay, is missing from this kernel).

With `fast_network`, the nodes look like real cluster nodes with two networks: eth0 on the
management bridge, where hostnames resolve (and each node's own hostname to 127.0.1.1, as
Debian's installer writes it), and eth1 on a second bridge, the fast network (`nodeN-fast` in
the hosts file); `rate` then limits the fast links and `mgmt_rate` the management ones. A job
that names no interface talks over whatever the hostnames give (gloo: its own node's 127.0.1.1,
so it cannot reach the others; Open MPI: both networks); the system file's `interface` makes
gloo and Open MPI use eth1. Paths under /tmp named as `shared` (the state dir, the
test session's temp dir) appear at the same path on every node, as a cluster's shared file
system would; everything else a node writes to /tmp stays its own.

A "keeper" process (`sleep infinity`) holds each node's UTS and mount namespaces; a command
runs on a node by entering the keeper's namespaces (`nsenter`, not `ip netns exec`, which
remounts /sys and hides the cgroup mount slurmd needs). Every process the cluster makes runs in
one of its network namespaces, so `down` finds them all there, even when `up` failed before
recording them; every namespace and link is named after the cluster's prefix, so `down` finds
those the same way. `up` on a state dir that holds a cluster first removes it.

    cluster = Cluster(state_dir, nodes=2, ranks_per_node=2, rate="1gbit")
    cluster.up()
    cluster.run("node2", ["hostname"])  # -> node2
    cluster.down()
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

from tests.ranks import REPO

STATE_FILE = "cluster.json"
LOCK = "/run/lock/mcr-test-cluster.lock"  # held while a cluster picks its subnet, so two never pick one
SUBNETS = ipaddress.ip_network("10.213.0.0/16")  # each cluster takes a free /24 of it
HEAD = "head"
TOOLS = ("ip", "nsenter", "unshare", "mount", "tc")
RATE = re.compile(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)")
RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}


class ClusterError(RuntimeError):
    """The cluster could not be built or used: the message says what failed and where its logs are."""


def missing() -> str | None:
    """Why namespaces, veth pairs and a bridge cannot be made here, or None. Probed inside a
    throwaway network namespace, so nothing is left on the machine."""
    if os.geteuid() != 0:
        return "the test cluster's network namespaces, links and daemons need root"
    absent = [t for t in TOOLS if shutil.which(t) is None]
    if absent:
        return f"{', '.join(absent)} not found (iproute2 and util-linux provide them)"
    probe = "ip link add name va type veth peer name vb && ip link add name br type bridge && ip link set va master br"
    try:
        proc = subprocess.run(
            ["unshare", "-n", "-u", "-m", "sh", "-c", probe], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        return "probing for network namespaces timed out after 30 s"
    if proc.returncode != 0:
        return f"this kernel or container cannot make network namespaces, veth pairs and bridges: {proc.stderr.strip()}"
    return None


LINK_BURST_BYTES = 256 * 1024  # what a rate-limited link passes above its rate (tc tbf's bucket)


def bits_per_s(rate: str) -> float:
    match = RATE.fullmatch(rate)
    if not match:
        raise ClusterError(f"--rate: bad value {rate!r}; give tc's form, e.g. 100mbit, 1gbit, 10gbit")
    return float(match.group(1)) * RATE_UNITS[match.group(2)]


def sh(*cmd, check=True, timeout=30) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise ClusterError(f"`{shlex.join(cmd)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


@contextmanager
def subnet_lock(deadline_s: float = 60):
    os.makedirs(os.path.dirname(LOCK), exist_ok=True)
    with open(LOCK, "w") as f:
        end = time.monotonic() + deadline_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > end:
                    raise ClusterError(f"{LOCK} held for {deadline_s} s by another cluster's `up`") from None
                time.sleep(0.1)
        yield


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 of SUBNETS that no address or route on this machine overlaps."""
    used = []
    for line in sh("ip", "-4", "-o", "addr").stdout.splitlines() + sh("ip", "-4", "route").stdout.splitlines():
        for word in line.split():
            try:
                used.append(ipaddress.ip_network(word, strict=False))
            except ValueError:
                continue
    candidates = list(SUBNETS.subnets(new_prefix=24))
    start = os.getpid() % len(candidates)  # concurrent sessions start their search apart
    for i in range(len(candidates)):
        net = candidates[(start + i) % len(candidates)]
        if not any(net.overlaps(u) for u in used):
            return net
    raise ClusterError(f"no free /24 left in {SUBNETS}: remove stale test clusters with `python -m tests.cluster down`")


# A cluster's name prefix: "mc<pid>" for one made from the command line (it outlives that process),
# "mt<pid>" for one a test session owns (stale once that session is gone: `remove_orphans`)
OWNED = re.compile(r"^(mt(\d+)[a-j]?)-")


def unique_prefix(kind: str = "mc") -> str:
    """Short (link names have 15 characters), and unused by any namespace or link here."""
    taken = sh("ip", "netns", "list").stdout + sh("ip", "-o", "link").stdout
    for suffix in ["", *"abcdefghij"]:
        prefix = f"{kind}{os.getpid()}{suffix}"
        if f"{prefix}-" not in taken:
            return prefix
    raise ClusterError("no unused cluster name prefix")


FAST_IFACE = "eth1"  # the fast network's interface on every node (with fast_network)


def remove_orphans() -> list[str]:
    """Take down every cluster whose test session has ended without taking it down (killed, as a
    CI timeout kills): its processes, namespaces and links. Returns their prefixes."""
    names = sh("ip", "netns", "list").stdout.split() + [
        line.split(": ")[1].split("@")[0] for line in sh("ip", "-o", "link").stdout.splitlines()
    ]
    owners = {m.group(1): int(m.group(2)) for m in map(OWNED.match, names) if m}
    orphans = sorted(prefix for prefix, pid in owners.items() if not os.path.exists(f"/proc/{pid}"))
    for prefix in orphans:
        orphan = Cluster(os.path.join("/nonexistent", prefix))  # no state file: found by its prefix
        orphan.prefix = prefix
        orphan.down()
    return orphans


class Cluster:
    def __init__(
        self,
        state: str,
        nodes: int = 2,
        ranks_per_node: int = 2,
        rate: str | None = None,
        shared=(),
        fast_network: bool = False,
        mgmt_rate: str | None = None,
        session_owned: bool = False,
    ):
        if nodes < 1 or ranks_per_node < 1:
            raise ClusterError(f"a cluster needs at least 1 node and 1 rank per node, not {nodes} x {ranks_per_node}")
        for value in (rate, mgmt_rate):
            if value:
                bits_per_s(value)
        if mgmt_rate and not fast_network:
            raise ClusterError("--mgmt-rate limits the management network, which only --fast-network adds")
        self.state = os.path.abspath(state)
        self.node_count = nodes
        self.ranks_per_node = ranks_per_node
        self.rate = rate
        self.fast_network = fast_network
        self.mgmt_rate = mgmt_rate
        # the checkout and the Python that runs it are on every node, wherever they lie (CI clones under /tmp)
        self.shared = sorted({self.state, REPO, sys.prefix, *map(os.path.abspath, shared)})
        self.prefix = ""
        self.subnet = ""
        self.fast_subnet = ""
        self.keepers: dict[str, int] = {}
        self.session_owned = session_owned  # made by this test session: named so that `remove_orphans` finds it
        self._children: list[subprocess.Popen] = []  # keepers this process started: reaped at down

    # --- what the cluster is -------------------------------------------------------------------
    @property
    def nodes(self) -> list[str]:
        return [f"node{i}" for i in range(1, self.node_count + 1)]

    def address(self, node: str, network: str = "mgmt") -> str:
        """node<i> is .<i>, head .253; this machine's own end of the bridge (outside every node) .254.
        `network`: mgmt (eth0, where hostnames resolve) or fast (eth1, with fast_network)."""
        hosts = list(ipaddress.ip_network(self.subnet if network == "mgmt" else self.fast_subnet).hosts())
        index = {HEAD: 252, "outside": 253}.get(node)
        return str(hosts[index if index is not None else int(node[len("node") :]) - 1])

    def netns(self, node: str) -> str:
        return f"{self.prefix}-{node}"

    def link(self, node: str, network: str = "mgmt") -> str:
        return f"{self.prefix}-{'h' if node == HEAD else node[len('node') :]}{'' if network == 'mgmt' else 'f'}"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    @property
    def fast_bridge(self) -> str:
        return f"{self.prefix}-bf"

    def save(self) -> None:
        fields = (
            "node_count",
            "ranks_per_node",
            "rate",
            "shared",
            "prefix",
            "subnet",
            "keepers",
            "fast_network",
            "mgmt_rate",
            "fast_subnet",
        )
        with open(os.path.join(self.state, STATE_FILE), "w") as f:
            json.dump({key: getattr(self, key) for key in fields}, f, indent=1)

    @classmethod
    def load(cls, state: str) -> "Cluster":
        path = os.path.join(os.path.abspath(state), STATE_FILE)
        try:
            with open(path) as f:
                saved = json.load(f)
        except FileNotFoundError:
            raise ClusterError(
                f"no cluster in {state} (no {STATE_FILE}); start one with `python -m tests.cluster up`"
            ) from None
        cluster = cls(
            state,
            saved["node_count"],
            saved["ranks_per_node"],
            saved["rate"],
            saved["shared"],
            saved.get("fast_network", False),
            saved.get("mgmt_rate"),
        )
        cluster.prefix, cluster.subnet, cluster.keepers = saved["prefix"], saved["subnet"], saved["keepers"]
        cluster.fast_subnet = saved.get("fast_subnet", "")
        return cluster

    # --- running things on a node ----------------------------------------------------------------
    def command(self, node: str, cmd: list, cwd: str | None = None) -> list:
        """`cmd` as run on `node`: in its network, hostname and mount namespaces, in `cwd`
        (default: this process's; nsenter would otherwise start in the node's /)."""
        if node not in self.keepers:
            raise ClusterError(f"no node {node!r} in this cluster; it has {', '.join(self.keepers)}")
        where = f"--wdns={cwd or os.getcwd()}"
        return ["nsenter", "-t", str(self.keepers[node]), "-n", "-u", "-m", where, "--", *map(str, cmd)]

    def run(self, node: str, cmd: list, timeout: float = 60, check: bool = True, **kwargs):
        """Run `cmd` on `node` to the end; its output as text. A timeout kills it (it is in the node's namespaces)."""
        proc = subprocess.run(
            self.command(node, cmd, kwargs.pop("cwd", None)), text=True, capture_output=True, timeout=timeout, **kwargs
        )
        if check and proc.returncode != 0:
            raise ClusterError(
                f"on {node}: `{shlex.join(map(str, cmd))}` failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
            )
        return proc

    def popen(self, node: str, cmd: list, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(node, cmd, kwargs.pop("cwd", None)), **kwargs)

    def pids(self, node: str, **env: str) -> list[int]:
        """Every process in the node's network namespace (a job's ranks, its daemons, the keeper),
        or those whose environment holds `env` (SLURM_PROCID="3": a rank its launcher started)."""
        out = sh("ip", "netns", "pids", self.netns(node), check=False).stdout
        pids = [int(p) for p in out.split()]
        if not env:
            return pids
        want, found = {f"{key}={value}" for key, value in env.items()}, []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/environ") as f:
                    if want <= set(f.read().split("\0")):
                        found.append(pid)
            except OSError:  # ended meanwhile
                continue
        return found

    # --- up and down -----------------------------------------------------------------------------
    def up(self, deadline_s: float = 30) -> "Cluster":
        if os.path.exists(os.path.join(self.state, STATE_FILE)):
            Cluster.load(self.state).down()  # idempotent: what an earlier `up` here left goes first
        os.makedirs(self.state, exist_ok=True)
        self.prefix = unique_prefix("mt" if self.session_owned else "mc")
        self.save()  # the prefix first: a `down` after a failure halfway finds everything by it
        try:
            with subnet_lock():
                self.subnet = str(free_subnet())
                sh("ip", "link", "add", "name", self.bridge, "type", "bridge")
                sh("ip", "addr", "add", f"{self.address('outside')}/24", "dev", self.bridge)
                if self.fast_network:  # a second /24: the first is taken now, free_subnet sees it
                    self.fast_subnet = str(free_subnet())
                    sh("ip", "link", "add", "name", self.fast_bridge, "type", "bridge")
                    sh("ip", "addr", "add", f"{self.address('outside', 'fast')}/24", "dev", self.fast_bridge)
            sh("ip", "link", "set", self.bridge, "up")
            if self.fast_network:
                sh("ip", "link", "set", self.fast_bridge, "up")
            self.save()
            self._write_hosts()
            for node in [HEAD, *self.nodes]:
                self._add_node(node, deadline_s)
                self.save()
            self._write_rsh()
        except BaseException:
            self.down()
            raise
        return self

    def _write_hosts(self) -> None:
        """One hosts file per node: every node's name on the management network (and, with
        fast_network, nodeN-fast on the fast one, and the node's own name on 127.0.1.1)."""
        lines = ["127.0.0.1 localhost", f"{self.address(HEAD)} {HEAD}"]
        lines += [f"{self.address(n)} {n}" for n in self.nodes]
        if self.fast_network:
            lines += [f"{self.address(n, 'fast')} {n}-fast" for n in self.nodes]
        for node in [HEAD, *self.nodes]:
            own = [f"127.0.1.1 {node}"] if self.fast_network and node != HEAD else []  # first match wins
            os.makedirs(os.path.join(self.state, "nodes", node), exist_ok=True)
            with open(self.hosts_file(node), "w") as f:
                f.write("\n".join(own + lines) + "\n")

    def hosts_file(self, node: str) -> str:
        return os.path.join(self.state, "nodes", node, "hosts")

    @property
    def rsh(self) -> str:
        """A command that runs a command on a node, as ssh would (`rsh node2 hostname`, with a login's
        bare environment). Open MPI's launcher starts its daemons on other nodes through it
        (`--mca plm_rsh_agent`)."""
        return os.path.join(self.state, "rsh")

    def _write_rsh(self) -> None:
        cases = " ".join(f"{node}) pid={pid};;" for node, pid in self.keepers.items())
        lines = [
            "#!/bin/sh",
            "# written by tests/cluster/nodes.py: `rsh [ssh options] NODE COMMAND...` runs COMMAND on NODE",
            'while [ "${1#-}" != "$1" ]; do shift; done  # ssh options (-x) mean nothing here',
            f'case "$1" in {cases} *) echo "rsh: no node $1 in cluster {self.prefix}" >&2; exit 255;; esac',
            "shift",
            "# in the environment of a fresh ssh login: what the command needs, it must bring",
            'exec nsenter -t "$pid" -n -u -m --wdns="$PWD" -- env -i HOME="$HOME" PATH=/usr/bin:/bin /bin/sh -c "$*"',
        ]
        with open(self.rsh, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.chmod(self.rsh, 0o755)

    def _add_node(self, node: str, deadline_s: float) -> None:
        ns = self.netns(node)
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        # with a fast network, `rate` limits it and `mgmt_rate` the management one
        self._add_link(node, "mgmt", "eth0", self.bridge, self.mgmt_rate if self.fast_network else self.rate)
        if self.fast_network and node != HEAD:  # the login node sits on the management network only
            self._add_link(node, "fast", FAST_IFACE, self.fast_bridge, self.rate)
        self.keepers[node] = self._start_keeper(node, deadline_s)

    def _add_link(self, node: str, network: str, iface: str, bridge: str, rate: str | None) -> None:
        ns, link = self.netns(node), self.link(node, network)
        peer = f"{link}p"
        sh("ip", "link", "add", "name", link, "type", "veth", "peer", "name", peer)
        sh("ip", "link", "set", peer, "netns", ns)
        sh("ip", "link", "set", link, "master", bridge, "up")
        inside = ["ip", "-n", ns]
        sh(*inside, "link", "set", peer, "name", iface)
        sh(*inside, "addr", "add", f"{self.address(node, network)}/24", "dev", iface)
        sh(*inside, "link", "set", iface, "up")
        if rate and node != HEAD:  # both directions of the node's link: its egress, and the bridge's into it
            # A burst of 4 GSO packets (1 ms at 2 Gbit/s): 64 KiB falls short of the rate (0.7 of
            # 2 Gbit/s measured), and 10 ms of traffic (2.5 MB at 2 Gbit/s) passed messages of up to
            # 1 MiB at the veth's speed, which the tuner took for the link's (configs/tuning/vm-2x1-2gbit-burst.txt)
            tbf = ["root", "tbf", "rate", rate, "burst", str(LINK_BURST_BYTES), "latency", "50ms"]
            sh("tc", "-n", ns, "qdisc", "add", "dev", iface, *tbf)
            sh("tc", "qdisc", "add", "dev", link, *tbf)

    def _start_keeper(self, node: str, deadline_s: float) -> int:
        """`sleep infinity` in the node's namespaces, after giving them its hostname, hosts file and /tmp."""
        node_tmp = os.path.join(self.state, "nodes", node, "tmp")
        os.makedirs(node_tmp, exist_ok=True)
        setup = [f"hostname {node}", f"mount --bind {shlex.quote(self.hosts_file(node))} /etc/hosts"]
        for path in self.shared:  # bound into the node's /tmp before it replaces the machine's
            if path.startswith("/tmp/"):
                inner = os.path.join(node_tmp, os.path.relpath(path, "/tmp"))
                setup += [f"mkdir -p {shlex.quote(inner)}", f"mount --bind {shlex.quote(path)} {shlex.quote(inner)}"]
        setup += [f"mount --rbind {shlex.quote(node_tmp)} /tmp", "echo ready", "exec sleep infinity"]
        log = os.path.join(self.state, "nodes", node, "keeper.log")
        cmd = ["nsenter", f"--net=/var/run/netns/{self.netns(node)}", "unshare", "-u", "-m", "--propagation", "private"]
        with open(log, "w") as out:
            # nsenter and unshare exec, and sh execs sleep: the pid is the keeper's own
            keeper = subprocess.Popen(
                [*cmd, "sh", "-ec", "; ".join(setup)], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self._children.append(keeper)
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            with open(log) as f:
                text = f.read()
            if "ready" in text:
                return keeper.pid
            if keeper.poll() is not None:
                raise ClusterError(f"could not set up node {node}'s namespaces:\n{text}")
            time.sleep(0.05)
        raise ClusterError(f"node {node}'s namespaces were not ready after {deadline_s} s; see {log}")

    def down(self, grace_s: float = 10) -> None:
        """Remove every process, namespace and link of this cluster; safe to call twice."""
        if not self.prefix:
            return
        namespaces = [n for n in sh("ip", "netns", "list").stdout.split() if n.startswith(f"{self.prefix}-")]
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5)):
            pids = self._pids_in(namespaces)
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            end = time.monotonic() + wait_s
            while pids and self._pids_in(namespaces) and time.monotonic() < end:
                time.sleep(0.1)
        survivors = [f"process {pid}" for pid in self._pids_in(namespaces)]  # seen only while the namespaces exist
        for child in self._children:  # killed above; reaped here, or they stay zombies of this process
            try:
                child.wait(5)
            except subprocess.TimeoutExpired:
                pass
        for ns in namespaces:
            sh("ip", "netns", "del", ns, check=False)
        for name in self._links():
            sh("ip", "link", "del", name, check=False)  # a veth's peer goes with it
        leftover = survivors + self.leftovers()
        if leftover:  # the state file stays, so that another `down` can try again
            raise ClusterError(f"cluster {self.prefix} could not remove {', '.join(leftover)}")
        if os.path.exists(os.path.join(self.state, STATE_FILE)):
            os.remove(os.path.join(self.state, STATE_FILE))  # what is gone cannot be entered (`run` says so)

    def _pids_in(self, namespaces: list[str]) -> list[int]:
        out = [sh("ip", "netns", "pids", ns, check=False).stdout for ns in namespaces]
        return [int(p) for text in out for p in text.split()]

    def _links(self) -> list[str]:
        names = [line.split(": ")[1].split("@")[0] for line in sh("ip", "-o", "link").stdout.splitlines()]
        return [name for name in names if name.startswith(f"{self.prefix}-")]

    def leftovers(self) -> list[str]:
        """What of this cluster is still on the machine: namespaces and links (its processes live in those)."""
        found = [f"namespace {n}" for n in sh("ip", "netns", "list").stdout.split() if n.startswith(f"{self.prefix}-")]
        return found + [f"link {name}" for name in self._links()]
