"""Whether MPI may be handed CUDA device memory: decided per library, then checked once at start.

What `MPIX_Query_cuda_support()` says is not the answer everywhere. In Open MPI before 5 (and
IBM Spectrum MPI and MVAPICH2, which follow it) it is a build-time constant, so it says yes where
the launch left CUDA off, and MPI then crashes on the first device pointer. Each library has its
own run-time switch; `decide` knows them (the sources are cited at each rule), `gather` reads what
it needs from a live mpi4py, and `self_test` runs an all-reduce on GPU memory before the backend
trusts the answer. `resolve` is the one call for the MPI backend.

The user's setting (`mpi_cuda_aware`, `MCR_MPI_CUDA_AWARE`): auto (the rules below), true (trust
it; the self-test still runs), false (every GPU tensor is staged through host memory).
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import re
from typing import Iterable, Mapping, NamedTuple, Optional

SETTINGS = ("auto", "true", "false")
SETTING = "MCR_MPI_CUDA_AWARE"  # the environment variable; config key mpi_cuda_aware
OFF = f"or set {SETTING}=false"  # the way out every "could be, but is not" reason ends with
MPIX_GPU_SUPPORT_CUDA = 0  # mpix.h in MPICH 3.4 and later
SELF_TEST_COUNTS = (1000, 1 << 20)  # float32 elements: an eager-sized message and a 4 MiB one


class Decision(NamedTuple):
    aware: bool  # hand device pointers to MPI
    reason: str  # one line: why, and where the answer is no but could be yes, the fix
    fixable: bool = False  # no, but this library reads device memory when launched as `reason` says


class Inputs(NamedTuple):
    """What `decide` reads, as `gather` finds it in a live MPI."""

    version: str  # MPI.Get_library_version()
    env: Mapping[str, str]  # the environment (for Open MPI, with its MCA parameter files beneath it)
    query_cuda: Optional[int]  # MPIX_Query_cuda_support(); None where not exported (or not called)
    query_gpu: Optional[int]  # MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &flag); None where not exported
    loaded: tuple  # paths of the shared objects this process has mapped (/proc/self/maps)


class MpiCudaAwareError(RuntimeError):
    pass


def check_setting(value) -> str:
    """The setting, normalized (a YAML `false` arrives as "False"); a bad one is a ValueError."""
    word = str(value).strip().lower()
    if word not in SETTINGS:
        raise ValueError(f"bad value {value!r} for mpi_cuda_aware ({SETTING}); choose auto, true or false")
    return word


# --- the decision ------------------------------------------------------------------------------


def decide(
    version: str,
    env: Mapping[str, str],
    query_cuda: Optional[int],
    query_gpu: Optional[int],
    loaded: Iterable[str],
    setting: str = "auto",
) -> Decision:
    """Whether to hand device pointers to MPI, from the library's version string, the environment,
    what the library's own queries said (None where it has none), the shared objects the process
    has loaded, and the user's setting. Pure: no MPI, no GPU."""
    setting = check_setting(setting)
    if setting == "true":
        return Decision(True, f"{SETTING}=true (mpi_cuda_aware: true): the user says MPI reads device memory")
    if setting == "false":
        return Decision(False, f"{SETTING}=false (mpi_cuda_aware: false): GPU tensors are staged through host memory")
    family = library_family(version)
    names = tuple(os.path.basename(path) for path in loaded)
    return _RULES[family](_label(family, version), version, env, query_cuda, query_gpu, names)


def library_family(version: str) -> str:
    """Which library wrote this MPI_Get_library_version string (the derivatives first: Spectrum
    MPI's says Open MPI too, and Cray's and MVAPICH's carry MPICH)."""
    text = version.lower()
    for family, marker in (
        ("spectrum", "spectrum mpi"),
        ("cray-mpich", "cray mpich"),
        ("mvapich", "mvapich"),
        ("intel-mpi", "intel(r) mpi library"),
        ("open-mpi", "open mpi"),
        ("mpich", "mpich version"),
    ):
        if marker in text:
            return family
    return "other"


