"""Whether MPI is handed CUDA device memory (`mcr.backends.mpi_cuda`): one test per library rule,
the user's setting both ways, and the glue and self-test against the real Open MPI here (no GPU:
the self-test runs its check on host memory), each in a process of its own, as a singleton."""

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from mcr.backends import mpi_cuda
from mcr.backends.mpi_cuda import Decision, decide
from mcr.config import ConfigError, load
from tests.ranks import REPO

OMPI4 = "Open MPI v4.1.5, package: Open MPI builder@host Distribution, ident: 4.1.5, repo rev: v4.1.5, Feb 23, 2023"
OMPI5 = "Open MPI v5.0.3, package: Open MPI builder@host Distribution, ident: 5.0.3, repo rev: v5.0.3, Apr 08, 2024"
SPECTRUM = "IBM Spectrum MPI 10.3.1.2, package: IBM Spectrum MPI, ident: 10.3.1.2, repo rev: IBM_SPECTRUM_MPI"
MVAPICH2 = "MVAPICH2 Version      :\t2.3.7\nMVAPICH2 Release date :\tWed March 02 22:00:00 EST 2022\nMVAPICH2 Device       :\tch3:mrail\n"
CRAY = "MPI VERSION    : CRAY MPICH version 8.1.25.17 (ANL base 3.4a2)\nMPI BUILD INFO : Sun Feb 26 16:42 2023 (git hash aecd99f)\n"
MPICH4 = "MPICH Version:      4.2.0\nMPICH Release date: Fri Feb  9 12:29:21 CST 2024\nMPICH Device:       ch4:ucx\n"
INTEL = "Intel(R) MPI Library 2021.13 for Linux* OS\n"
LIBMPI = ("/opt/mpi/lib/libmpi.so.40",)


def ask(version, env=None, query_cuda=None, query_gpu=None, loaded=LIBMPI, setting="auto") -> Decision:
    return decide(version, env or {}, query_cuda, query_gpu, loaded, setting)


# --- Open MPI -----------------------------------------------------------------------------------


def test_open_mpi_4_built_with_cuda_is_aware():
    decision = ask(OMPI4, query_cuda=1)
    assert decision.aware and "build-time constant" in decision.reason


def test_open_mpi_4_query_is_a_constant_so_opal_cuda_support_off_wins_and_names_the_fix():
    # conda-forge's Open MPI 4 answers 1 to the query and ships opal_cuda_support off in its param file
    decision = ask(OMPI4, {"OMPI_MCA_opal_cuda_support": "false"}, query_cuda=1)
    assert not decision.aware and decision.fixable
    assert "OMPI_MCA_opal_cuda_support=false" in decision.reason and "--mca opal_cuda_support 1" in decision.reason
    assert not ask(OMPI4, {"OMPI_MCA_mpi_cuda_support": "0"}, query_cuda=1).aware  # the deprecated synonym


def test_open_mpi_4_built_without_cuda_is_not_aware():
    decision = ask(OMPI4, query_cuda=0)
    assert not decision.aware and not decision.fixable and "built without CUDA" in decision.reason


def test_open_mpi_5_trusts_its_run_time_query_both_ways():
    assert ask(OMPI5, query_cuda=1).aware
    decision = ask(OMPI5, query_cuda=0)
    assert not decision.aware and not decision.fixable and "accelerator component" in decision.reason


def test_open_mpi_5_saying_no_names_the_setting_that_turned_cuda_off():
    decision = ask(OMPI5, {"OMPI_MCA_opal_cuda_support": "0"}, query_cuda=0)
    assert not decision.aware and decision.fixable and "OMPI_MCA_opal_cuda_support=0" in decision.reason
    decision = ask(OMPI5, {"OMPI_MCA_accelerator": "^cuda"}, query_cuda=0)
    assert decision.fixable and "OMPI_MCA_accelerator=^cuda" in decision.reason


def test_open_mpi_over_ucx_without_its_cuda_transports_is_not_aware():
    decision = ask(OMPI5, {"UCX_TLS": "rc,sm,self"}, query_cuda=1)
    assert not decision.aware and decision.fixable and "UCX_TLS=rc,sm,self" in decision.reason
    assert not ask(OMPI4, {"UCX_TLS": "^cuda"}, query_cuda=1).aware
    assert ask(OMPI5, {"UCX_TLS": "rc,cuda_copy,cuda_ipc"}, query_cuda=1).aware
    assert ask(OMPI5, {"UCX_TLS": "^cuda_ipc"}, query_cuda=1).aware
    assert ask(OMPI5, {"UCX_TLS": "rc", "OMPI_MCA_pml": "ob1"}, query_cuda=1).aware  # UCX is not the pml
    assert not ask(OMPI5, {"OMPI_MCA_accelerator": "null"}, query_cuda=0).aware
    assert not ask(OMPI5, {"OMPI_MCA_accelerator": "^rocm"}, query_cuda=0).fixable  # CUDA was not left out


