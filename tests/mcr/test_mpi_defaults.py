"""What the runtime sets before MPI starts (`mcr.backends.mpi.apply_mpi_defaults`), read back from
Open MPI's own component selection: on a host without a fabric device btl/ofi is never opened
(closing it costs every process start a second), and a user's own btl list wins."""

import glob
import re

import pytest

from mcr.backends.mpi import FABRIC_DEVICES
from tests.ranks import run_ranks

START = "import mcr; mcr.init(backends='mpi'); mcr.all_reduce(__import__('torch').ones(1)); mcr.finalize()"
VERBOSE = {"OMPI_MCA_btl_base_verbose": "100"}


def btls_initialized(env):
    out = run_ranks(2, ["-c", START], env={**VERBOSE, **env}).check().output
    return out, set(re.findall(r"select: initializing btl component (\w+)", out))


@pytest.mark.skipif(
    any(glob.glob(pattern) for pattern in FABRIC_DEVICES),
    reason="this host has a fabric device, where btl/ofi stays in: nothing to leave out",
)
def test_btl_ofi_is_left_out_on_a_host_without_a_fabric():
    out, btls = btls_initialized({})
    assert "ofi" not in btls and {"self", "sm", "tcp"} <= btls, out[-3000:]


def test_a_users_btl_list_wins():
    out, btls = btls_initialized({"OMPI_MCA_btl": "self,tcp"})
    assert btls == {"self", "tcp"}, out[-3000:]