def _label(family: str, version: str) -> str:
    patterns = {
        "spectrum": ("IBM Spectrum MPI", r"Spectrum MPI\D*(\d[\d.]*)"),
        "cray-mpich": ("Cray MPICH", r"CRAY MPICH version (\d[\d.]*\d)"),
        "mvapich": ("MVAPICH", r"(MVAPICH\S*)\s+Version\s*:\s*(\S+)"),
        "intel-mpi": ("Intel MPI", r"Intel\(R\) MPI Library (\d[\d.]*\d)"),
        "open-mpi": ("Open MPI", r"Open MPI v(\d[\w.]*)"),
        "mpich": ("MPICH", r"MPICH Version:\s*(\S+)"),
    }
    if family not in patterns:
        first = version.strip().splitlines()[0] if version.strip() else "an unnamed MPI library"
        return first.split(",")[0].strip()
    name, pattern = patterns[family]
    found = re.search(pattern, version, re.IGNORECASE)
    if not found:
        return name
    if family == "mvapich":  # MVAPICH2, MVAPICH2-GDR or MVAPICH (3.x), with its version
        return f"{found.group(1)} {found.group(2)}"
    return f"{name} {found.group(1)}"


def _release(version: str, pattern: str) -> tuple:
    found = re.search(pattern, version, re.IGNORECASE)
    return tuple(int(part) for part in found.groups()) if found else ()


def _false(value: Optional[str]) -> bool:  # Open MPI's boolean MCA values
    return value is not None and value.strip().lower() in ("0", "false", "no", "off", "disabled")


def _true(value: Optional[str]) -> bool:
    return value is not None and value.strip().lower() in ("1", "true", "yes", "on", "enabled")


def _open_mpi(label, version, env, query_cuda, query_gpu, loaded) -> Decision:
    # Open MPI 2.x-4.x: MPIX_Query_cuda_support() returns OPAL_CUDA_SUPPORT, a build-time constant
    # (ompi/mpiext/cuda/c/mpiext_cuda.c up to v4.1.8; open-mpi/ompi#7963 "MPIX_Query_cuda_support()
    # is useless" at run time). CUDA is then on unless the MCA parameter opal_cuda_support (its
    # deprecated synonym mpi_cuda_support) is false: opal/runtime/opal_params.c defaults it to the
    # build, and conda-forge's builds ship it off in openmpi-mca-params.conf ("set
    # OMPI_MCA_opal_cuda_support=true"), which `gather` folds into env.
    # Open MPI 5: it returns whether the CUDA accelerator component was selected at run time
    # (mpiext_cuda.c from v5.0.0), which that component declines when opal_cuda_support is false
    # (opal/mca/accelerator/cuda/accelerator_cuda_component.c): the answer can be trusted there.
    if query_cuda is None:
        return Decision(
            False,
            f"{label} exports no MPIX_Query_cuda_support (before 2.0, or its cuda extension left out): "
            f"treated as not CUDA-aware; set {SETTING}=true if it is",
        )
    off = next(
        (
            f"{var}={env[var]}"
            for var in ("OMPI_MCA_opal_cuda_support", "OMPI_MCA_mpi_cuda_support")
            if _false(env.get(var))
        ),
        None,
    )
    turn_on = (
        f"set OMPI_MCA_opal_cuda_support=1 (mpiexec --mca opal_cuda_support 1) to pass device memory to MPI, {OFF}"
    )
    major = _release(version, r"Open MPI v(\d+)")
    if major and major[0] >= 5:
        if not query_cuda:
            if off:
                return Decision(False, f"{label} is told {off} (environment or MCA parameter file): {turn_on}", True)
            accelerator = env.get("OMPI_MCA_accelerator")
            if accelerator and _leaves_out(accelerator, ("cuda",)):
                return Decision(
                    False,
                    f"{label} is told OMPI_MCA_accelerator={accelerator}, which leaves CUDA out: "
                    f"include cuda to pass device memory to MPI, {OFF}",
                    True,
                )
            return Decision(
                False,
                f"{label}: MPIX_Query_cuda_support()=0 (built without CUDA, or no CUDA accelerator component loaded)",
            )
        yes = Decision(True, f"{label}: MPIX_Query_cuda_support()=1 (its CUDA accelerator component is loaded)")
    else:
        if not query_cuda:
            return Decision(False, f"{label}: built without CUDA (MPIX_Query_cuda_support()=0)")
        if off:
            return Decision(
                False, f"{label} is built with CUDA but told {off} (environment or MCA parameter file): {turn_on}", True
            )
        yes = Decision(
            True,
            f"{label}: built with CUDA (MPIX_Query_cuda_support()=1, a build-time constant before Open MPI 5) "
            "and opal_cuda_support is not turned off",
        )
    # Over the UCX pml, device memory is UCX's to move ("Since UCX will be providing the CUDA
    # support", Open MPI's CUDA page), and neither query looks at UCX: a UCX_TLS without its CUDA
    # transports leaves Open MPI unable to (the `-x UCX_TLS=rc` run in open-mpi/ompi#7970). Where
    # another pml is named, UCX_TLS does not matter. (Rule inferred from those two sources.)
    pml = env.get("OMPI_MCA_pml", "")
    tls = env.get("UCX_TLS")
    if tls and (not pml or not _leaves_out(pml, ("ucx",))) and _leaves_out(tls, ("cuda", "cuda_copy"), "cuda"):
        return Decision(
            False,
            f"{label} over UCX with UCX_TLS={tls}, which has no CUDA transport: add cuda_copy,cuda_ipc "
            f"to it to pass device memory to MPI, {OFF}",
            True,
        )
    return yes


