"""Ops in flight: every async op's handle from its issue until its op has completed.

In flight must mean alive: the runtime keeps each handle (its request and buffers) whatever the
caller does with it, so a dropped handle frees nothing under the backend (mpi4py keeps no
buffer alive) and its post-steps (AVG's divide, copy-outs, a future's result) still run.

One lock guards both collections here: every handle in issue order, with the communicator of
its collective (None for send/recv, which a later blocking op must not wait for); and the
handles of backends that progress only inside their own calls (MPI), which a rank blocked on
another backend keeps moving (mixing rule 3). Handles are tested and waited on outside the lock:
testing or waiting runs an op's finishers, which may issue more ops.

Who completes a handle (each under the handle's own lock, finishers exactly once):

    caller's thread     wait() / is_completed(), and a blocking op on the same communicator
                        (`complete_earlier`), finalize (`complete_all`)
    mcr-progress        tests every pending handle (`handles`), drops completed ones
    mcr-mpi-driver      tests the driven handles (`test_driven`) while a rank blocks on gloo
    mpi worker thread   runs large MPI collectives; their handles complete when it is done
"""

from __future__ import annotations

import time
from collections import deque
from threading import Lock

SWEEP_FROM = 64  # past this many entries, test them all and drop every completed one


class OpFailed(RuntimeError):
    """An async op failed where no wait of its caller would name it (a sweep, the progress thread)."""


def tested(handle) -> bool:
    """`handle.is_completed()`, a failure naming its own op: a thread testing it is not that op's
    caller, and the error must not read as the failure of whatever call it runs in."""
    try:
        return handle.is_completed()
    except Exception as exc:
        op = handle.op
        what = f"{op[0]} on backend {op[1]} ({op[2]} bytes, group of {op[3]} ranks)" if op else "an async op"
        raise OpFailed(f"{what} failed: {exc}") from exc


class InFlight:
    def __init__(self):
        self._lock = Lock()
        # (communicator or None, handle), in issue order; always this one deque, so a caller may
        # keep it to test "anything in flight?" without a call (a hint: checked again under the lock)
        self.entries = deque()
        self._sweep_at = SWEEP_FROM
        self._driven = []  # handles of ops that move only inside their library's calls
        self._driven_sweep_at = SWEEP_FROM

    def add(self, comm, handle, driven: bool = False) -> None:
        """Keep `handle` until its op completes. `comm`: its collective's communicator (a later
        blocking op on it completes this one first); None for send/recv. `driven`: its backend
        progresses only inside its own calls."""
        ops = self.entries
        with self._lock:
            while ops and ops[0][1].done:  # ops complete roughly in issue order
                ops.popleft()
            ops.append((comm, handle))
            sweep = len(ops) >= self._sweep_at  # an old op is still pending (a receive waiting for its send)
            if driven:
                # completed handles leave here too: test_driven runs only when a rank blocks on
                # another backend, so an MPI-only job would keep every handle (and the garbage
                # collector walk them all)
                if len(self._driven) >= self._driven_sweep_at:
                    self._driven = [h for h in self._driven if not h.done]
                    self._driven_sweep_at = max(SWEEP_FROM, 2 * len(self._driven))
                self._driven.append(handle)
        if sweep:
            for handle in self.handles():
                tested(handle)  # MPI_Test moves MPI's progress engine; finishers run here
            with self._lock:
                self._keep_pending()
                self._sweep_at = max(SWEEP_FROM, 2 * len(self.entries))

    def handles(self) -> list:
        with self._lock:
            return [entry[1] for entry in self.entries]

    def sizes(self) -> tuple:
        """(handles kept, driven handles kept): bounded however long a job runs."""
        with self._lock:
            return len(self.entries), len(self._driven)

    def any_pending_alone(self) -> bool:
        """Whether an op is pending that completes without its caller's wait (the progress
        thread's work; gloo's send/recv complete only inside their wait)."""
        with self._lock:
            return any(not h.done and h.completes_alone for _, h in self.entries)

    def forget_completed(self) -> None:
        with self._lock:
            self._keep_pending()

    def complete_earlier(self, comm) -> None:
        """Before a blocking collective: complete the async collectives issued before it on the
        same communicator. Safe: every member issues them in the same order, so a peer that
        reaches this op has posted those before it; and it makes a blocking op a point where
        dropped handles' results are ready, as gloo's in-order queue does."""
        with self._lock:
            earlier = [handle for c, handle in self.entries if c is comm]
        if earlier:
            for handle in earlier:
                handle.wait()
            self.forget_completed()

    def complete_all(self) -> None:
        """finalize(): wait for every op still in flight, collectives and send/recv alike, until
        the GPU has run those on CUDA tensors (a finisher may issue more: loop until none is left)."""
        while self.entries:
            for handle in self.handles():
                handle.wait()
                while not tested(handle):  # queued on a GPU, which has not run it yet
                    time.sleep(1e-4)
            self.forget_completed()

    def abandon(self, comm_ids=None) -> None:
        """abort(): forget the collectives on the communicators of `comm_ids` (None: every op),
        never waiting for them; their handles are the caller's alone (a wait fails as the aborted
        library fails it)."""
        with self._lock:
            kept = [entry for entry in self.entries if comm_ids is not None and id(entry[0]) not in comm_ids]
            self.entries.extend(kept)  # never empty while an op is kept (see _keep_pending)
            for _ in range(len(self.entries) - len(kept)):
                self.entries.popleft()
            ids = {id(handle) for _, handle in kept}
            self._driven = [handle for handle in self._driven if comm_ids is not None and id(handle) in ids]

    def test_driven(self) -> None:
        """Test every driven handle once, without blocking (MPI_Test moves MPI's progress)."""
        with self._lock:
            pending = list(self._driven)
        done = {id(handle) for handle in pending if tested(handle)}
        if done:
            with self._lock:
                self._driven = [handle for handle in self._driven if id(handle) not in done]

    def _keep_pending(self) -> None:  # under the lock
        """Drop the completed entries in place. The hot path and the progress thread read the
        deque without the lock, so it never passes through empty while an op is pending: each
        pending entry goes to the back before it leaves the front."""
        entries = self.entries
        for _ in range(len(entries)):
            entry = entries[0]
            if not entry[1].done:
                entries.append(entry)
            entries.popleft()
