"""A multi-node test cluster on this machine, by hand (as root):

    python -m tests.cluster up --nodes 2 --ranks-per-node 2 [--rate 1gbit] [--no-slurm] [--state DIR]
    python -m tests.cluster up --fast-network --rate 10gbit --mgmt-rate 1gbit  # eth0 + eth1 (fast) per node
    python -m tests.cluster run node2 -- hostname        # any command, on a node (head: the login node)
    python -m tests.cluster run head -- srun -N2 -n4 --mpi=pmix hostname
    python -m tests.cluster status
    python -m tests.cluster down                         # every namespace, link and daemon it made

The nodes share this machine's cores: give `mpiexec` across them `--bind-to none` (as
`launch.local` does), or Open MPI binds each node's ranks from core 0 up, onto the same cores;
and `-x OMP_NUM_THREADS` set to the cores over all ranks, or each rank sizes its thread pool for
all of them.
`up` replaces a cluster already in the state dir; `down` is safe to repeat. From outside the
nodes, SLURM's clients need `SLURM_CONF=<state>/slurm/slurm.conf` (printed by `up`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from tests.cluster.nodes import HEAD, Cluster, ClusterError, missing
from tests.cluster.slurm import ClusterSlurm
from tests.launch import slurm_cluster

DEFAULT_STATE = "/tmp/mcr-test-cluster"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("up", "down", "run", "status"))
    parser.add_argument("node", nargs="?", help="run: node1..nodeN or head")
    parser.add_argument("--state", default=DEFAULT_STATE, help=f"the cluster's directory (default {DEFAULT_STATE})")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--ranks-per-node", type=int, default=2, help="CPUs each node offers SLURM")
    parser.add_argument("--rate", help="limit every node's link to this rate, in tc's form: 100mbit, 1gbit")
    parser.add_argument(
        "--fast-network", action="store_true", help="a second network (eth1) beside the management one (eth0)"
    )
    parser.add_argument("--mgmt-rate", help="with --fast-network: limit the management links (--rate: the fast ones)")
    parser.add_argument("--no-slurm", action="store_true", help="namespaces only, no slurmctld/slurmd")
    argv = sys.argv[1:] if argv is None else argv
    own, cmd = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = parser.parse_intermixed_args(own)
    try:
        return COMMANDS[args.command](args, cmd)
    except ClusterError as exc:
        print(f"tests.cluster {args.command}: {exc}", file=sys.stderr)
        return 1


def up(args, _cmd) -> int:
    why = missing() or (None if args.no_slurm else slurm_cluster.missing())
    if why:
        raise ClusterError(why)
    cluster = Cluster(
        args.state, args.nodes, args.ranks_per_node, args.rate, fast_network=args.fast_network, mgmt_rate=args.mgmt_rate
    ).up()
    fast = f", fast network {cluster.fast_subnet} (eth1)" if cluster.fast_network else ""
    print(
        f"cluster {cluster.prefix}: {', '.join(cluster.nodes)} and {HEAD} on {cluster.subnet}{fast}; "
        f"state in {cluster.state}"
    )
    if not args.no_slurm:
        slurm = ClusterSlurm(cluster)
        try:
            slurm.start()
        except BaseException:
            cluster.down()
            raise
        print(f"SLURM: slurmctld on {HEAD}, slurmd on each node; from here: export SLURM_CONF={slurm.conf}")
    return 0


def down(args, _cmd) -> int:
    if os.path.exists(os.path.join(args.state, "cluster.json")):
        Cluster.load(args.state).down()
    print(f"no cluster left from {args.state}")
    return 0


def run(args, cmd) -> int:
    cluster = Cluster.load(args.state)
    if not args.node or not cmd:
        raise ClusterError("usage: python -m tests.cluster run NODE -- COMMAND [ARGS...]")
    env = ClusterSlurm(cluster).env if os.path.exists(os.path.join(args.state, "slurm", "slurm.conf")) else None
    return subprocess.call(cluster.command(args.node, cmd), env=env)


def status(args, _cmd) -> int:
    cluster = Cluster.load(args.state)
    for node in [HEAD, *cluster.nodes]:
        fast = f"{cluster.address(node, 'fast'):<16}" if cluster.fast_network and node != HEAD else ""
        print(
            f"{node:<8}{cluster.address(node):<16}{fast}namespace {cluster.netns(node)}, "
            f"{len(cluster.pids(node))} processes"
        )
    leftover = cluster.leftovers()
    mgmt = f", management rate {cluster.mgmt_rate or 'unlimited'}" if cluster.fast_network else ""
    print(
        f"{len(leftover)} namespaces and links of {cluster.prefix} on this machine; "
        f"rate {cluster.rate or 'unlimited'}{mgmt}"
    )
    return 0


COMMANDS = {"up": up, "down": down, "run": run, "status": status}

if __name__ == "__main__":
    sys.exit(main())