def _leaves_out(listing: str, names: tuple, prefix: Optional[str] = None) -> bool:
    """Whether an MCA/UCX component list (`a,b` or `^a,b`) leaves all of `names` out; with
    `prefix`, an included name starting with it counts as one of them (UCX's cuda_ipc, ...)."""
    excluding = listing.strip().startswith("^")
    items = [item.strip().lower() for item in listing.strip().lstrip("^").split(",") if item.strip()]
    if excluding:
        return any(item in names for item in items)
    if "all" in items:
        return False
    return not any(item in names or (prefix and item.startswith(prefix)) for item in items)


def _spectrum(label, version, env, query_cuda, query_gpu, loaded) -> Decision:
    # Spectrum MPI is CUDA-aware only when launched with -gpu (jsrun --smpiargs="-gpu", mpirun
    # -gpu), which sets OMPI_MCA_pml_pami_enable_cuda=1 in each rank: LAMMPS's KOKKOS package reads
    # exactly that ("The Spectrum MPI '-gpu' flag is not set", src/KOKKOS/kokkos.cpp), and Summit
    # job scripts turn it off with OMPI_MCA_pml_pami_enable_cuda=0 instead of `export_smpi_env -gpu`.
    # Its MPIX_Query_cuda_support is Open MPI 4's build-time constant. GPU buffers need the PAMI pml
    # (IBM's documentation, quoted in the OpenPOWER HPC application guide): another pml has none.
    # libpami_cudahook.so proves nothing: jsrun preloads it without -gpu too (olcf-user-docs#78).
    if query_cuda == 0:
        return Decision(False, f"{label}: built without CUDA (MPIX_Query_cuda_support()=0)")
    if not _true(env.get("OMPI_MCA_pml_pami_enable_cuda")):
        return Decision(
            False,
            f'{label} without -gpu: launch with jsrun --smpiargs="-gpu" (or mpirun -gpu) to pass device memory to MPI, {OFF}',
            True,
        )
    pml = env.get("OMPI_MCA_pml")
    if pml and "pami" not in pml:
        return Decision(
            False,
            f"{label} with -gpu but OMPI_MCA_pml={pml}: only the PAMI pml carries GPU buffers; unset it, {OFF}",
            True,
        )
    return Decision(True, f"{label} launched with -gpu (OMPI_MCA_pml_pami_enable_cuda=1)")


def _mvapich(label, version, env, query_cuda, query_gpu, loaded) -> Decision:
    # MVAPICH2(-GDR): MPIX_Query_cuda_support follows Open MPI 4's build-time logic (MVAPICH's
    # developer in open-mpi/ompi#7970), and CUDA buffers need MV2_USE_CUDA=1 in each rank (the
    # MVAPICH2-GDR guide and NVIDIA's GPUDirect RDMA manual launch with -genv MV2_USE_CUDA=1;
    # LAMMPS's KOKKOS package requires it). MVAPICH 3 / MVAPICH-Plus are MPICH 4 based and export
    # MPIX_GPU_query_support, which is trusted as for MPICH (an inference: not checked on one).
    if query_gpu is not None:
        if query_gpu:
            return Decision(True, f"{label}: MPIX_GPU_query_support(CUDA)=1")
        return Decision(False, f"{label}: MPIX_GPU_query_support(CUDA)=0 (built without CUDA, or GPU support off)")
    if query_cuda == 0:
        return Decision(False, f"{label}: built without CUDA (MPIX_Query_cuda_support()=0); MVAPICH2-GDR has it")
    if env.get("MV2_USE_CUDA", "").strip() != "1":
        return Decision(
            False,
            f"{label} without MV2_USE_CUDA=1: export MV2_USE_CUDA=1 in every rank to pass device memory to MPI, {OFF}",
            True,
        )
    return Decision(True, f"{label} with MV2_USE_CUDA=1")


