"""The runtime's state and its two central steps: choosing a backend and running the op.

Every public op in `mcr.api` describes its call (op family, message bytes, dtype, group) and
hands it here, so backend choice, the watchdog, the flight recorder and the communication log
live in one place. Starting the backends, the store and the table is `mcr.startup`'s job; the
choice itself is the pure `mcr.choose.select_backend`; ops in flight are `mcr.inflight`'s.

Why mixing backends cannot deadlock (the rule the code keeps):
  1. The choice depends only on values equal on every rank of the group: the op family, the
     message size (agreed by an all-reduce MAX where sizes may legitimately differ), the group
     size, dtype and device, and the configuration. So all ranks put op k on the same backend.
  2. Each backend runs its own ops in issue order: gloo/nccl queue them per process group;
     MPI matches collectives per communicator in call order and its blocking calls progress
     every pending request of that library.
  3. No backend's progress depends on another backend: gloo and nccl progress on their own
     threads and streams; MPI progresses only inside MPI calls, for its in-flight nonblocking
     ops and for sends it has already returned from (buffered eager data goes out over TCP
     only from inside a later MPI call). So a rank that blocks on gloo or nccl (a blocking op,
     a wait on a handle, making a node-aware op's groups) in a job with MPI keeps MPI moving
     until it can go on: another thread tests its in-flight MPI ops and pokes MPI's progress
     engine meanwhile (`mcr.mpi_driver`); where MPI gives no MPI_THREAD_MULTIPLE the waiting
     thread does it itself, polling its op (an op that gloo marks done only inside its wait()
     is then waited on a helper thread: no test would ever see it done). Without this a peer
     waiting in MPI for this rank would wait for a rank that waits for it on gloo:
     tests/mcr/scripts/cross_progress.py deadlocked that way, and tests/cluster's random stress
     with node-aware candidates when only in-flight ops were driven. (The progress thread,
     `mcr.progress`, tests them too; the rule holds with it turned off.)
  Hence if every rank issues the same sequence, by induction the first incomplete op has been
  reached by every rank on the same backend, with all earlier ops on that backend posted
  before it, and completes. tests/mcr/test_robustness.py checks this with random interleavings (scripts/stress.py).
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import time
from threading import Event, get_ident
from time import perf_counter, time_ns
from typing import NamedTuple

import torch

from . import env as launch_env
from . import node_aware, startup, streams, threads, trace
from .backends import builtin_order
from .backends.base import Backend
from .blocking import prepare as prepare_blocking
from .callbacks import CallbackThread
from .choose import Call, Policy, require, select_backend, table_rule
from .commlog import CommLog
from .config import ConfigError, RuntimeConfig
from .debug import CallChecker
from .flight import DONE, RETURNED, FlightRecorder
from .group import Group
from .handle import Handle
from .inflight import InFlight
from .issuing import prepare as prepare_issue
from .mpi_driver import MPIDriver
from .ops import dtype_name
from .progress import ProgressThread
from .streams import CudaRoute, StreamHandle, StreamOrder
from .tuning.candidates import label
from .tuning.online import OnlineTuner
from .tuning.table import Choice
from .watchdog import Watchdog

log = logging.getLogger("mcr")


class CommError(RuntimeError):
    pass


class OpCall(NamedTuple):
    """An op as the watchdog, the comm log and error messages name it."""

    family: str
    backend: str
    nbytes: int
    group_size: int


class NodePlan(NamedTuple):
    """A node-aware candidate resolved to its backends (`mcr.node_aware`)."""

    intra: Backend  # runs the phases inside each node
    inter: Backend  # runs the phase between nodes
    label: str  # node:INTRA+INTER, as the table and the comm log name it


class Route(NamedTuple):
    """Where one kind of call runs: made once per distinct call and kept in the choice cache,
    so the hot path allocates nothing to describe its op."""

    backend: Backend  # a node-aware route: its inter-node backend
    chunk_bytes: int  # > 0: an all-reduce larger than this runs as a train of chunks
    op: OpCall  # `op.backend`: the candidate's label (mpi, mpi/chunk=1M, node:mpi+gloo)
    plan: NodePlan | None  # set: run as phases inside and between nodes
    rule: str  # the rung that chose it (`mcr.choose.Selection.rule`), for the flight recorder
    dtype_name: str  # and what the recorder says of the call's tensors
    itemsize: int
    device_type: str
    staged: bool = False  # CUDA tensors through host memory even where the library reads them (X/host)


class Runtime:
    def __init__(self, cfg: RuntimeConfig, info: launch_env.LaunchInfo, store=None, op_timeout_s=None):
        """`op_timeout_s`: torch's process-group timeout, after which a gloo or nccl op raises
        (default: the watchdog's); MPI has none."""
        self.cfg = cfg
        self.info = info
        self.rank = info.rank
        self.world_size = info.world_size
        self.device = streams.bind_device(info.local_rank)  # before MPI and NCCL start (None: no GPU)
        started = startup.start(cfg, info, store, op_timeout_s)
        self.backends, self.unavailable = started.backends, started.unavailable  # unavailable: name -> why
        self.store, self.topology, self.shape = started.store, started.topology, started.shape

        self._next_gid = 0
        # every group this runtime made communicators for: finalize() releases them (the torch
        # hook's groups are held by torch's ProcessGroup, which frees them with destroy_process_group)
        self._groups = []
        # member groups made so far under each key: a group made again under a key (torch names
        # a group by its ranks) rendezvous under a fresh store prefix, never the old one's addresses
        self._member_made = collections.Counter()
        self.world = self.new_group(range(info.world_size))
        self.table = self._online_tuner(cfg) if cfg.tuning == "auto" else started.table
        self.comm_log = CommLog() if cfg.comm_log else None
        self.recorder = (
            FlightRecorder(
                info.rank, cfg.flight_recorder, cfg.flight_recorder_dir, cfg.watchdog_timeout_s, bool(cfg.trace_dir)
            )
            if cfg.flight_recorder > 0 or cfg.trace_dir
            else None
        )
        if cfg.trace_dir:  # each op also a span in a running torch.profiler's trace (`mcr.trace`)
            self.call = self._profiled_call
        dump = self.dump_flight_record if self.recorder is not None else None
        self.watchdog = Watchdog(info.rank, cfg.watchdog_timeout_s, dump) if cfg.watchdog_timeout_s > 0 else None
        # the watchdog's {thread: op} map each blocking wait registers in (no watchdog: one nobody reads)
        self.waits = self.watchdog.waits if self.watchdog is not None else {}
        self.watch = self._watched_wait  # bound once: every async handle carries it
        self._choices = {}
        self._forced = None  # force_backend()
        self._warned = set()
        self.in_flight = InFlight()  # every async op's handle until its op completes (mcr.inflight)
        self._pending = self.in_flight.entries  # the hot path's "anything in flight?", without a call
        self.needs_driving = {name for name, backend in self.backends.items() if not backend.progresses_alone}
        # backends that take no calls from a second thread (an MPI without MPI_THREAD_MULTIPLE)
        self._single_threaded = [name for name, backend in self.backends.items() if not backend.thread_multiple]
        # rule 3: keeps MPI moving while this rank blocks on another backend (None: none needs
        # driving, or one takes no calls from a second thread: the waiting thread drives it itself)
        self._driver = MPIDriver(self._drive) if self.needs_driving and not self._single_threaded else None
        self._checker = self._call_checker(cfg)
        # where call() adds nothing to a ready blocking route (no per-call check, no profiler
        # span), api.all_reduce runs the route's prepared function itself: the hot path
        self.direct = self._checker is None and not cfg.trace_dir
        self.progress = self._progress_thread(cfg)
        self.callbacks = CallbackThread()  # sets dist.Work futures as their ops complete (mcr.callbacks)
        if self.world_size > 1:
            startup.abort_job_on_uncaught_exception(self.rank, self.dump_flight_record, self.abort_job)
        if self.rank == 0:
            startup.say_once(started, info, self.table)

    # --- start-up (the backends, store and table: mcr.startup) ---------------------------------
    def dump_flight_record(self, why="asked for", directory=None, frame=None) -> str | None:
        """Write this rank's flight record (`mcr.flight`) into `directory` (default: the
        configured one) and say where on stderr; None where the recorder is off or no directory
        is set. Safe from any thread, and at any moment (the watchdog, signals)."""
        if self.recorder is None:
            return None
        try:
            path = self.recorder.dump(why, directory, frame)
        except OSError as exc:
            sys.stderr.write(f"mcr: rank {self.rank} could not write its flight record: {exc}\n")
            return None
        if path is not None:
            sys.stderr.write(f"mcr: rank {self.rank} wrote its flight record ({why}) to {path}\n")
            sys.stderr.flush()
        return path

    def abort_job(self):
        """End this rank now and, through MPI where it runs, the whole job."""
        for backend in self.backends.values():
            backend.end_job()
        os._exit(1)

    def _progress_thread(self, cfg):
        """The thread that completes async ops nobody waits on (`mcr.progress`); none where the
        MPI library cannot take calls from two threads at once."""
        if not cfg.progress_thread:
            return None
        single = self._single_threaded
        if single:
            if self.rank == 0:
                log.warning(
                    "mcr: %s takes no calls from two threads at once (for MPI: no MPI_THREAD_MULTIPLE), so "
                    "async ops progress only when waited on (no progress thread); use a library built with "
                    "thread support to overlap them",
                    " and ".join(single),
                )
            return None
        return ProgressThread(self, self.watchdog.waits if self.watchdog is not None else None)

    def _online_tuner(self, cfg):
        """`tuning: auto`: learn per (op, size bucket) on first use; `tuning_save` keeps it."""
        return OnlineTuner(self, builtin_order("cpu"), save_path=cfg.tuning_save)

    def new_group(self, ranks) -> Group:
        ranks = sorted(set(int(r) for r in ranks))
        if not ranks:
            raise ValueError("new_group: no ranks given; pass the global ranks of the group's members")
        bad = [r for r in ranks if not 0 <= r < self.world_size]
        if bad:
            raise ValueError(f"new_group: ranks {bad or ranks} are not in the world of {self.world_size} ranks")
        group = Group(self._next_gid, ranks, self.rank, self.topology.shape(ranks))
        self._next_gid += 1
        self._open(group, lambda backend: backend.new_group(group.gid, ranks, group.rank))
        self._groups.append(group)
        return group

    def _open(self, group, make) -> None:
        """Each backend's communicator for `group` (`make(backend)`; None off the group), but
        none of a backend that needs a GPU per rank where two members share one: NCCL refuses
        them ("Duplicate GPU detected"), and every member knows it alike (the GPUs were exchanged
        at start-up), so every member chooses without it (mixing rule 1)."""
        shared = self.topology.shared_gpu(group.ranks)
        for name, backend in self.backends.items():
            if shared is not None and backend.gpu_per_rank:
                group.unavailable[name] = (
                    f"ranks {shared[0]} and {shared[1]} of the group share a GPU, and {name} needs one GPU per rank"
                )
                continue
            comm = make(backend)
            if comm is not None:
                group.comms[name] = comm

    def member_group(self, gid, ranks, timeout=None, keep=True) -> Group:
        """A group built by its members alone, in the given rank order (group rank i is
        ranks[i]): MPI by MPI_Comm_create_group, gloo and nccl on the store under the group's
        key. `keep`: released at finalize() (torch's groups are released by torch)."""
        group = Group(gid, ranks, self.rank, self.topology.shape(ranks))
        key = "/".join(map(str, gid)) if isinstance(gid, tuple) else str(gid)
        self._member_made[key] += 1
        key = f"{key}#{self._member_made[key]}"  # every member counts the same creations
        self._open(group, lambda backend: backend.member_group(key, ranks, group.rank, timeout))
        if keep:
            self._groups.append(group)
        return group

    def node_groups(self, group) -> node_aware.NodeGroups:
        """The group's node-local and peer groups, made by their members the first time a
        node-aware op runs on the group (every member is at that op: the choice is agreed), and
        kept on the group. With MPI ops in flight they are made beside a thread that keeps those
        moving (rule 3)."""
        if group.node_groups is not None:
            return group.node_groups
        layout = self.topology.layout(group.ranks)
        node = next(k for k, members in enumerate(layout.local) if self.rank in members)
        index = layout.local[node].index(self.rank)

        def build():
            # released with the group (Group.release), not kept past a group torch destroys
            local = self.member_group(("node", group.gid, "local", node), layout.local[node], keep=False)
            peers = self.member_group(("node", group.gid, "peers", index), layout.peers[index], keep=False)
            made.append(node_aware.NodeGroups.of(group, layout, local, peers))

        made = []
        if self._driver is not None:  # gloo connects through the store meanwhile (rule 3)
            self._driver.during(build)
        else:
            build()
        group.node_groups = made[0]
        return made[0]

    def _call_checker(self, cfg):
        """MCR_DEBUG=detail: a checker that meets the group's ranks on gloo before each collective."""
        if cfg.debug != "detail":
            return None
        gloo = self.backends.get("gloo")
        if gloo is None:
            raise ConfigError(
                f"debug=detail (MCR_DEBUG) checks calls over gloo, which is unavailable here "
                f"({self.unavailable.get('gloo')}); add gloo to the backends or turn debug off"
            )

        def gather(group, out, mine):
            op = OpCall("debug_check", "gloo", mine.nbytes, group.size)
            self.run(op, group, gloo, "all_gather_into_tensor", (out, mine))

        return CallChecker(gather, self.rank)

    # --- the routine every op shares ------------------------------------------------------------
    def call(self, family, method, nbytes, group, tensor, explicit, async_op, args, reduce_op=None, after=None):
        """Choose a backend for this call (step 2), run `method` of it with the group's
        communicator, `*args` and `async_op` (step 3, chunked where the table says), then
        `after` (AVG's divide): now for a blocking op, at completion for an async one.
        `nbytes` is the op's message size by its own rule; `tensor` gives dtype and device."""
        if self._checker is not None and family != "send_recv":
            self._checker.check(family, group, nbytes, tensor.dtype, reduce_op)
        # one lookup finds the route and, for a plain one, the backend's bound method and the
        # group's communicator (the choice itself is cached by `route`, keyed by op family)
        key = (method, nbytes, tensor.dtype, tensor.is_cuda, explicit, reduce_op, self._forced)
        ready = group.ready.get(key)
        if ready is None:
            ready = self._make_ready(key, family, group, tensor)
        route, blocking, issue = ready
        if blocking is not None:  # a plain route: one backend call, prepared (mcr.blocking, mcr.issuing)
            if not async_op:
                blocking(group, args)
                if after is not None:
                    after()
                return None
            handle = issue(group, args)
            return handle if after is None else handle.then(after)
        # a route in chunks or node-aware phases: the runtime's own steps, each recorded by itself
        recorder = self.recorder
        if recorder is not None:
            entry = recorder.issue(route, group, method, async_op, args[1] if family == "send_recv" else None)
        else:
            entry = None
        result = (
            self._run_node_aware(route, group, method, args, async_op)
            if route.plan is not None
            else self._run_chunked(route, group, tensor, reduce_op, async_op)
        )
        if entry is not None:
            if not async_op:
                entry[DONE] = time_ns()
            else:
                result.stamp_done(entry)
                entry[RETURNED] = time_ns()
        if after is None:
            return result
        if async_op:
            return result.then(after)
        after()
        return None

    def _make_ready(self, key, family, group, tensor):
        """(route, blocking run, async issue) for `call`'s cache on the group, under `key` (which
        holds the backend force_backend() names: forcing one never meets an older call); the two
        runs (`mcr.blocking`, `mcr.issuing`) None where the route runs in chunks or phases
        (`_run_chunked`, `_run_node_aware`)."""
        method, nbytes, dtype, is_cuda, explicit, reduce_op, _ = key
        device_type = "cuda" if is_cuda else "cpu"
        route = self.route(family, nbytes, group, dtype, device_type, explicit, reduce_op)
        blocking = issue = None
        if route.plan is None and not (route.chunk_bytes and nbytes > route.chunk_bytes) and is_cuda:
            backend = route.backend
            comm = group.comms[backend.name]
            cuda = CudaRoute(
                self, route.op, backend, method, comm, route, route.staged, reduce_op=reduce_op, dtype=dtype
            )
            blocking, issue = cuda.run, cuda.issue
        elif route.plan is None and not (route.chunk_bytes and nbytes > route.chunk_bytes):
            backend = route.backend
            fn, comm = getattr(backend, method), group.comms[backend.name]
            call = backend.for_route(method, comm, nbytes, dtype, device_type, reduce_op)
            blocking = prepare_blocking(self, route.op, group, fn, comm, call, route, method)
            issue_call = backend.for_route(method, comm, nbytes, dtype, device_type, reduce_op, async_op=True)
            issue = prepare_issue(self, route.op, group, fn, comm, issue_call, route, method)
        if len(group.ready) > 65536:
            group.ready.clear()  # bounded, as the choices are
        ready = group.ready[key] = (route, blocking, issue)
        return ready

    def _profiled_call(self, family, method, *args, **kwargs):
        """`call` inside a torch.profiler span while a profiler runs (tracing only: off the hot path)."""
        if not torch._C._autograd._profiler_enabled():
            return Runtime.call(self, family, method, *args, **kwargs)
        with torch.autograd.profiler.record_function(f"mcr:{method}"):
            return Runtime.call(self, family, method, *args, **kwargs)

    # --- step 2: choose ------------------------------------------------------------------------
    def force_backend(self, name: str | None) -> None:
        """Run every op that follows on backend `name` (or a node-aware candidate such as
        `node:mpi+gloo`), or (None) choose again as configured. For benchmarks that compare
        backends inside one job; every rank must call it alike."""
        if name is not None:
            self._require(name, "force_backend", "asked for by force_backend()")
        self._forced = name
        self._choices.clear()

    def choose(self, family, nbytes, group, dtype, device_type, explicit=None, reduce_op=None):
        """(backend, chunk_bytes) for this call; the same on every rank of the group."""
        return self.route(family, nbytes, group, dtype, device_type, explicit, reduce_op)[:2]

    def route(self, family, nbytes, group, dtype, device_type, explicit=None, reduce_op=None) -> Route:
        key = (family, nbytes, group.gid, dtype, device_type, explicit, reduce_op)
        found = self._choices.get(key)
        if found is not None:
            return found
        if not group.is_member:
            raise ValueError(f"mcr.{family}: rank {self.rank} is not a member of {group}")
        backend, chunk, plan, rule, staged = self._decide(
            family, nbytes, group, dtype, device_type, explicit, reduce_op
        )
        name = backend.name if plan is None else plan.label
        op = OpCall(family, name + ("/host" if staged else ""), nbytes, group.size)  # as the comm log names it
        found = Route(backend, chunk, op, plan, rule, dtype_name(dtype), dtype.itemsize, device_type, staged)
        if len(self._choices) > 65536:
            self._choices.clear()  # bounded: uneven all-to-all sizes are many
        self._choices[key] = found
        return found

    def _decide(self, family, nbytes, group, dtype, device_type, explicit, reduce_op):
        """(backend, chunk bytes, node plan or None, rule, staged) by `select`; its notes (a
        fallback, a node-aware candidate run flat) are said here, each once. `staged`: CUDA
        tensors through host memory (the candidate X/host)."""
        picked = self.select(family, nbytes, group, dtype, device_type, explicit, reduce_op)
        for note in picked.notes:
            if note.key not in self._warned and (group.rank if note.by_group else self.rank) == 0:
                log.warning("mcr: %s", note.text)
            self._warned.add(note.key)
        backend = self.backends[picked.backend]
        rule = picked.rule if not picked.notes else f"{picked.rule}; {'; '.join(n.text for n in picked.notes)}"
        if picked.intra:
            return backend, 0, NodePlan(self.backends[picked.intra], backend, picked.label), rule, False
        return backend, picked.chunk_bytes, None, rule, picked.host

    def select(self, family, nbytes, group, dtype, device_type, explicit=None, reduce_op=None):
        """`mcr.choose.select_backend` for a call on `group` (the pure choice `python -m
        mcr.tools.explain` runs too), with what the group lacks: backends with no communicator
        on it, or on its node-local or peer groups (NCCL where two members share a GPU), known
        alike on every member. A send or receive's `reduce_op` "tagged" says it has a tag."""
        tagged = reduce_op == "tagged"
        call = Call(
            family, nbytes, group.size, group.nodes, dtype, device_type, None if tagged else reduce_op, explicit,
            group.shape, group.gid, frozenset(group.unavailable), *self._phase_missing(group), tagged,
        )  # fmt: skip
        policy = Policy(self.cfg.overrides, self.cfg.backend, self._forced)
        unavailable = {**self.unavailable, **group.unavailable}
        return select_backend(call, policy, self.backends, unavailable, lambda: self._from_table(call, group))

    def _phase_missing(self, group):
        """The backends a node-aware op on `group` could not run its intra-node and its
        inter-node phases on (a GPU per rank needed, two ranks of such a group on one GPU)."""
        needy = [name for name, backend in self.backends.items() if backend.gpu_per_rank]
        layout = self.topology.layout(group.ranks) if needy and group.nodes else None
        if layout is None:
            return frozenset(), frozenset()
        shared = self.topology.shared_gpu
        intra = any(shared(ranks) for ranks in layout.local)
        inter = any(shared(ranks) for ranks in layout.peers)
        return frozenset(needy if intra else ()), frozenset(needy if inter else ())

    def _from_table(self, call, group):
        """(Choice, rule) from the tuning table, or None; an online table may measure now, with the group."""
        table = self.table
        if table is None or not table.online:
            return table_rule(table, call)
        if call.device_type != table.device:
            return None
        choice = table.decide(call.family, call.nbytes, group, call.dtype, call.device_type, call.reduce_op)
        return None if choice is None else (choice, f"the tuning table {table.path}")

    def _require(self, name, family, why):
        require(name, family, why, self.backends, self.unavailable)

    def agreed_bytes(self, family, group, nbytes) -> int:
        """Where message sizes legitimately differ across ranks (uneven all-to-all), the choice
        is made on the largest size in the group, which every rank learns through one small
        all-reduce. It is skipped when the choice for this op cannot depend on the size."""
        if self.table is None or not self.table.depends_on_size(family, group.size, group.nodes):
            return nbytes
        size = torch.tensor([nbytes], dtype=torch.int64)
        self.call("all_reduce", "all_reduce", 8, group, size, None, False, (size, "max"), "max")
        return int(size.item())

    # --- step 3 and 4: run, watch and account --------------------------------------------------
    def run(self, op: OpCall, group, backend, method, args, logged=True):
        """`method` of `backend` on the group, blocking, under the watchdog, its time in the comm
        log (unless a chunk of an op that is logged whole): the runtime's own steps (node-aware
        phases, finalize's barriers, debug checks), as `mcr.blocking` describes; on CUDA tensors
        under the stream rules (`mcr.streams`)."""
        comm = group.comms[backend.name]
        if streams.device_of(args) is not None:
            dtype = next(a.dtype for a in args if isinstance(a, torch.Tensor))
            reduce_op = next((a for a in args if isinstance(a, str)), None)  # a reduction's op name
            return CudaRoute(self, op, backend, method, comm, logged=logged, reduce_op=reduce_op, dtype=dtype).run(
                group, args
            )
        return prepare_blocking(self, op, group, getattr(backend, method), comm, logged=logged)(group, args)

    def _drive(self) -> None:
        """Let the backends that progress only inside their calls (MPI) move, without blocking:
        test their in-flight ops, then poke their progress engines (for sends that returned
        before their data left)."""
        self.in_flight.test_driven()
        for name in self.needs_driving:
            self.backends[name].progress()

    def wait_keeping_mpi_moving(self, wait, test) -> None:
        """`wait()`, a blocking wait on something other than MPI (another backend's op, a CUDA
        event), keeping MPI moving meanwhile where the job has MPI (mixing rule 3): beside the
        driver thread, or from this thread by polling `test()` where MPI takes no second thread."""
        if not self.needs_driving:
            wait()
        elif self._driver is not None:
            self._driver.during(wait)
        else:
            self._wait_driving(test)
            wait()

    def _wait_driving(self, test) -> None:
        """Return when `test()` is true, keeping MPI moving meanwhile from this thread (where no
        MPI driver thread can). Sleeps grow from 20 µs to 1 ms, so a long wait costs little CPU."""
        pause = 2e-5
        while not test():
            self._drive()
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)

    def _wait_driving_aside(self, wait) -> None:
        """Rule 3 without an MPI driver thread, for an op whose library marks it done only inside
        its own wait(): that wait runs on a helper thread while this one keeps MPI moving. Polling
        its test instead would never see it done (tests/mcr/scripts/waited_only.py)."""
        done, failed = Event(), []

        def waiter():
            try:
                wait()
            except BaseException as exc:  # raised here, on the caller's thread, under its watchdog
                failed.append(exc)
            finally:
                done.set()

        threads.start(waiter, "mcr-wait")
        self._wait_driving(done.is_set)
        done.wait()
        if failed:
            raise failed[0]

    def _run_node_aware(self, route, group, method, args, async_op):
        """The op as phases inside and between nodes (`mcr.node_aware`), each a blocking op run
        and watched here like any other (the watchdog names the phase), the whole logged once
        under its candidate's label. An async call runs its phases before it returns: a later
        phase needs an earlier one's result, and issuing it from another thread later would
        break the issue order the mixing rules rest on; the handle comes back complete."""
        plan, groups = route.plan, self.node_groups(group)
        family, started = route.op.family, perf_counter()

        def phase(where, phase_method, *phase_args):
            backend, sub = (plan.intra, groups.local) if where == "intra" else (plan.inter, groups.peers)
            what = f"{family} via {plan.label}: {where}-node {phase_method}"
            op = OpCall(what, backend.name, phase_args[1 if phase_method != "all_reduce" else 0].nbytes, sub.size)
            self.run(op, sub, backend, phase_method, phase_args, False)

        node_aware.run(method, args, groups, phase)
        if self.comm_log is not None:
            self.comm_log.record(route.op, perf_counter() - started)
        if not async_op:
            return None
        handle = Handle(lambda: None, lambda: True)
        handle.wait()
        handle.op = route.op
        return handle

    def _run_chunked(self, route, group, tensor, reduce_op, async_op):
        """Large all-reduces run faster as a train of chunks (they stay in cache); each chunk is
        its own op on the same backend, in the same order on every rank. The comm log shows the
        caller's op under its candidate's name (`mpi/chunk=1M`), not the chunks."""
        backend = route.backend
        fn, comm = backend.all_reduce, group.comms[backend.name]
        flat = tensor.view(-1)
        per = max(1, route.chunk_bytes // tensor.element_size())
        started, comm_log = perf_counter(), self.comm_log
        whole = route.op._replace(backend=label(Choice(backend.name, route.chunk_bytes)))
        prepare = prepare_issue if async_op else prepare_blocking
        order = StreamOrder(tensor.device, comm_log is not None) if tensor.is_cuda else None
        handles, runs = [], {}  # runs: a chunk's function by its size (all but the last share one)
        for start in range(0, flat.numel(), per):
            part = flat[start : start + per]
            run = runs.get(part.nbytes)
            if run is None:
                op = route.op._replace(nbytes=part.nbytes)
                if order is not None:  # CUDA tensors: each chunk under the stream rules
                    cuda = CudaRoute(
                        self, op, backend, "all_reduce", comm, None, route.staged, False, reduce_op, tensor.dtype
                    )
                    run = runs[part.nbytes] = cuda.issue if async_op else cuda.run
                else:
                    run = runs[part.nbytes] = prepare(self, op, group, fn, comm, logged=False)
            handles.append(run(group, (part, reduce_op)))
        if not async_op:
            if comm_log is not None and order is None:  # on CUDA the chunks' GPU times are not summed here
                comm_log.record(whole, perf_counter() - started)
            return None
        handle = Handle(lambda: [h.wait() for h in handles], lambda: all(h.is_completed() for h in handles), tensor)
        if order is not None:  # the whole op's finishers (AVG) on the issuing stream, after every chunk
            handle = StreamHandle(handle, order, whole, group, None, comm_log)
        else:
            if comm_log is not None:
                handle.then(lambda: comm_log.record(whole, perf_counter() - started))
            handle.op = whole
        self.hold(comm, handle)  # the caller may drop it: its post-step (AVG) must still run
        return handle

    def hold(self, comm, handle, driven=False):
        """Keep an async op's handle in flight until its op completes (`mcr.inflight`), and wake
        the progress thread if it sleeps."""
        self.in_flight.add(comm, handle, driven)
        progress = self.progress
        if progress is not None and progress.idle:
            progress.poke()

    def _watched_wait(self, inner_wait, inner_test, handle):
        """An async op's wait (`handle.watch`) under the watchdog and rule 3, its failure naming
        the op."""
        op, group, waits = handle.op, handle.group, self.waits
        if handle.record is not None:
            FlightRecorder.waited(handle.record)
        thread = get_ident()
        waits[thread] = (op,)  # a fresh object per wait (mcr.watchdog)
        try:
            if op.backend in self.needs_driving or not self.needs_driving:
                inner_wait()  # waiting in MPI moves MPI; without MPI nothing needs moving
            elif self._driver is not None or handle.completes_alone:
                self.wait_keeping_mpi_moving(inner_wait, inner_test)
            else:  # no test ever says done (gloo's send/recv, reduce-scatter): wait beside, not instead
                self._wait_driving_aside(inner_wait)
        except Exception as exc:
            raise self.op_error(op, group, exc) from exc
        finally:
            waits.pop(thread, None)

    def op_error(self, op, group, exc):
        error = CommError(
            f"rank {self.rank}: {op.family} on backend {op.backend} ({op.nbytes} bytes, group ranks "
            f"{list(group.ranks)}) failed: {exc}"
        )
        if self.watchdog is not None:  # a SIGTERM while this error is reported still names the op
            self.watchdog.failed = (op, exc)
        return error

    # --- shutdown ------------------------------------------------------------------------------
    def finalize(self):
        if self._checker is not None:  # a rank that skipped a call meets its peers' call here
            self._checker.check("finalize", self.world, 0, None)
        self.in_flight.complete_all()  # under the watchdog: a peer that never posts its part is named
        self.callbacks.stop()  # the futures of those ops; their callbacks may issue more ops
        self.in_flight.complete_all()
        if self.cfg.flight_recorder_dump_on_finalize:
            self.dump_flight_record("finalize")
        if self.cfg.trace_dir:
            trace.write_rank(self.recorder, self.rank, self.cfg.trace_dir, time.time_ns())
        if self.comm_log is not None:
            if self.rank == 0:
                print("mcr communication log (rank 0)\n" + self.comm_log.table(), flush=True)
            if self.cfg.comm_log_json:
                path = self.cfg.comm_log_json.replace("{rank}", str(self.rank))
                if self.rank == 0 or "{rank}" in self.cfg.comm_log_json:
                    self.comm_log.write_json(path)
        # No rank tears down its connections while a peer still has ops in flight on them; these
        # barriers run under the watchdog, so a peer that never finalizes is named, not waited for.
        comm_log, self.comm_log = self.comm_log, None  # already printed; the job's traffic only
        for name, backend in self.backends.items():
            if backend.closing_barrier and name in self.world.comms:
                self.run(OpCall("finalize", name, 0, self.world.size), self.world, backend, "barrier", ())
        self.comm_log = comm_log
        if self.progress is not None:
            self.progress.stop()
        if self._driver is not None:
            self._driver.stop()
        if self.watchdog is not None:
            self.watchdog.stop()
        for backend in self.backends.values():
            backend.shutdown()
        # Destroy gloo/NCCL groups now, while Python runs: left to interpreter exit (the caller may
        # still hold this runtime), their worker threads end after the interpreter is gone, and one
        # that then needs the GIL aborts the process ("terminate called without an active
        # exception", seen once in CI under torchrun). torch's destroy_process_group does the same.
        self._release_groups()

    def abort(self) -> None:
        """torch's abort: this rank stops communicating now. Ops in flight are abandoned, not
        waited for; no closing barrier, log or record; the helper threads stop; every group's
        communicators abort (`Backend.abort`: NCCL's ops end, gloo's run out their timeout
        unseen, MPI's stay with the library until the process ends)."""
        self.in_flight.abandon()
        for thread in (self.progress, self._driver, self.watchdog):
            if thread is not None:
                thread.stop()
        for group in reversed(self._groups):  # newest first, as torch aborts its groups
            self._abort_comms(group)
        self._groups.clear()

    def abort_group(self, group) -> None:
        """torch's abort of one group: its ops in flight abandoned, its communicators aborted."""
        self.in_flight.abandon({id(comm) for comm in group.communicators()})
        self._abort_comms(group)
        if group in self._groups:
            self._groups.remove(group)

    def _abort_comms(self, group) -> None:
        group.release(lambda name, comm: self.backends[name].abort(comm))

    def release_at_exit(self) -> None:
        """The script ends without finalize() (`mcr.api` calls this at exit): destroy the groups
        now, while Python runs, for the reason finalize does; one run in three of a 300-op gloo
        script aborted at exit without this. No barrier (a peer may be gone, or exiting on an
        error) and nothing else of finalize: it only lets gloo's threads end. Not while an op is
        still in flight: a gloo thread inside one ends only when it does, so that exit stays
        as it was."""
        if all(handle.is_completed() for handle in self.in_flight.handles()):
            self._release_groups()

    def _release_groups(self) -> None:
        for group in self._groups:
            group.release()  # the backends, shut down, freed their communicators already
        self._groups.clear()

    def release_group(self, group) -> None:
        """A group whose user is done with it (torch destroyed its ProcessGroup): its collectives
        in flight completed, then each backend's communicator handed back to its library, its
        node groups' too. MPI frees its contexts: a job making and destroying groups would run
        out of them (MPICH has a few thousand)."""
        for comm in group.comms.values():
            self.in_flight.complete_earlier(comm)
        group.release(lambda name, comm: self.backends[name].release(comm))