def test_open_mpi_without_the_query_is_not_aware():
    assert not ask(OMPI4, query_cuda=None).aware


def test_open_mpi_param_files_lie_beneath_the_environment(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "openmpi-mca-params.conf").write_text("# conda-forge\nopal_cuda_support = 0\nbtl = ^openib\n")
    loaded = (str(tmp_path / "lib" / "libmpi.so.40"),)
    env = {"HOME": str(tmp_path / "home")}
    folded = mpi_cuda.with_open_mpi_param_files(env, loaded)
    assert folded["OMPI_MCA_opal_cuda_support"] == "0" and folded["OMPI_MCA_btl"] == "^openib"
    assert not decide(OMPI4, folded, 1, None, loaded).aware
    user_says = mpi_cuda.with_open_mpi_param_files({**env, "OMPI_MCA_opal_cuda_support": "1"}, loaded)
    assert decide(OMPI4, user_says, 1, None, loaded).aware  # the environment beats the file


# --- the other libraries ------------------------------------------------------------------------


def test_spectrum_mpi_without_gpu_flag_is_not_aware_though_its_query_says_yes():
    decision = ask(SPECTRUM, query_cuda=1)
    assert not decision.aware and decision.fixable
    assert 'jsrun --smpiargs="-gpu"' in decision.reason and "MCR_MPI_CUDA_AWARE=false" in decision.reason


def test_spectrum_mpi_launched_with_gpu_is_aware_on_the_pami_pml_only():
    assert ask(SPECTRUM, {"OMPI_MCA_pml_pami_enable_cuda": "1"}, query_cuda=1).aware
    decision = ask(SPECTRUM, {"OMPI_MCA_pml_pami_enable_cuda": "1", "OMPI_MCA_pml": "yalla"}, query_cuda=1)
    assert not decision.aware and "OMPI_MCA_pml=yalla" in decision.reason


def test_mvapich2_needs_mv2_use_cuda():
    decision = ask(MVAPICH2, query_cuda=1)
    assert not decision.aware and decision.fixable and "MV2_USE_CUDA=1" in decision.reason
    assert decision.reason.startswith("MVAPICH2 2.3.7")
    assert ask(MVAPICH2, {"MV2_USE_CUDA": "1"}, query_cuda=1).aware
    assert not ask(MVAPICH2, {"MV2_USE_CUDA": "1"}, query_cuda=0).aware  # a build without CUDA


def test_cray_mpich_needs_gpu_support_enabled_and_the_cuda_gtl_loaded():
    gtl = LIBMPI + ("/opt/cray/pe/mpich/8.1.25/gtl/lib/libmpi_gtl_cuda.so.0",)
    assert ask(CRAY, {"MPICH_GPU_SUPPORT_ENABLED": "1"}, loaded=gtl).aware
    decision = ask(CRAY, {}, loaded=gtl)
    assert not decision.aware and decision.fixable and "MPICH_GPU_SUPPORT_ENABLED=1" in decision.reason
    decision = ask(CRAY, {"MPICH_GPU_SUPPORT_ENABLED": "1"}, loaded=LIBMPI + ("/opt/x/libmpi_gtl_hsa.so.0",))
    assert not decision.aware and "libmpi_gtl_cuda" in decision.reason


def test_mpich_trusts_mpix_gpu_query_support_and_names_enable_gpu_when_it_is_off():
    assert ask(MPICH4, query_gpu=1).aware
    assert not ask(MPICH4, query_gpu=0).aware
    decision = ask(MPICH4, {"MPIR_CVAR_ENABLE_GPU": "0"}, query_gpu=0)
    assert decision.fixable and "MPIR_CVAR_ENABLE_GPU=0" in decision.reason
    assert not ask(MPICH4, query_cuda=1, query_gpu=None).aware  # before 3.4: no run-time query