def _cray_mpich(label, version, env, query_cuda, query_gpu, loaded) -> Decision:
    # Cray MPICH: "the application must be linked to the GTL library, and the
    # MPICH_GPU_SUPPORT_ENABLED=1 environment variable must be set. If either of these are missing,
    # the application will fail to communicate GPU buffers" (CSCS, Cray MPICH page; NERSC's says the
    # same). For CUDA the GTL is libmpi_gtl_cuda (libmpi_gtl_hsa is AMD's). With the variable set
    # and no GTL at all, MPI_Init aborts ("GPU_SUPPORT_ENABLED is requested, but GTL library is
    # not linked"), so a Python that got here with it set has some GTL mapped.
    enabled = env.get("MPICH_GPU_SUPPORT_ENABLED", "").strip() == "1"
    gtl = any(name.startswith("libmpi_gtl_cuda") for name in loaded)
    if enabled and gtl:
        return Decision(True, f"{label} with MPICH_GPU_SUPPORT_ENABLED=1 and libmpi_gtl_cuda loaded")
    link = "libmpi_gtl_cuda linked into mpi4py (build it with the Cray wrapper cc and craype-accel-nvidia* loaded)"
    if enabled:
        return Decision(
            False, f"{label} with MPICH_GPU_SUPPORT_ENABLED=1 but without libmpi_gtl_cuda: needs {link}, {OFF}", True
        )
    return Decision(
        False,
        f"{label} without MPICH_GPU_SUPPORT_ENABLED=1: export it (with {link}) to pass device memory to MPI, {OFF}",
        True,
    )


INTEL_CUDA_FROM = (2021, 13)  # the first Developer Reference seen to list NVIDIA GPUs (2021.9's: Intel GPUs only)


def _intel_mpi(label, version, env, query_cuda, query_gpu, loaded) -> Decision:
    # Intel MPI: GPU buffers only with I_MPI_OFFLOAD=1 (default 0), and CUDA only where
    # I_MPI_OFFLOAD_MODE is auto or cuda (Developer Reference, "GPU Support", 2021.13 and later:
    # "Current support is limited to Intel GPUs and Nvidia GPUs"; 2021.9's says Intel GPUs only).
    # Versions between are treated as Intel-only: an inference from the pages found.
    release = _release(version, r"Intel\(R\) MPI Library (\d+)\.(\d+)")
    if release and release < INTEL_CUDA_FROM:
        return Decision(
            False,
            f"{label}: its GPU buffer support is documented for Intel GPUs only before "
            f"{INTEL_CUDA_FROM[0]}.{INTEL_CUDA_FROM[1]}; set {SETTING}=true if this one reads CUDA memory",
        )
    if env.get("I_MPI_OFFLOAD", "0").strip() != "1":
        return Decision(
            False,
            f"{label} without I_MPI_OFFLOAD=1: export I_MPI_OFFLOAD=1 to pass device memory to MPI, {OFF}",
            True,
        )
    mode = env.get("I_MPI_OFFLOAD_MODE", "auto").strip().lower()
    if mode not in ("auto", "cuda"):
        return Decision(
            False, f"{label} with I_MPI_OFFLOAD_MODE={mode}: set it to cuda (or auto) for CUDA memory, {OFF}", True
        )
    return Decision(True, f"{label} with I_MPI_OFFLOAD=1 (I_MPI_OFFLOAD_MODE={mode})")


