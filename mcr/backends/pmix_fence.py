"""A barrier through the job's PMIx server, run after MPI_Init and before this rank sends anything.

Open MPI ends MPI_Init with a PMIx fence that collects no data, and SLURM's pmix plugin (seen
with SLURM 22.05) lets the ranks of one node past such a fence while a rank on another node is
still in Open MPI's modex. What they send next reaches that rank before MPI_COMM_WORLD is set up
in its PML, and it dies in MPI_Init (SIGSEGV in mca_pml_ob1_recv_frag_callback_match; reported
as open-mpi/ompi#12495). A fence that collects data does hold every rank there.
"""

from __future__ import annotations

import ctypes

PMIX_SUCCESS = 0
PMIX_BOOL = 1  # pmix_data_type_t
PMIX_MAX_KEYLEN = 511
COLLECT_DATA = b"pmix.collect"  # PMIX_COLLECT_DATA


class _Data(ctypes.Union):  # the start of pmix_value_t's union, which holds pointers (8-aligned)
    _fields_ = [("flag", ctypes.c_bool), ("words", ctypes.c_void_p * 3)]


class _Value(ctypes.Structure):  # pmix_value_t
    _fields_ = [("type", ctypes.c_uint16), ("data", _Data)]


class Info(ctypes.Structure):  # pmix_info_t, the same layout from PMIx 2 on
    _fields_ = [("key", ctypes.c_char * (PMIX_MAX_KEYLEN + 1)), ("flags", ctypes.c_uint32), ("value", _Value)]


def collect_data() -> Info:
    return Info(key=COLLECT_DATA, value=_Value(type=PMIX_BOOL, data=_Data(flag=True)))


def fence_all_ranks(mpi, rank: int) -> None:
    """Return once every rank of the job has called this (so has finished MPI_Init). Where the
    MPI library runs on no PMIx (MPICH's hydra, Cray PMI) there is nothing to do."""
    if mpi.COMM_WORLD.Get_size() == 1:
        return
    lib = ctypes.CDLL(mpi.__file__)  # mpi4py's module: its dependencies hold libpmix, if any
    fence, initialized = getattr(lib, "PMIx_Fence", None), getattr(lib, "PMIx_Initialized", None)
    if fence is None or initialized is None or not initialized():
        return
    fence.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(Info), ctypes.c_size_t]
    info = collect_data()
    status = fence(None, 0, ctypes.byref(info), 1)  # no procs: every rank of this job
    if status != PMIX_SUCCESS:
        raise RuntimeError(
            f"mcr: rank {rank}: the PMIx fence after MPI_Init failed (PMIx status {status}); "
            "the job's PMIx server (srun --mpi=pmix, mpiexec) lost a rank: see the first rank's error"
        )
