"""One op in its call forms, side by side in one run: all_to_all_single against list-form
all_to_all at the same total size (the list form costs what its packing costs over the other).

    python -m launch.local -n 2 -m mcr.tools.bench_forms [--backend mpi] [--max-bytes 64M]

Every number is the slowest rank's median; the forms are timed in interleaved rounds (A B, B A,
...) and each keeps its best round.
"""

from __future__ import annotations

import argparse
import sys

import torch

from .. import api
from ..commlog import human_bytes
from ..measure import iterations_for, time_call
from ..tuning.candidates import parse_bytes
from .bench import sizes_between
from .machine import Watch


def forms(total_bytes, n, backend):
    """{form: call} for an all-to-all of `total_bytes` of float32 input per rank, distinct blocks."""
    numel = max(n, total_bytes // 4 // n * n)
    x = torch.arange(numel, dtype=torch.float32) + 1000 * api.get_rank()
    out = torch.empty_like(x)
    ins = list(x.chunk(n))
    outs = [torch.empty_like(t) for t in ins]
    return numel * 4, {
        "single": lambda: api.all_to_all_single(out, x, backend=backend),
        "list": lambda: api.all_to_all(outs, ins, backend=backend),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="mpi")
    parser.add_argument("--min-bytes", default="16")
    parser.add_argument("--max-bytes", default="64M")
    parser.add_argument("--step", type=int, default=4, help="size factor between rows")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds; each form keeps its best")
    args = parser.parse_args(argv)
    watch = Watch()  # from here: how busy the machine was while this ran
    rt = api.init(tuning=None)
    if args.backend not in rt.backends:
        parser.error(f"backend {args.backend!r} is unavailable here: {rt.unavailable.get(args.backend)}")
    n = rt.world_size
    sizes = sizes_between(parse_bytes(args.min_bytes), parse_bytes(args.max_bytes), args.step)
    if rt.rank == 0:
        print(f"# all_to_all on {args.backend}, {n} ranks: input bytes per rank, slowest rank's median")
        print(f"{'size':>9}{'single us':>12}{'list us':>12}{'list/single':>13}\n" + "-" * 46, flush=True)
    for size in sizes:
        actual, calls = forms(size, n, args.backend)
        iters = max(5, iterations_for(actual) // args.rounds)
        best = dict.fromkeys(calls, float("inf"))
        for r in range(args.rounds):
            for name in calls if r % 2 == 0 else reversed(list(calls)):
                best[name] = min(best[name], time_call(api.runtime(), calls[name], iters, warmup=3))
        if rt.rank == 0:
            s, lst = best["single"], best["list"]
            print(f"{human_bytes(actual):>9}{s * 1e6:>12.1f}{lst * 1e6:>12.1f}{lst / s:>13.2f}", flush=True)
    if rt.rank == 0:
        print(watch.line(), flush=True)
    api.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
