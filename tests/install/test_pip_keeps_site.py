"""`pip install .` into an environment that has its own torch and mpi4py keeps both: pyproject.toml
declares them without versions, so an installed one of any version meets them (a site's CUDA
torch, an mpi4py built against the site's MPI, like Polaris' conda one linked to Cray MPICH's GTL).

    TESTS_INSTALL=1 .venv/bin/python -m pytest -q tests/install/test_pip_keeps_site.py

A real venv gets torch 2.10.0 from the package index (older than the 2.11 the hooks were tested
from; `torch>=2.11` had pip replace it with the newest torch) and mpi4py 3.1.6 built from source
against this checkout's Open MPI (`mpi4py>=4` had pip replace it with PyPI's wheel). pip, as
configured on the machine, then plans `pip install .` and `pip install '.[deepspeed]'` of the
checkout (`--dry-run --report`): neither may install torch or mpi4py. Minutes (torch is a 900 MB
download; mpi4py compiles), so `make test` skips it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.ranks import REPO

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("TESTS_INSTALL") != "1",
        reason="minutes (downloads torch 2.10, compiles mpi4py 3.1.6): TESTS_INSTALL=1 runs it",
    ),
    pytest.mark.timeout(3600),
]
OLD_TORCH, OLD_MPI4PY = "2.10.0", "3.1.6"
# the downloads, kept for the next run (pip's own cache keeps no file this large)
CACHE = os.environ.get("TESTS_INSTALL_CACHE", os.path.expanduser("~/.cache/mcr-tests/wheels"))


def run(*cmd, env=None, timeout=1800) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(cmd)}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> str:
    """A venv's python holding torch 2.10.0 and mpi4py 3.1.6 built against an MPI."""
    venv = tmp_path_factory.mktemp("site") / "venv"
    run(sys.executable, "-m", "venv", str(venv))
    python = str(venv / "bin" / "python")
    wanted = [f"torch=={OLD_TORCH}", f"mpi4py=={OLD_MPI4PY}"]
    run(python, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", "mpi4py", "-d", CACHE, *wanted)
    pip = [python, "-m", "pip", "install", "-q", "--no-deps", "--find-links", CACHE]
    run(*pip, "--no-index", wanted[0])
    mpicc = os.path.join(os.path.dirname(sys.executable), "mpicc")  # the checkout's .venv: PyPI's Open MPI
    # mpi4py 3.1's build runs on the setuptools of its day: the venv's own (65 on Python 3.11), plus wheel
    run(python, "-m", "pip", "install", "-q", "wheel")
    run(*pip, "--no-build-isolation", "--no-binary", "mpi4py", wanted[1], env=dict(os.environ, MPICC=mpicc))
    return python


def planned(python: str, target: str) -> dict:
    """{name: version} that `pip install target` would install into that python's environment."""
    report = run(python, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-", target)
    return {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in json.loads(report)["install"]}


def installed(python: str) -> dict:
    listing = json.loads(run(python, "-m", "pip", "list", "--format=json"))
    return {item["name"].lower(): item["version"] for item in listing}


@pytest.mark.parametrize("extra", ["", "[deepspeed]"])
def test_pip_install_keeps_the_sites_torch_and_mpi4py(site, extra):
    assert {k: v for k, v in installed(site).items() if k in ("torch", "mpi4py")} == {
        "torch": OLD_TORCH,
        "mpi4py": OLD_MPI4PY,
    }
    plan = planned(site, REPO + extra)
    assert "mcr-dl" in plan, plan  # the checkout itself is what pip installs
    assert {name: plan[name] for name in ("torch", "mpi4py") if name in plan} == {}, plan
