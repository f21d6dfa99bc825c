"""Job scripts for every system in configs/systems: valid bash (and shellcheck-clean), the
scheduler's own directives and time format, and clear errors for bad system files."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from launch.cli import check_resume_dir, main
from launch.scripts import Job, job_script
from launch.systems import REPO, SYSTEMS_DIR, LaunchError, load_system, parse_time, queue_name, walltime
from tests.ranks import clean_env

SYSTEMS = sorted(f[: -len(".yaml")] for f in os.listdir(SYSTEMS_DIR) if f.endswith(".yaml"))


def script(system: str, nodes: int = 2, seconds: int = 3600, tmp="/tmp/job", **overrides) -> str:
    s = load_system(system, **{"account": "proj1", **overrides})
    return job_script(Job(s, nodes, seconds, tmp, "moe-test", "moe", ["--config", "configs/moe/tiny.yaml"]))


@pytest.mark.parametrize("system", SYSTEMS)
def test_every_system_writes_a_script_that_bash_accepts(system, tmp_path):
    path = tmp_path / "job.sh"
    path.write_text(script(system, tmp=str(tmp_path)))
    subprocess.run(["bash", "-n", str(path)], check=True)


@pytest.mark.parametrize("system", SYSTEMS)
def test_every_system_writes_a_script_that_shellcheck_accepts(system, tmp_path):
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed: `make slurm-deps` installs it (or `apt-get install shellcheck`)")
    path = tmp_path / "job.sh"
    path.write_text(script(system, tmp=str(tmp_path)))
    proc = subprocess.run(["shellcheck", "-S", "warning", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def written(tmp_path, *args) -> str:
    """`python -m launch script ... -- moe`'s job script."""
    assert main(["script", *args, "--out", str(tmp_path), "--quiet", "--", "moe"]) == 0
    (job_dir,) = [d for d in tmp_path.iterdir() if d.is_dir()]
    return (job_dir / "job.sh").read_text()