def _mpich(label, version, env, query_cuda, query_gpu, loaded) -> Decision:
    # MPICH 3.4 and later: MPIX_GPU_query_support answers at run time: 0 when the CVAR
    # MPIR_CVAR_ENABLE_GPU is 0, or when MPI_Init found no device and cleared it
    # (src/mpi/misc/gpu_query.c, src/mpi/init/init_gpu.c). MPIX_Query_cuda_support is not called:
    # in 3.4 it asserts its own success code was an error (src/mpi/misc/gpu.c).
    if query_gpu is None:
        return Decision(
            False,
            f"{label} exports no MPIX_GPU_query_support (before 3.4): treated as not CUDA-aware; "
            f"set {SETTING}=true if it is",
        )
    if query_gpu:
        return Decision(True, f"{label}: MPIX_GPU_query_support(CUDA)=1 (built with CUDA, GPU support on)")
    for var in ("MPIR_CVAR_ENABLE_GPU", "MPICH_ENABLE_GPU", "MPIR_PARAM_ENABLE_GPU"):
        if env.get(var, "").strip() == "0":
            return Decision(False, f"{label} is told {var}=0: unset it to pass device memory to MPI, {OFF}", True)
    return Decision(False, f"{label}: MPIX_GPU_query_support(CUDA)=0 (built without CUDA, or no GPU found at MPI_Init)")


def _other(label, version, env, query_cuda, query_gpu, loaded) -> Decision:
    return Decision(
        False,
        f"{label}: mcr does not know how this library turns CUDA on, so GPU tensors are staged through "
        f"host memory; set {SETTING}=true if it reads device memory",
    )


_RULES = {
    "open-mpi": _open_mpi,
    "spectrum": _spectrum,
    "mvapich": _mvapich,
    "cray-mpich": _cray_mpich,
    "intel-mpi": _intel_mpi,
    "mpich": _mpich,
    "other": _other,
}


# --- gathering the inputs from a live MPI ------------------------------------------------------


def gather(mpi, env: Optional[Mapping[str, str]] = None, maps: str = "/proc/self/maps") -> Inputs:
    """`decide`'s inputs from mpi4py's started `MPI` module: the version string, the environment,
    the library's own CUDA queries (through ctypes, only the ones it exports) and the shared
    objects mapped into this process."""
    version = mpi.Get_library_version().rstrip("\x00").strip()
    loaded = loaded_objects(maps)
    handles = _libraries(mpi, loaded)
    query_gpu = _query_gpu_support(handles)
    # MPICH 3.4's MPIX_Query_cuda_support asserts on success: only ask where MPIX_GPU_query_support is absent
    query_cuda = _query_cuda_support(handles) if query_gpu is None else None
    env = dict(os.environ if env is None else env)
    if library_family(version) in ("open-mpi", "spectrum"):
        env = with_open_mpi_param_files(env, loaded)
    return Inputs(version, env, query_cuda, query_gpu, loaded)


def loaded_objects(maps: str = "/proc/self/maps") -> tuple:
    """The paths of the shared objects mapped into this process, in first-mapped order."""
    try:
        with open(maps) as f:
            lines = f.read().splitlines()
    except OSError:
        return ()
    paths = {}
    for line in lines:
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith("/") and ".so" in fields[5]:
            paths.setdefault(fields[5].removesuffix(" (deleted)"), None)
    return tuple(paths)


def _libraries(mpi, loaded) -> list:
    """ctypes handles that can see the MPI library's symbols: mpi4py's extension (its own
    dependencies are searched), then every mapped libmpi*."""
    handles = []
    for path in [getattr(mpi, "__file__", None)] + [p for p in loaded if os.path.basename(p).startswith("libmpi")]:
        if not path:
            continue
        try:
            handles.append(ctypes.CDLL(path))
        except OSError:
            continue
    return handles


def _symbol(handles, name):
    for handle in handles:
        try:
            return handle[name]  # a fresh function object: setting its signature touches no shared one
        except AttributeError:
            continue
    return None


def _query_cuda_support(handles) -> Optional[int]:
    func = _symbol(handles, "MPIX_Query_cuda_support")  # int MPIX_Query_cuda_support(void)
    if func is None:
        return None
    func.argtypes = []
    func.restype = ctypes.c_int
    return int(func() != 0)


def _query_gpu_support(handles) -> Optional[int]:
    func = _symbol(handles, "MPIX_GPU_query_support")  # int MPIX_GPU_query_support(int gpu_type, int *is_supported)
    if func is None:
        return None
    func.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    func.restype = ctypes.c_int
    flag = ctypes.c_int(0)
    if func(MPIX_GPU_SUPPORT_CUDA, ctypes.byref(flag)) != 0:  # not MPI_SUCCESS: no answer
        return None
    return int(flag.value != 0)


