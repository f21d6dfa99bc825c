"""Which rank died: "mcr: rank R (host H) died", from the launcher's own words and the ranks' files.

Each rank writes rank-<R>.json ({"rank", "host", "pid"}: `mcr/rank_file.py`) into the job's rank
directory (MCR_RANK_DIR) at start-up. When the launcher fails, this names the rank that died:
- `launch.local` watches the ranks' processes (`FirstToEnd`) and names the one that ended first,
  once the launcher has reported a death (where every rank ran on its node; else as below);
- in a job script, Open MPI's prterun, srun, Cray PALS' mpiexec and torchrun name it themselves
  (rank, task, "Root Cause"); Hydra (MPICH, Intel MPI) says "BAD TERMINATION" with a PID and host
  that are not the dead rank's (MPICH 5 gives the node's first rank's PID; Intel MPI lists every
  rank it killed, in rank order), so there only the host is named; jsrun's words are not known
  here (no public record of them was found), so under it the flight records speak alone.

    python -m launch.dead_rank RANK_DIR LOGFILE --flight-dir DIR   # what the job scripts run after a failed launcher
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import socket
import sys
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class RankFile:
    rank: int
    host: str
    pid: int
    ended_well: bool  # it exited by itself after finalize(), with no uncaught exception


def read_rank_files(directory: str) -> dict[int, RankFile]:
    """rank -> what it wrote at start-up (a rank that died before `mcr.init` wrote none)."""
    found = {}
    for name in os.listdir(directory) if os.path.isdir(directory) else []:
        if re.fullmatch(r"rank-\d+\.json", name):
            with open(os.path.join(directory, name)) as f:
                about = json.load(f)
            found[about["rank"]] = RankFile(about["rank"], about["host"], about["pid"], about.get("ended_well", False))
    return found


# What a launcher prints about a rank that died, with the rank in group "rank" (first match: the
# first that died) and, where it says, the host in group "host".
NAMED = [
    # Open MPI: "prterun noticed that process rank 1 with PID 123 on node vm exited on signal 9 (Killed)."
    re.compile(r"process rank (?P<rank>\d+) with PID \d+ on node (?P<host>\S+) exited on\s+signal"),
    # srun: "srun: error: vm: task 1: Killed" (or "tasks 0-1: ...": the first of them)
    re.compile(r"srun: error: (?P<host>\S+): tasks? (?P<rank>\d+)[-,\d]*: (?!Terminated)"),
    # Cray PALS' mpiexec (Polaris, Aurora, Derecho): "x3004c0s7b0n0.hsn.cm.polaris.alcf.anl.gov: rank 3
    # died from signal 9"; those it then ends say signal 15 (pmodels/mpich#7569 and #7605)
    re.compile(r"(?m)^(?P<host>\S+): rank (?P<rank>\d+) died from signal (?!15\b)"),
    # torchrun's error summary: "Root Cause (first observed failure):" then time, host, rank
    re.compile(r"Root Cause \(first observed failure\):\s*\[\d+\]:\s*time\s*: .*\n\s*host\s*: (?P<host>\S+)"
               r"\s*rank\s*: (?P<rank>\d+)"),
]  # fmt: skip
# Hydra's banner: a rank on this host died, but which one it does not say
HYDRA = re.compile(r"BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n=\s+(?:RANK \d+ )?PID \d+ RUNNING AT (\S+)")


# torchrun's summary block of a rank a signal ended ("exitcode  : -9 (pid: 12771)  (SIGKILL)"): the
# dead rank, where its "Root Cause" names a peer that failed of it in the same second
SIGNALED = re.compile(r"host\s*: (?P<host>\S+)\s*rank\s*: (?P<rank>\d+) \(local_rank: \d+\)\s*exitcode\s*: -\d+")


def named_by_launcher(output: str) -> tuple[int, str] | None:
    """(rank, host) of the first rank the launcher's `output` says died, or None."""
    signaled = SIGNALED.search(output)
    if signaled:
        return int(signaled["rank"]), signaled["host"]
    found = [m for m in (pattern.search(output) for pattern in NAMED) if m]
    if not found:
        return None
    first = min(found, key=lambda m: m.start())
    return int(first["rank"]), first["host"]


