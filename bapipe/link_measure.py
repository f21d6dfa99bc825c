"""Measure the point-to-point link between two local processes (gloo send/recv on loopback) and
fit latency + bytes/bandwidth, for the ``link`` entry of a cluster file describing this machine.

The timing is the runtime's own (`mcr.measure.time_op("send_recv")`: half a ping-pong, the
slower rank's median), so bapipe and `mcr.tools.tune` measure a link the same way. The two
processes run this module under the repository's launcher (``bapipe.local_job``):

    python -m launch.local -n 2 --launcher torchrun -m bapipe.link_measure --out points.json
"""

import argparse
import json
import os
import tempfile

from .cluster import fit_link
from .local_job import run_local

SIZES = [2**k for k in range(12, 23, 2)]  # 4 KiB .. 4 MiB, around a pipeline's activations


def _ping_pong(repeats: int, out: str) -> None:
    import torch

    import mcr
    from mcr.measure import time_op

    torch.set_num_threads(1)
    mcr.init(backends="gloo")
    rt = mcr.runtime()
    points = [(size, time_op(rt, "send_recv", size, backend="gloo", iters=repeats, warmup=2)[0]) for size in SIZES]
    if mcr.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(points, f)
    mcr.finalize()


def measure_p2p(repeats=20, timeout_s=300):
    """Returns (Link, [(bytes, seconds)]) for gloo send/recv between two processes here."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "points.json")
        job = ["-m", "bapipe.link_measure", "--repeats", str(repeats), "--out", out]
        run_local(2, job, timeout_s, "the link measurement")
        with open(out) as f:
            points = [tuple(p) for p in json.load(f)]
    return fit_link(points), points


def main(argv=None):
    parser = argparse.ArgumentParser(description="one rank of the link measurement (internal)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    _ping_pong(args.repeats, args.out)


if __name__ == "__main__":
    main()
