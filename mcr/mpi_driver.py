"""Mixing rule 3's one owner (`mcr.runtime`'s docstring): while a thread of this rank blocks on
a backend that progresses alone (gloo, nccl, a CUDA event), MPI keeps moving.

MPI moves only inside MPI calls, and not only for the ops a rank still has in flight: a blocking
send may return once its data is copied into the library's buffers (the eager protocol), and over
TCP those buffers go out only from inside a later MPI call of the sending rank. A peer blocked in
the matching receive then waits for that rank, which may itself be blocked in gloo, waiting for
that peer. tests/cluster's random stress (2 nodes x 2 ranks, seed 23, a table mixing flat and
node-aware candidates) hung in 3 of 19 runs while the runtime drove MPI only for its in-flight
ops, each time with one rank in a blocking MPI reduce-scatter on a 2-rank group across the nodes
that its peer had returned from, and every other rank in a gloo all-reduce waiting for it (which
step inside Open MPI was left undelivered was not pinned down: simple scripts of eager sends or
reduce-scatters followed by gloo did not hang). Keeping MPI moving throughout every wait on
another backend, in-flight ops or not, made 20 runs of 20 pass.

A wait for a CUDA event (a stream reaching an op) polls it on the waiting thread instead
(`wait_gpu`): most such waits last microseconds, which waking the driver thread would multiply.

So, in a job with MPI, every blocking wait on another backend runs inside `during()`: the waiting
thread blocks in the library's own wait (the op completes as soon as the library says so) while
this thread tests the in-flight MPI ops and pokes MPI's progress engine, after a pause that doubles
from MIN_PAUSE_S to MAX_PAUSE_S (a wait shorter than the first pause costs no MPI call), and
sleeps when nobody waits. It calls MPI from a second thread,
so `MPIDriver` starts it only where MPI gives MPI_THREAD_MULTIPLE, and otherwise drives MPI from
the waiting thread itself: polling the op it waits for, or, for an op whose library marks it done
only inside its own wait(), running that wait on a helper thread meanwhile.
"""

from __future__ import annotations

import threading
import time

from . import threads

# A stuck peer needs MPI to move eventually, not at once: long pauses keep the thread off the
# cores gloo's own threads need (at 100 µs-1 ms, a 1 MiB gloo all-reduce across 2 nodes took
# 2.1-2.4 ms against 1.4-1.6 ms without the thread: configs/tuning/vm-2nodes-bench.txt).
MIN_PAUSE_S = 1e-3
MAX_PAUSE_S = 10e-3


# The waiting thread's own polls, where MPI takes no second thread: from 20 µs to 1 ms, so a long
# wait costs little CPU.
MIN_POLL_S = 2e-5
MAX_POLL_S = 1e-3
# A wait for a CUDA event first polls it this long without a pause or an MPI call: a staged op's
# copies take microseconds, a sleep tens of them, and rule 3 asks nothing of the first millisecond
# (the driver thread's first pause)
GPU_SPIN_S = 1e-4


