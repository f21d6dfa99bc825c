"""Large CPU tensors land on huge pages once mcr is imported (MPI's single-copy transfers need
them, `mcr.hugepages`), a user's own setting wins, and a rank whose tensors missed them is told."""

import subprocess
import sys

import pytest

from mcr import hugepages
from tests.ranks import REPO, clean_env, run_script

# Under "always" every tensor is on huge pages whatever mcr does; under "never" none can be.
pytestmark = pytest.mark.skipif(
    hugepages.system_mode() != "madvise",
    reason=f"transparent huge pages are in mode {hugepages.system_mode()!r}; these tests need 'madvise': "
    "as root, `echo madvise > /sys/kernel/mm/transparent_hugepage/enabled` (in a VM or container, on its host)",
)

PROBE = """
import torch
{before}
import mcr
from mcr import hugepages
x = torch.ones(1 << 22)  # 16 MiB
print("huge bytes", hugepages.huge_bytes(x))
"""


def huge_bytes_after_import(before="", **env):
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(before=before)],
        env={**clean_env(), "PYTHONPATH": REPO, **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out.split("huge bytes")[1])


def test_tensors_allocated_after_import_are_on_huge_pages():
    assert huge_bytes_after_import() >= 8 << 20


def test_the_users_own_setting_wins():
    assert huge_bytes_after_import(THP_MEM_ALLOC_ENABLE="0") == 0


def test_allocating_before_import_leaves_4k_pages():
    # torch reads the variable at its first CPU allocation: this is what the runtime warns about
    assert huge_bytes_after_import(before="torch.ones(10)") == 0


WARNING = "large CPU tensors are on 4 KiB pages"


@pytest.mark.parametrize("early", [False, True])
def test_the_runtime_warns_when_torch_allocated_first(tmp_path, early):
    script = tmp_path / "job.py"
    script.write_text(
        "import torch\n"
        + ("torch.ones(10)\n" if early else "")
        + "import mcr\nmcr.init()\nx = torch.arange(1 << 20, dtype=torch.float32)\nmcr.all_reduce(x)\n"
        + "assert torch.equal(x, torch.arange(1 << 20, dtype=torch.float32) * 2)\nmcr.finalize()\n"
    )
    out = run_script(2, str(script)).check().output
    assert (WARNING in out) == early, out