def test_intel_mpi_needs_offload_a_cuda_mode_and_a_release_with_cuda():
    assert ask(INTEL, {"I_MPI_OFFLOAD": "1"}).aware
    assert ask(INTEL, {"I_MPI_OFFLOAD": "1", "I_MPI_OFFLOAD_MODE": "cuda"}).aware
    decision = ask(INTEL, {})
    assert not decision.aware and decision.fixable and "I_MPI_OFFLOAD=1" in decision.reason
    assert not ask(INTEL, {"I_MPI_OFFLOAD": "1", "I_MPI_OFFLOAD_MODE": "level_zero"}).aware
    older = "Intel(R) MPI Library 2021.9 for Linux* OS\n"
    assert not ask(older, {"I_MPI_OFFLOAD": "1"}).aware  # Intel GPUs only


def test_an_unknown_library_is_not_aware_unless_the_user_says_true():
    decision = ask("Microsoft MPI 10.1.12498.18", query_cuda=1)
    assert not decision.aware and "MCR_MPI_CUDA_AWARE=true" in decision.reason
    assert ask("Microsoft MPI 10.1.12498.18", setting="true").aware


# --- the user's setting -------------------------------------------------------------------------


def test_true_overrides_a_library_that_says_no():
    decision = ask(SPECTRUM, query_cuda=1, setting="true")
    assert decision.aware and "MCR_MPI_CUDA_AWARE=true" in decision.reason


def test_false_overrides_a_library_that_says_yes():
    decision = ask(OMPI5, query_cuda=1, setting="False")  # a YAML `false` arrives as "False"
    assert not decision.aware and not decision.fixable


def test_a_bad_setting_names_the_valid_ones():
    with pytest.raises(ValueError, match="choose auto, true or false"):
        ask(OMPI5, query_cuda=1, setting="yes")
    with pytest.raises(ConfigError, match=r"bad value 'maybe' for mpi_cuda_aware \(MCR_MPI_CUDA_AWARE\); choose auto"):
        load(env={"MCR_MPI_CUDA_AWARE": "maybe"})
    assert load(env={"MCR_MPI_CUDA_AWARE": "FALSE"}).mpi_cuda_aware == "false"
    assert load(env={}).mpi_cuda_aware == "auto"


# --- every rank agrees --------------------------------------------------------------------------


class Ranks:
    """A communicator's allgather, as every rank would see it (what `agree` uses of it)."""

    def __init__(self, decisions):
        self.decisions = decisions

    def allgather(self, mine):
        return [(d.aware, d.reason, d.fixable) for d in self.decisions]


def test_ranks_agree_on_no_when_one_rank_says_no():
    yes, no = Decision(True, "fine"), Decision(False, "MVAPICH2 2.3.7 without MV2_USE_CUDA=1", True)
    decision = mpi_cuda.agree(Ranks([yes, no, yes]), yes)
    assert not decision.aware and decision.fixable and decision.reason.startswith("not on every rank: rank 1: MVAPICH2")
    assert mpi_cuda.agree(Ranks([yes, yes]), yes) == yes


# --- the self-test's check ----------------------------------------------------------------------


class ForgetfulComm:
    """One rank whose MPI returns from Allreduce without writing: what a library that ignores
    device memory it cannot read looks like."""

    def Get_rank(self):  # noqa: N802 (mpi4py's names)
        return 0

    def Get_size(self):  # noqa: N802
        return 2

    def Allreduce(self, send, recv, op):  # noqa: N802
        pass

    def allgather(self, mine):
        return [mine, mine]  # the other rank fares the same


# the names the self-test takes from mpi4py's MPI (importing mpi4py.MPI would start MPI in this process)
NAMES = SimpleNamespace(memory=SimpleNamespace(fromaddress=lambda address, size: address), FLOAT=0, SUM=0, IN_PLACE=0)


def test_self_test_raises_naming_the_setting_when_mpi_returns_wrong_values():
    with pytest.raises(mpi_cuda.MpiCudaAwareError) as caught:
        mpi_cuda.self_test(ForgetfulComm(), NAMES, device="cpu", why="MVAPICH2 2.3.7 with MV2_USE_CUDA=1")
    message = str(caught.value)
    assert "first rank 0: 1000 floats out of place: element 0 is -1.0, expected" in message
    assert "MVAPICH2 2.3.7 with MV2_USE_CUDA=1" in message and "Set MCR_MPI_CUDA_AWARE=false" in message


