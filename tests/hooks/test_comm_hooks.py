"""torch's own DDP communication hooks on backend "mcr" (tests/hooks/scripts/comm_hooks.py).

PowerSGD and the quantization hooks chain callbacks that issue collectives and wait on them; they
must train as on gloo, and keep one op order on every rank when several buckets' callbacks run in
one step (where plain gloo itself fails).
"""

import pytest

from tests.hooks.common import assert_same_losses, families, run, tagged

WATCHDOG = {"MCR_WATCHDOG_TIMEOUT": "60"}  # a hang ends naming the op, not at the test's timeout

HOOKS = (
    "allreduce",
    "fp16_compress",
    "powerSGD",
    "powerSGD_no_warm_start",
    "quantization_pertensor",
    "quantization_perchannel",
    "post_localSGD",
    "optimizer_overlap",
)


@pytest.fixture(scope="module")
def gloo_one_bucket():
    return tagged(run("scripts/comm_hooks.py", "gloo", "one", launcher="torchrun", timeout=180), "LOSSES")


@pytest.mark.parametrize("progress_thread", ["1", "0"])
def test_every_ddp_comm_hook_trains_as_on_gloo(gloo_one_bucket, progress_thread):
    out = run(
        "scripts/comm_hooks.py", "mcr", "one", env={**WATCHDOG, "MCR_PROGRESS_THREAD": progress_thread}, timeout=180
    )
    got = tagged(out, "LOSSES")
    assert {key.split()[0] for key in got} == set(HOOKS), sorted(got)
    assert_same_losses(got, gloo_one_bucket)
    logs = tagged(out, "COMMLOG")
    assert families(logs["powerSGD 0"]).get("all_reduce") == {"mpi"}, logs["powerSGD 0"]  # through the runtime
    assert families(logs["quantization_perchannel 1"]).get("all_gather") == {"mpi"}, logs["quantization_perchannel 1"]


def test_hooks_of_many_buckets_keep_one_op_order_on_every_rank():
    """A bucket per layer: each hook's callbacks issue collectives while backward issues the next
    bucket's. With the progress thread the op completes elsewhere; the callbacks must still run
    in the caller's order (the same losses as with callbacks run inline, thread off), on MPI and
    on mcr's gloo route alike."""
    inline = tagged(
        run("scripts/comm_hooks.py", "mcr", "many", env={**WATCHDOG, "MCR_PROGRESS_THREAD": "0"}, timeout=180), "LOSSES"
    )
    threaded = tagged(run("scripts/comm_hooks.py", "mcr", "many", env=WATCHDOG, timeout=180), "LOSSES")
    over_gloo = tagged(
        run("scripts/comm_hooks.py", "mcr", "many", launcher="torchrun", env=WATCHDOG, timeout=180), "LOSSES"
    )
    assert {key.split()[0] for key in inline} == set(HOOKS), sorted(inline)
    assert_same_losses(threaded, inline)
    assert_same_losses(over_gloo, inline)
