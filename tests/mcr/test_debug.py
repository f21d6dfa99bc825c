"""MCR_DEBUG=detail: ranks making different collective calls are stopped with both calls named."""

import os

import pytest

from tests.ranks import run_script

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")
# what rank 1 calls instead of rank 0's `all_reduce #2 (float32, sum, 32 bytes)`
MISMATCHES = {
    "op": "rank 1 called all_gather #2 (float32, 64 bytes)",
    "dtype": "rank 1 called all_reduce #2 (float64, sum, 64 bytes)",
    "shape": "rank 1 called all_reduce #2 (float32, sum, 36 bytes)",
    "skip": "rank 1 called all_to_all #2 (float32,",
    "skip-last": "rank 1 called finalize() after 2 collectives",
    "reduce-op": "rank 1 called all_reduce #2 (float32, max, 32 bytes)",
}


@pytest.mark.parametrize("mode", list(MISMATCHES))
def test_a_mismatched_call_stops_the_job_naming_both_ranks_calls(mode):
    result = run_script(
        2, os.path.join(SCRIPTS, "mismatch.py"), mode, env={"MCR_DEBUG": "detail", "MCR_WATCHDOG_TIMEOUT": "120"}
    )
    assert result.returncode != 0, result.output[-3000:]
    out = result.output
    assert "made different collective calls" in out, out[-3000:]
    rank0 = (
        "rank 0 called all_to_all #3 (float32," if mode == "skip-last" else "rank 0 called all_reduce #2 (float32, sum"
    )
    assert rank0 in out and MISMATCHES[mode] in out, out[-3000:]
    assert "calls matched" not in out


def test_a_mismatch_inside_a_subgroup_names_its_ranks_and_the_differing_reduce_op():
    # 4 ranks; on the group of ranks 1, 2 and 3, rank 2 reduces with MAX where the others sum
    result = run_script(
        4, os.path.join(SCRIPTS, "mismatch.py"), "subgroup", env={"MCR_DEBUG": "detail", "MCR_WATCHDOG_TIMEOUT": "120"}
    )
    assert result.returncode != 0, result.output[-3000:]
    calls = (
        "the ranks of group [1, 2, 3] made different collective calls: rank 1 called all_reduce #1 (float32, sum, "
        "32 bytes); rank 2 called all_reduce #1 (float32, max, 32 bytes); rank 3 called all_reduce #1 (float32, sum, "
        "32 bytes)"
    )
    assert calls in result.output, result.output[-3000:]
    assert "calls matched" not in result.output


@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_matching_calls_pass_the_check_including_uneven_all_to_all(launcher):
    env = {"MCR_DEBUG": "detail"}
    out = run_script(2, os.path.join(SCRIPTS, "mismatch.py"), "none", launcher=launcher, env=env).check().output
    assert out.count("calls matched") == 2, out[-3000:]
