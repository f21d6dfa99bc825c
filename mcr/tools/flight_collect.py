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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", help="the flight-recorder directory (MCR_FR_DIR, flight_recorder_dir)")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.directory):
        parser.error(f"no directory {args.directory}; give the one MCR_FR_DIR (flight_recorder_dir) named")
    if not flight.flight_file.live_files(args.directory):
        parser.error(f"no live flight records (mcr_fr_live_<rank>.ring) in {args.directory}")
    for line in flight.collect_and_tell(args.directory, "mcr.tools.flight_collect"):
        print(line, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