def dead_rank_lines(output: str, ranks: dict[int, RankFile], first_to_end: int | None = None) -> list[str]:
    """What to print after a failed launcher whose `output` (its stdout and stderr) reports a
    dead rank: `ranks` are the rank files, `first_to_end` the rank `FirstToEnd` saw end first
    (None: not watched), which beats the launcher's word (torchrun's "Root Cause" is the first
    of the ranks that failed within the same second)."""
    named, hydra = named_by_launcher(output), HYDRA.search(output)
    if named is None and hydra is None:  # no rank died (an abort, the watchdog): the launcher's words suffice
        return []
    if first_to_end is not None:
        named = first_to_end, ranks[first_to_end].host
    if named is not None:
        rank, host = named
        lines = [f"mcr: rank {rank} (host {ranks[rank].host if rank in ranks else host}) died"]
    else:
        there = [r for r in sorted(ranks) if ranks[r].host == hydra.group(1) and not ranks[r].ended_well]
        on_host = ", ".join(map(str, there)) or "none wrote a file, or each ended well"
        lines = [f"mcr: a rank on host {hydra.group(1)} died (Hydra does not say which; ranks there: {on_host})"]
    return lines  # the op each rank was last in comes before them (`flight_record_lines`)


def flight_record_lines(directory: str, who: str) -> list[str]:
    """The ranks' flight records in `directory` (MCR_FR_DIR) after a failed launcher: a dump made
    from the live record of each rank killed without warning (Hydra's SIGKILL), and the op each
    rank was last in and not done (`mcr.flight.collect_and_tell`); none where it does not exist."""
    if not os.path.isdir(directory):
        return []
    from mcr import flight  # loads torch: only after a failed job, never to launch one

    return flight.collect_and_tell(directory, who)


class FirstToEnd:
    """Watches the ranks (their PIDs from the rank files, as they appear) and keeps the order in
    which they end, from the kernel's process descriptors: no launcher's word needed, where every
    rank runs on this node."""

    def __init__(self, directory: str, nprocs: int):
        self.directory, self.nprocs = directory, nprocs
        self.ended: list[list[int]] = []  # the ranks seen ending, in order; those seen at once together
        self.seen: set[int] = set()  # the ranks whose files were read
        self.elsewhere = False  # some ranks run on other nodes
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._watch, name="mcr-first-to-end", daemon=True)
        self._thread.start()

    def first(self) -> int | None:
        """The rank that ended first, of those that did not end well (`mcr.rank_file`: a rank
        that finished first is not the one that died), once the job is over (`stop` first); None
        where some ranks ran on other nodes (their files name another host, or are written
        there) or wrote none, or where the first to end were seen ending together (one wake-up
        of a busy watcher)."""
        files = read_rank_files(self.directory)
        ended = [batch for batch in ([r for r in b if not files[r].ended_well] for b in self.ended) if batch]
        every_rank_here = len(self.seen) == self.nprocs and not self.elsewhere
        alone = ended and len(ended[0]) == 1
        return ended[0][0] if alone and every_rank_here else None

    def stop(self) -> None:
        os.write(self._stop_w, b"x")
        self._thread.join()
        os.close(self._stop_r)
        os.close(self._stop_w)

    def _watch(self) -> None:
        poller, by_fd, seen = select.poll(), {}, self.seen
        poller.register(self._stop_r, select.POLLIN)
        host = socket.gethostname()
        batch, stopping = [], False  # the ranks the last poll saw ending
        while True:
            # a rank already gone when its file is first read ended since the last look, as
            # those the last poll saw did: which of them was first is not known
            for rank, about in read_rank_files(self.directory).items():
                if rank in seen:
                    continue
                seen.add(rank)
                if about.host != host:  # another node's: who ended first is the launcher's to say
                    self.elsewhere = True
                    continue
                try:
                    fd = os.pidfd_open(about.pid)
                except ProcessLookupError:
                    batch.append(rank)
                    continue
                except OSError:  # no process descriptors (Linux before 5.3): the launcher's words alone
                    return
                by_fd[fd] = rank
                poller.register(fd, select.POLLIN)
            if batch:
                self.ended.append(batch)
            if stopping:
                for fd in by_fd:
                    os.close(fd)
                return
            # until every rank has written its file, look for new ones every 0.1 s
            ready = [fd for fd, _ in poller.poll(None if len(seen) >= self.nprocs else 100)]
            stopping = self._stop_r in ready
            batch = [by_fd.pop(fd) for fd in ready if fd != self._stop_r]
            for fd in ready:
                if fd != self._stop_r:
                    poller.unregister(fd)
                    os.close(fd)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m launch.dead_rank", description="Name the rank that died, after a failed launcher."
    )
    parser.add_argument("rank_dir", help="the ranks' files (MCR_RANK_DIR)")
    parser.add_argument("log", help="the launcher's output")
    parser.add_argument("--flight-dir", help="the ranks' flight records (MCR_FR_DIR): name the op each was in")
    args = parser.parse_args(argv)
    with open(args.log, errors="replace") as f:
        output = f.read()
    said = flight_record_lines(args.flight_dir, "launch.dead_rank") if args.flight_dir else []
    for line in said + dead_rank_lines(output, read_rank_files(args.rank_dir)):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