class MPIDriver:
    """Whether this job needs MPI kept moving, and how each kind of wait keeps it moving."""

    def __init__(self, backends, in_flight):
        """`backends`: name -> Backend; `in_flight`: the runtime's `InFlight` (its driven handles)."""
        self._moved_by_calls = [backend for backend in backends.values() if not backend.progresses_alone]
        # the backends that progress only inside their own calls (MPI): names, as ops label them
        self.needed = frozenset(backend.name for backend in self._moved_by_calls)
        # backends that take no calls from a second thread (an MPI without MPI_THREAD_MULTIPLE)
        self.single_threaded = [name for name, backend in backends.items() if not backend.thread_multiple]
        self._in_flight = in_flight
        self.thread = _DriverThread(self.drive) if self.needed and not self.single_threaded else None

    def drive(self) -> None:
        """Let MPI move, without blocking: test its in-flight ops, then poke its progress engine
        (for sends that returned before their data left)."""
        self._in_flight.test_driven()
        for backend in self._moved_by_calls:
            backend.progress()

    def drives(self, label) -> bool:
        """Whether a blocking op labelled `label` must keep MPI moving: the job has MPI and the
        op runs elsewhere (waiting inside MPI moves MPI itself)."""
        return bool(self.needed) and label not in self.needed

    def during(self, wait, test=None):
        """`wait()`, a blocking wait on something other than MPI (another backend's op, a CUDA
        event, a group's rendezvous), keeping MPI moving meanwhile: beside the driver thread, or
        where MPI takes no second thread by polling `test()` from this one (no `test`: not at all)."""
        if not self.needed:
            return wait()
        if self.thread is not None:
            return self.thread.during(wait)
        if test is not None:
            self._poll(test)
        return wait()

    def wait_for(self, label, wait, test, testable: bool) -> None:
        """An async op's wait (op labelled `label`). `testable`: its `test()` can say done; where
        not (gloo's send/recv, reduce-scatter) and no driver thread runs, its wait runs beside
        this thread rather than being polled: no test would ever see it done
        (tests/mcr/scripts/waited_only.py)."""
        if not self.drives(label):
            wait()
        elif self.thread is not None or testable:
            self.during(wait, test)
        else:
            self._wait_aside(wait)

    def wait_gpu(self, event) -> None:
        """Block until the CUDA `event` has completed (a stream reached an op: rule 1's wait), on
        this thread and without waking another: it polls the event, for GPU_SPIN_S alone, then,
        in a job with MPI, driving MPI between polls (rule 3), as a rank without the driver thread
        waits; without MPI it blocks in the event."""
        spin_until = time.perf_counter() + GPU_SPIN_S
        while not event.query():
            if time.perf_counter() > spin_until:
                if self.needed:
                    self._poll(event.query)
                else:
                    event.synchronize()
                return

    def stop(self) -> None:
        if self.thread is not None:
            self.thread.stop()

    def _poll(self, test) -> None:
        pause = MIN_POLL_S
        while not test():
            self.drive()
            time.sleep(pause)
            pause = min(2 * pause, MAX_POLL_S)

    def _wait_aside(self, wait) -> None:
        done, failed = threading.Event(), []

        def waiter():
            try:
                wait()
            except BaseException as exc:  # raised here, on the caller's thread, under its watchdog
                failed.append(exc)
            finally:
                done.set()

        threads.start(waiter, "mcr-wait")
        self._poll(done.is_set)
        done.wait()
        if failed:
            raise failed[0]


class _DriverThread:
    """The thread that drives MPI while some thread of this rank waits elsewhere."""

    def __init__(self, drive):
        self._drive = drive  # tests the in-flight MPI ops and pokes MPI's progress engine; never blocks
        self._lock = threading.Lock()
        self._waiting = 0  # threads now inside during()
        self._wake = threading.Event()  # set while someone waits
        self._stopped = False
        self._thread = None  # started by the first wait

    def during(self, wait):
        """Run `wait()` (a blocking call on another backend) while MPI keeps moving; returns its result."""
        with self._lock:
            if self._thread is None:
                self._thread = threads.start(self._loop, "mcr-mpi-driver")
            self._waiting += 1
            self._wake.set()
        try:
            return wait()
        finally:
            with self._lock:
                self._waiting -= 1
                if not self._waiting and not self._stopped:  # a stop's wake stays set
                    self._wake.clear()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self):
        while True:
            self._wake.wait()
            pause = MIN_PAUSE_S
            while True:
                time.sleep(pause)  # first: most waits end sooner, and then cost no MPI call here
                if not self._wake.is_set() or self._stopped:
                    break
                try:
                    self._drive()
                except Exception:  # an MPI op failed: its own wait raises it, naming the op
                    pass
                pause = min(2 * pause, MAX_PAUSE_S)
            if self._stopped:
                return
