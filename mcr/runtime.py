"""The runtime: its life cycle (start, groups, finalize, abort) and the routine every op shares.

Every public op in `mcr.api` describes its call (op family, message bytes, dtype, group) and
hands it to `Runtime.call`, which routes it (`mcr.routing`, once per kind of call, kept on the
group) and runs it: one backend call (`mcr.runner`, `mcr.streams` on CUDA), a
train of chunks (`mcr.chunked`) or node-aware phases (`mcr.node_aware`). Starting the backends,
the store and the table is `mcr.startup`'s job; ops in flight are `mcr.inflight`'s; rule 3 below
is `mcr.mpi_driver`'s.

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
from threading import get_ident
from time import time_ns

import torch

from . import env as launch_env
from . import node_aware, startup, streams, trace
from .backends import builtin_order
from .callbacks import CallbackThread
from .chunked import run_chunked
from .commlog import CommLog
from .config import ConfigError, RuntimeConfig
from .debug import CallChecker
from .flight import DONE, LIVE, RETURNED, S_DONE, FlightRecorder
from .gpu_turns import GpuTurns
from .group import Group, route_key
from .inflight import InFlight
from .mpi_driver import MPIDriver
from .ops import Average, as_average
from .progress import ProgressThread
from .rank_file import mark_a_clean_exit
from .request import Request
from .routing import OpCall, Router
from .runner import prepare_async_issue, prepare_blocking_run
from .stream_ordered import StreamOps, StreamOrderedRoute, then
from .streams import CudaRoute
from .tuning.online import OnlineTuner
from .watchdog import Watchdog

log = logging.getLogger("mcr")


class CommError(RuntimeError):
    pass


class Runtime:
    def __init__(self, cfg: RuntimeConfig, info: launch_env.LaunchInfo, store=None, op_timeout_s=None):
        """`op_timeout_s`: torch's process-group timeout, after which a gloo or nccl op raises
        (default: the watchdog's); MPI has none."""
        self.cfg = cfg
        self.info = info
        self.rank = info.rank
        self.world_size = info.world_size
        started = startup.start(cfg, info, store, op_timeout_s)  # binds the device, before MPI or after (jsrun)
        self.device = streams.bound_device()  # None: no GPU
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
        self.router = Router(cfg, self.rank, self.backends, self.unavailable, self.topology, started.table)
        if cfg.tuning == "auto":  # learn per (op, size bucket) on first use; `tuning_save` keeps it
            self.router.table = OnlineTuner(self, builtin_order("cpu"), save_path=cfg.tuning_save)
        self.comm_log = CommLog() if cfg.comm_log else None
        self.recorder = (
            FlightRecorder(
                info.rank, cfg.flight_recorder, cfg.flight_recorder_dir, cfg.watchdog_timeout_s, bool(cfg.trace_dir)
            )
            if cfg.flight_recorder > 0 or cfg.trace_dir
            else None
        )
        self.traced = bool(cfg.trace_dir)  # each op also a span in a running torch.profiler's trace (`mcr.trace`)
        # ops of a GPU library (NCCL), read on the recorder's, comm log's and watchdog's schedule
        self.stream_ops = StreamOps()
        dump = self.dump_flight_record if self.recorder is not None else None
        self.watchdog = (
            Watchdog(info.rank, cfg.watchdog_timeout_s, dump, self.stream_ops.settle)
            if cfg.watchdog_timeout_s > 0
            else None
        )
        # the watchdog's {thread: op} map each blocking wait registers in (no watchdog: one nobody reads)
        self.waits = self.watchdog.waits if self.watchdog is not None else {}
        self.watch = self._watched_wait  # bound once: every async handle carries it
        self.in_flight = InFlight()  # every async op's handle until its op completes (mcr.inflight)
        self.driver = MPIDriver(self.backends, self.in_flight)  # rule 3: MPI moves while this rank waits elsewhere
        self.turns = self._gpu_turns(cfg)  # a CUDA-aware MPI and NCCL take turns on the GPU (None: no need)
        self._checker = self._call_checker(cfg)
        # where call() adds nothing to a ready blocking route (no per-call check, no profiler
        # span), api.all_reduce runs the route's prepared function itself: the hot path
        self.direct = self._checker is None and not cfg.trace_dir
        self.progress = self._progress_thread(cfg)
        self.callbacks = CallbackThread()  # sets dist.Work futures as their ops complete (mcr.callbacks)
        if self.world_size > 1:
            startup.abort_job_on_uncaught_exception(self.rank, self.dump_flight_record, self.abort_job)
        if self.rank == 0:
            startup.say_once(started, info, self.router.table)

    # --- start-up (the backends, store and table: mcr.startup) ---------------------------------
    def dump_flight_record(self, why="asked for", directory=None, frame=None) -> str | None:
        """Write this rank's flight record (`mcr.flight`) into `directory` (default: the
        configured one) and say where on stderr; None where the recorder is off or no directory
        is set. Safe from any thread, and at any moment (the watchdog, signals)."""
        if self.recorder is None:
            return None
        self.stream_ops.settle()  # GPU ops the GPU has run since the last look: stamped done
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

    def _gpu_turns(self, cfg):
        """`GpuTurns` where a GPU library (NCCL) and a host-driven library handed device memory (a
        CUDA-aware MPI) both run here, unless `mpi_nccl_concurrent` lets them run side by side."""
        backends = self.backends.values()
        if cfg.mpi_nccl_concurrent or not any(b.gpu_native for b in backends):
            return None
        if not any(b.drives_device_memory for b in backends):
            return None
        return GpuTurns(self.stream_ops, self.driver, tracked=self.recorder is not None)

    def _progress_thread(self, cfg):
        """The thread that completes async ops nobody waits on (`mcr.progress`); none where the
        MPI library cannot take calls from two threads at once."""
        if not cfg.progress_thread:
            return None
        single = self.driver.single_threaded
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

    def new_group(self, ranks, cpu_only=False) -> Group:
        """`cpu_only`: the group never carries CUDA tensors, so no GPU library's communicator is
        made for it (each costs GPU memory and a connection set-up); a CUDA op on it fails."""
        ranks = sorted(set(int(r) for r in ranks))
        if not ranks:
            raise ValueError("new_group: no ranks given; pass the global ranks of the group's members")
        bad = [r for r in ranks if not 0 <= r < self.world_size]
        if bad:
            raise ValueError(f"new_group: ranks {bad or ranks} are not in the world of {self.world_size} ranks")
        group = Group(self._next_gid, ranks, self.rank, self.topology.shape(ranks))
        group.cpu_only = cpu_only
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
            if group.cpu_only and backend.gpu_native:
                group.unavailable[name] = "the group is CPU-only (new_group(cpu_only=True))"
                continue
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
    def call(self, request):
        """Route this call (step 2, `mcr.routing`), run `method` of its backend with the group's
        communicator, `*args` and `async_op` (step 3: one call, chunks or node-aware phases), then
        `after` (AVG's divide): now for a blocking op, at completion for an async one."""
        if self.traced and torch._C._autograd._profiler_enabled():
            with torch.autograd.profiler.record_function(f"mcr:{request.method}"):
                return self._call(request)
        return self._call(request)

    def _call(self, request):
        family, group, tensor, reduce_op = request.family, request.group, request.tensor, request.reduce_op
        if self._checker is not None and family != "send_recv":
            self._checker.check(family, group, request.nbytes, tensor.dtype, reduce_op)
        method, args, async_op, after = request.method, request.args, request.async_op, request.after
        key = route_key(method, request.nbytes, tensor, request.explicit, reduce_op, self.router.forced)
        ready = group.routes.get(key)
        if ready is None:
            ready = self._make_route(key, family, group, tensor)
        route, blocking, issue = ready
        if blocking is not None:  # one backend call, prepared (mcr.runner, mcr.stream_ordered)
            if after is not None and type(after) is Average and route.backend.native_avg:
                args, after = as_average(args), None  # the library's own average
            if not async_op:
                blocking(group, args)
                if after is not None:
                    after()
                return None
            handle = issue(group, args)
            return handle if after is None else then(handle, after)
        # a route in chunks or node-aware phases: the runtime's own steps, each recorded by itself
        recorder = self.recorder
        if recorder is not None:
            entry = recorder.opener(route, method, async_op)(group, args[1] if family == "send_recv" else None)
        else:
            entry = None
        result = (
            node_aware.run_route(self, route, group, method, args, async_op)
            if route.plan is not None
            else run_chunked(self, route, group, tensor, reduce_op, async_op)
        )
        if entry is not None:
            if not async_op:
                entry[DONE] = entry[LIVE][S_DONE] = time_ns()
            else:
                result.stamp_done(entry)
                entry[RETURNED] = time_ns()
        if after is None:
            return result
        if async_op:
            return then(result, after)
        after()
        return None

    def batch_p2p(self, batch) -> list:
        """Sends and receives issued together (`mcr.api.batch_isend_irecv`): [(group, method,
        tensor, group peer, tag)]. On a GPU library, one group of the library on the group's
        communicator (one Work); elsewhere each op as its own isend/irecv (a handle each). Each
        op's backend is chosen as for a lone send or receive, so both sides of each pair agree."""
        routes = []
        for group, method, tensor, _, tag in batch:
            reduce_op = "tagged" if tag else None
            key = route_key(method, tensor.nbytes, tensor, None, reduce_op, self.router.forced)
            ready = group.routes.get(key) or self._make_route(key, "send_recv", group, tensor)
            routes.append(ready[0])
        native = [r.device_type == "cuda" and r.backend.gpu_native and not r.staged for r in routes]
        if not any(native):
            return [
                self.call(
                    Request("send_recv", m, t.nbytes, g, t, (t, peer, tag), None, True, "tagged" if tag else None)
                )
                for g, m, t, peer, tag in batch
            ]
        where = {(r.op.label, id(b[0])) for r, b in zip(routes, batch)}
        if not all(native) or len(where) > 1:
            ran = ", ".join(f"{m} of {t.nbytes} bytes on {r.op.label}" for r, (_, m, t, _, _) in zip(routes, batch))
            raise ValueError(
                f"mcr.batch_isend_irecv: the batch's ops run on different backends or groups ({ran}), so they "
                "cannot be one group of one library on both sides; batch only ops of one group that run on one "
                "GPU library (CUDA tensors the same library takes), or issue them one by one with isend/irecv"
            )
        return [self._gpu_batch(batch, routes)]

    def _gpu_batch(self, batch, routes):
        group, backend = batch[0][0], routes[0].backend
        if self.turns is not None and self.turns.mpi:
            self.turns.nccl_may_launch()
        entries = None
        if self.recorder is not None:
            entries = tuple(
                self.recorder.opener(r, m, True)(group, peer) for r, (_, m, _, peer, _) in zip(routes, batch)
            )
        try:
            work = backend.p2p_batch(group.comms[backend.name], [(m, t, peer) for _, m, t, peer, _ in batch], True)
        except Exception as exc:
            raise self.op_error(routes[0].op, group, exc) from exc
        if not torch.cuda.is_current_stream_capturing():
            self.stream_ops.add(work, routes[0].op, entries)
        return work

    def _make_route(self, key, family, group, tensor):
        """(route, blocking run, async issue) for `key` in the group's cache; the two runs
        (`mcr.runner`, on CUDA tensors `mcr.streams.CudaRoute`) None where the
        route runs in chunks or phases (`mcr.chunked`, `mcr.node_aware`)."""
        method, nbytes, dtype, is_cuda, explicit, reduce_op, _ = key
        if is_cuda and group.cpu_only:
            raise ValueError(
                f"mcr.{family}: group {list(group.ranks)} was made CPU-only (new_group(cpu_only=True)) and has no "
                "GPU communicator; pass CPU tensors, or make the group without cpu_only"
            )
        device_type = "cuda" if is_cuda else "cpu"
        route = self.router.route(family, nbytes, group, dtype, device_type, explicit, reduce_op)
        blocking = issue = None
        if route.runs_whole(nbytes):
            backend = route.backend
            fn, comm = getattr(backend, method), group.comms[backend.name]
            if is_cuda and backend.gpu_native and not route.staged:
                gpu = StreamOrderedRoute(self, route.op, backend, method, comm, route)
                blocking, issue = gpu.run, gpu.issue
            elif is_cuda:
                cuda = CudaRoute(
                    self, route.op, backend, method, comm, route, route.staged, reduce_op=reduce_op, dtype=dtype
                )
                blocking, issue = cuda.run, cuda.issue
            else:
                call = backend.for_route(method, comm, nbytes, dtype, device_type, reduce_op)
                blocking = prepare_blocking_run(self, route.op, group, fn, comm, call, route, method)
                issue_call = backend.for_route(method, comm, nbytes, dtype, device_type, reduce_op, async_op=True)
                issue = prepare_async_issue(self, route.op, group, fn, comm, issue_call, route, method)
        if len(group.routes) > 65536:
            group.routes.clear()  # bounded: uneven all-to-all sizes are many
        ready = group.routes[key] = (route, blocking, issue)
        return ready

    # --- step 3 and 4: run, watch and account --------------------------------------------------
    def run(self, op: OpCall, group, backend, method, args, logged=True):
        """`method` of `backend` on the group, blocking, under the watchdog, its time in the comm
        log (unless a chunk of an op that is logged whole): the runtime's own steps (node-aware
        phases, finalize's barriers, debug checks), as `mcr.runner` describes; on CUDA tensors
        under the stream rules (`mcr.streams`)."""
        comm = group.comms[backend.name]
        if streams.device_of(args) is not None and backend.gpu_native:
            return StreamOrderedRoute(self, op, backend, method, comm).run(group, args)
        if streams.device_of(args) is not None:
            dtype = next(a.dtype for a in args if isinstance(a, torch.Tensor))
            reduce_op = next((a for a in args if isinstance(a, str)), None)  # a reduction's op name
            return CudaRoute(self, op, backend, method, comm, logged=logged, reduce_op=reduce_op, dtype=dtype).run(
                group, args
            )
        return prepare_blocking_run(self, op, group, getattr(backend, method), comm, logged=logged)(group, args)

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
            self.driver.wait_for(op.label, inner_wait, inner_test, handle.completes_alone)
        except Exception as exc:
            raise self.op_error(op, group, exc) from exc
        finally:
            waits.pop(thread, None)

    def op_error(self, op, group, exc):
        error = CommError(
            f"rank {self.rank}: {op.family} on backend {op.label} ({op.nbytes} bytes, group ranks "
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
        self.stream_ops.settle(block=True)  # GPU ops: stamped done and timed once the GPU ran them
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
                self.run(OpCall("finalize", name, 0, self.world.size), self.world, backend, "barrier", (None,))
        self.comm_log = comm_log
        if self.progress is not None:
            self.progress.stop()
        self.driver.stop()
        if self.watchdog is not None:
            self.watchdog.stop()
        for backend in self.backends.values():
            backend.shutdown()
        # Destroy gloo/NCCL groups now, while Python runs: left to interpreter exit (the caller may
        # still hold this runtime), their worker threads end after the interpreter is gone, and one
        # that then needs the GIL aborts the process ("terminate called without an active
        # exception", seen once in CI under torchrun). torch's destroy_process_group does the same.
        self._release_groups()
        if self.recorder is not None:
            self.recorder.finalize()  # its live file says the rank ended well
        if self.cfg.rank_dir:
            mark_a_clean_exit(self.cfg.rank_dir, self.rank)

    def abort(self) -> None:
        """torch's abort: this rank stops communicating now. Ops in flight are abandoned, not
        waited for; no closing barrier, log or record; the helper threads stop; every group's
        communicators abort (`Backend.abort`: NCCL's ops end, gloo's run out their timeout
        unseen, MPI's stay with the library until the process ends)."""
        self.in_flight.abandon()
        for thread in (self.progress, self.driver, self.watchdog):
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
