"""Large CPU tensors on transparent huge pages.

Open MPI moves a large message between ranks of one node in a single copy: the kernel reads the
peer's pages (CMA). On 4 KiB pages that copy is slow; on 2 MiB pages it runs at memory speed
(`python -m mcr.tools.bench_large` on both; figures in configs/tuning/vm-n2-bench-large.txt).
torch puts its CPU allocations on huge pages only when THP_MEM_ALLOC_ENABLE=1 is set before its
first CPU allocation (it reads the variable once), so importing mcr sets that default; a value the
user set wins. Tensors allocated before are left as they are (collapsing them would cost a copy of
every buffer each time a fresh one appears), and the runtime says so at start-up.
"""

from __future__ import annotations

import os

ENV = "THP_MEM_ALLOC_ENABLE"
_MODE_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"


def request():
    """Ask torch for huge pages, unless the user said otherwise; call before torch allocates."""
    os.environ.setdefault(ENV, "1")


def system_mode() -> str:
    """The kernel's THP mode: "always", "madvise" (only where asked: torch asks), "never", or
    "unknown" where the kernel has no THP."""
    try:
        with open(_MODE_FILE) as f:
            return f.read().split("[", 1)[1].split("]", 1)[0]
    except (OSError, IndexError):
        return "unknown"


def huge_bytes(tensor) -> int:
    """Bytes of huge pages in the mapping that holds this CPU tensor (from /proc/self/smaps)."""
    address, inside = tensor.data_ptr(), False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(v, 16) for v in head.split("-"))
                inside = start <= address < end
            elif inside and head == "AnonHugePages:":
                return int(line.split()[1]) * 1024
    return 0


def torch_uses_them() -> bool | None:
    """Whether a fresh 8 MiB torch tensor lands on huge pages; None where this cannot be told
    (no THP in the kernel, no /proc)."""
    import torch  # here, not at the top: `mcr/__init__` imports this module before anything imports torch

    if system_mode() in ("never", "unknown"):
        return None
    probe = torch.ones(1 << 21)  # 8 MiB: holds whole 2 MiB pages wherever it starts
    try:
        return huge_bytes(probe) > 0
    except OSError:
        return None
