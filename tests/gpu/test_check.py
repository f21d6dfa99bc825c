"""tests/gpu/check.py's reading of pytest, on any machine: a small test file run by real pytest
through the check's own step runner, then the summary `make gpu-check` prints. A test that
skipped is named there as SKIPPED with its reason, and its step is not "passed"."""

from __future__ import annotations

import os

import pytest

from tests.gpu import check

PASSES = "def test_runs():\n    assert 1 + 1 == 2\n"
# the two ways tests/gpu skips: a marker (needs_gpu) and a call in the test (the CUDA-aware case)
SKIPS = {
    "marker": "@pytest.mark.skipif(True, reason='no CUDA-aware MPI here')\ndef test_aware():\n    pass\n",
    "call": "def test_aware():\n    pytest.skip('no CUDA-aware MPI here')\n",
}
FAILS = "def test_wrong():\n    assert 2 + 2 == 5, 'arithmetic broke'\n"


def run_sample(tmp_path, *bodies):
    """Run a test file made of `bodies` as the check's tests/gpu step; (the step, the summary)."""
    path = tmp_path / "test_sample.py"
    path.write_text("import pytest\n\n\n" + "\n\n".join(bodies))
    step = check.pytest_step("tests/gpu", str(tmp_path / "report.xml"), [str(path)], 120)
    check.run(step, dict(os.environ), str(tmp_path / "step.log"))
    return step, check.summary([step], {"torch": "2"}, {}, str(tmp_path))


@pytest.mark.parametrize("how", sorted(SKIPS))
def test_a_skipped_test_is_printed_as_skipped_with_its_reason_never_as_passed(tmp_path, how):
    step, text = run_sample(tmp_path, PASSES, SKIPS[how])
    assert step.status == "skipped", text
    assert "1 passed, 1 skipped" in step.note, text
    skipped = [line.strip() for line in text.splitlines() if line.strip().startswith("SKIPPED")]
    assert len(skipped) == 1 and "test_aware: " in skipped[0] and skipped[0].endswith("no CUDA-aware MPI here"), text
    assert text.splitlines()[-1] == "gpu-check: NOT passed: tests/gpu (skipped)", text


def test_every_test_passing_is_a_passed_step_with_nothing_under_it(tmp_path):
    step, text = run_sample(tmp_path, PASSES)
    assert (step.status, step.details) == ("passed", []), text
    assert text.splitlines()[-1] == "gpu-check: all passed", text


def test_a_failure_is_named_beside_the_skips(tmp_path):
    step, text = run_sample(tmp_path, PASSES, SKIPS["call"], FAILS)
    assert step.status == "failed" and step.note.startswith("exit 1: "), text
    assert [line.split(": ")[0] for line in step.details] == [
        "FAILED test_sample::test_wrong",
        "SKIPPED test_sample::test_aware",
    ]
    assert "arithmetic broke" in step.details[0], text


def test_a_pytest_that_left_no_report_is_not_passed(tmp_path):
    """pytest killed (the step's time limit) or crashed before it wrote --junitxml."""
    step = check.pytest_step("tests/gpu", str(tmp_path / "never-written.xml"), [], 1)
    step.status = "passed"
    check.judge_tests(step, 0)
    assert step.status == "failed" and "no report" in step.note
