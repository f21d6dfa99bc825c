"""torch's c10d suite on backend "mcr" with its ranks in an MPI world, so that MPI runs the ops:

    python -m tests.conformance.mpi_world -n 3            # mpiexec -n 3, every test the pytest classes run

Under spawn (suite.py) the ranks have no MPI world and every op runs on gloo. Here mpiexec
starts the ranks once; each rank runs the same tests in the same order, each on a fresh process
group as under spawn (file:// init, torch's rank and world size, which agree with mpiexec's),
and the runtime routes their ops to MPI. Rank 0 prints one `RESULT <class>.<test> <status>` line
per test. A test that kills or hangs a rank ends the job (the watchdog names the op); the driver
records it as failed and starts a new job from the next test.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import traceback
import unittest

PERSONAS = {"mcr": (), "gloo": ("mcr",), "mpi": ("mcr", "gloo")}  # as the pytest modules build them

# Tests that expect what MPI cannot do, and why (they run, on gloo, under spawn)
NOT_IN_MPI_WORLD = {
    name: "an MPI op has no timeout: the barrier the test expects to time out waits (the watchdog names it)"
    for name in ("test_barrier_timeout_full_group", "test_barrier_timeout_group", "test_barrier_timeout_global")
}


def tests_to_run(world_size: int) -> tuple[dict, list[tuple[str, str]]]:
    """The persona classes, and (persona, test) in run order: what the pytest classes run."""
    os.environ["WORLD_SIZE"] = str(world_size)
    from tests.conformance.suite import case_class

    classes, names = {}, []
    for persona, others in PERSONAS.items():
        case = classes[persona] = case_class(__name__, persona, others)
        for name in sorted(n for n in dir(case) if n.startswith("test_")):
            method = getattr(case, name)
            if callable(method) and not getattr(method, "__unittest_skip__", False) and name not in case.dropped_tests:
                names.append((persona, name))
    return classes, names


# --- one rank ---------------------------------------------------------------------------------
def run_rank(first: int) -> None:
    from mcr.backends.mpi import apply_mpi_defaults

    apply_mpi_defaults()  # this harness starts MPI before the runtime does: the runtime's settings first
    from mpi4py import MPI

    comm = MPI.COMM_WORLD.Dup()  # the harness's own channel, apart from the runtime's
    rank, size = comm.Get_rank(), comm.Get_size()
    classes, tests = tests_to_run(size)
    import torch.distributed as dist
    from torch.testing._internal import common_distributed, common_utils
    from torch.testing._internal.common_distributed import TEST_SKIPS

    from tests.conformance.suite import backend_named_mcr, load

    skips = {skip.exit_code: skip.message for skip in TEST_SKIPS.values()}
    if rank == 0:
        print(f"TOTAL {len(tests)}", flush=True)
    named = set()
    for index in range(first, len(tests)):
        persona, name = tests[index]
        if persona != "mcr" and persona not in named:  # groups made for the persona's backend run on "mcr"
            backend_named_mcr(persona)
            named.add(persona)
        if rank == 0:
            common_distributed.initialize_temp_directories()
            print(f"START {index} {persona}.{name}", flush=True)
        temp = comm.bcast(os.environ.get("TEMP_DIR"), root=0)
        os.environ["TEMP_DIR"] = temp
        load(persona).Barrier.init()  # this rank's barrier count from 0; the files are new
        comm.Barrier()
        case = classes[persona](name)
        case.rank, case.file_name = rank, os.path.join(temp, "init_dir", "shared_init_file")
        common_utils.set_rng_seed()  # the suite's tests draw the same random values on every rank
        if name in NOT_IN_MPI_WORLD:
            status = f"skipped: {NOT_IN_MPI_WORLD[name]}"
        else:
            status = _run_one(case, name, rank, size, dist, skips)
        statuses = comm.gather(status, root=0)
        if rank == 0:
            failed = [f"rank {r}: {s}" for r, s in enumerate(statuses) if s.startswith("failed")]
            skipped = [s for s in statuses if s.startswith("skipped")]
            verdict = "failed " + " | ".join(failed) if failed else (skipped[0] if skipped else "passed")
            print(f"RESULT {index} {persona}.{name} {verdict}".replace("\n", "\\n"), flush=True)
            common_distributed.cleanup_temp_dir()
        comm.Barrier()


def _run_one(case, name, rank, size, dist, skips) -> str:
    from datetime import timedelta

    import torch
    from torch.testing._internal.distributed import distributed_test

    timeout = timedelta(seconds=distributed_test.CUSTOM_PG_TIMEOUT.get(name, distributed_test.default_pg_timeout))
    try:
        dist.init_process_group(
            init_method=case.init_method, backend="mcr", world_size=size, rank=rank, timeout=timeout
        )
        if rank == 0:  # where the tests' ops run: MPI, unless the runtime could not start it
            import mcr

            rt = mcr.runtime()
            print(f"ROUTE {rt.router.choose('all_reduce', 4, rt.world, torch.float32, 'cpu')[0].name}", flush=True)
        case._barrier()
        getattr(case, name)()
        case._barrier()
        return "passed"
    except unittest.SkipTest as skip:
        return f"skipped: {skip}"
    except SystemExit as exit:  # the suite's skip decorators exit the rank's process with a code
        return f"skipped: {skips[exit.code]}" if exit.code in skips else f"failed: exit code {exit.code}"
    except Exception:
        return "failed: " + traceback.format_exc()[-2000:]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# --- the driver -------------------------------------------------------------------------------
def run(nprocs: int, timeout_s: float = 1800) -> dict:
    """{"<persona>.<test>": status} for every test, one mpiexec job after another, and under
    "routes" the backends the runtime chose for a small all-reduce."""
    from launch.local import mpiexec_command

    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    env.setdefault("MCR_WATCHDOG_TIMEOUT", "120")  # a hung test ends its job, named, instead of the run
    results, first, total = {"routes": set()}, 0, None
    while total is None or first < total:
        cmd = mpiexec_command(nprocs, ["-m", "tests.conformance.mpi_world", "--rank-loop", str(first)])
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        started = None
        for line in proc.stdout.splitlines():
            if match := re.match(r"START (\d+) (\S+)$", line):
                started = (int(match.group(1)), match.group(2))
            elif match := re.match(r"RESULT (\d+) (\S+) (.*)$", line):
                results[match.group(2)] = match.group(3).replace("\\n", "\n")
                started = None
            elif match := re.match(r"TOTAL (\d+)$", line):
                total = int(match.group(1))
            elif match := re.match(r"ROUTE (\S+)$", line):
                results["routes"].add(match.group(1))
        if proc.returncode == 0 and started is None:
            break
        if started is None:
            raise RuntimeError(f"mpiexec failed before any test:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        results[started[1]] = f"failed: the job ended in this test (exit {proc.returncode}): {proc.stderr[-1500:]}"
        first = started[0] + 1
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--nprocs", type=int, default=2)
    parser.add_argument("--rank-loop", type=int, default=None, help=argparse.SUPPRESS)  # inside mpiexec
    args = parser.parse_args(argv)
    if args.rank_loop is not None:
        run_rank(args.rank_loop)
        return 0
    results = run(args.nprocs)
    print(f"{args.nprocs} ranks in an MPI world; the runtime chose {', '.join(sorted(results.pop('routes')))}")
    for test, status in results.items():
        print(f"{test}: {status.splitlines()[0] if status else status}")
    counts = {kind: sum(s.startswith(kind) for s in results.values()) for kind in ("passed", "skipped", "failed")}
    print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
