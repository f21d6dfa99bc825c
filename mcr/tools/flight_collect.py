"""Make a flight record (`mcr_fr_rank_<r>`, torch's format) for every rank in a flight-recorder
directory that left no dump of its own, from its live file (`mcr.flight_file`): a rank its
launcher killed without warning (Hydra's SIGKILL), or one that ended well with no dump asked for.
Then `torchfrtrace DIR` reads every rank. `launch.local` runs it when a job with MCR_FR_DIR fails.

    python -m mcr.tools.flight_collect runs/fr
"""

from __future__ import annotations

import argparse
import os
import sys

from .. import flight


def collect(directory: str, who: str = "mcr.tools.flight_collect") -> dict:
    """`flight.collect(directory)`, said on stderr: each rank written, and the op each rank was last
    in and not done. {rank: path written}."""
    written = flight.collect(directory)
    pending = flight.open_ops(directory)
    for rank, path in written.items():
        sys.stderr.write(f"{who}: rank {rank} left no flight-record dump; wrote {path} from its live record\n")
    for rank, line in pending.items():
        sys.stderr.write(f"{who}: rank {rank} was last in {line}\n")
    if written:
        sys.stderr.write(f"{who}: read every rank's record with: torchfrtrace {directory}\n")
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", help="the flight-recorder directory (MCR_FR_DIR, flight_recorder_dir)")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.directory):
        parser.error(f"no directory {args.directory}; give the one MCR_FR_DIR (flight_recorder_dir) named")
    if not flight.flight_file.live_files(args.directory):
        parser.error(f"no live flight records (mcr_fr_live_<rank>.ring) in {args.directory}")
    collect(args.directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
