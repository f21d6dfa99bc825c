"""A CUDA-aware MPI and NCCL on one GPU take turns: each runs only while the other is idle there.

NCCL's kernels wait on the GPU until every peer's kernel of the op runs, and a CUDA-aware MPI
moves device memory with copies, IPC and streams of its own. NCCL's documentation ("NCCL and MPI",
"Inter-GPU Communication with CUDA-aware MPI") says that using NCCL concurrently with a CUDA-aware
MPI may create deadlocks; NCCL's maintainer adds that keeping the two in separate phases removes
any chance of one (NVIDIA/nccl#493); users hit it (open-mpi/ompi#8806), and Horovod refuses to mix
NCCL and MPI GPU ops unless told to (horovod/horovod#435). So by default, on each rank:

- a CUDA-aware MPI op starts (on whichever thread runs it, after its ready event) only once every
  NCCL op issued before it has run on the GPU (`mpi_may_start`);
- an NCCL op issued while CUDA-aware MPI ops are in flight is launched only once they have
  finished on the host (`nccl_may_launch`): from their issue, not their start, so an op a peer has
  not reached yet is never waited for from both sides (the NCCL ops each MPI op waits for were
  issued before it on every rank, and their peers launched them).

Each wait keeps MPI moving (mixing rule 3). An NCCL op pays for this only while a CUDA-aware MPI op
is in flight: its route tests one list (`mpi`) for being empty. `mpi_nccl_concurrent: true`
(MCR_MPI_NCCL_CONCURRENT=1) runs them side by side, which NCCL does not support.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import torch


class GpuTurns:
    """The turns of one rank's CUDA-aware MPI ops and NCCL ops on its GPU."""

    def __init__(self, stream_ops, driver, tracked: bool):
        """`stream_ops`: the runtime's NCCL ops the GPU has not run (`StreamOps`); `driver`: rule
        3's `MPIDriver`; `tracked`: every NCCL op is held there until the GPU ran it (the flight
        recorder is on); otherwise an MPI op waits for the whole GPU instead."""
        # CUDA-aware MPI ops in flight, oldest first: an NCCL route reads it without the lock (empty:
        # nothing to wait for); always this one list, changed in place under the lock
        self.mpi = []
        self._lock = threading.Lock()
        self._ops, self._driver, self._tracked = stream_ops, driver, tracked

    # --- NCCL's side ---------------------------------------------------------------------------
    def nccl_may_launch(self) -> None:
        """Before an NCCL launch: return once every CUDA-aware MPI op in flight has finished on
        the host (an async one's finishers queued), waiting on this thread under the watchdog."""
        for op in list(self.mpi):
            op.wait_host()
        self._forget_finished()

    # --- MPI's side ----------------------------------------------------------------------------
    def mpi_issued(self, handle) -> None:
        """An async CUDA-aware MPI op was issued: NCCL ops issued from now on wait for it."""
        with self._lock:
            self.mpi[:] = [op for op in self.mpi if not op.host_done] + [handle]

    @contextlib.contextmanager
    def mpi_running(self):
        """Around a blocking CUDA-aware MPI op: another thread's NCCL op waits for it."""
        running = _Running()
        with self._lock:
            self.mpi.append(running)
        try:
            yield
        finally:
            running.finished.set()
            self._forget_finished()

    def mpi_may_start(self, device) -> None:
        """Return once the GPU has run every NCCL op issued so far (call it after the MPI op's
        ready event, before the library touches the memory)."""
        if not self._tracked:  # blocking NCCL ops leave no event behind: wait for the whole GPU
            self._driver.during(lambda: torch.cuda.synchronize(device))
            return
        while True:
            done = self._ops.oldest()
            if done is None:
                return
            if isinstance(done, torch.cuda.Event):
                self._driver.during(done.synchronize, done.query)
            else:  # torch's Work: a stream of this wait's waits on its future, the host on an event after
                self._driver.during(functools.partial(_work_ran, done), done.is_completed)

    def _forget_finished(self) -> None:
        with self._lock:
            self.mpi[:] = [op for op in self.mpi if not op.host_done]


class _Running:
    """A blocking CUDA-aware MPI op on some thread, as `GpuTurns.mpi` holds it."""

    __slots__ = ("finished",)

    def __init__(self):
        self.finished = threading.Event()

    @property
    def host_done(self) -> bool:
        return self.finished.is_set()

    def wait_host(self) -> None:
        self.finished.wait()


def _work_ran(work) -> None:
    """Block until the GPU has run torch's `work`: a stream of this call waits on its CUDA-aware
    future (its stash stays: `Work.wait` would release it for that stream), then the host on an
    event recorded after the wait."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        work.get_future().wait()
        ran = torch.cuda.Event()
        ran.record()
    ran.synchronize()