def with_open_mpi_param_files(env: Mapping[str, str], loaded: Iterable[str] = ()) -> dict:
    """`env` with Open MPI's MCA parameter files folded in as OMPI_MCA_* variables, in Open MPI's
    precedence (opal/mca/base/mca_base_var.c): the override file > the environment > the files of
    mca_base_param_files, the first listed winning (default: ~/.openmpi/mca-params.conf, then
    $sysconfdir/openmpi-mca-params.conf)."""
    sysconfdir = _open_mpi_sysconfdir(env, loaded)
    listed = env.get("OMPI_MCA_mca_base_param_files") or env.get("OMPI_MCA_mca_param_files")
    if listed is not None:
        files = [] if listed.strip() == "none" else [path for path in listed.split(",") if path]
    else:
        home = env.get("HOME") or os.path.expanduser("~")
        files = [os.path.join(home, ".openmpi", "mca-params.conf")]
        if sysconfdir:
            files.append(os.path.join(sysconfdir, "openmpi-mca-params.conf"))
    merged = {}
    for path in reversed(files):
        merged.update(_param_file(path))
    merged.update(env)
    if sysconfdir:
        merged.update(_param_file(os.path.join(sysconfdir, "openmpi-mca-params-override.conf")))
    return merged


def _open_mpi_sysconfdir(env, loaded) -> Optional[str]:
    if env.get("OPAL_SYSCONFDIR"):
        return env["OPAL_SYSCONFDIR"]
    if env.get("OPAL_PREFIX"):
        return os.path.join(env["OPAL_PREFIX"], "etc")
    for path in loaded:  # $prefix/lib/libmpi.so.40 (libmpi_ibm.so for Spectrum): $prefix/etc
        if re.match(r"libmpi(_ibm)?\.so", os.path.basename(path)):
            return os.path.join(os.path.dirname(os.path.dirname(path)), "etc")
    return None


def _param_file(path: str) -> dict:
    """An MCA parameter file's `name = value` lines as OMPI_MCA_name entries."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    params = {}
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, value = (part.strip() for part in line.split("=", 1))
        params[f"OMPI_MCA_{name}"] = value.strip("\"'")
    return params


# --- agreeing, and checking the answer ---------------------------------------------------------


def agree(comm, decision: Decision) -> Decision:
    """The same answer on every rank of `comm` (yes only where every rank says yes): the backend's
    choice of ops and routes must be equal on every rank, and the self-test is collective."""
    views = comm.allgather((bool(decision.aware), decision.reason, bool(decision.fixable)))
    if all(aware for aware, _, _ in views) or not decision.aware:
        return decision
    rank, (_, reason, fixable) = next((rank, view) for rank, view in enumerate(views) if not view[0])
    return Decision(False, f"not on every rank: rank {rank}: {reason}", fixable)


def resolve(comm, mpi, setting: str = "auto", gpu: Optional[bool] = None, device=None) -> Decision:
    """The MPI backend's one call at start: decide on this rank, agree over `comm`, and where the
    answer is yes, check it with `self_test` (raising MpiCudaAwareError if MPI got it wrong).
    `gpu`: whether this rank has a CUDA device (default: torch says); `device`: the one to test on."""
    if gpu is None:
        import torch

        gpu = torch.cuda.is_available()
    setting = check_setting(setting)
    if not gpu:
        decision = Decision(False, "no CUDA device on this rank")
    elif setting == "auto":
        decision = decide(*gather(mpi), setting=setting)
    else:  # the user decided: nothing to read from the library
        decision = decide("", {}, None, None, (), setting=setting)
    decision = agree(comm, decision)
    if decision.aware:
        self_test(comm, mpi, device=device, why=decision.reason)
    return decision


def self_test(comm, mpi, device=None, why: str = "") -> None:
    """All-reduce distinct float32 values from every rank, out of place and in place, at an eager
    size and at 4 MiB, straight from and into GPU memory; check each result whole on every rank,
    and raise MpiCudaAwareError on every rank, naming the setting, if any rank saw a wrong value.
    Collective over `comm`. `device`: the CUDA device (default: the current one); a CPU device
    runs the same check on host memory (the tests do, where no GPU exists). A library that
    crashes on a device pointer cannot be caught: for that case Python's faulthandler is on
    during the calls, and its traceback names the function that says what to set."""
    import torch

    if device is None:
        if not torch.cuda.is_available():
            return
        device = torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    rank, size = comm.Get_rank(), comm.Get_size()
    problems = []
    for count in SELF_TEST_COUNTS:
        send = _pattern(count, rank, device)
        recv = torch.full_like(send, -1.0)  # a value no sum of the pattern can take
        in_place = send.clone()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the fills are done before MPI reads the memory
        try:
            with _crash_traceback():
                _mpi_reads_cuda_memory__if_this_crashes_set_MCR_MPI_CUDA_AWARE_false(comm, mpi, send, recv, in_place)
        except Exception as exc:  # mpi4py raises MPI.Exception: an answer too, reported with the others
            problems.append(f"the all-reduce of {count} floats raised {type(exc).__name__}: {exc}")
            continue  # the next size's calls still run, so every rank makes the same collective calls
        expected = _expected(count, size)
        for how, result in (("out of place", recv), ("in place", in_place)):
            wrong = _first_wrong(result.cpu(), expected)
            if wrong is not None:
                index, got, want = wrong
                problems.append(f"{count} floats {how}: element {index} is {got}, expected {want}")
    reports = comm.allgather(problems[:1])
    bad = [(rank, report[0]) for rank, report in enumerate(reports) if report]
    if bad:
        first_rank, first = bad[0]
        because = f" (taken as CUDA-aware: {why})" if why else ""
        raise MpiCudaAwareError(
            f"MPI all-reduce on {device.type.upper()} memory is wrong on {len(bad)} rank(s), first rank "
            f"{first_rank}: {first}{because}. Set {SETTING}=false (config mpi_cuda_aware: false) to stage "
            "GPU tensors through host memory"
        )


def _mpi_reads_cuda_memory__if_this_crashes_set_MCR_MPI_CUDA_AWARE_false(comm, mpi, send, recv, in_place):  # noqa: N802
    """The calls that hand device pointers to MPI. A library that is not CUDA-aware may crash in
    here (SIGSEGV): this name is what faulthandler's traceback shows."""

    def buffer(t):
        return [mpi.memory.fromaddress(t.data_ptr(), t.nbytes), mpi.FLOAT]

    comm.Allreduce(buffer(send), buffer(recv), mpi.SUM)
    comm.Allreduce(mpi.IN_PLACE, buffer(in_place), mpi.SUM)


