"""DeepSpeed-MoE (expert parallel 2), ZeRO-2 and ZeRO-3 on the runtime vs stock DeepSpeed on gloo.

The gloo baseline loads DeepSpeed's shared-memory op, which `make setup` builds (in
$TORCH_EXTENSIONS_DIR; where it is missing, the first run builds it: about a minute); the
runtime side never loads it.
"""

import glob
import os
import re

import pytest

from tests.hooks.common import assert_same_losses, families, run, tagged

ENV = {"DS_ACCELERATOR": "cpu"}


@pytest.fixture(scope="module")
def gloo_losses():
    return tagged(run("scripts/deepspeed_hook.py", "gloo", env=ENV, timeout=400), "LOSSES")


def test_install_instead_of_init_distributed_matches_gloo_and_uses_the_runtime(gloo_losses):
    out = run("scripts/deepspeed_hook.py", "mcr", env=ENV)
    assert_same_losses(tagged(out, "LOSSES"), gloo_losses)
    for rank in ("0", "1"):
        ops = families(tagged(out, "COMMLOG")[rank])
        # MoE all-to-all, gate and gradient all-reduce, ZeRO all-gather and ZeRO-3 reduce-scatter
        for op in ("all_to_all", "all_reduce", "all_gather", "reduce_scatter"):
            assert ops.get(op) == {"mpi"}, f"rank {rank}: {op} did not go through the runtime on mpi: {ops}"


def test_install_after_init_distributed_under_torchrun(gloo_losses):
    out = run("scripts/deepspeed_hook.py", "after", launcher="torchrun", env=ENV)
    assert_same_losses(tagged(out, "LOSSES"), gloo_losses)
    ops = families(tagged(out, "COMMLOG")["0"])
    for op in ("all_to_all", "all_reduce", "all_gather", "reduce_scatter"):
        assert ops.get(op) == {"gloo"}, f"{op} did not go through the runtime: {ops}"


@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_deepspeed_takes_the_device_mcr_bound_where_each_rank_sees_one_gpu(launcher):
    """Two ranks that each see one GPU (emulated on the CPU: tests/hooks/scripts/deepspeed_device.py).
    mcr binds cuda:0 on both; DeepSpeed's engine and ZeRO-3 took cuda:<LOCAL_RANK>, so local rank 1
    died with 'invalid device ordinal'. LOCAL_RANK and DeepSpeed's local rank stay the launcher's:
    under Open MPI DeepSpeed asserts LOCAL_RANK equals OMPI_COMM_WORLD_LOCAL_RANK."""
    got = tagged(run("scripts/deepspeed_device.py", "emulated", launcher=launcher), "DEVICE")
    assert sorted(got) == ["0", "1"], got
    for rank in (0, 1):
        assert got[str(rank)] == {
            "mcr": "cuda:0",
            "launcher local rank": rank,
            "LOCAL_RANK": str(rank),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(rank) if launcher == "mpiexec" else None,
            "engine local_rank": rank,
            "engine device": "cuda:0",
            "engine set_device": ["cuda:0"],
            "deepspeed.comm local rank": rank,
            "zero3 local_device": "cuda:0",
            "zero3 set_device": ["cuda:0"],
            "current device": None,
        }, f"rank {rank}"


# Lines of the installed DeepSpeed that make a device of a local rank without its accelerator,
# where mcr's cannot follow, and why that does no harm.
NOT_THROUGH_THE_ACCELERATOR = {
    "runtime/data_pipeline/data_sampling/data_analyzer.py": "the offline data analyser, no training job",
    "utils/init_on_device.py": "an example in a docstring",
}
# The places the engine and ZeRO-3 take their device from LOCAL_RANK (read for issue 50).
DEVICE_FROM_LOCAL_RANK = {
    "runtime/engine.py",  # _set_distributed_vars: set_device and device_name of device_rank (or local_rank)
    "runtime/zero/partition_parameters.py",  # zero.Init: device_name(os.environ["LOCAL_RANK"]), set_device
    "runtime/zero/utils.py",  # the rank-0 list checks' tensors on device_name(os.environ["LOCAL_RANK"])
    "runtime/pipe/module.py",  # PipelineModule.to(device_name(local_rank))
}


def test_deepspeed_makes_every_device_of_a_local_rank_through_its_accelerator():
    """install() makes DeepSpeed's device the one mcr bound by giving DeepSpeed an accelerator
    that names it for this rank's local rank (mcr.hooks.deepspeed._match_deepspeed_device). That
    holds only while every line of DeepSpeed that turns a local rank into a device asks its
    accelerator (device_name, device, set_device) and none sets torch's device itself."""
    import deepspeed

    root = os.path.dirname(deepspeed.__file__)
    local_rank = re.compile(r"LOCAL_RANK|local_rank|device_rank")
    device = re.compile(r"device_name\(|set_device\(|\.device\(|cuda:|\.to\(|\.cuda\(")
    asks = re.compile(r"get_accelerator\(\)\.(device_name|device|set_device)\(")
    sets_torch = re.compile(r"torch\.cuda\.set_device\(")
    asking, elsewhere = set(), []
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        name = os.path.relpath(path, root)
        if name.startswith("accelerator" + os.sep) or name in NOT_THROUGH_THE_ACCELERATOR:
            continue  # the accelerators themselves
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if local_rank.search(line) and device.search(line) and asks.search(line):
                    asking.add(name)
                elif (local_rank.search(line) and device.search(line)) or sets_torch.search(line):
                    elsewhere.append(f"{name}:{number}: {line.strip()}")
    assert not elsewhere, (
        f"deepspeed {deepspeed.__version__} makes a device without its accelerator, which mcr's "
        "BoundCUDAAccelerator cannot redirect; check mcr.hooks.deepspeed._match_deepspeed_device:\n"
        + "\n".join(elsewhere)
    )
    assert DEVICE_FROM_LOCAL_RANK <= asking, f"not found where they were read: {DEVICE_FROM_LOCAL_RANK - asking}"


def test_another_cuda_accelerator_that_would_name_the_wrong_device_is_refused_by_name(monkeypatch):
    """A CUDA accelerator of the user's own is kept where it names the bound device already, and
    refused, naming it and the fix, where it would name cuda:<local rank> on a rank that sees one GPU."""
    import types

    import torch
    from deepspeed.accelerator import get_accelerator, set_accelerator
    from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator

    from mcr.hooks.deepspeed import _match_deepspeed_device

    class SiteAccelerator(CUDA_Accelerator):
        pass

    before, site = get_accelerator(), SiteAccelerator()
    set_accelerator(site)
    try:
        monkeypatch.setenv("LOCAL_RANK", "0")
        _match_deepspeed_device(types.SimpleNamespace(device=torch.device("cuda", 0)))
        assert get_accelerator() is site
        monkeypatch.setenv("LOCAL_RANK", "1")
        with pytest.raises(RuntimeError, match=r"SiteAccelerator, which names local rank 1's device cuda:1.*cuda:0"):
            _match_deepspeed_device(types.SimpleNamespace(device=torch.device("cuda", 0)))
    finally:
        set_accelerator(before)
