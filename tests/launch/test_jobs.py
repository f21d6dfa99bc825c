"""Job scripts for LSF, SLURM and Cobalt systems: valid bash, one rank per GPU, MPI launcher."""

import subprocess

import pytest

from launch.jobs import main

CMD = ["python", "-m", "apps.moe", "--config", "configs/moe/default.yaml"]


def write(tmp_path, system, nodes):
    out = tmp_path / "job.sh"
    assert (
        main(["--system", f"configs/systems/{system}.yaml", "--nodes", str(nodes), "--output", str(out), "--", *CMD])
        == 0
    )
    text = out.read_text()
    subprocess.run(["bash", "-n", str(out)], check=True)  # it parses
    return text


def test_lassen_uses_bsub_and_jsrun_with_4_gpus_per_node(tmp_path):
    text = write(tmp_path, "lassen", 4)
    assert "#BSUB -nnodes 4" in text and "export LOCAL_WORLD_SIZE=4" in text
    assert "jsrun --nrs 4 --rs_per_host 1 --tasks_per_rs 4 --gpu_per_rs ALL_GPUS" in text
    assert text.rstrip().endswith(" ".join(CMD))


def test_thetagpu_uses_mpirun_with_8_per_node_and_the_nodefile(tmp_path):
    text = write(tmp_path, "thetagpu", 2)
    assert "mpirun -np 16 -npernode 8 --hostfile $COBALT_NODEFILE" in text
    assert "export MASTER_ADDR=$(head -n 1 $COBALT_NODEFILE)" in text


def test_slurm_uses_srun_with_pmix(tmp_path):
    text = write(tmp_path, "thetagpu-slurm", 3)
    assert "#SBATCH --nodes=3" in text and "#SBATCH --ntasks-per-node=8" in text
    assert "srun --mpi=pmix python -m apps.moe" in text


def test_unknown_scheduler_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nscheduler: pbs\ngpus_per_node: 4\n")
    with pytest.raises(SystemExit, match="unknown scheduler 'pbs'; choose one of lsf, slurm, cobalt"):
        main(["--system", str(bad), "--nodes", "1", "--", "true"])
