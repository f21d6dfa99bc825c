"""Write a batch job script that runs a command on N nodes of a described system.

    python -m launch.jobs --system configs/systems/lassen.yaml --nodes 4 --time 1:00 \
        -- python -m apps.moe --config configs/moe/default.yaml

LSF (bsub + jsrun), SLURM (sbatch + srun --mpi=pmix) and Cobalt-style node files (mpirun) are
supported. Every script launches one rank per GPU through the MPI launcher, so the MPI backend
has a world, exports LOCAL_WORLD_SIZE (TorchRec assumes 8 otherwise) and keeps wandb offline.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass

from omegaconf import OmegaConf


@dataclass
class System:
    name: str
    scheduler: str  # lsf | slurm | cobalt
    gpus_per_node: int
    queue: str = ""
    bank: str = ""


SCHEDULERS = ("lsf", "slurm", "cobalt")


def load_system(path: str) -> System:
    system = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(System), OmegaConf.load(path)))
    if system.scheduler not in SCHEDULERS:
        raise SystemExit(f"{path}: unknown scheduler {system.scheduler!r}; choose one of {', '.join(SCHEDULERS)}")
    return system


def _common_env(system: System) -> list[str]:
    return [
        f"export LOCAL_WORLD_SIZE={system.gpus_per_node}",
        "export WANDB_MODE=${WANDB_MODE:-offline}",
        "export OMPI_MCA_mpi_yield_when_idle=1",
    ]


def lsf_script(system: System, nodes: int, time: str, command: str, job: str) -> str:
    return "\n".join(
        [
            "#!/bin/bash",
            f"#BSUB -nnodes {nodes}",
            f"#BSUB -W {time}",
            f"#BSUB -q {system.queue}",
            f"#BSUB -G {system.bank}",
            f"#BSUB -J {job}",
            f"#BSUB -o {job}.%J.out",
            *_common_env(system),
            f"jsrun --nrs {nodes} --rs_per_host 1 --tasks_per_rs {system.gpus_per_node} --gpu_per_rs ALL_GPUS "
            f'--cpu_per_rs ALL_CPUS --bind packed:8 --smpiargs="-gpu" {command}',
            "",
        ]
    )


def slurm_script(system: System, nodes: int, time: str, command: str, job: str) -> str:
    return "\n".join(
        [
            "#!/bin/bash",
            f"#SBATCH --nodes={nodes}",
            f"#SBATCH --ntasks-per-node={system.gpus_per_node}",
            f"#SBATCH --gpus-per-node={system.gpus_per_node}",
            f"#SBATCH --time={time}",
            f"#SBATCH --partition={system.queue}",
            f"#SBATCH --job-name={job}",
            f"#SBATCH --output={job}.%j.out",
            *_common_env(system),
            f"srun --mpi=pmix {command}",
            "",
        ]
    )


def cobalt_script(system: System, nodes: int, time: str, command: str, job: str) -> str:
    ranks = nodes * system.gpus_per_node
    return "\n".join(
        [
            "#!/bin/bash",
            f"#COBALT -n {nodes}",
            f"#COBALT -t {time}",
            f"#COBALT -q {system.queue}",
            *_common_env(system),
            "export MASTER_ADDR=$(head -n 1 $COBALT_NODEFILE)",
            f"mpirun -np {ranks} -npernode {system.gpus_per_node} --hostfile $COBALT_NODEFILE "
            f"-x PATH -x LD_LIBRARY_PATH -x PYTHONPATH -x LOCAL_WORLD_SIZE -x WANDB_MODE -x MASTER_ADDR "
            f"-x OMPI_MCA_mpi_yield_when_idle {command}",
            "",
        ]
    )


WRITERS = {"lsf": lsf_script, "slurm": slurm_script, "cobalt": cobalt_script}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, command = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--system", required=True, help="a YAML file from configs/systems/")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--time", default="1:00", help="wall time, h:mm")
    parser.add_argument("--job-name", default="mcr-dl")
    parser.add_argument("--output", default="-", help="script path (default: print)")
    args = parser.parse_args(own)
    if not command:
        parser.error("give the command to run after --")
    if args.nodes < 1:
        parser.error("--nodes must be at least 1")
    system = load_system(args.system)
    script = WRITERS[system.scheduler](system, args.nodes, args.time, shlex.join(command), args.job_name)
    if args.output == "-":
        sys.stdout.write(script)
    else:
        with open(args.output, "w") as f:
            f.write(script)
    return 0


if __name__ == "__main__":
    sys.exit(main())
