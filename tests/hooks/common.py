"""Helpers for the hooks tests: run a script on 2 real ranks and read what each rank printed."""

import os

import torch

from tests.ranks import run_script
from tests.report import tagged  # noqa: F401  (the hooks tests import it from here)

HERE = os.path.dirname(os.path.abspath(__file__))


def run(script, *args, launcher="mpiexec", env=None, timeout=300):
    return run_script(2, os.path.join(HERE, script), *args, launcher=launcher, env=env, timeout=timeout).check().output


def assert_same_losses(got, want):
    assert got.keys() == want.keys() and got, f"runs report different models/ranks: {sorted(got)} vs {sorted(want)}"
    for key in want:
        torch.testing.assert_close(
            torch.tensor(got[key]),
            torch.tensor(want[key]),
            rtol=1e-5,
            atol=1e-6,
            msg=lambda m, key=key: f"losses of {key} differ from the gloo run: {m}",
        )
        assert len(set(want[key])) > 1, f"{key}: the losses do not change, so they cannot show training happened"


def families(comm_log_rows):
    """{op family: set of backends} from COMMLOG rows [op, backend, bytes, count]."""
    out = {}
    for op, backend, _, _ in comm_log_rows:
        out.setdefault(op, set()).add(backend)
    return out
