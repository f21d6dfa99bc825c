"""Session fixtures: a real single-node SLURM, and DeepSpeed's ops built once for every job."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from launch.systems import REPO
from tests.launch import slurm_cluster

# Built once per venv (not per job): copied into each job's own TORCH_EXTENSIONS_DIR. Per venv,
# because torch rebuilds an op whose build flags (the venv's include paths) differ from the cache's;
# and per path to it, which the flags spell as Python was started (a venv reached through a
# symlink gets other flags: its jobs rebuilt a cache built through the real path).
OPS_CACHE = os.path.join(sys.prefix, "test-torch-extensions-" + hashlib.sha1(sys.prefix.encode()).hexdigest()[:8])
BUILD_OPS = (
    "from deepspeed.accelerator import get_accelerator; get_accelerator().create_op_builder('FusedAdamBuilder').load()"
)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    why = slurm_cluster.missing()
    if why:
        if os.geteuid() == 0:  # CI runs as root and installs SLURM (make slurm-deps): missing is a failure
            pytest.fail(why)
        pytest.skip(why)
    cluster = slurm_cluster.Cluster(str(tmp_path_factory.mktemp("slurm")))
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = cluster.conf  # for scontrol/scancel called by launch.submit in this process
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        if before is None:
            os.environ.pop("SLURM_CONF")
        else:
            os.environ["SLURM_CONF"] = before


@pytest.fixture(scope="session")
def ops_cache():
    """DeepSpeed's FusedAdam built into a private directory, then renamed into place whole, so a
    session killed mid-build leaves no half-built cache (and no lock) for the next one."""
    if not os.path.isdir(OPS_CACHE):
        building = f"{OPS_CACHE}.building-{os.getpid()}"
        built = os.path.join(os.environ.get("TORCH_EXTENSIONS_DIR", "/nonexistent"), "fused_adam")
        if os.path.exists(os.path.join(built, "fused_adam.so")) and not os.path.exists(os.path.join(built, "lock")):
            shutil.copytree(built, os.path.join(building, "fused_adam"))  # `make setup` built it for this venv
        # the venv's ninja first, as in the job scripts: a build log from another ninja version
        # ("build log version is too old") makes every job rebuild from scratch
        path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
        env = dict(os.environ, TORCH_EXTENSIONS_DIR=building, DS_ACCELERATOR="cpu", PATH=path)
        subprocess.run([sys.executable, "-c", BUILD_OPS], env=env, check=True, timeout=1200, capture_output=True)
        try:
            os.rename(building, OPS_CACHE)
        except OSError:  # another session finished first
            pass
    return OPS_CACHE


def write_test_system(path: str, ops_cache: str) -> str:
    """configs/systems/local.yaml with the pre-built ops cache and the CPU accelerator named."""
    cfg = OmegaConf.load(os.path.join(REPO, "configs", "systems", "local.yaml"))
    cfg.torch_extensions_cache = ops_cache
    cfg.env.DS_ACCELERATOR = "cpu"
    OmegaConf.save(cfg, path)
    return str(path)
