"""tests/gpu/scripts/nccl_log.py reads NCCL's debug log, the witness the GPU tests hold in-place
ops, node-aware phases and abort to. Here, on any machine: lines as NCCL 2.21, 2.28 and 2.30 print
them (their format strings in `src/enqueue.cc` and `src/init.cc`, with a host, pid, thread and
device prefix as `ncclDebugLog` writes it), and a log read while NCCL is still writing it."""

from __future__ import annotations

import os

from tests.gpu.scripts import nccl_log

PREFIX = "gpu-node:4242:4250 [0] NCCL INFO "
CALL_2_28 = (  # %zu count; the default stream is (nil)
    PREFIX + "AllReduce: opCount 1f sendbuff 0x7f3a10000000 recvbuff 0x7f3a10000000 count 1024 datatype 9 op 4 "
    "root 0 comm 0x55d0c0a0b0c0 [nranks=1] stream (nil)"
)
CALL_2_21 = (  # %zi count, and a timestamp before the prefix where NCCL_DEBUG_TIMESTAMP_LEVELS asks for one
    "[2026-11-28 10:00:00] " + PREFIX + "Broadcast: opCount 0 sendbuff 0x7f3a10001000 recvbuff 0x7f3a10002000 "
    "count 256 datatype 7 op 0 root 3 comm 0x55d0c0a0b0c0 [nranks=8] stream 0x55d0c1000000"
)
LIFE = [
    PREFIX + "ncclCommInitRankConfig comm 0x55d0c0a0b0c0 rank 0 nranks 1 cudaDev 0 nvmlDev 0 busId 1b000 "
    "commId 0x9f2e - Init COMPLETE",
    PREFIX + "comm 0x55d0c0a0b0c0 rank 0 nRanks 1 nNodes 1 localRanks 1 localRank 0 MNNVL 0",  # not a lifecycle line
    PREFIX + "comm 0x55d0c0a0b0c0 rank 0 nRanks 1 cudaDev 0 busId 1b000 - Abort START",  # 2.28, 2.30
    PREFIX + "comm 0x55d0c0a0b0c0 rank 0 nranks 1 cudaDev 0 busId 1b000 - Abort COMPLETE",
    PREFIX + "ncclCommSplit comm 0x55d0c0b0c0d0 rank 0 nranks 1 cudaDev 0 nvmlDev 0 busId 1b000 parent "
    "0x55d0c0a0b0c0 splitCount 1 color 0 key 0 - Init COMPLETE",
    PREFIX + "comm 0x55d0c0b0c0d0 rank 0 nranks 1 cudaDev 0 busId 1b000 - Destroy COMPLETE",
]


def test_a_call_line_gives_every_field_whatever_the_nccl_version():
    new, old = nccl_log.calls(["unrelated line", CALL_2_28, *LIFE, CALL_2_21])
    assert new == nccl_log.Call(
        tid=4250,
        name="AllReduce",
        sendbuff=0x7F3A10000000,
        recvbuff=0x7F3A10000000,
        count=1024,
        datatype=9,
        op=4,
        root=0,
        comm=0x55D0C0A0B0C0,
        nranks=1,
        stream=0,
    )
    assert old.what() == ("Broadcast", 256, 7, 0, 3, 8)
    assert (old.sendbuff, old.recvbuff, old.stream) == (0x7F3A10001000, 0x7F3A10002000, 0x55D0C1000000)


def test_communicators_are_followed_from_init_to_abort_or_destroy():
    seen = nccl_log.communicators([CALL_2_28, *LIFE])
    assert seen == {0x55D0C0A0B0C0: ["init", "abort"], 0x55D0C0B0C0D0: ["init", "destroy"]}


def test_a_log_is_read_in_pieces_and_a_half_written_line_waits(tmp_path):
    path = tmp_path / "nccl.log"
    log = nccl_log.NcclLog(str(path))
    assert log.read() == []  # NCCL has written nothing yet
    with open(path, "w") as f:
        f.write(CALL_2_28 + "\n" + PREFIX + "AllRed")
    assert log.read() == [CALL_2_28]
    with open(path, "a") as f:
        f.write("uce: ...\n" + "\ngpu-node:4242:4250 [0] some.cc:12 NCCL WARN Cuda failure 'out of memory'\n")
    assert log.read() == [
        PREFIX + "AllReduce: ...",
        "",
        "gpu-node:4242:4250 [0] some.cc:12 NCCL WARN Cuda failure 'out of memory'",
    ]
    assert log.warnings == ["gpu-node:4242:4250 [0] some.cc:12 NCCL WARN Cuda failure 'out of memory'"]
    assert log.read() == []


def test_turn_on_points_nccl_at_a_file_of_this_process_over_the_callers_settings(monkeypatch):
    for name in (*nccl_log.SETTINGS, "NCCL_DEBUG_FILE"):
        monkeypatch.setenv(name, "WARN")  # restored after the test
    log = nccl_log.turn_on()
    assert os.environ["NCCL_DEBUG"] == "INFO" and "COLL" in os.environ["NCCL_DEBUG_SUBSYS"]
    assert os.environ["NCCL_DEBUG_FILE"] == log.path and str(os.getpid()) in log.path
