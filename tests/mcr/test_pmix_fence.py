"""The fence's one PMIx info (PMIX_COLLECT_DATA "pmix.collect", a PMIX_BOOL, 1: true), built with ctypes, is the bytes PMIx's own PMIx_Info_load writes."""

import subprocess
import sys

from tests.ranks import rank_env

COMPARE = """
import ctypes, mpi4py
mpi4py.rc.initialize = False  # load the library, start nothing
from mpi4py import MPI
from mcr.backends.pmix_fence import Info, collect_data
lib = ctypes.CDLL(MPI.__file__)
theirs, yes = Info(), ctypes.c_bool(True)
assert lib.PMIx_Info_load(ctypes.byref(theirs), b"pmix.collect", ctypes.byref(yes), ctypes.c_uint16(1)) == 0
ours = collect_data()
n = Info.value.offset + Info.value.size
print("same" if bytes(ours)[:n] == bytes(theirs)[:n] else f"differ: ours {bytes(ours)[500:n]} theirs {bytes(theirs)[500:n]}")
"""


def test_collect_data_info_matches_pmix_info_load():
    out = subprocess.run([sys.executable, "-c", COMPARE], env=rank_env(), capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "same", out.stdout + out.stderr
