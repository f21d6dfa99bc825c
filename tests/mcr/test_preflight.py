"""The preflight (mcr/tools/preflight.py): every rank's place and a collective on each backend, one
table, and an exit code that fails the job where a check failed, naming the rank and the fix. Here
on CPU ranks (the GPU checks say "no GPU"); under SLURM in tests/launch/test_slurm.py and
tests/cluster/test_preflight.py; on a GPU in tests/gpu/test_binding_said.py."""

from __future__ import annotations

import socket
import subprocess
import sys

from mcr.tools.preflight import cpulist, cpus_text, problems
from tests.ranks import REPO, rank_env

PREFLIGHT = [sys.executable, "-m", "launch.local", "-n", "2", "-m", "mcr.tools.preflight"]


def run(*prefix) -> subprocess.CompletedProcess:
    """Two fresh ranks (no fork server: they must inherit the CPU binding `prefix` sets)."""
    return subprocess.run([*prefix, *PREFLIGHT], cwd=REPO, env=rank_env(), capture_output=True, text=True, timeout=300)


def test_two_cpu_ranks_pass_every_check_and_say_no_gpu():
    proc = run()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    host = socket.gethostname()
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["rank", "host", "local", "CUDA_VISIBLE_DEVICES", "GPU", "GPU", "cores", "cores"] + [
        "nccl",
        "gloo",
        "mpi",
    ]
    for rank in (0, 1):  # no GPU: nccl says so and passes; gloo and MPI all-reduced every value right
        assert lines[1 + rank].split() == [str(rank), host, str(rank), "(unset)", "no", "GPU", "-", "all"] + [
            "no",
            "GPU",
            "ok",
            "ok",
        ], proc.stdout
    assert "CUDA tensors to MPI: no: no CUDA device on this rank; self-test: ok on host memory" in proc.stdout
    assert lines[-1] == "preflight: every check passed (2 ranks on 1 node(s))", proc.stdout


def test_two_ranks_bound_to_one_core_fail_naming_the_rank_and_the_fix():
    proc = run("taskset", "-c", "0")  # both ranks on core 0: a binding gone wrong
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "rank 1 (" in proc.stdout and ") is bound to cores 0 that rank 0 is bound to too. Fix: give each rank" in (
        proc.stdout
    )
    assert proc.stdout.splitlines()[-1] == "preflight: 1 problem(s) (2 ranks on 1 node(s))"


def row(rank, host="n1", uuid="", cpus=(0, 1, 2, 3), gpu_cpus=None, **ops) -> dict:
    return {
        "rank": rank, "host": host, "local_rank": rank, "visible": "(unset)", "cpus": list(cpus), "all_cpus": 4,
        "gpu": "cuda:0" if uuid else "no GPU", "uuid": uuid, "gpu_cpus": gpu_cpus, "gpus_seen": 1 if uuid else 0,
        "nccl": ops.get("nccl", "ok"), "gloo": ops.get("gloo", "ok"),
        "mpi": {"library": "MPI", "cuda": "no", "self_test": ops.get("self_test", "ok"), "op": ops.get("mpi", "ok")},
    }  # fmt: skip


def test_each_kind_of_problem_names_its_rank_and_fix():
    rows = [
        row(0, uuid="GPU-a", cpus=[0, 1], gpu_cpus=[2, 3]),  # its cores are not its GPU's
        row(1, uuid="GPU-a", cpus=[2, 3], gpu_cpus=[2, 3]),  # rank 0's GPU
        row(2, host="n2", uuid="GPU-c", gpu_cpus=[0, 1]),  # unbound (every core): no binding to be wrong
        row(3, host="n2", uuid="GPU-d", gloo="failed: RuntimeError: Connection refused"),
    ]
    found = problems(rows)
    assert len(found) == 3, found
    assert found[0].startswith("rank 0 (n1) runs on cores 0-1, but its GPU cuda:0")
    assert "is nearest cores 2-3. Fix: bind each rank to the cores of its GPU's NUMA node" in found[0]
    assert found[1].startswith("rank 1 (n1) shares GPU GPU-a with rank 0, so NCCL cannot run between them. Fix:")
    assert found[2].startswith("rank 3 (n2): gloo all-reduce across the nodes failed: RuntimeError: Connection")
    assert "Fix: name the fast network's interface" in found[2]
    assert problems([row(0, uuid="GPU-a", cpus=[2, 3], gpu_cpus=[2, 3]), row(1, uuid="GPU-b")]) == []


def test_cpu_lists_read_and_write_the_kernels_form():
    assert cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert cpus_text({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11" and cpus_text(set()) == "-"
