"""LSF, PBS Pro and Cobalt job scripts run end to end under TEST DOUBLES of their tools
(tests/launch/doubles: bsub + jsrun, qsub + Cray PALS mpiexec, Cobalt qsub + Open MPI mpirun).

The doubles set what the real systems document (LSB_*, JSM_NAMESPACE_*, PBS_NODEFILE, PMI_*,
COBALT_NODEFILE, OMPI_COMM_WORLD_*) for 2 "nodes" x 2 ranks on this host; the ranks run
tests/launch/probe.py, which discovers its place with mcr.env and all-gathers it over gloo at
the rendezvous the script exported. Only the product's code decides ranks and addresses. Each
rank also shows the GPU settings it started with: its GPU and its MPI's GPU switch.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys

import pytest
from omegaconf import OmegaConf

from launch.cli import main
from launch.scripts import SCHEDULER_LOG, Job, write_script
from launch.submit import job_state, submit, wait
from launch.systems import SYSTEMS_DIR, load_system

DOUBLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "doubles")


@pytest.fixture
def doubles(tmp_path, monkeypatch):
    """The doubles first on PATH, keeping their state (job ids, exit codes, arguments) in tmp_path."""
    monkeypatch.setenv("PATH", DOUBLES + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("SCHEDULER_DOUBLE_STATE", str(tmp_path))


@pytest.mark.parametrize("system, launcher", [("lassen", "jsrun"), ("polaris", "cray-pals"), ("thetagpu", "openmpi")])
def test_rank_discovery_end_to_end_under_scheduler_test_doubles(system, launcher, tmp_path, doubles):
    s = load_system(system, account="proj1")
    s.preamble = [f"export PATH={DOUBLES}:{os.path.dirname(sys.executable)}:$PATH"]  # instead of module/conda
    s.ranks_per_node, s.gpus_per_node, s.cpus_per_task = 2, 2, 3
    job = Job(s, 2, 600, str(tmp_path / "job"), "probe", "probe", [], module="tests.launch.probe")
    job_id = submit(s.scheduler, write_script(job), cwd=job.job_dir)  # the double runs the job before answering
    # what launch submit --wait reads: Cobalt's qstat lists live jobs only, so an ended one is gone
    assert wait(s.scheduler, [job_id], 30, poll_s=0.1) == {job_id: "GONE" if s.scheduler == "cobalt" else "DONE"}

    log_name = SCHEDULER_LOG[s.scheduler].replace("%J", job_id)  # Cobalt's: job.output
    with open(os.path.join(job.job_dir, log_name)) as f:
        text = f.read()
    if s.scheduler == "cobalt":
        text += open(os.path.join(job.job_dir, "job.error")).read()
    rows = re.findall(r"probe: rank (\d+) local (\d+) of (\d+) world (\d+)", text)
    assert sorted(tuple(map(int, r)) for r in rows) == [(r, r % 2, 2, 4) for r in range(4)], text
    port = 20000 + int(job_id) % 20000
    assert f"probe: launcher {launcher}; master {socket.gethostname()}:{port}" in text
    assert "probe: threads 3 (the trainers' rule)" in text  # thread counts from the CPUs per task
    assert os.path.isdir(os.path.join(job.job_dir, f"probe-{job_id}"))  # the run dir named with the job id

    # what each rank was started with: one GPU and its cores, and the MPI's GPU switch
    gpu_env = dict(re.findall(r"probe-env: rank (\d+) gpu (.*)", text))
    assert sorted(gpu_env) == ["0", "1", "2", "3"], text
    tool = {"lsf": "jsrun", "pbs": "mpiexec", "cobalt": "mpirun"}[s.scheduler]
    with open(tmp_path / f"{tool}.args") as f:
        given = " ".join(json.loads(f.readline()))
    if system == "lassen":  # a resource set per rank with its GPU; -gpu turns on Spectrum MPI's CUDA path
        assert "--rs_per_host 2 --tasks_per_rs 1 --cpu_per_rs 3 --gpu_per_rs 1 --bind packed:3" in given
        assert "--smpiargs=-gpu" in given
        assert all("OMPI_MCA_pml_pami_enable_cuda=1" in seen for seen in gpu_env.values())
    elif system == "polaris":  # cores by depth; the wrapper gives local rank r GPU 3 - r (ALCF's order)
        assert "--depth 3 --cpu-bind depth launch/gpu_affinity_reversed.sh 4" in given
        for rank, seen in gpu_env.items():
            assert f"CUDA_VISIBLE_DEVICES={3 - int(rank) % 2}" in seen and "MPICH_GPU_SUPPORT_ENABLED=1" in seen
            # ALCF's NCCL plugin reaches every rank: NCCL_NET and the library path that holds the plugin
            assert "NCCL_NET=AWS Libfabric FI_MR_CACHE_MONITOR=userfaultfd" in seen, seen
            assert "LD_LIBRARY_PATH=/soft/libraries/aws-ofi-nccl/v1.9.1-aws/lib:/soft/libraries/hwloc/lib" in seen
    else:  # mpirun forwards the MVAPICH2-GDR switch to every node; the wrapper binds each rank's cores
        assert "-x MV2_USE_CUDA" in given
        assert "--map-by ppr:2:node --bind-to none --hostfile" in given and " launch/gpu_numa_bind.sh " in given
        assert all("MV2_USE_CUDA=1" in seen for seen in gpu_env.values())


def test_polaris_without_the_nccl_plugin_leaves_no_nccl_setting_on_any_rank_not_even_the_modules(tmp_path, doubles):
    # ALCF's conda module sets the plugin's variables itself; ALCF's advice where the plugin hangs
    # a job (Megatron-DeepSpeed) is to unset them, which --no-nccl-plugin does after the preamble
    s = load_system("polaris", account="proj1", nccl_plugin_off=True)
    module = "export NCCL_NET='AWS Libfabric' NCCL_COLLNET_ENABLE=1 FI_MR_CACHE_MONITOR=userfaultfd"
    s.preamble = [f"export PATH={DOUBLES}:{os.path.dirname(sys.executable)}:$PATH", module]
    s.ranks_per_node, s.gpus_per_node, s.cpus_per_task = 2, 2, 1
    job = Job(s, 1, 600, str(tmp_path / "job"), "probe", "probe", [], module="tests.launch.probe")
    job_id = submit(s.scheduler, write_script(job), cwd=job.job_dir)
    assert wait(s.scheduler, [job_id], 30, poll_s=0.1) == {job_id: "DONE"}
    text = open(os.path.join(job.job_dir, "job.out")).read()
    gpu_env = dict(re.findall(r"probe-env: rank (\d+) gpu (.*)", text))
    assert sorted(gpu_env) == ["0", "1"], text
    for seen in gpu_env.values():
        assert "NCCL_NET= FI_MR_CACHE_MONITOR= " in seen and "aws-ofi-nccl" not in seen, seen
        assert "MPICH_GPU_SUPPORT_ENABLED=1" in seen


def test_submit_on_cobalt_names_the_log_cobalt_writes(tmp_path, doubles, capsys):
    # Cobalt's -O is a prefix: the job's output lands in <prefix>.output, its errors in .error
    system = tmp_path / "thetagpu.yaml"
    cfg = OmegaConf.load(os.path.join(SYSTEMS_DIR, "thetagpu.yaml"))
    cfg.preamble = [f"export PATH={DOUBLES}:{os.path.dirname(sys.executable)}:$PATH"]
    cfg.ranks_per_node, cfg.gpus_per_node, cfg.cpus_per_task = 2, 2, 1
    OmegaConf.save(cfg, system)
    args = ["--system", str(system), "--nodes", "1", "--account", "proj1", "--out", str(tmp_path / "runs"), "--quiet"]
    assert main(["submit", *args, "--", "moe", "--help"]) == 0
    out = capsys.readouterr().out
    log = re.search(r"^log: +(\S+) \(its stderr: job.error; Cobalt's record: job.cobaltlog\)$", out, re.M).group(1)
    assert os.path.basename(log) == "job.output", out
    assert "job " in open(log).read()  # the script's own line: "job <id>: 4 ranks of apps.moe ..."


@pytest.mark.parametrize("scheduler", ["lsf", "pbs", "cobalt"])
def test_a_scheduler_that_does_not_answer_leaves_a_job_unknown_and_one_it_does_not_know_is_gone(
    scheduler, doubles, monkeypatch
):
    # a daemon too busy to answer, or restarting, must not end launch submit --wait (SLURM did once)
    assert job_state(scheduler, "4242") == "GONE"  # "is not found", "Unknown Job Id", not listed
    monkeypatch.setenv("SCHEDULER_DOUBLE_DOWN", "1")
    assert job_state(scheduler, "4242") is None


@pytest.mark.parametrize("system", ["lassen", "polaris"])
def test_a_job_whose_ranks_fail_is_read_as_failed(system, tmp_path, doubles):
    s = load_system(system, account="proj1")
    s.preamble = [f"export PATH={DOUBLES}:{os.path.dirname(sys.executable)}:$PATH"]
    job = Job(s, 1, 600, str(tmp_path / "job"), "probe", "probe", [], module="tests.launch.no_such_module")
    job_id = submit(s.scheduler, write_script(job), cwd=job.job_dir)
    assert wait(s.scheduler, [job_id], 30, poll_s=0.1) == {job_id: "FAILED"}  # LSF's EXIT, PBS's exit status
