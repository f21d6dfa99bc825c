"""Is the network each library was told to use there, and does it reach the other nodes?

Cluster nodes often have two networks: a management one, where hostnames resolve (a node's own
name often to 127.0.1.1, as Debian's installer writes /etc/hosts), and a fast one for the job's
data. The system file names the fast network's interface (`interface:` in configs/systems/), and
the job scripts pass it on as GLOO_SOCKET_IFNAME (gloo), OMPI_MCA_btl_tcp_if_include (Open MPI's
data) and OMPI_MCA_oob_tcp_if_include / PRTE_MCA_oob_tcp_if_include (its daemons' wire-up). A
wrong value fails late and obscurely: a name missing on a node gave MPI_ERR_INTERN in the
runtime's first MPI call, `lo` a hang at start-up, and gloo with no name "Connection refused"
to 127.0.1.1. So, naming the variable, the node and what the node has:
  - before any backend starts, every interface those variables name exists here, and a job
    spanning nodes does not give Open MPI loopback alone (`check_names`);
  - before gloo starts, each node's gloo address (GLOO_SOCKET_IFNAME's, else the address its
    hostname resolves to, as gloo picks it) accepts a TCP connection from every other node
    (`check_gloo_reach`), agreed on the store so that every rank stops alike.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import socket
import struct

GLOO_VAR = "GLOO_SOCKET_IFNAME"
MPI_VARS = ("OMPI_MCA_btl_tcp_if_include", "OMPI_MCA_oob_tcp_if_include", "PRTE_MCA_oob_tcp_if_include")
CONNECT_TIMEOUT_S = 10.0


class NetworkConfigError(RuntimeError):
    """An interface variable names what this node lacks, or a network that does not reach the other nodes."""


def interfaces() -> dict:
    """This node's interfaces: name -> IPv4 address (None where it has none)."""
    out = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:  # SIOCGIFADDR
                raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
                out[name] = socket.inet_ntoa(raw[20:24])
            except OSError:
                out[name] = None
    return out


def _described(found: dict) -> str:
    return ", ".join(f"{name} {addr or '(no IPv4)'}" for name, addr in found.items())


def _matches(entry: str, found: dict) -> list:
    """The interfaces an entry of an include list selects: a name, or (Open MPI) a subnet a.b.c.d/n."""
    if "/" in entry:
        net = ipaddress.ip_network(entry, strict=False)
        return [n for n, a in found.items() if a and ipaddress.ip_address(a) in net]
    return [entry] if entry in found else []


def check_names(env, spans_nodes: bool) -> None:
    """Every interface GLOO_SOCKET_IFNAME and Open MPI's include lists name is on this node."""
    named = [(var, env[var].strip()) for var in (GLOO_VAR, *MPI_VARS) if env.get(var, "").strip()]
    if not named:
        return
    found, host = interfaces(), socket.gethostname()
    for var, value in named:
        chosen = []
        for entry in (e.strip() for e in value.split(",") if e.strip()):
            matched = _matches(entry, found)
            if not matched:
                raise NetworkConfigError(
                    f"{var}={value}: {host} has no interface {entry!r} (it has {_described(found)}); name the "
                    f"interface of the network that joins the nodes (the system file's `interface:`), the same on "
                    f"every node"
                )
            chosen += matched
        loopback = all(found[n] and ipaddress.ip_address(found[n]).is_loopback for n in chosen)
        if spans_nodes and loopback:
            raise NetworkConfigError(
                f"{var}={value}: on {host} that is loopback only ({_described({n: found[n] for n in chosen})}), "
                f"which other nodes cannot reach; name the interface of the network that joins the nodes "
                f"(this node has {_described(found)})"
            )


def gloo_address(env) -> tuple:
    """(address, how gloo came to it): GLOO_SOCKET_IFNAME's interface, else the hostname's address."""
    name = env.get(GLOO_VAR, "").split(",")[0].strip()
    if name:
        return interfaces().get(name), f"{GLOO_VAR}={name}"
    host = socket.gethostname()
    try:
        return socket.gethostbyname(host), f"{GLOO_VAR} unset, so the address {host} resolves to"
    except OSError:
        return None, f"{GLOO_VAR} unset, and {host} does not resolve"


def check_gloo_reach(store, topology, rank: int, env, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Each node's first rank listens on its gloo address and connects to every other node's;
    every rank reads all the results from the store and raises the same error on any failure."""
    nodes = topology.node_names
    if len(nodes) < 2:
        return
    node = topology.node_of[rank]
    first = topology.node_of.index(node) == rank
    gen = store.add(f"netcheck/generation/{rank}", 1)  # a runtime started again in one job starts afresh
    key = f"netcheck/{gen}"
    listener = None
    try:
        if first:
            addr, how = gloo_address(env)
            problem = None
            if addr is None:
                problem = f"{how}: {nodes[node]} has no IPv4 address there (it has {_described(interfaces())})"
            elif ipaddress.ip_address(addr).is_loopback:
                problem = f"{how}: on {nodes[node]} that is {addr}, a loopback address other nodes cannot reach"
            else:
                try:
                    listener = socket.create_server((addr, 0), backlog=len(nodes))  # the kernel accepts for us
                except OSError as exc:
                    problem = f"{how}: {nodes[node]} cannot listen on {addr} ({exc})"
            where = f"{addr}:{listener.getsockname()[1]}" if listener else ""
            store.set(f"{key}/addr/{node}", json.dumps([where, how, problem]))
            peers = [json.loads(v) for v in store.multi_get([f"{key}/addr/{k}" for k in range(len(nodes))])]
            failures = [problem] if problem else []
            for k, (where_k, how_k, problem_k) in enumerate(peers):
                if k == node or problem_k or not where_k:
                    continue
                host_k, port_k = where_k.rsplit(":", 1)
                try:
                    socket.create_connection((host_k, int(port_k)), timeout=timeout_s).close()
                except OSError as exc:
                    failures.append(f"{how_k}: {nodes[node]} cannot reach {nodes[k]} at {host_k} ({exc})")
            store.set(f"{key}/result/{node}", json.dumps(failures))
        results = store.multi_get([f"{key}/result/{k}" for k in range(len(nodes))])
    finally:
        if listener is not None:
            listener.close()
    failures = [f for value in results for f in json.loads(value)]
    if failures:
        raise NetworkConfigError(
            "gloo's network does not join the nodes: "
            + "; ".join(failures)
            + f". Set {GLOO_VAR} to the interface of the network that joins them (the system file's `interface:`)"
        )
