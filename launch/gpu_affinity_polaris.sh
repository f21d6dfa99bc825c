#!/bin/bash
# One GPU per rank on Polaris (4 A100): Cray PALS mpiexec binds no GPUs, so each rank sees only
# the GPU its local rank names. In reverse order, as in ALCF's set_affinity_gpu_polaris.sh: with
# `--cpu-bind depth` local rank 0 gets the first cores, which sit nearest GPU 3.
# https://docs.alcf.anl.gov/polaris/running-jobs/using-gpus/#binding-mpi-ranks-to-gpus
export CUDA_VISIBLE_DEVICES=$((3 - PMI_LOCAL_RANK % 4))
exec "$@"
