"""End a stock-torch gloo reference run without Python's interpreter exit.

Stock torch's gloo sometimes aborts while Python finalizes, after destroy_process_group has
returned on every rank: "terminate called without an active exception" (a gloo worker thread
still holds a tensor; pytorch/pytorch#190489, #179291). Here 1 reference run in 12-24 did.
The reference's results are printed by then, so it leaves at once. Runs with no stock gloo
group keep their normal exit: an abort there would be ours, and the tests must see it.
"""

import os
import sys


def leave():
    """Tear the default group down and exit 0 without finalizing the interpreter."""
    import torch.distributed as dist

    dist.barrier()  # no rank tears gloo down while its peer still talks
    dist.destroy_process_group()
    if "mpi4py.MPI" in sys.modules:  # something started MPI (DeepSpeed's discovery): end it as mpiexec expects
        from mpi4py import MPI

        if not MPI.Is_finalized():
            MPI.Finalize()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
