"""The flight recorder's live file: each rank's ring (`mcr.flight`) also kept in a memory-mapped
file in the flight-recorder directory, so a rank that ends with no chance to dump (Hydra's
mpiexec SIGKILLs every rank a few ms after one dies, with no SIGTERM first) still leaves its
record: the page cache keeps what the process wrote, however it ends.

Two files per rank, neither ending in digits nor holding torch's `mcr_fr_rank_` prefix (torch's
analyzer reads a directory's files by those):

- `mcr_fr_live_<rank>.ring`: a header, then one fixed-size slot of int64 fields per ring entry,
  written with one `struct.pack_into` as the op opens and its DONE (STARTED, for an async op)
  stamped into the same slot: no formatting, no lock, no system call per op.
- `mcr_fr_live_<rank>.ops`: what is the same for many ops (op, sizes, dtype, backend, rule,
  group), one JSON line per distinct call, appended once; a slot holds its line number.

`mcr.flight.collect` turns the files of ranks that left no dump into torch's format."""

from __future__ import annotations

import errno
import json
import mmap
import os
import struct
import tempfile
from time import time_ns
from typing import NamedTuple

from .files import MODE

MAGIC = b"MCRFR\x00\x00\x01"
# magic, rank, slots, pid, when the file was made (ns), op timeout (ms), state, records dumped
HEADER = struct.Struct("<8s7q")
HEADER_BYTES = 64
RUNNING, FINALIZED = 0, 1  # the header's state
STATE_OFFSET = 8 + 5 * 8
DUMPED_OFFSET = STATE_OFFSET + 8
# a slot: record id, line of its facts in the .ops file, collective and p2p sequence numbers,
# peer + 1 (0: none), thread, created, started, done (ns; 0: not yet)
SLOT = struct.Struct("<9q")
SLOT_WORDS = SLOT.size // 8
S_RECORD, S_FACTS, S_SEQ, S_P2P_SEQ, S_PEER, S_THREAD, S_CREATED, S_STARTED, S_DONE = range(SLOT_WORDS)

# the slot of an entry with no live file (none configured, or its op fell off the ring): its
# stamps land here and are never read
NO_SLOT = memoryview(bytearray(SLOT.size)).cast("q")

RING_SUFFIX, OPS_SUFFIX = ".ring", ".ops"
PREFIX = "mcr_fr_live_"


def ring_path(directory: str, rank: int) -> str:
    return os.path.join(directory, f"{PREFIX}{rank}{RING_SUFFIX}")


class LiveFile:
    """One rank's live file, made afresh (under a temporary name, then renamed: a mapping of this
    rank's earlier file, from an earlier init, is never truncated under it)."""

    def __init__(self, directory: str, rank: int, slots: int, timeout_ms: int):
        os.makedirs(directory, exist_ok=True)
        self.path = ring_path(directory, rank)
        size = HEADER_BYTES + slots * SLOT.size
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=RING_SUFFIX)
        try:
            os.fchmod(fd, MODE)
            try:  # blocks now: a full disk is an error here, not a SIGBUS later
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without it: sparse
                    raise
                os.ftruncate(fd, size)
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        HEADER.pack_into(self.map, 0, MAGIC, rank, slots, os.getpid(), time_ns(), timeout_ms, RUNNING, 0)
        words = memoryview(self.map).cast("q")
        # each slot's int64 fields: the ring's entries hold theirs and stamp DONE into it
        first = HEADER_BYTES // 8
        self.slots = [words[first + i * SLOT_WORDS : first + (i + 1) * SLOT_WORDS] for i in range(slots)]
        self._words = words
        ops = self.path[: -len(RING_SUFFIX)] + OPS_SUFFIX
        self._ops_fd = os.open(ops, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, MODE)
        self._lines = 0
        os.replace(tmp, self.path)  # the facts file first: a reader that finds the ring finds both

    def describe(self, facts: dict) -> int:
        """Append `facts` (a distinct call's) as the next line of the .ops file; its line number.
        Before any slot names it, so a reader never meets a slot whose line is not there."""
        os.write(self._ops_fd, (json.dumps(facts, separators=(",", ":")) + "\n").encode())
        self._lines += 1
        return self._lines - 1

    def mark(self, offset: int, value: int) -> None:
        self._words[offset // 8] = value

    def close(self) -> None:
        """finalize(): the rank ended well; the file stays (a peer's record needs this rank's)."""
        self.mark(STATE_OFFSET, FINALIZED)
        fd, self._ops_fd = self._ops_fd, -1  # a describe() after this fails (EBADF), never writes elsewhere
        if fd >= 0:
            os.close(fd)


class LiveRecord(NamedTuple):
    rank: int
    pid: int
    made_ns: int
    timeout_ms: int
    state: int
    dumped: int  # records 0..dumped-1 are in this rank's own dump (0: it made none)
    facts: list  # the .ops file's lines
    slots: list  # (record, facts, seq, p2p_seq, peer + 1, thread, created, started, done), oldest first


def live_files(directory: str) -> dict:
    """{rank: path} of the live files in `directory`."""
    found = {}
    for name in os.listdir(directory) if os.path.isdir(directory) else ():
        digits = name[len(PREFIX) : -len(RING_SUFFIX)]
        if name.startswith(PREFIX) and name.endswith(RING_SUFFIX) and digits.isdigit():
            found[int(digits)] = os.path.join(directory, name)
    return found


def read(path: str) -> LiveRecord:
    """A rank's live file as it stands; ValueError where it is not one (or is cut short)."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        magic, rank, slots, pid, made_ns, timeout_ms, state, dumped = HEADER.unpack_from(data, 0)
    except struct.error:
        magic = None
    if magic != MAGIC or len(data) < HEADER_BYTES + slots * SLOT.size:
        raise ValueError(f"{path} is not an mcr live flight record (cut short, or made by another mcr version)")
    with open(path[: -len(RING_SUFFIX)] + OPS_SUFFIX) as f:
        # past the last newline: a line cut short by the end of the process, which no slot names yet
        facts = [json.loads(line) for line in f.read().split("\n")[:-1]]
    found = []
    for i in range(slots):
        slot = SLOT.unpack_from(data, HEADER_BYTES + i * SLOT.size)
        if slot[S_CREATED] and 0 <= slot[S_FACTS] < len(facts):  # written (a slot cut in half: dropped)
            found.append(slot)
    found.sort()
    return LiveRecord(rank, pid, made_ns, timeout_ms, state, dumped, facts, found)
