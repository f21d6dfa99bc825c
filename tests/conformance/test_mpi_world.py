"""torch's c10d suite on backend "mcr" in an MPI world of 2 ranks (mpi_world.py): MPI runs the ops."""

from tests.conformance.mpi_world import run


def test_c10d_suite_passes_with_mpi_running_the_ops():
    results = run(2)
    assert results.pop("routes") == {"mpi"}
    failed = {test: status for test, status in results.items() if status.startswith("failed")}
    assert not failed, "\n\n".join(f"{test}: {status}" for test, status in failed.items())
    passed = sum(status == "passed" for status in results.values())
    assert passed >= 90, f"only {passed} of {len(results)} tests ran"  # the runner lost its tests
