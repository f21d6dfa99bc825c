"""The interface every backend implements: one method per op, nothing else.

Backends are thin: they run the op they are given on the group object they created, and know
nothing about choice, logging or watchdogs (those live in `mcr.runtime`). Ranks passed in are
ranks *within the group*. Every op returns a `Handle` when `async_op` is true (a `gpu_native`
library: torch's Work), else None after the op has completed (a `gpu_native` library: once it is
queued on the caller's current stream). AVG reaches only a backend with `native_avg`: for the
others the runtime runs SUM and a divide.
"""

from __future__ import annotations


class BackendUnavailable(RuntimeError):
    """Raised by a backend's constructor with the reason it cannot run here."""


class Backend:
    name: str = "?"
    devices: frozenset = frozenset({"cpu"})
    # False for a library whose nonblocking ops advance only inside its own calls (MPI): the
    # runtime then keeps them moving while the rank blocks on another backend.
    progresses_alone: bool = True
    # False for a library that cannot take calls from two threads at once (an MPI without
    # MPI_THREAD_MULTIPLE): no progress thread then, and a rank drives it from its waiting thread.
    thread_multiple: bool = True
    # False for a library that starts without the runtime's TCP store (MPI has its own world,
    # and gives the others their rendezvous address when no launcher did)
    needs_store: bool = True
    # True for a library that orders its ops on CUDA tensors against the caller's current stream
    # itself, as torch's process groups do (NCCL; gloo on the ops it runs on CUDA tensors); False
    # for a host-driven one (MPI), which the runtime keeps off the memory until the stream reached
    # the op (`mcr.streams`, rule 1)
    stream_ordered: bool = False
    # False for a library whose groups do not meet in finalize()'s closing barrier (NCCL: a
    # barrier there would need a world communicator on a GPU; the host libraries' barrier suffices)
    closing_barrier: bool = True
    # False for a library that matches a pair's messages in order, whatever their tags (NCCL):
    # a tagged send or receive is then chosen elsewhere
    p2p_tags: bool = True
    # True for a library that takes a timeout per call and fails the call when it passes (gloo;
    # MPI has none, and NCCL's ends the process): a barrier given one is chosen there
    call_timeouts: bool = False
    # True for a library that runs no group where two members share a GPU (NCCL): the runtime
    # then opens no communicator of it there, and chooses another backend for that group
    gpu_per_rank: bool = False
    # True for a GPU library whose ops are kernels on CUDA streams and never block the host
    # (NCCL): the runtime runs its ops on CUDA tensors as torch does (`mcr.stream_ordered`)
    gpu_native: bool = False
    # True for a library that averages itself (NCCL's ncclAvg): AVG is not SUM and a divide there
    native_avg: bool = False
    # True for a host-driven library handed device memory (a CUDA-aware MPI): its ops on the GPU
    # and a GPU library's take turns there (`mcr.gpu_turns`)
    drives_device_memory: bool = False

    @classmethod
    def start(cls, info, store, timeout_s: float, cfg=None) -> "Backend":
        """Build it for this job (`info`: mcr.env.LaunchInfo; `store`: the runtime's torch store,
        None for a backend with needs_store False; `timeout_s`: the op timeout where the library
        has one; `cfg`: the runtime's config). Raise BackendUnavailable with the reason where it
        cannot run here."""
        return cls(store, info.rank, info.world_size, timeout_s)

    @classmethod
    def expected_devices(cls, gpu: bool) -> frozenset:
        """The devices a job on this machine (`gpu`: it has one) would run it on, judged without
        starting it (`mcr.tools.explain`); raise BackendUnavailable where it would not start."""
        return cls.devices

    def version(self) -> str:
        raise NotImplementedError

    def new_group(self, gid: int, ranks: list[int], group_rank: int, timeout=None):
        """Called on every rank of the world (like torch's new_group); returns this backend's
        group object on members and None elsewhere. `timeout` (a timedelta, torch's group
        timeout): where the library has one, an op on the group raises after it."""
        raise NotImplementedError

    def supports(self, family: str, dtype, reduce_op, device_type: str) -> bool:
        return device_type in self.devices

    def refusal(self, family: str, dtype, reduce_op, device_type: str) -> str | None:
        """Why `supports` says no to a call its dtypes and ops would allow (the machine lacks what
        the library needs), for the note that names the backend chosen instead; else None."""
        return None

    def reads_device(self, method: str, dtype, reduce_op) -> bool:
        """Whether `method` reads and writes CUDA tensors itself; where not, the runtime runs it on
        pinned host copies (`mcr.streams.to_host`). Asked only where `supports` said cuda."""
        return False

    def prepare(self, method: str, comm, args) -> tuple:
        """`method` on `comm` with `args` as this library runs it on CUDA tensors, for the runtime
        to run under the stream rules (`mcr.streams`): `(method, args, finish)`, where the device
        temporaries the op reads or writes (a packed list) are made now, on the current stream (the
        issuing one, before the op's ready event: rule 1), and `finish` (or None) queues what the op
        leaves in them into the caller's tensors (the copy-outs) on the stream current when it runs
        (the issuing one, as the op's first finisher: rule 3). By default the op as it is."""
        return method, args, None

    def issue_after(self, ready, method: str, comm, args):
        """Issue `method` async on `comm` with `args`, the library touching their memory only
        after `ready()` returned (the issuing stream reached the op: `mcr.streams`, rule 1).
        By default the issuing thread waits first; a backend with a worker thread may wait there."""
        ready()
        return getattr(self, method)(comm, *args, True)

    def progress(self) -> None:
        """Move the library's own progress once, without blocking: called while a rank blocks on
        another backend, for a library whose `progresses_alone` is False (mixing rule 3)."""

    def for_route(self, method: str, comm, nbytes: int, dtype, device_type: str, reduce_op, async_op=False):
        """The calls of one route (the runtime caches this per route): a function of `method`'s
        arguments after the group, run on `comm`, blocking or (`async_op`) returning the op's
        handle. A backend may return a faster one that holds what the route fixes (message
        size, dtype, device, reduce op) instead of looking it up per call."""
        fn = getattr(self, method)
        return lambda *args: fn(comm, *args, async_op)

    def all_reduce(self, g, tensor, reduce_op, async_op):
        raise NotImplementedError

    def reduce(self, g, tensor, dst, reduce_op, async_op):
        raise NotImplementedError

    def broadcast(self, g, tensor, src, async_op):
        raise NotImplementedError

    def all_gather(self, g, output_list, tensor, async_op):
        raise NotImplementedError

    def all_gather_into_tensor(self, g, output, tensor, async_op):
        raise NotImplementedError

    def gather(self, g, tensor, gather_list, dst, async_op):
        raise NotImplementedError

    def scatter(self, g, tensor, scatter_list, src, async_op):
        raise NotImplementedError

    def reduce_scatter(self, g, output, input_list, reduce_op, async_op):
        raise NotImplementedError

    def reduce_scatter_tensor(self, g, output, input, reduce_op, async_op):
        raise NotImplementedError

    def all_to_all(self, g, output_list, input_list, async_op):
        raise NotImplementedError

    def all_to_all_single(self, g, output, input, output_splits, input_splits, async_op):
        raise NotImplementedError

    def send(self, g, tensor, dst, tag, async_op):
        raise NotImplementedError

    def recv(self, g, tensor, src, tag, async_op):
        """src None: from any source (always async); the handle's `source()` names the sender's group rank."""
        raise NotImplementedError

    def barrier(self, g, timeout, async_op):
        """`timeout` (a timedelta): fail once it passed, where `call_timeouts` (None: the group's)."""
        raise NotImplementedError

    def member_group(self, key: str, ranks: list[int], group_rank: int, timeout=None):
        """A group built by its members alone, in the given rank order (group rank i is
        ranks[i]); `key` is the same on every member and differs between groups. By default
        the group as `new_group` makes it, with `key` naming it in the store."""
        return self.new_group(key, list(ranks), group_rank, timeout)

    def release(self, comm) -> None:
        """A group's communicator its user is done with (`Runtime.release_group`); by default
        dropping it is enough (torch's process groups end their threads when released)."""

    def end_job(self):
        """End the whole job where the library can (MPI takes every rank down); the runtime
        then ends this process."""

    def abort(self, comm) -> None:
        """torch's abort of one communicator: end its ops and connections now, waiting for no
        peer. By default nothing: MPI has no local abort (MPI_Abort ends the job), so its ops
        stay with the library."""

    def shutdown(self):
        pass