def test_the_command_line_changes_a_system_for_one_job_and_the_script_stays_valid(tmp_path):
    text = written(
        tmp_path, "--system", "polaris", "--nodes", "2", "--account", "proj1",
        "--module", "cudatoolkit", "--module", "nccl", "--preamble", "ulimit -c 0",
        "--env", "NCCL_COLLNET_ENABLE=", "--env", "NCCL_CROSS_NIC=0", "--env", "MY_FLAG=a b",
        "--directive", "-l place=excl", "--launcher-args=--label --no-transfer",
    )  # fmt: skip
    setup = text.split('source "$HOME/venvs/mcr-dl/bin/activate"\n', 1)[1]
    assert setup.startswith("module load cudatoolkit\nmodule load nccl\nulimit -c 0\n")  # after the file's own
    assert "\n#PBS -l place=scatter\n#PBS -l place=excl\n" in text
    assert "\nunset NCCL_COLLNET_ENABLE\n" in text and "NCCL_COLLNET_ENABLE=1" not in text  # NAME= unsets
    assert "\nNCCL_CROSS_NIC=0\n" in text and "\nMY_FLAG='a b'\n" in text  # the file's value replaced; a new one
    exported = text.split("\nexport LOCAL_WORLD_SIZE ", 1)[1].split("\n")[0].split()
    assert {"NCCL_CROSS_NIC", "MY_FLAG"} <= set(exported) and "NCCL_COLLNET_ENABLE" not in exported
    assert "\nmpiexec -n 8 --ppn 4 --depth 8 --cpu-bind depth --label --no-transfer launch/" in text
    path = next(tmp_path.glob("*/job.sh"))
    subprocess.run(["bash", "-n", str(path)], check=True)
    if shutil.which("shellcheck"):
        proc = subprocess.run(["shellcheck", "-S", "warning", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout


def test_modules_added_to_a_system_without_a_preamble_keep_the_venv_that_wrote_the_script(tmp_path):
    text = written(tmp_path, "--system", "local", "--nodes", "1", "--module", "gcc")
    venv = os.path.dirname(sys.executable)
    assert f"\nmodule load gcc\nexport PATH={venv}:$PATH\n" in text  # after the module: its python stays first


@pytest.mark.parametrize("bad", ["NOVALUE", "1X=2", "A-B=1"])
def test_a_bad_env_setting_is_refused_naming_the_form(tmp_path, capsys, bad):
    args = ["script", "--system", "local", "--nodes", "1", "--env", bad, "--out", str(tmp_path), "--", "moe"]
    assert main(args) == 2
    assert f"--env: bad value {bad!r}; give NAME=VALUE (NAME= unsets NAME)" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_time_is_h_mm_ss_in_and_each_schedulers_form_out():
    seconds = parse_time("1:30:00")
    assert [walltime(s, seconds) for s in ("slurm", "pbs", "lsf", "cobalt")] == ["1:30:00", "1:30:00", "1:30", "90"]
    assert walltime("cobalt", parse_time("0:00:30")) == "1"  # rounded up, never 0
    for bad in ("1:00", "90", "0:60:00", "0:00:00"):
        with pytest.raises(LaunchError, match="--time"):
            parse_time(bad)


def test_the_ranks_run_python_exec_where_set_else_the_preambles_python_or_this_one(monkeypatch):
    monkeypatch.delenv("PYTHON_EXEC", raising=False)
    assert f" {sys.executable} -m apps.moe " in script("local")
    assert " python -m apps.moe " in script("polaris")  # its preamble loads the center's environment
    monkeypatch.setenv("PYTHON_EXEC", "/other/python")  # as torchrun reads it for its workers
    assert " /other/python -m apps.moe " in script("local") and " /other/python -m apps.moe " in script("polaris")


def test_slurm_cpu_system_asks_for_no_gpus_and_no_partition_unless_given():
    text = script("local", nodes=1)
    assert "#SBATCH --ntasks-per-node=2" in text and "#SBATCH --cpus-per-task=1" in text
    assert "gpus" not in text and "--partition" not in text
    assert "#SBATCH --partition=short" in script("local", queue="short")
    gpu = script("slurm-gpu", queue="gpu")
    assert "#SBATCH --gpus-per-node=8" in gpu and "#SBATCH --account=proj1" in gpu and "#SBATCH --time=1:00:00" in gpu
    # every rank sees its node's GPUs and mcr binds one: no cgroup between ranks, so CUDA IPC works
    assert "\nsrun --mpi=pmix --kill-on-bad-exit=1 --cpus-per-task=8 --gpu-bind=none python" in gpu.replace(
        sys.executable, "python"
    )
    assert "--gpus-per-task" not in gpu
    fenced = script("slurm-gpu", gpu_bind="per_task")  # where MPI never gets GPU memory
    assert " --cpus-per-task=8 --gpus-per-task=1 " in fenced and "--gpu-bind" not in fenced
    assert "--gpus-per-task" not in script("local") and "--gpu-bind" not in script("local")
    assert "\nsrun --kill-on-bad-exit=1 " in script("slurm-gpu", srun_mpi="")  # no flag: the site's MpiDefault
    assert "\nsrun --mpi=cray_shasta --kill-on-bad-exit=1 " in script("slurm-gpu", srun_mpi="cray_shasta")


def test_perlmutter_gives_every_rank_its_nodes_gpus_one_by_wrapper_cray_mpich_with_gtl_and_the_nccl_plugin():
    text = script("perlmutter")
    for line in ("--nodes=2", "--ntasks-per-node=4", "--cpus-per-task=32", "--gpus-per-node=4", "--account=proj1"):
        assert f"\n#SBATCH {line}\n" in text, line
    assert "\n#SBATCH --constraint=gpu\n" in text and "\n#SBATCH --qos=regular\n" in text
    assert "--partition" not in text
    launch = (
        "\nsrun --mpi=cray_shasta --kill-on-bad-exit=1 --cpus-per-task=32 --gpu-bind=none --cpu-bind=cores "
        "launch/gpu_affinity_reversed.sh 4 python -m apps.moe "
    )
    assert launch in text and "--gpus-per-task" not in text  # no cgroup per rank: Cray MPICH's CUDA IPC works
    # Cray MPICH takes GPU buffers through its GTL, which craype-accel-nvidia80 puts in reach
    assert "\nMPICH_GPU_SUPPORT_ENABLED=1\n" in text
    assert "\nmodule load PrgEnv-gnu cudatoolkit craype-accel-nvidia80 nccl\n" in text
    exported = text.split("\nexport LOCAL_WORLD_SIZE ", 1)[1].split("\n")[0].split()
    nccl = {"NCCL_NET": "'AWS Libfabric'", "NCCL_NET_GDR_LEVEL": "PHB", "NCCL_CROSS_NIC": "1",
            "FI_CXI_DISABLE_HOST_REGISTER": "1", "FI_MR_CACHE_MONITOR": "userfaultfd",
            "FI_CXI_DEFAULT_CQ_SIZE": "131072"}  # fmt: skip
    for key, value in nccl.items():
        assert f"\n{key}={value}\n" in text and key in exported, key
    assert f"\nunset {' '.join(nccl)}\n" in script("perlmutter", nccl_plugin_off=True)


def test_lassen_uses_bsub_and_jsrun_with_the_bank_a_resource_set_per_gpu_and_gpu_smpiargs():
    text = script("lassen", account="mybank")
    assert "#BSUB -G mybank" in text and "#BSUB -W 1:00" in text and "#BSUB -nnodes 2" in text
    launch = text.split("\njsrun ", 1)[1]
    assert launch.startswith(
        '--nrs 8 --rs_per_host 4 --tasks_per_rs 1 --cpu_per_rs 10 --gpu_per_rs 1 --bind packed:10 --smpiargs="-gpu" '
    )
    assert "\nmodule load gcc/8.3.1 cuda/11.8.0 spectrum-mpi\n" in text and "conda activate mcr-dl" in text


def test_thetagpu_cobalt_charges_the_project_and_runs_mpirun_on_the_node_file():
    text = script("thetagpu")
    assert "#COBALT -A proj1" in text and "#COBALT -t 60" in text
    assert "\n#COBALT -O /tmp/job/job\n" in text  # a prefix: job.output, job.error, job.cobaltlog
    # a node's 8 ranks in order and unbound by mpirun; the wrapper binds each to its GPU's cores
    assert 'mpirun -np 16 --map-by ppr:8:node --bind-to none --hostfile "$COBALT_NODEFILE" -x PATH' in text
    assert " launch/gpu_numa_bind.sh python -m apps.moe " in text
    assert "-x MASTER_PORT" in text and "-x TORCH_EXTENSIONS_DIR" in text
    assert "\nMV2_USE_CUDA=1\n" in text and "-x MV2_USE_CUDA " in text  # MVAPICH2-GDR's GPU switch, on every node


def test_polaris_pbs_uses_select_walltime_mpiexec_a_gpu_per_rank_and_cray_mpich_gpu_support():
    text = script("polaris")
    assert "#PBS -l select=2:system=polaris" in text and "#PBS -l walltime=1:00:00" in text
    assert "#PBS -A proj1" in text and "#PBS -l filesystems=home:eagle" in text
    assert (
        "\nmpiexec -n 8 --ppn 4 --depth 8 --cpu-bind depth launch/gpu_affinity_reversed.sh 4 python -m apps.moe "
        in text
    )
    assert "\nMPICH_GPU_SUPPORT_ENABLED=1\n" in text and "\nmodule load conda craype-accel-nvidia80\n" in text


def test_polaris_queue_is_chosen_from_the_node_count_and_wall_time_as_alcf_lists_them():
    # docs.alcf.anl.gov/polaris/running-jobs/: debug 1-2 nodes, debug-scaling 1-10, prod 10-496, by time
    s = load_system("polaris", account="proj1")
    hour = parse_time("1:00:00")
    fits = [(1, hour), (2, hour), (3, hour), (10, hour), (24, hour), (25, hour), (496, hour)]
    fits += [(10, 3 * hour), (24, 3 * hour), (25, 6 * hour), (100, 24 * hour)]
    assert [queue_name(s, n, t) for n, t in fits] == ["debug"] * 2 + ["debug-scaling"] * 2 + ["prod"] * 7
    for nodes, seconds in ((3, 3 * hour), (497, hour), (24, 4 * hour)):
        with pytest.raises(
            LaunchError, match=rf"no queue of polaris takes {nodes} node\(s\) .*debug-scaling \(1-10 nodes"
        ):
            queue_name(s, nodes, seconds)
    assert "\n#PBS -q debug-scaling\n" in script("polaris", nodes=4, seconds=1800)  # the default debug refuses 3+
    assert "\n#PBS -q prod\n" in script("polaris", nodes=12, seconds=2 * hour)
    assert "\n#PBS -q preemptable\n" in script("polaris", nodes=4, seconds=30 * hour, queue="preemptable")  # --queue


def test_polaris_puts_alcfs_nccl_plugin_and_settings_in_the_script_and_one_switch_takes_them_out():
    text = script("polaris")
    plugin = "export LD_LIBRARY_PATH=/soft/libraries/aws-ofi-nccl/v1.9.1-aws/lib:/soft/libraries/hwloc/lib:"
    assert f"\n{plugin}" in text and text.index(plugin) < text.index("\nmpiexec ")
    exported = text.split("\nexport LOCAL_WORLD_SIZE ", 1)[1].split("\n")[0].split()
    settings = {  # docs.alcf.anl.gov/polaris/applications-and-libraries/libraries/nccl/
        "NCCL_NET_GDR_LEVEL": "PHB", "NCCL_CROSS_NIC": "1", "NCCL_COLLNET_ENABLE": "1", "NCCL_NET": "'AWS Libfabric'",
        "FI_CXI_DISABLE_HOST_REGISTER": "1", "FI_MR_CACHE_MONITOR": "userfaultfd", "FI_CXI_DEFAULT_CQ_SIZE": "131072",
    }  # fmt: skip
    for key, value in settings.items():
        assert f"\n{key}={value}\n" in text and key in exported, key
    assert "unset" not in text
    # off: none of it, and the conda module's own copies unset (ALCF: the plugin can hang Megatron-DeepSpeed)
    off = script("polaris", nccl_plugin_off=True)
    assert "aws-ofi-nccl" not in off and "NCCL_NET=" not in off and "FI_MR_CACHE_MONITOR=" not in off
    assert f"\nunset {' '.join(settings)}\n" in off
    assert "\nMPICH_GPU_SUPPORT_ENABLED=1\n" in off  # MPI's own GPU switch stays
    assert "NCCL_NET" not in script("lassen")  # a system that names no plugin sets none


@pytest.mark.parametrize("variable", ["PMI_LOCAL_RANK", "SLURM_LOCALID"])  # Cray PALS (Polaris), srun (Perlmutter)
def test_gpu_wrapper_gives_each_local_rank_one_gpu_in_reverse_order(variable):
    wrapper = os.path.join(REPO, "launch", "gpu_affinity_reversed.sh")
    seen = []
    for local_rank in range(5):
        env = {"PATH": os.environ["PATH"], variable: str(local_rank)}
        proc = subprocess.run(
            [wrapper, "4", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES"], env=env, capture_output=True, text=True
        )
        seen.append(proc.stdout.strip())
    assert seen == ["3", "2", "1", "0", "3"]
    proc = subprocess.run([wrapper, "4", "true"], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True)
    assert proc.returncode != 0 and "no local rank" in proc.stderr


def test_gpu_numa_wrapper_binds_each_local_rank_to_the_cores_of_its_gpu(tmp_path):
    # a copy of sysfs' PCI device tree: two NVIDIA 3D controllers whose cores are the other way
    # round (GPU 0 nearest core 1), a NIC, and an NVIDIA bridge (an NVSwitch) that is no GPU
    devices = {
        "0000:07:00.0": ("0x10de", "0x030200", "1"),
        "0000:0f:00.0": ("0x10de", "0x030200", "0"),
        "0000:0c:00.0": ("0x15b3", "0x020700", "0-1"),
        "0000:c1:00.0": ("0x10de", "0x068000", "0-1"),
    }
    for address, (vendor, cls, cpus) in devices.items():
        (tmp_path / address).mkdir()
        for name, value in (("vendor", vendor), ("class", cls), ("local_cpulist", cpus)):
            (tmp_path / address / name).write_text(value + "\n")
    wrapper = os.path.join(REPO, "launch", "gpu_numa_bind.sh")
    show = ["sh", "-c", 'grep Cpus_allowed_list /proc/self/status | cut -f2; echo "$CUDA_DEVICE_ORDER"']
    seen = []
    for local_rank in range(3):
        env = {
            "PATH": os.environ["PATH"],
            "MCR_SYSFS_PCI": str(tmp_path),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
        }
        proc = subprocess.run([wrapper, *show], env=env, capture_output=True, text=True, check=True)
        seen.append(proc.stdout.split())
    assert seen == [["1", "PCI_BUS_ID"], ["0", "PCI_BUS_ID"], ["1", "PCI_BUS_ID"]]  # GPU (local rank % 2)'s cores
    # where the rank sees chosen GPUs only, it runs as placed
    env["CUDA_VISIBLE_DEVICES"] = "1"
    placed = subprocess.run(show, env=env, capture_output=True, text=True, check=True).stdout.split()[0]
    proc = subprocess.run([wrapper, *show], env=env, capture_output=True, text=True, check=True)
    assert proc.stdout.split()[0] == placed


def test_every_script_sets_up_the_environment_the_trainers_read():
    for system in SYSTEMS:
        text = script(system)
        for line in (
            "cd ",
            "\nLOCAL_WORLD_SIZE=",
            "\nMASTER_ADDR=",
            "\nMASTER_PORT=$((20000 + JOB_ID % 20000))",
            "\nWANDB_MODE=${WANDB_MODE:-offline}",
            "\nOMP_NUM_THREADS=",
            "\nTORCH_EXTENSIONS_DIR=$RUN_DIR/torch_extensions",
        ):
            assert line in text, (system, line)
        exported = text.split("\nexport LOCAL_WORLD_SIZE ", 1)[1].split("\n")[0].split() + ["LOCAL_WORLD_SIZE"]
        assert {"LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "WANDB_MODE"} <= set(exported)
        assert 'out_dir="$JOB_DIR" name="moe-$JOB_ID"' in text
        # the ranks' files and the launcher's output, read when it fails (run for real: tests/launch/test_slurm.py)
        assert "\nMCR_RANK_DIR=$RUN_DIR/ranks" in text and "MCR_RANK_DIR" in exported, system
        launched = text.rstrip().splitlines()[-1]
        dead_rank = ' -m launch.dead_rank "$MCR_RANK_DIR" "$LAUNCHER_LOG" --flight-dir "$RUN_DIR/flight_recorder";'
        assert launched.endswith(dead_rank + " exit $status; }"), launched
        assert '2>&1 | tee "$LAUNCHER_LOG" ||' in launched, (system, launched)


def test_a_system_naming_the_fast_interface_sends_gloo_nccl_and_open_mpi_over_it_and_keeps_the_hostname():
    text = script("local", interface="ib0")
    exported = text.split("\nexport LOCAL_WORLD_SIZE ", 1)[1].split("\n")[0].split()
    for var in (
        "GLOO_SOCKET_IFNAME",
        "NCCL_SOCKET_IFNAME",
        "OMPI_MCA_btl_tcp_if_include",
        "PRTE_MCA_oob_tcp_if_include",
    ):
        assert f"\n{var}=ib0\n" in text and var in exported, var
    assert "\nMASTER_ADDR=$(scontrol show hostnames" in text  # the store listens on every interface
    assert "GLOO_SOCKET_IFNAME" not in script("local")  # none named: the libraries' own choice
    assert "-x GLOO_SOCKET_IFNAME" in script("thetagpu", interface="ib0")  # mpirun forwards it to every node


@pytest.mark.parametrize(
    "content, message",
    [
        ("scheduler: slurm\nacount: x\n", "unknown key 'acount' in .*; valid keys: name, scheduler, account"),
        ("scheduler: sge\n", "bad value 'sge' for key 'scheduler' in .*; choose one of slurm, lsf, pbs, cobalt"),
        ("scheduler: slurm\nranks_per_node: 0\n", "bad value 0 for key 'ranks_per_node' in .*: must be >= 1"),
        ("scheduler: slurm\ncpus_per_task: two\n", "bad value for key 'cpus_per_task' in .*: Value 'two'"),
        ("scheduler: slurm\nsrun_mpi: pmi3\n", "choose one of pmix, pmi2, cray_shasta, none, ''"),
        (
            "scheduler: slurm\ngpu_bind: single\n",
            "bad value 'single' for key 'gpu_bind' in .*; choose one of per_task, none",
        ),
        ("scheduler: pbs\n", "pbs jobs need a project to charge; give --account"),
        ("ranks_per_node: 4\ngpus_per_node: 8\n", "bad value 8 for key 'gpus_per_node' in .*: 0 or ranks_per_node"),
    ],
)
def test_bad_system_files_are_clear_errors(tmp_path, content, message):
    path = tmp_path / "sys.yaml"
    path.write_text(content)
    with pytest.raises(LaunchError, match=message):
        load_system(str(path))


def test_dry_run_writes_an_executable_script_in_a_fresh_job_dir_and_errors_are_one_line(tmp_path, capsys):
    args = ["submit", "--system", "local", "--nodes", "1", "--out", str(tmp_path), "--dry-run", "--", "moe"]
    assert main(args) == 0 and main(args) == 0
    dirs = sorted(os.listdir(tmp_path))
    assert len(dirs) == 2 and dirs[0].startswith("moe-local-1n-")  # the second job never overwrites the first
    path = tmp_path / dirs[0] / "job.sh"
    assert os.access(path, os.X_OK) and "not submitted" in capsys.readouterr().out
    out = ["--out", str(tmp_path)]
    assert main(["submit", "--system", "local", "--nodes", "1", "--time", "1:00", *out, "--", "moe"]) == 2
    assert main(["submit", "--system", "local", "--nodes", "1", *out, "--", "nope"]) == 2
    err = capsys.readouterr().err
    assert "--time: bad value '1:00'; give h:mm:ss" in err and "unknown app 'nope'; choose one of" in err
    assert len(os.listdir(tmp_path)) == 2  # a refused job leaves no directory behind


def test_sweep_dry_run_writes_every_jobs_script_with_its_queue_and_submits_none(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no qsub here: a submit would fail the sweep
    args = ["sweep", "--system", "polaris", "--account", "proj1", "--app", "moe", "--nodes", "1,4,12"]
    assert main([*args, "--backends", "gloo,nccl", "--out", str(tmp_path), "--dry-run", "--", "train.steps=4"]) == 0
    out = capsys.readouterr().out
    (sweep_dir,) = [d for d in tmp_path.iterdir() if d.name.startswith("sweep-moe-polaris-")]
    for nodes, queue in ((1, "debug"), (4, "debug-scaling"), (12, "prod")):
        for backend in ("gloo", "nccl"):
            text = (sweep_dir / f"{nodes}n-{backend}" / "job.sh").read_text()
            assert f"\n#PBS -q {queue}\n" in text and f"#PBS -l select={nodes}:" in text
            assert f"comm.backend={backend}" in text and "train.steps=4" in text
            assert f"sweep: {nodes} node(s) x {backend} (queue {queue}): " in out
    assert "wrote 6 job scripts" in out and "(not submitted)" in out


@pytest.mark.parametrize("system", SYSTEMS)
def test_preflight_writes_a_short_job_running_the_check_on_every_rank(system, tmp_path, capsys):
    args = ["preflight", "--system", system, "--nodes", "2", "--account", "proj1", "--out", str(tmp_path), "--quiet"]
    assert main(args) == 0
    assert "(not submitted; --submit runs it)" in capsys.readouterr().out
    (path,) = tmp_path.glob("preflight-*/job.sh")
    text = path.read_text()
    assert " -m mcr.tools.preflight " in text and 'name="preflight-$JOB_ID"' in text
    assert walltime(load_system(system, account="proj1").scheduler, parse_time("0:10:00")) in text  # short
    if shutil.which("shellcheck"):
        proc = subprocess.run(["shellcheck", "-S", "warning", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout


def test_launching_imports_neither_torch_nor_mcr():
    code = "import sys, launch.cli, launch.sweep, launch.preflight, launch.local; print([m for m in ('torch', 'mcr', 'mpi4py') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_resume_refuses_a_run_dir_with_nothing_to_resume(tmp_path):
    (tmp_path / "moe-7").mkdir()
    for path, message in [
        (tmp_path / "nowhere", "no such run dir"),
        (tmp_path / "moe-7", "no checkpoints/latest there, so nothing to resume"),
    ]:
        with pytest.raises(LaunchError, match=message):
            check_resume_dir(str(path), "moe")
    with pytest.raises(LaunchError, match="not a run of dense"):
        check_resume_dir(str(tmp_path / "moe-7"), "dense")


def test_local_launcher_passes_mpiexec_args_through_and_refuses_them_for_torchrun(tmp_path):
    # what a compare across nodes relies on (--mpiexec-args "--host node1:1,node2:1 ..."): the
    # options reach mpiexec; here --output tag, whose effect shows on every rank's line
    script = tmp_path / "hello.py"
    script.write_text("print('hello from a rank', flush=True)\n")
    launch = [sys.executable, "-m", "launch.local", "-n", "2"]
    tagged = subprocess.run(
        [*launch, "--mpiexec-args", "--output tag", str(script)],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
    )
    assert tagged.returncode == 0, tagged.stdout + tagged.stderr
    assert sorted(re.findall(r"\[\d+,(\d)\]<stdout>: hello from a rank", tagged.stdout)) == ["0", "1"], tagged.stdout
    refused = subprocess.run(
        [*launch, "--launcher", "torchrun", "--mpiexec-args", "--output tag", str(script)],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and "--mpiexec-args needs --launcher mpiexec" in refused.stderr, refused.stderr
