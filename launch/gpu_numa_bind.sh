#!/bin/bash
# `gpu_numa_bind.sh COMMAND...`: run COMMAND on the cores nearest the GPU this rank will use, GPU
# (local rank % GPUs) as mcr binds it, for launchers that place ranks but know nothing of GPUs:
# Open MPI's mpirun on a DGX A100, whose GPU r is not on NUMA node r (mpirun --map-by numa would put
# rank 0 on node 0, its GPU on node 3). The GPUs are the node's NVIDIA display/3D devices in PCI
# order (CUDA_DEVICE_ORDER=PCI_BUS_ID makes CUDA count them so too); their cores are the kernel's
# local_cpulist of each. Where CUDA_VISIBLE_DEVICES is set, or no NVIDIA GPU is found, COMMAND runs
# as placed. MCR_SYSFS_PCI names another PCI device tree (the tests' copy of one).
local_rank=${OMPI_COMM_WORLD_LOCAL_RANK:-${SLURM_LOCALID:-${PMI_LOCAL_RANK:?no local rank: OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID or PMI_LOCAL_RANK}}}
export CUDA_DEVICE_ORDER=PCI_BUS_ID
gpus=()
for dev in "${MCR_SYSFS_PCI:-/sys/bus/pci/devices}"/*; do
    [[ -r $dev/vendor && $(<"$dev/vendor") == 0x10de && $(<"$dev/class") == 0x030[02]* ]] && gpus+=("$dev")
done
if [[ -n ${CUDA_VISIBLE_DEVICES:-} || ${#gpus[@]} -eq 0 ]]; then
    exec "$@"
fi
cores=$(<"${gpus[local_rank % ${#gpus[@]}]}/local_cpulist")
exec taskset -c "$cores" "$@"
