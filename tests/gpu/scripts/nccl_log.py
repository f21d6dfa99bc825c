"""NCCL's own record of what it was asked to do, as a witness the runtime cannot fake.

At one rank an in-place op changes no value (a SUM, AVG or MAX of one rank and a broadcast from
itself are identities) and NCCL enqueues no GPU work for it (`ncclLaunchOneRank` copies only
between distinct buffers), so no value a script reads shows whether, how or where NCCL ran it.
NCCL's debug log does: with `NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL` it writes one line per call
it enqueues, on the calling thread before the call returns (`ncclEnqueueCheck`, NCCL 2.18 to
2.30):

    host:PID:TID [DEV] NCCL INFO AllReduce: opCount 3 sendbuff 0x7f.. recvbuff 0x7f.. count 1024
        datatype 7 op 4 root 0 comm 0x55.. [nranks=1] stream 0x55..

and with INIT (2.30: DESTROY) one line per communicator made, aborted or destroyed
(`comm 0x55.. rank 0 nranks 1 ... - Init COMPLETE`, `- Abort START`, `- Destroy COMPLETE`).

`turn_on()` sets those variables for this process; NCCL reads them once, at its first call that
logs, so a script calls it before `mcr.init()` (which makes the first communicator).
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass

SETTINGS = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,COLL,DESTROY"}  # unknown names are ignored
CALL = re.compile(
    r":(?P<tid>\d+) \[\d+\] NCCL INFO (?P<name>\w+): opCount [0-9a-fx]+ sendbuff (?P<sendbuff>\S+) "
    r"recvbuff (?P<recvbuff>\S+) count (?P<count>-?\d+) datatype (?P<datatype>\d+) op (?P<op>\d+) "
    r"root (?P<root>-?\d+) comm (?P<comm>\S+) \[nranks=(?P<nranks>\d+)\] stream (?P<stream>\S+)"
)
COMM = re.compile(r"comm (0x[0-9a-f]+) rank \d+ nranks (\d+) .*- (Init|Abort|Destroy) (?:START|COMPLETE)", re.I)


def pointer(text: str) -> int:
    """A `%p` as glibc prints it: 0x7f.., or (nil) for the null pointer (the legacy default stream)."""
    return 0 if text == "(nil)" else int(text, 16)


@dataclass(frozen=True)
class Call:
    """One call NCCL enqueued, as its log line says."""

    tid: int  # the calling thread (gettid), as threading.get_native_id() gives it
    name: str  # AllReduce, Reduce, Broadcast, AllGather, ReduceScatter, Send, Recv...
    sendbuff: int
    recvbuff: int
    count: int
    datatype: int  # ncclDataType_t: 7 float32, 9 bfloat16
    op: int  # ncclRedOp_t: 0 sum, 2 max, 4 avg
    root: int
    comm: int
    nranks: int
    stream: int  # 0: the legacy default stream

    def what(self) -> tuple:
        """What was asked, without where: two calls of the same op on the same input agree on it."""
        return self.name, self.count, self.datatype, self.op, self.root, self.nranks


def calls(lines) -> list:
    found = []
    for line in lines:
        m = CALL.search(line)
        if m:
            ints = {k: int(v) for k, v in m.groupdict().items() if k in ("tid", "count", "datatype", "op", "root")}
            ptrs = {k: pointer(m[k]) for k in ("sendbuff", "recvbuff", "comm", "stream")}
            found.append(Call(name=m["name"], nranks=int(m["nranks"]), **ints, **ptrs))
    return found


def communicators(lines) -> dict:
    """{communicator: what happened to it, in order: "init", "abort", "destroy"} (a START and a
    COMPLETE line count once)."""
    seen = {}
    for line in lines:
        m = COMM.search(line)
        if m:
            steps = seen.setdefault(pointer(m[1]), [])
            if not steps or steps[-1] != m[3].lower():
                steps.append(m[3].lower())
    return seen


class NcclLog:
    """The log NCCL writes for this process (line-buffered), read in pieces: `read()` returns the
    lines written since the last read; NCCL's warnings, which go there too, are kept in
    `warnings` for the script to print."""

    def __init__(self, path: str):
        self.path = path
        self._at = 0
        self.warnings = []

    def read(self) -> list:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._at)
                text = f.read()
        except FileNotFoundError:  # NCCL has logged nothing yet
            return []
        whole = text[: text.rfind(b"\n") + 1]  # a line NCCL is still writing is read next time
        self._at += len(whole)
        lines = whole.decode(errors="replace").splitlines()
        self.warnings += [line for line in lines if "NCCL WARN" in line]
        return lines


def turn_on() -> NcclLog:
    """Log NCCL's calls and communicators to a file of this process's own; call it before NCCL's
    first use here (settings the caller had are replaced: the scripts need these)."""
    path = os.path.join(tempfile.gettempdir(), f"mcr-nccl-{os.getpid()}.log")
    if os.path.exists(path):  # a previous process of this pid
        os.remove(path)
    os.environ.update(SETTINGS, NCCL_DEBUG_FILE=path)
    return NcclLog(path)
