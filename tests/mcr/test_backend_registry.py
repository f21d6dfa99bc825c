"""A library registered by its one line in mcr.backends is started, named and run like the built-in ones."""

import os
import re

from tests.mcr.test_ops import SCRIPTS, expected_checks
from tests.ranks import run_script


def test_a_backend_registered_by_one_line_runs_every_op_on_real_ranks():
    # MCR_BACKEND=gloo2: the config check accepts the new name, and the automatic choice's
    # runs (the configured default decides) go to it too
    out = run_script(2, os.path.join(SCRIPTS, "extra_backend.py"), env={"MCR_BACKEND": "gloo2"}).check().output
    oks = re.findall(r"rank (\d+): OK (\d+) checks on backends (\[[^\]]*\])", out)
    assert sorted(int(r) for r, _, _ in oks) == [0, 1], out[-3000:]
    for r, count, found in oks:
        assert found == "['mpi', 'gloo', 'gloo2']" and int(count) == expected_checks(int(r), 2, 3), oks
    assert "cannot run" not in out, out[-3000:]
    # the comm log keeps the new backend's ops under its own name
    assert re.search(r"^all_to_all +gloo2 ", out, re.M), out[-3000:]