@contextlib.contextmanager
def _crash_traceback():
    """Python's faulthandler on (to stderr, fd 2) for the duration, unless it already is. It dumps
    the Python stack on SIGSEGV/SIGBUS/SIGABRT, then hands the signal to the handler it replaced
    (the MPI library's own, which prints its backtrace)."""
    enabled_here = False
    if not faulthandler.is_enabled():
        try:
            faulthandler.enable(file=2, all_threads=False)
            enabled_here = True
        except (OSError, ValueError, RuntimeError):
            pass  # no stderr to write to: the crash goes unexplained, as before
    try:
        yield
    finally:
        if enabled_here:
            faulthandler.disable()


PERIOD = 17  # the pattern repeats every 17 elements; sums stay exact in float32 up to ~1e6 ranks


def _pattern(count: int, rank: int, device):
    """Rank r's values: (i + 3r) mod 17 + 1, small integers shifted by rank, so the float32 sum is
    exact whatever order MPI adds in, a mix-up of elements or ranks shows, and (on 2 ranks or more)
    no single rank's buffer equals the sum."""
    import torch

    index = torch.arange(count, dtype=torch.int64)
    return ((index + 3 * rank) % PERIOD + 1).to(torch.float32).to(device)


def _expected(count: int, size: int):
    """The sum of every rank's `_pattern`, on the host: ranks whose 3r mod 17 agree add the same
    values, so 17 vector adds instead of `size`."""
    import torch

    index = torch.arange(count, dtype=torch.int64)
    total = torch.zeros(count, dtype=torch.float64)
    for shift in range(PERIOD):
        first = 6 * shift % PERIOD  # 3r = shift (mod 17) for r = 6 shift (mod 17): 3 * 6 = 18 = 1
        ranks = len(range(first, size, PERIOD))
        if ranks:
            total += ranks * ((index + shift) % PERIOD + 1).to(torch.float64)
    return total.to(torch.float32)


def _first_wrong(got, expected):
    import torch

    if torch.equal(got, expected):
        return None
    index = int(torch.nonzero(got != expected)[0][0])
    return index, got[index].item(), expected[index].item()
