"""torch's own c10d test suite (`torch.testing._internal.distributed.distributed_test`, shipped in
the torch wheel) against backend "mcr", started as torch starts it: each test spawns WORLD_SIZE
processes that meet through a file:// init (no launcher, so no MPI world: gloo on torch's store).

    WORLD_SIZE=3 python -m pytest tests/conformance      # default 2 ranks; `make conformance`: 2, 3, 4, 8

The suite decides at import, by backend name, which tests to skip. It is imported as
"mcr" with the feature sets that describe what "mcr" supports (a registered plugin; DDP and
subgroups on CPU), and again as a persona, "gloo" or "mpi": a copy of the suite whose skips and
test bodies see that backend's name, so that the tests it keeps for that backend alone
(all-to-all, `get_future`, timeouts, batched send/recv, DDP's CPU paths...) run too. Every copy
runs its tests on "mcr": in a persona's ranks, the process groups the suite makes for its
backend are made on "mcr". A persona's class keeps only the tests no other class runs.
"""

from __future__ import annotations

import importlib
import importlib.util
import multiprocessing
import os
import sys
import unittest

import torch  # noqa: F401  (before the suite: it imports torch.testing, which needs torch whole)
import torch.distributed as dist

import mcr  # noqa: F401  (registers backend "mcr" here and in every spawned rank)

os.environ.setdefault("WORLD_SIZE", "2")
os.environ["BACKEND"] = "mcr"  # read by the suite's modules at import and in each spawned rank

from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

# What "mcr" supports, in the suite's own terms: a plugin backend running DDP and subgroups on CPU
for feature in ("plugin", "ddp", "subgroup"):
    DistTestCases.backend_feature[feature].add("mcr")

SUITE = "torch.testing._internal.distributed.distributed_test"
# How each test starts its ranks: "spawn", torch's own start (`make conformance`), or "forkserver"
# (`make test`): the same fresh processes without launcher variables, several times faster here.
START = os.environ.get("C10D_START", "forkserver")

# Tests that cannot pass on a backend of another name, whatever it does, and why
_MONITORED = "torch's monitored_barrier refuses every backend not named gloo (distributed_c10d.monitored_barrier)"
NOT_FOR_MCR = {
    "test_monitored_barrier_gloo": _MONITORED,
    "test_monitored_barrier_gloo_subgroup": _MONITORED,
    # these two run only at 8 ranks or more (`make conformance`; the suite skips them below)
    "test_monitored_barrier_failure_order": _MONITORED,
    "test_monitored_barrier_wait_all_ranks": _MONITORED,
}


def load(persona: str):
    """The suite's module with its skips decided as for backend `persona`, run on "mcr". A
    persona's copy is registered under its own name, as tests pickle the suite's models."""
    if persona == "mcr":
        return importlib.import_module(SUITE)
    name = f"_c10d_suite_as_{persona}"
    if name in sys.modules:
        return sys.modules[name]
    os.environ["BACKEND"] = persona
    try:
        spec = importlib.util.spec_from_file_location(name, importlib.util.find_spec(SUITE).origin)
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        os.environ["BACKEND"] = "mcr"
    return module


def case_class(module: str, persona: str, only_where_skipped_as=()):
    """A unittest class of the suite's tests, spawning its ranks per test as torch's runner does.
    `only_where_skipped_as`: other personas; tests one of them runs are dropped from this class
    (decided in the test process only: a spawned rank runs the one test it is given)."""
    suite = load(persona)

    class Case(suite.TestDistBackend, suite.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            if START == "spawn":
                self._spawn_processes()  # torch's own start
            else:
                multiprocessing.get_context("forkserver").set_forkserver_preload([module])
                self._start_processes(ForkserverRank)

        @classmethod
        def _run(cls, rank, test_name, file_name, pipe, env=None, **kwargs):
            os.environ.update(env or {})  # a forkserver's child starts with the server's environment
            if persona != "mcr":  # this rank's process groups: "mcr", whatever name the bodies give
                backend_named_mcr(persona)
            super()._run(rank, test_name, file_name, pipe, **kwargs)

    # spawned ranks unpickle the class by name: it must be found in the test module
    Case.__qualname__ = Case.__name__ = f"TestC10dAs{persona.capitalize()}"
    Case.__module__ = module
    for name, why in NOT_FOR_MCR.items():
        setattr(Case, name, unittest.skip(why)(getattr(Case, name)))
    Case.dropped_tests = set()  # left out at collection (conftest.py)
    if only_where_skipped_as and multiprocessing.parent_process() is None:
        others = [load(other).DistributedTest._DistTestBase for other in only_where_skipped_as]
        for name in [n for n in dir(Case) if n.startswith("test_")]:
            if _skipped(getattr(Case, name)) or any(not _skipped(getattr(o, name, None)) for o in others):
                Case.dropped_tests.add(name)
    return Case


class ForkserverRank(multiprocessing.get_context("forkserver").Process):
    """A start like spawn's (a fresh process, no launcher) without importing torch and the suite
    again for every rank of every test: each rank is forked from a server that imported the test
    module once. It gets the test's environment (TEMP_DIR, INIT_METHOD) as an argument."""

    def __init__(self, *args, kwargs=None, **more):
        super().__init__(*args, kwargs={**(kwargs or {}), "env": dict(os.environ)}, **more)


def backend_named_mcr(persona: str) -> None:
    """In a persona's rank (a process of its own), process groups that the suite creates for
    its persona's backend are made on "mcr": the bodies believe they run on that backend."""
    for name in ("init_process_group", "new_group"):
        make = getattr(dist, name)

        def on_mcr(*args, _make=make, **kwargs):
            if kwargs.get("backend") in (None, persona):
                kwargs["backend"] = "mcr"
            return _make(*args, **kwargs)

        setattr(dist, name, on_mcr)


def _skipped(method) -> bool:
    return method is None or getattr(method, "__unittest_skip__", False)


def skip_reason(method) -> str:
    return getattr(method, "__unittest_skip_why__", "")