def test_resolve_runs_the_self_test_when_the_answer_is_yes():
    with pytest.raises(mpi_cuda.MpiCudaAwareError, match="taken as CUDA-aware: MCR_MPI_CUDA_AWARE=true"):
        mpi_cuda.resolve(ForgetfulComm(), NAMES, "true", gpu=True, device="cpu")
    assert not mpi_cuda.resolve(ForgetfulComm(), NAMES, "false", gpu=True, device="cpu").aware  # no check, no error


def test_self_test_without_a_gpu_and_no_device_does_nothing():
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU: the self-test would run")
    mpi_cuda.self_test(ForgetfulComm(), None)  # would raise if it ran


# --- the real Open MPI here, in a process of its own --------------------------------------------


# the module alone, without the mcr package (whose import of torch costs seconds a process)
PRELUDE = """
import importlib.util
spec = importlib.util.spec_from_file_location("mpi_cuda", "mcr/backends/mpi_cuda.py")
mpi_cuda = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mpi_cuda)
from mpi4py import MPI  # a singleton: MPI_Init without mpiexec
"""


def run_python(code):
    env = {key: value for key, value in os.environ.items() if not key.startswith(("OMPI_", "PMIX_", "MCR_"))}
    env["OMPI_MCA_btl"] = "self"
    return subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_gather_reads_the_real_open_mpi_which_here_says_no():
    done = run_python(
        """
        inputs = mpi_cuda.gather(MPI)
        print(repr(inputs.version.splitlines()[0]), inputs.query_cuda, inputs.query_gpu)
        print(any(p.endswith("libmpi.so.40") for p in inputs.loaded))
        print(mpi_cuda.decide(*inputs).reason)
        """
    )
    assert done.returncode == 0, done.stderr
    first, loaded, reason = done.stdout.splitlines()
    # the pip wheel of Open MPI 5 is built without CUDA: it exports MPIX_Query_cuda_support, and it says 0
    assert first.startswith("'Open MPI v5") and first.endswith(" 0 None"), first
    assert loaded == "True" and "MPIX_Query_cuda_support()=0" in reason


def test_self_test_passes_on_a_real_all_reduce_of_host_memory():
    done = run_python(
        """
        mpi_cuda.self_test(MPI.COMM_WORLD, MPI, device="cpu")
        print("passed")
        """
    )
    assert done.returncode == 0 and done.stdout.strip() == "passed", done.stderr


def test_resolve_decides_agrees_and_checks_on_the_real_open_mpi():
    done = run_python(
        """
        world = MPI.COMM_WORLD
        print(mpi_cuda.resolve(world, MPI, "auto"))  # torch finds no GPU here
        print(mpi_cuda.resolve(world, MPI, "auto", gpu=True))  # as if it had one: this Open MPI says no
        # the user says yes: the self-test runs (on host memory here, where no GPU exists) and passes
        print(mpi_cuda.resolve(world, MPI, "true", gpu=True, device="cpu"))
        """
    )
    assert done.returncode == 0, done.stderr
    no_gpu, library_says_no, user_says_yes = done.stdout.splitlines()
    assert "aware=False" in no_gpu and "no CUDA device on this rank" in no_gpu
    assert "aware=False" in library_says_no and "MPIX_Query_cuda_support()=0" in library_says_no
    assert "aware=True" in user_says_yes and "MCR_MPI_CUDA_AWARE=true" in user_says_yes


def test_a_crash_inside_the_device_all_reduce_prints_a_traceback_naming_the_setting():
    done = run_python(
        """
        import ctypes

        class Buffer:  # a tensor, as far as the all-reduce looks at one
            def __init__(self, address):
                self.address, self.nbytes = address, 4096
            def data_ptr(self):
                return self.address

        memory = [ctypes.create_string_buffer(4096) for _ in range(2)]
        recv, in_place = (Buffer(ctypes.addressof(m)) for m in memory)
        unreadable = Buffer(16)  # what a device pointer is to a library that is not CUDA-aware
        with mpi_cuda._crash_traceback():
            mpi_cuda._mpi_reads_cuda_memory__if_this_crashes_set_MCR_MPI_CUDA_AWARE_false(
                MPI.COMM_WORLD, MPI, unreadable, recv, in_place
            )
        print("no crash")
        """
    )
    assert done.returncode != 0 and "no crash" not in done.stdout, done.stdout + done.stderr
    assert "Fatal Python error: Segmentation fault" in done.stderr, done.stderr
    assert "in _mpi_reads_cuda_memory__if_this_crashes_set_MCR_MPI_CUDA_AWARE_false" in done.stderr, done.stderr
