#!/bin/bash
# `gpu_affinity_reversed.sh GPUS COMMAND...`: run COMMAND seeing one GPU, chosen from this rank's
# local rank in reverse order, where the launcher binds no GPUs and a node's first cores sit nearest
# its last GPU: Polaris (Cray PALS, as ALCF's set_affinity_gpu_polaris.sh:
# docs.alcf.anl.gov/polaris/running-jobs/using-gpus/#binding-mpi-ranks-to-gpus) and Perlmutter
# (srun --gpu-bind=none, as WarpX's job script: github.com/BLAST-WarpX/warpx/pull/4223). It sets
# CUDA_VISIBLE_DEVICES, not a cgroup, so CUDA IPC between the node's ranks still works.
gpus=${1:?usage: gpu_affinity_reversed.sh GPUS_PER_NODE COMMAND...}
shift
local_rank=${PMI_LOCAL_RANK:-${PALS_LOCAL_RANKID:-${SLURM_LOCALID:?no local rank: PMI_LOCAL_RANK (PALS) or SLURM_LOCALID (srun)}}}
export CUDA_VISIBLE_DEVICES=$((gpus - 1 - local_rank % gpus))
exec "$@"
